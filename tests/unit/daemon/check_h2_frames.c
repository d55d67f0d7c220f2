/* The HTTP/2 frame reader of the read guard and the TLS relay (rpc/h2_frames.h): the client
 * preface, frame headers split at every byte boundary, frame lengths left to gRPC, the streams
 * allowed before a SETTINGS acknowledgement, the RST_STREAM bucket, and how many bytes may go
 * on when the verdict turns. */
#include <check.h>
#include <string.h>

#include "rpc/h2_frames.h"
#include "suites.h"

static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

static size_t frame(uint8_t *out, uint32_t len, int type, uint32_t stream) {
  out[0] = (uint8_t)(len >> 16), out[1] = (uint8_t)(len >> 8), out[2] = (uint8_t)len;
  out[3] = (uint8_t)type, out[4] = 0;
  out[5] = (uint8_t)(stream >> 24), out[6] = (uint8_t)(stream >> 16), out[7] = (uint8_t)(stream >> 8);
  out[8] = (uint8_t)stream;
  memset(out + 9, 0xab, len);
  return 9 + len;
}

/* The preface, SETTINGS, a HEADERS, DATA of 300 bytes, an RST_STREAM, a PING: 5 frames. */
static size_t stream_of_frames(uint8_t *out) {
  size_t n = 0;
  memcpy(out, preface, 24);
  n = 24;
  n += frame(out + n, 0, 4, 0);
  n += frame(out + n, 20, 1, 1);
  n += frame(out + n, 300, 0, 1);
  n += frame(out + n, 4, 3, 1);
  n += frame(out + n, 8, 6, 0);
  return n;
}

/* Fed whole, and fed in two pieces split at every byte: the same 5 frames, 1 reset, PASS. */
START_TEST(test_split_at_every_byte) {
  uint8_t buf[1024];
  size_t n = stream_of_frames(buf);
  for (size_t cut = 0; cut <= n; cut++) {
    ttd_h2_frames f;
    ttd_h2_frames_init(&f, 200, 1, 0);
    ck_assert_int_eq(ttd_h2_frames_feed(&f, buf, cut, 0), TTD_H2_PASS);
    ck_assert_int_eq(ttd_h2_frames_feed(&f, buf + cut, n - cut, 0), TTD_H2_PASS);
    ck_assert_uint_eq(f.frames, 5);
    ck_assert_uint_eq(f.resets, 1);
    ck_assert_uint_eq(f.payload_left, 0);
    ck_assert_uint_eq(f.head_len, 0);
  }
  ttd_h2_frames f; /* one byte at a time */
  ttd_h2_frames_init(&f, 200, 1, 0);
  for (size_t i = 0; i < n; i++) ck_assert_int_eq(ttd_h2_frames_feed(&f, buf + i, 1, 0), TTD_H2_PASS);
  ck_assert_uint_eq(f.frames, 5);
  ck_assert_int_eq(ttd_h2_frames_feed(&f, NULL, 0, 0), TTD_H2_PASS);
}
END_TEST

/* Anything but the preface is refused at its first wrong byte, even one byte in; a parser
 * told the preface was checked starts at a frame. */
START_TEST(test_preface) {
  ttd_h2_frames f;
  ttd_h2_frames_init(&f, 200, 1, 0);
  ck_assert_int_eq(ttd_h2_frames_feed(&f, (const uint8_t *)"PRI * HTTP/2", 12, 0), TTD_H2_PASS);
  ck_assert_int_eq(ttd_h2_frames_feed(&f, (const uint8_t *)".1\r\n", 4, 0), TTD_H2_BAD_PREFACE);
  ck_assert_int_eq(ttd_h2_frames_feed(&f, (const uint8_t *)preface, 24, 0), TTD_H2_BAD_PREFACE); /* sticky */
  ttd_h2_frames_init(&f, 200, 1, 0);
  ck_assert_int_eq(ttd_h2_frames_feed(&f, (const uint8_t *)"GET / HTTP/1.1\r\n", 16, 0), TTD_H2_BAD_PREFACE);
  uint8_t buf[16];
  ttd_h2_frames_init(&f, 200, 0, 0);
  ck_assert_int_eq(ttd_h2_frames_feed(&f, buf, frame(buf, 4, 3, 1), 0), TTD_H2_PASS);
  ck_assert_uint_eq(f.resets, 1);
  ck_assert_str_eq(ttd_h2_verdict_text(TTD_H2_BAD_PREFACE), "not the HTTP/2 client preface");
}
END_TEST

