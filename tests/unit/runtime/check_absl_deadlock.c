/* daemon/absl_deadlock.c: the Abseil that gRPC loaded here (Debian 12's) exports the switch
 * under the name we look up, and TTD_ABSL_DEADLOCK_DETECTION=1 keeps detection on. */
#include <check.h>
#include <stdlib.h>

#include "base/absl_deadlock.h"
#include "suites.h"

START_TEST(test_switch_found_and_applied) {
  unsetenv("TTD_ABSL_DEADLOCK_DETECTION");
  ck_assert_int_eq(ttd_absl_deadlock_detection_off(), 1);
  ck_assert_int_eq(ttd_absl_deadlock_detection_off(), 1); /* again: the same setting */
}
END_TEST

START_TEST(test_variable_keeps_detection) {
  setenv("TTD_ABSL_DEADLOCK_DETECTION", "1", 1);
  ck_assert_int_eq(ttd_absl_deadlock_detection_off(), 0);
  setenv("TTD_ABSL_DEADLOCK_DETECTION", "0", 1); /* any other value: off as usual */
  ck_assert_int_eq(ttd_absl_deadlock_detection_off(), 1);
  unsetenv("TTD_ABSL_DEADLOCK_DETECTION");
}
END_TEST

Suite *absl_deadlock_suite(void) {
  Suite *s = suite_create("absl_deadlock");
  TCase *tc = tcase_create("switch");
  tcase_add_test(tc, test_switch_found_and_applied);
  tcase_add_test(tc, test_variable_keeps_detection);
  suite_add_tcase(s, tc);
  return s;
}
