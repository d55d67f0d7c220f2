/* kernels/shape.c: numel, numpy broadcasting of shapes, and accumulate. */

#include <stdint.h>
#include <string.h>

#include "kernels.h"
#include "kernel_testing.h"
#include "suites.h"

/* numel is the product of the dims, 1 for 0-d and 0 with a zero dim. */
START_TEST(test_numel) {
  ttd_kshape s = kt_shp(0);
  ck_assert_int_eq(ttd_kshape_numel(&s), 1);
  s = kt_shp(1, 7);
  ck_assert_int_eq(ttd_kshape_numel(&s), 7);
  s = kt_shp(4, 2, 3, 4, 5);
  ck_assert_int_eq(ttd_kshape_numel(&s), 120);
  s = kt_shp(3, 2, 0, 5);
  ck_assert_int_eq(ttd_kshape_numel(&s), 0);
  s = kt_shp(8, 2, 2, 2, 2, 2, 2, 2, 3);
  ck_assert_int_eq(ttd_kshape_numel(&s), 384);
}
END_TEST

/* Broadcasting follows numpy; mismatches return -1 and clear the output; the output may alias an input. */
START_TEST(test_broadcast_shape) {
  struct {
    ttd_kshape a, b, want;
    int ok;
  } cases[] = {
      {kt_shp(0), kt_shp(0), kt_shp(0), 1},
      {kt_shp(1, 5), kt_shp(0), kt_shp(1, 5), 1},
      {kt_shp(0), kt_shp(2, 3, 4), kt_shp(2, 3, 4), 1},
      {kt_shp(3, 3, 1, 5), kt_shp(2, 4, 1), kt_shp(3, 3, 4, 5), 1},
      {kt_shp(2, 4, 1), kt_shp(3, 3, 1, 5), kt_shp(3, 3, 4, 5), 1},
      {kt_shp(2, 1, 3), kt_shp(2, 2, 1), kt_shp(2, 2, 3), 1},
      {kt_shp(2, 2, 3), kt_shp(1, 3), kt_shp(2, 2, 3), 1},
      {kt_shp(3, 2, 0, 3), kt_shp(1, 3), kt_shp(3, 2, 0, 3), 1},
      {kt_shp(2, 3, 1), kt_shp(1, 0), kt_shp(2, 3, 0), 1},
      {kt_shp(1, 3), kt_shp(1, 4), kt_shp(0), 0},
      {kt_shp(2, 2, 3), kt_shp(2, 3, 1), kt_shp(0), 0},
      {kt_shp(3, 2, 0, 3), kt_shp(2, 2, 3), kt_shp(0), 0},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
    ttd_kshape out = kt_shp(3, 9, 9, 9);
    int rc = ttd_broadcast_shape(&cases[i].a, &cases[i].b, &out);
    ck_assert_msg(rc == (cases[i].ok ? 0 : -1), "case %zu: rc %d", i, rc);
    ck_assert_msg(memcmp(&out, &cases[i].want, sizeof(out)) == 0, "case %zu: wrong shape (ndim %d)", i, out.ndim);
  }
  ttd_kshape a = kt_shp(2, 4, 1), b = kt_shp(3, 3, 1, 5), want = kt_shp(3, 3, 4, 5);
  ck_assert_int_eq(ttd_broadcast_shape(&a, &b, &a), 0);
  ck_assert_int_eq(memcmp(&a, &want, sizeof(a)), 0);
}
END_TEST

/* accumulate adds src into dst for odd and large sizes, and n = 0 touches nothing. */
START_TEST(test_accumulate) {
  static const int64_t sizes[] = {1, 7, 33, 1023, 100003};
  uint64_t st = 1;
  for (size_t s = 0; s < sizeof(sizes) / sizeof(*sizes); s++) {
    int64_t n = sizes[s];
    float *dst = kt_random_floats(&st, n, -5, 5), *src = kt_random_floats(&st, n, -5, 5);
    double *want = kt_dbuf(n);
    for (int64_t i = 0; i < n; i++) want[i] = (double)(dst[i] + src[i]);
    ttd_k_accumulate(kt_pool, dst, src, n);
    kt_expect_close("accumulate", dst, want, n, 0, 0);
  }
  float one = 1.0f, two = 2.0f;
  ttd_k_accumulate(kt_pool, &one, &two, 0);
  ck_assert(one == 1.0f);
}
END_TEST

Suite *kernels_shape_suite(void) {
  Suite *s = suite_create("kernels_shape");
  TCase *tc = tcase_create("shape");
  tcase_add_checked_fixture(tc, kt_setup, kt_teardown);
  tcase_add_test(tc, test_numel);
  tcase_add_test(tc, test_broadcast_shape);
  tcase_add_test(tc, test_accumulate);
  suite_add_tcase(s, tc);
  return s;
}