/* Frame lengths are gRPC's to check, since it raises SETTINGS_MAX_FRAME_SIZE at run time:
 * DATA of 4 MiB, and of the 16 MiB - 1 the length field holds at most, pass, their payload
 * skipped whole. */
START_TEST(test_large_frames_pass) {
  static const uint32_t lengths[] = {4194303, 4194304, 5164508, 0xffffff};
  uint8_t head[9];
  for (size_t i = 0; i < sizeof(lengths) / sizeof(lengths[0]); i++) {
    ttd_h2_frames f;
    ttd_h2_frames_init(&f, 200, 0, 0);
    frame(head, 0, 0, 1);
    head[0] = (uint8_t)(lengths[i] >> 16), head[1] = (uint8_t)(lengths[i] >> 8), head[2] = (uint8_t)lengths[i];
    ck_assert_int_eq(ttd_h2_frames_feed(&f, head, 9, 0), TTD_H2_PASS);
    ck_assert_uint_eq(f.payload_left, lengths[i]);
  }
}
END_TEST

/* HEADERS opening n streams (odd ids from 1), after a SETTINGS acknowledgement when acked;
 * the server has written (its SETTINGS out) before that acknowledgement when spoke. */
static ttd_h2_verdict open_streams(ttd_h2_frames *f, int n, int acked, int spoke) {
  uint8_t buf[16];
  ttd_h2_frames_init(f, 200, 0, 0);
  if (spoke) ttd_h2_frames_server_spoke(f);
  if (acked) {
    frame(buf, 0, 4, 0);
    buf[4] = 1; /* ACK */
    ttd_h2_frames_feed(f, buf, 9, 0);
  }
  ttd_h2_verdict v = TTD_H2_PASS;
  for (int i = 0; i < n && v == TTD_H2_PASS; i++)
    v = ttd_h2_frames_feed(f, buf, frame(buf, 4, 1, 2u * (uint32_t)i + 1), 0);
  return v;
}

/* Before the client acknowledges the server's SETTINGS (gRPC then holds it to no stream
 * bound), 1024 new streams pass and the 1025th is refused; HEADERS on a stream already open
 * (trailers) and SETTINGS that are not an acknowledgement open nothing; an acknowledgement
 * sent before the server wrote its SETTINGS acknowledges nothing; once acknowledged, the
 * streams are gRPC's to bound. */
START_TEST(test_streams_before_settings_ack) {
  ttd_h2_frames f;
  ck_assert_int_eq(open_streams(&f, TTD_H2_STREAMS_BEFORE_ACK, 0, 1), TTD_H2_PASS);
  uint8_t buf[16];
  ck_assert_int_eq(ttd_h2_frames_feed(&f, buf, frame(buf, 4, 1, 1), 0), TTD_H2_PASS); /* stream 1 again */
  ck_assert_int_eq(ttd_h2_frames_feed(&f, buf, frame(buf, 6, 4, 0), 0), TTD_H2_PASS); /* SETTINGS, no ACK */
  ck_assert_uint_eq(f.streams_unacked, TTD_H2_STREAMS_BEFORE_ACK);
  ck_assert_int_eq(ttd_h2_frames_feed(&f, buf, frame(buf, 4, 1, 2u * TTD_H2_STREAMS_BEFORE_ACK + 1), 0),
                   TTD_H2_STREAM_FLOOD);
  ck_assert_int_eq(open_streams(&f, 20000, 1, 0), TTD_H2_STREAM_FLOOD); /* acknowledged too early */
  ck_assert_uint_eq(f.streams_unacked, TTD_H2_STREAMS_BEFORE_ACK + 1);
  ck_assert_int_eq(open_streams(&f, 20000, 1, 1), TTD_H2_PASS);
  ck_assert_uint_eq(f.streams_unacked, 0);
  ck_assert_str_eq(ttd_h2_verdict_text(TTD_H2_STREAM_FLOOD),
                   "HTTP/2 stream flood: the client opened more streams than the server allows without acknowledging "
                   "its SETTINGS");
}
END_TEST

/* The bucket: 200 resets at once pass, the 201st does not; a second later 200 more pass
 * (not 400: the bucket is 200 deep); half a second refills 100. */
