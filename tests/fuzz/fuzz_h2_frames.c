/* Fuzz harness: the relay's HTTP/2 frame reader (daemon/rpc/h2_frames.c), the part of ttd
 * that reads a TCP peer's bytes before gRPC does.
 *
 * Input: u8 mode, u8 step, then the client's bytes. Mode bit 0 set: the parser expects the
 * client preface first; bits 1-7: the clock advances by that many milliseconds between
 * pieces. The bytes are fed whole to one parser and in pieces of step+1 bytes to another:
 * both must reach the same verdict and the same frame and reset counts (a frame split
 * across reads is read as one), and a parser that passed every byte must sit inside a
 * frame or between frames, never past one. */
#include <stdio.h>
#include <stdlib.h>

#include "fuzz_input.h"
#include "rpc/h2_frames.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_input in = {data, size};
  uint8_t mode = fuzz_u8(&in);
  size_t step = (size_t)fuzz_u8(&in) + 1;
  int preface = mode & 1;
  int64_t tick = mode >> 1;
  ttd_h2_frames whole, pieces;
  ttd_h2_frames_init(&whole, 200, preface, 0);
  ttd_h2_frames_init(&pieces, 200, preface, 0);
  /* The whole feed sees every byte at time 0 unless the clock moves: then both parsers
   * read piece by piece at the same times, and only the piece sizes differ. */
  int64_t now = 0;
  if (tick == 0) {
    ttd_h2_frames_feed(&whole, in.data, in.left, 0);
  }
  for (size_t at = 0; at < in.left; at += step) {
    size_t n = in.left - at < step ? in.left - at : step;
    if (tick) {
      for (size_t k = 0; k < n; k++) ttd_h2_frames_feed(&whole, in.data + at + k, 1, now);
    }
    ttd_h2_frames_feed(&pieces, in.data + at, n, now);
    now += tick;
  }
  if (whole.verdict != pieces.verdict || whole.frames != pieces.frames || whole.resets != pieces.resets ||
      whole.streams_unacked != pieces.streams_unacked) {
    fprintf(stderr, "fuzz: pieces of %zu read as verdict %d, %llu frames, %llu resets; whole: %d, %llu, %llu\n", step,
            pieces.verdict, (unsigned long long)pieces.frames, (unsigned long long)pieces.resets, whole.verdict,
            (unsigned long long)whole.frames, (unsigned long long)whole.resets);
    abort();
  }
  if (whole.verdict == TTD_H2_PASS &&
      (whole.head_len >= TTD_H2_FRAME_HEADER_LEN || whole.payload_left > 0xffffffu ||
       whole.preface_seen > TTD_H2_PREFACE_LEN || (whole.head_len && whole.payload_left))) {
    fprintf(stderr, "fuzz: the parser passed its input but stands outside any frame\n");
    abort();
  }
  return 0;
}
