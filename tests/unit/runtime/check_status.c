/* daemon/status.h: making, reading and freeing statuses, NULL as OK, TTD_RETURN_IF_ERROR,
 * canonical code names and long messages. */
#include <check.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "suites.h"

/* A status carries its code and the formatted message. */
START_TEST(test_make_code_message) {
  uint64_t h = 0xdeadbeef01ull;
  ttd_status_t s = ttd_make_status(GRPC_STATUS_NOT_FOUND, "tensor %" PRIx64 " not found (%d/%s)", h, 7, "x");
  ck_assert_ptr_nonnull(s);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_NOT_FOUND);
  ck_assert_str_eq(ttd_status_message(s), "tensor deadbeef01 not found (7/x)");
  ttd_status_free(s);
}
END_TEST

/* Every non-OK code is kept as given. */
START_TEST(test_every_code_kept) {
  for (int c = GRPC_STATUS_CANCELLED; c <= GRPC_STATUS_UNAUTHENTICATED; c++) {
    ttd_status_t s = ttd_make_status((ttd_code)c, "code %d", c);
    ck_assert_int_eq(ttd_status_code(s), c);
    char want[32];
    snprintf(want, sizeof(want), "code %d", c);
    ck_assert_str_eq(ttd_status_message(s), want);
    ttd_status_free(s);
  }
}
END_TEST

/* An empty format gives an empty message, and a literal percent sign survives. */
START_TEST(test_empty_and_percent) {
  ttd_status_t s = ttd_make_status(GRPC_STATUS_INTERNAL, "%s", "");
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_INTERNAL);
  ck_assert_str_eq(ttd_status_message(s), "");
  ttd_status_free(s);
  s = ttd_make_status(GRPC_STATUS_OUT_OF_RANGE, "100%% full");
  ck_assert_str_eq(ttd_status_message(s), "100% full");
  ttd_status_free(s);
}
END_TEST

/* A status made with OK by mistake still reads as an error, never as OK. */
START_TEST(test_make_with_ok_is_error) {
  ttd_status_t s = ttd_make_status(GRPC_STATUS_OK, "oops");
  ck_assert_ptr_nonnull(s);
  ck_assert_int_ne(ttd_status_code(s), GRPC_STATUS_OK);
  ck_assert_str_eq(ttd_status_message(s), "oops");
  ttd_status_free(s);
}
END_TEST

/* NULL is OK: code OK, message "", and freeing it is a no-op. */
START_TEST(test_null_is_ok) {
  ck_assert_ptr_null(TTD_OK);
  ck_assert_int_eq(ttd_status_code(TTD_OK), GRPC_STATUS_OK);
  ck_assert_ptr_nonnull(ttd_status_message(TTD_OK));
  ck_assert_str_eq(ttd_status_message(TTD_OK), "");
  ttd_status_free(NULL);
}
END_TEST

static int after_macro;

static ttd_status_t fail_with(ttd_code code) {
  return code == GRPC_STATUS_OK ? TTD_OK : ttd_make_status(code, "inner failure %d", (int)code);
}

static ttd_status_t outer(ttd_code inner_code) {
  TTD_RETURN_IF_ERROR(fail_with(inner_code));
  after_macro++;
  return TTD_OK;
}

static ttd_status_t outer_twice(ttd_code first, ttd_code second) {
  TTD_RETURN_IF_ERROR(fail_with(first));
  after_macro++;
  TTD_RETURN_IF_ERROR(fail_with(second));
  after_macro++;
  return TTD_OK;
}

/* TTD_RETURN_IF_ERROR returns the very status it got and skips the rest of the function. */
START_TEST(test_return_if_error_propagates) {
  after_macro = 0;
  ttd_status_t s = outer(GRPC_STATUS_ABORTED);
  ck_assert_ptr_nonnull(s);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_ABORTED);
  ck_assert_str_eq(ttd_status_message(s), "inner failure 10");
  ck_assert_int_eq(after_macro, 0);
  ttd_status_free(s);

  s = outer_twice(GRPC_STATUS_OK, GRPC_STATUS_DATA_LOSS);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_DATA_LOSS);
  ck_assert_int_eq(after_macro, 1);
  ttd_status_free(s);
}
END_TEST

/* TTD_RETURN_IF_ERROR lets OK through and the function goes on. */
START_TEST(test_return_if_error_ok_continues) {
  after_macro = 0;
  ck_assert_ptr_null(outer(GRPC_STATUS_OK));
  ck_assert_int_eq(after_macro, 1);
  ck_assert_ptr_null(outer_twice(GRPC_STATUS_OK, GRPC_STATUS_OK));
  ck_assert_int_eq(after_macro, 3);
}
END_TEST

