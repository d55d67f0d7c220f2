/* client/tensor/tensor.h: device strings parsed by tt_place_parse and written by
 * tt_place_format. */
#include <check.h>
#include <string.h>

#include "tensor/tensor.h"
#include "suites.h"

static const struct {
  const char *text;
  int is_host, device, l1;
  const char *canonical;
} good[] = {
    {"cpu", 1, 0, 0, "cpu"},
    {"tt", 0, 0, 0, "tt:0"},
    {"tt:0", 0, 0, 0, "tt:0"},
    {"tt:3", 0, 3, 0, "tt:3"},
    {"tt:1/l1", 0, 1, 1, "tt:1/l1"},
    {"tt:1/dram", 0, 1, 0, "tt:1"},
    {"tt/l1", 0, 0, 1, "tt:0/l1"},
    {"tt/dram", 0, 0, 0, "tt:0"},
    {"tt:12/l1", 0, 12, 1, "tt:12/l1"},
    {"tt:1023", 0, 1023, 0, "tt:1023"},
};

static const char *const bad[] = {
    "",      "gpu",     "tt:",   "tt:x",      "tt:1/l2", "tt:-1",   "TT",     "CPU",   "cpu:0",
    "tt:1/", "tt:1/L1", "tt:1 ", " tt:1",     "tt:+1",   "tt:1x",   "tt1",    "ttt",   "tt:/l1",
    "tt/",   "tt:1/l1x", "tt:1//l1", "tt:99999999999999999999", "tt:1/dram/l1", "cpux",
};

/* Every accepted spelling parses to the right host flag, device and location. */
START_TEST(test_parse_good) {
  tt_place p;
  memset(&p, 0x7F, sizeof(p));
  ck_assert_msg(tt_place_parse(good[_i].text, &p) == 0, "'%s' refused", good[_i].text);
  ck_assert_int_eq(p.is_host, good[_i].is_host);
  ck_assert_int_eq(p.device, good[_i].device);
  ck_assert_int_eq(p.l1, good[_i].l1);
}
END_TEST

/* Malformed spellings, wrong case, other devices and NULL are refused with -1. */
START_TEST(test_parse_bad) {
  tt_place p;
  ck_assert_msg(tt_place_parse(bad[_i], &p) == -1, "'%s' accepted", bad[_i]);
}
END_TEST

/* NULL text is refused and the output is cleared. */
START_TEST(test_parse_null) {
  tt_place p;
  memset(&p, 0x7F, sizeof(p));
  ck_assert_int_eq(tt_place_parse(NULL, &p), -1);
  ck_assert_int_eq(p.is_host, 0);
  ck_assert_int_eq(p.device, 0);
  ck_assert_int_eq(p.l1, 0);
}
END_TEST

/* format writes "cpu", "tt:N" or "tt:N/l1", and parse(format(p)) gives p back. */
START_TEST(test_format_roundtrip) {
  tt_place p, back;
  char buf[32];
  ck_assert_int_eq(tt_place_parse(good[_i].text, &p), 0);
  tt_place_format(&p, buf, sizeof(buf));
  ck_assert_str_eq(buf, good[_i].canonical);
  ck_assert_int_eq(tt_place_parse(buf, &back), 0);
  ck_assert_int_eq(back.is_host, p.is_host);
  ck_assert_int_eq(back.device, p.device);
  ck_assert_int_eq(back.l1, p.l1);
}
END_TEST

/* format of hand-built places, and a short buffer is truncated but terminated. */
START_TEST(test_format_direct) {
  char buf[32];
  tt_place host = {.is_host = 1, .device = 5, .l1 = 1};
  tt_place_format(&host, buf, sizeof(buf));
  ck_assert_str_eq(buf, "cpu");
  tt_place dev = {.is_host = 0, .device = 7, .l1 = 0};
  tt_place_format(&dev, buf, sizeof(buf));
  ck_assert_str_eq(buf, "tt:7");
  dev.l1 = 1;
  tt_place_format(&dev, buf, sizeof(buf));
  ck_assert_str_eq(buf, "tt:7/l1");
  char small[5];
  memset(small, 'X', sizeof(small));
  tt_place_format(&dev, small, sizeof(small));
  ck_assert_str_eq(small, "tt:7");
}
END_TEST

Suite *place_suite(void) {
  Suite *s = suite_create("place");
  TCase *tc = tcase_create("place");
  tcase_add_loop_test(tc, test_parse_good, 0, (int)(sizeof(good) / sizeof(good[0])));
  tcase_add_loop_test(tc, test_parse_bad, 0, (int)(sizeof(bad) / sizeof(bad[0])));
  tcase_add_test(tc, test_parse_null);
  tcase_add_loop_test(tc, test_format_roundtrip, 0, (int)(sizeof(good) / sizeof(good[0])));
  tcase_add_test(tc, test_format_direct);
  suite_add_tcase(s, tc);
  return s;
}
