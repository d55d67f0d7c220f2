#include "rpc/h2_frames.h"

#include <string.h>

const uint8_t ttd_h2_preface[TTD_H2_PREFACE_LEN + 1] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

void ttd_h2_frames_init(ttd_h2_frames *f, int max_resets, int expect_preface, int64_t now_ms) {
  memset(f, 0, sizeof(*f));
  f->preface_seen = expect_preface ? 0 : TTD_H2_PREFACE_LEN;
  f->max_resets = max_resets;
  f->reset_depth = (int64_t)max_resets * 1000;
  f->reset_millis = f->reset_depth;
  f->resets_ms = now_ms;
  f->verdict = TTD_H2_PASS;
}

/* One RST_STREAM: the bucket refills at max_resets a second, and each reset takes one. */
static ttd_h2_verdict take_reset(ttd_h2_frames *f, int64_t now_ms) {
  f->resets++;
  if (now_ms > f->resets_ms) {
    f->reset_millis += (now_ms - f->resets_ms) * f->max_resets;
    if (f->reset_millis > f->reset_depth) f->reset_millis = f->reset_depth;
    f->resets_ms = now_ms;
  }
  f->reset_millis -= 1000;
  return f->reset_millis < 0 ? TTD_H2_RESET_FLOOD : TTD_H2_PASS;
}

/* A whole frame header is in f->head. */
static ttd_h2_verdict frame_header(ttd_h2_frames *f, int64_t now_ms) {
  const uint8_t *h = f->head;
  uint8_t type = h[3], flags = h[4];
  uint32_t stream = (uint32_t)(h[5] & 0x7f) << 24 | (uint32_t)h[6] << 16 | (uint32_t)h[7] << 8 | h[8];
  f->frames++;
  f->head_len = 0;
  f->payload_left = (uint32_t)h[0] << 16 | (uint32_t)h[1] << 8 | h[2];
  if (type == TTD_H2_RST_STREAM) return take_reset(f, now_ms);
  if (type == TTD_H2_SETTINGS && (flags & TTD_H2_FLAG_ACK) && f->server_spoke) f->settings_acked = 1;
  if (type == TTD_H2_HEADERS && stream > f->last_stream) { /* a new stream */
    f->last_stream = stream;
    if (!f->settings_acked && ++f->streams_unacked > TTD_H2_STREAMS_BEFORE_ACK) return TTD_H2_STREAM_FLOOD;
  }
  return TTD_H2_PASS;
}

ttd_h2_verdict ttd_h2_frames_feed(ttd_h2_frames *f, const uint8_t *data, size_t len, int64_t now_ms) {
  size_t at = 0;
  while (at < len && f->verdict == TTD_H2_PASS) {
    if (f->preface_seen < TTD_H2_PREFACE_LEN) {
      size_t n = TTD_H2_PREFACE_LEN - f->preface_seen;
      if (n > len - at) n = len - at;
      if (memcmp(data + at, ttd_h2_preface + f->preface_seen, n) != 0) f->verdict = TTD_H2_BAD_PREFACE;
      f->preface_seen += (uint32_t)n;
      at += n;
    } else if (f->payload_left) {
      size_t n = len - at < f->payload_left ? len - at : f->payload_left;
      f->payload_left -= (uint32_t)n;
      at += n;
    } else if (f->head_len == 0 && len - at >= TTD_H2_FRAME_HEADER_LEN) {
      f->head_at = f->offset + at;
      memcpy(f->head, data + at, TTD_H2_FRAME_HEADER_LEN); /* the common case: a whole header */
      at += TTD_H2_FRAME_HEADER_LEN;
      f->verdict = frame_header(f, now_ms);
    } else {
      if (f->head_len == 0) f->head_at = f->offset + at;
      f->head[f->head_len++] = data[at++];
      if (f->head_len == TTD_H2_FRAME_HEADER_LEN) f->verdict = frame_header(f, now_ms);
    }
  }
  f->offset += at;
  if (f->verdict == TTD_H2_PASS) f->good = f->offset;
  else if (f->verdict == TTD_H2_BAD_PREFACE) f->good = 0;
  else if (f->good < f->head_at) f->good = f->head_at; /* up to the offending frame */
  return f->verdict;
}

void ttd_h2_frames_server_spoke(ttd_h2_frames *f) { f->server_spoke = 1; }

const char *ttd_h2_verdict_text(ttd_h2_verdict v) {
  switch (v) {
    case TTD_H2_PASS: return "HTTP/2 frames";
    case TTD_H2_BAD_PREFACE: return "not the HTTP/2 client preface";
    case TTD_H2_RESET_FLOOD: return "HTTP/2 rapid reset: the client reset streams faster than allowed";
    case TTD_H2_NO_CALL: return "no call after the HTTP/2 preface in time";
    case TTD_H2_STREAM_FLOOD:
      return "HTTP/2 stream flood: the client opened more streams than the server allows without acknowledging "
             "its SETTINGS";
  }
  return "?";
}