static int evaluations;
static ttd_status_t counted(void) {
  evaluations++;
  return ttd_make_status(GRPC_STATUS_UNAVAILABLE, "counted");
}
static ttd_status_t call_counted(void) {
  TTD_RETURN_IF_ERROR(counted());
  return TTD_OK;
}
/* TTD_RETURN_IF_ERROR evaluates its expression exactly once. */
START_TEST(test_return_if_error_evaluates_once) {
  evaluations = 0;
  ttd_status_t s = call_counted();
  ck_assert_int_eq(evaluations, 1);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_UNAVAILABLE);
  ttd_status_free(s);
}
END_TEST

/* ttd_code_name gives the canonical name of all 17 codes. */
START_TEST(test_code_names) {
  static const char *const want[] = {
      "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
      "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
      "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
      "UNAUTHENTICATED"};
  for (int c = 0; c < 17; c++) ck_assert_str_eq(ttd_code_name((ttd_code)c), want[c]);
  ck_assert_str_eq(ttd_code_name(GRPC_STATUS_INVALID_ARGUMENT), "INVALID_ARGUMENT");
  ck_assert_str_eq(ttd_code_name(GRPC_STATUS_UNAUTHENTICATED), "UNAUTHENTICATED");
}
END_TEST

/* Codes out of range are named "UNKNOWN", negative ones included. */
START_TEST(test_code_name_out_of_range) {
  ck_assert_str_eq(ttd_code_name((ttd_code)17), "UNKNOWN");
  ck_assert_str_eq(ttd_code_name((ttd_code)1000), "UNKNOWN");
  ck_assert_str_eq(ttd_code_name((ttd_code)-1), "UNKNOWN");
}
END_TEST

/* A message longer than 4 KiB is kept whole, byte for byte. */
START_TEST(test_long_message_kept) {
  size_t n = 20000;
  char *big = malloc(n + 1);
  ck_assert_ptr_nonnull(big);
  for (size_t i = 0; i < n; i++) big[i] = (char)('a' + i % 26);
  big[n] = '\0';
  ttd_status_t s = ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "head:%s:tail", big);
  const char *m = ttd_status_message(s);
  ck_assert_uint_eq(strlen(m), n + 10);
  ck_assert_int_eq(strncmp(m, "head:", 5), 0);
  ck_assert_int_eq(memcmp(m + 5, big, n), 0);
  ck_assert_str_eq(m + 5 + n, ":tail");
  ttd_status_free(s);
  free(big);
}
END_TEST

/* A message of exactly 4096 and 4097 characters is kept whole (no off-by-one at a buffer size). */
START_TEST(test_message_at_4k_boundary) {
  for (size_t n = 4094; n <= 4098; n++) {
    char *text = malloc(n + 1);
    memset(text, 'z', n);
    text[n] = '\0';
    ttd_status_t s = ttd_make_status(GRPC_STATUS_INTERNAL, "%s", text);
    ck_assert_uint_eq(strlen(ttd_status_message(s)), n);
    ck_assert_str_eq(ttd_status_message(s), text);
    ttd_status_free(s);
    free(text);
  }
}
END_TEST

/* Two statuses are independent: freeing one leaves the other's message intact. */
START_TEST(test_statuses_independent) {
  ttd_status_t a = ttd_make_status(GRPC_STATUS_NOT_FOUND, "first %d", 1);
  ttd_status_t b = ttd_make_status(GRPC_STATUS_ABORTED, "second %d", 2);
  ck_assert_ptr_ne(a, b);
  ttd_status_free(a);
  ck_assert_int_eq(ttd_status_code(b), GRPC_STATUS_ABORTED);
  ck_assert_str_eq(ttd_status_message(b), "second 2");
  ttd_status_free(b);
}
END_TEST

Suite *status_suite(void) {
  Suite *s = suite_create("status");
  TCase *tc = tcase_create("status");
  tcase_add_test(tc, test_make_code_message);
  tcase_add_test(tc, test_every_code_kept);
  tcase_add_test(tc, test_empty_and_percent);
  tcase_add_test(tc, test_make_with_ok_is_error);
  tcase_add_test(tc, test_null_is_ok);
  tcase_add_test(tc, test_long_message_kept);
  tcase_add_test(tc, test_message_at_4k_boundary);
  tcase_add_test(tc, test_statuses_independent);
  suite_add_tcase(s, tc);

  tc = tcase_create("propagation");
  tcase_add_test(tc, test_return_if_error_propagates);
  tcase_add_test(tc, test_return_if_error_ok_continues);
  tcase_add_test(tc, test_return_if_error_evaluates_once);
  suite_add_tcase(s, tc);

  tc = tcase_create("code_names");
  tcase_add_test(tc, test_code_names);
  tcase_add_test(tc, test_code_name_out_of_range);
  suite_add_tcase(s, tc);
  return s;
}