START_TEST(test_reset_bucket) {
  uint8_t rst[13];
  frame(rst, 4, 3, 1);
  ttd_h2_frames f;
  ttd_h2_frames_init(&f, 200, 0, 1000);
  for (int i = 0; i < 200; i++) ck_assert_int_eq(ttd_h2_frames_feed(&f, rst, sizeof(rst), 1000), TTD_H2_PASS);
  ck_assert_int_eq(ttd_h2_frames_feed(&f, rst, sizeof(rst), 1000), TTD_H2_RESET_FLOOD);
  ck_assert_uint_eq(f.resets, 201);

  ttd_h2_frames_init(&f, 200, 0, 0);
  for (int i = 0; i < 200; i++) ck_assert_int_eq(ttd_h2_frames_feed(&f, rst, sizeof(rst), 0), TTD_H2_PASS);
  for (int i = 0; i < 200; i++) ck_assert_int_eq(ttd_h2_frames_feed(&f, rst, sizeof(rst), 5000), TTD_H2_PASS);
  ck_assert_int_eq(ttd_h2_frames_feed(&f, rst, sizeof(rst), 5000), TTD_H2_RESET_FLOOD);

  ttd_h2_frames_init(&f, 200, 0, 0);
  for (int i = 0; i < 200; i++) ck_assert_int_eq(ttd_h2_frames_feed(&f, rst, sizeof(rst), 0), TTD_H2_PASS);
  for (int i = 0; i < 100; i++) ck_assert_int_eq(ttd_h2_frames_feed(&f, rst, sizeof(rst), 500), TTD_H2_PASS);
  ck_assert_int_eq(ttd_h2_frames_feed(&f, rst, sizeof(rst), 500), TTD_H2_RESET_FLOOD);

  /* A steady 100 a second, for a minute, never trips it; other frames never count. */
  ttd_h2_frames_init(&f, 200, 0, 0);
  uint8_t ping[17];
  frame(ping, 8, 6, 0);
  for (int ms = 0; ms < 60000; ms += 10) {
    ck_assert_int_eq(ttd_h2_frames_feed(&f, rst, sizeof(rst), ms), TTD_H2_PASS);
    for (int k = 0; k < 50; k++) ck_assert_int_eq(ttd_h2_frames_feed(&f, ping, sizeof(ping), ms), TTD_H2_PASS);
  }
}
END_TEST

/* The bytes that may go on stop at the first byte of the reset past the bucket, whether its
 * header comes whole, split after its third byte within one chunk, or split across two
 * chunks (then the chunk holding its end passes nothing more). */
START_TEST(test_good_stops_at_offending_frame) {
  uint8_t buf[24 + 9 + 4 * 13];
  size_t n = 24;
  memcpy(buf, preface, 24);
  n += frame(buf + n, 0, 4, 0);
  size_t resets_at = n;
  for (int i = 0; i < 4; i++) n += frame(buf + n, 4, 3, (uint32_t)(2 * i + 1));
  size_t third = resets_at + 2 * 13; /* the third reset, one past a bucket of 2 */
  ttd_h2_frames f;
  ttd_h2_frames_init(&f, 2, 1, 0);
  ck_assert_int_eq(ttd_h2_frames_feed(&f, buf, n, 0), TTD_H2_RESET_FLOOD);
  ck_assert_uint_eq(f.good, third);
  ck_assert_uint_eq(f.resets, 3);
  for (size_t cut = third + 1; cut < third + 9; cut++) {
    ttd_h2_frames_init(&f, 2, 1, 0);
    ck_assert_int_eq(ttd_h2_frames_feed(&f, buf, cut, 0), TTD_H2_PASS);
    ck_assert_uint_eq(f.good, cut); /* part of a header is no frame yet */
    ck_assert_int_eq(ttd_h2_frames_feed(&f, buf + cut, n - cut, 0), TTD_H2_RESET_FLOOD);
    ck_assert_uint_eq(f.good, cut);
    ck_assert_int_eq(ttd_h2_frames_feed(&f, buf, n, 0), TTD_H2_RESET_FLOOD); /* sticky */
    ck_assert_uint_eq(f.good, cut);
  }
  ttd_h2_frames_init(&f, 2, 1, 0);
  ck_assert_int_eq(ttd_h2_frames_feed(&f, (const uint8_t *)"GET / HTTP/1.1\r\n", 16, 0), TTD_H2_BAD_PREFACE);
  ck_assert_uint_eq(f.good, 0);
}
END_TEST

Suite *h2_frames_suite(void) {
  Suite *s = suite_create("h2_frames");
  TCase *tc = tcase_create("h2_frames");
  tcase_add_test(tc, test_split_at_every_byte);
  tcase_add_test(tc, test_preface);
  tcase_add_test(tc, test_large_frames_pass);
  tcase_add_test(tc, test_streams_before_settings_ack);
  tcase_add_test(tc, test_reset_bucket);
  tcase_add_test(tc, test_good_stops_at_offending_frame);
  suite_add_tcase(s, tc);
  return s;
}
