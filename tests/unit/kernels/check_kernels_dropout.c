/* kernels/dropout.c: masks drawn from (seed, step) (the same across pools, a new one per
 * step), the kept fraction and scale, the backward's mask, and p = 0 as the identity. */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "kernel_testing.h"
#include "suites.h"

static float *ones(int64_t n) {
  float *x = malloc((size_t)n * sizeof(float));
  ck_assert_ptr_nonnull(x);
  for (int64_t i = 0; i < n; i++) x[i] = 1.0f;
  return x;
}

/* Independent masks at p = 0.5 disagree on about half of n elements (3 sigma = 1.5 sqrt(n)). */
static void assert_independent(const float *y1, const float *y2, int64_t n, const char *what) {
  int64_t differ = 0;
  for (int64_t i = 0; i < n; i++) differ += (y1[i] == 0.0f) != (y2[i] == 0.0f);
  double sigma3 = 1.5 * sqrt((double)n);
  ck_assert_msg(fabs((double)differ - (double)n / 2) <= sigma3, "masks of %s differ at %lld of %lld", what,
                (long long)differ, (long long)n);
}

/* The same (seed, step) gives the same mask (also across pools); another seed, or another
 * step of the same seed, an independent one. */
START_TEST(test_dropout_seeds_and_steps) {
  const int64_t n = 100000;
  float *x = ones(n), *y1 = kt_nan_buf(n), *y2 = kt_nan_buf(n), *y3 = kt_nan_buf(n);
  ttd_pool *pool = ttd_pool_create(4);
  ck_assert_ptr_nonnull(pool);
  ttd_k_dropout(NULL, x, n, 0.5f, 42, 5, y1);
  ttd_k_dropout(pool, x, n, 0.5f, 42, 5, y2);
  ck_assert(memcmp(y1, y2, (size_t)n * sizeof(float)) == 0);
  ttd_k_dropout(NULL, x, n, 0.5f, 43, 5, y3);
  assert_independent(y1, y3, n, "seeds 42 and 43 at step 5");
  const uint64_t steps[] = {0, 4, 6, 1ull << 40};
  for (size_t k = 0; k < sizeof(steps) / sizeof(steps[0]); k++) {
    ttd_k_dropout(pool, x, n, 0.5f, 42, steps[k], y3);
    assert_independent(y1, y3, n, "steps 5 and another of seed 42");
  }
  /* consecutive steps of one seed: each pair independent */
  for (uint64_t step = 0; step < 8; step++) {
    ttd_k_dropout(pool, x, n, 0.5f, 7, step, y2);
    ttd_k_dropout(pool, x, n, 0.5f, 7, step + 1, y3);
    assert_independent(y2, y3, n, "consecutive steps of seed 7");
  }
  ttd_pool_destroy(pool);
  free(x), free(y1), free(y2), free(y3);
}
END_TEST

/* Over 1e5 elements the kept fraction is within 3 sigma of 1 - p at every step; kept values
 * are x / (1 - p). */
START_TEST(test_dropout_keep_fraction) {
  const int64_t n = 100000;
  const float ps[] = {0.1f, 0.3f, 0.5f, 0.9f};
  uint64_t rng = 19;
  float *x = kt_rand_buf(&rng, n, 0.5f, 1.5f), *y = kt_nan_buf(n);
  for (size_t t = 0; t < 4 * 3; t++) {
    float p = ps[t % 4];
    ttd_k_dropout(NULL, x, n, p, 1000 + t % 4, t / 4, y);
    int64_t kept = 0;
    for (int64_t i = 0; i < n; i++) {
      if (y[i] == 0.0f) continue;
      kept++;
      KT_CHECK_EACH(fabsf(y[i] - x[i] / (1.0f - p)) <= 1e-6f * fabsf(y[i]), "y[%lld] = %g for x = %g, p = %g",
                 (long long)i, (double)y[i], (double)x[i], (double)p);
    }
    double expect = (double)n * (1.0 - p), sigma = sqrt((double)n * p * (1.0 - p));
    ck_assert_msg(fabs((double)kept - expect) <= 3.0 * sigma, "p = %g: kept %lld, expected %.0f +- %.0f", (double)p,
                  (long long)kept, expect, 3.0 * sigma);
  }
  free(x), free(y);
}
END_TEST

/* The backward given the forward's (seed, step) drops exactly the forward's elements and
 * scales the rest the same way. */
START_TEST(test_dropout_backward_mask) {
  const int64_t n = 4099;
  uint64_t rng = 20;
  float *x = kt_rand_buf(&rng, n, -1, 1), *dy = kt_rand_buf(&rng, n, -1, 1), *y = kt_nan_buf(n), *dx = kt_nan_buf(n);
  ttd_k_dropout(NULL, x, n, 0.37f, 7, 3, y);
  ttd_k_dropout(NULL, x, n, 0.37f, 7, 4, dx); /* the next step in between changes nothing */
  ttd_k_dropout_backward(NULL, dy, n, 0.37f, 7, 3, dx);
  int64_t dropped = 0;
  for (int64_t i = 0; i < n; i++) {
    int kept = y[i] != 0.0f;
    dropped += !kept;
    double want = kept ? dy[i] / (1.0 - 0.37f) : 0.0;
    KT_CHECK_EACH(fabs(dx[i] - want) <= 1e-6 * fabs(want) && (dx[i] == 0.0f) == !kept, "dx[%lld] = %g, y = %g, dy = %g",
               (long long)i, (double)dx[i], (double)y[i], (double)dy[i]);
  }
  ck_assert_int_gt(dropped, 0);
  free(x), free(dy), free(y), free(dx);
}
END_TEST

/* p = 0 is the identity bit for bit (negative zero, infinity, NaN), forward and backward. */
START_TEST(test_dropout_p_zero) {
  const int64_t n = 1000;
  uint64_t rng = 21;
  float *x = kt_rand_buf(&rng, n, -5, 5), *y = kt_nan_buf(n), *dx = kt_nan_buf(n);
  x[0] = -0.0f;
  x[1] = INFINITY;
  x[2] = NAN;
  ttd_k_dropout(NULL, x, n, 0.0f, 99, 12, y);
  ttd_k_dropout_backward(NULL, x, n, 0.0f, 99, 12, dx);
  ck_assert(memcmp(x, y, (size_t)n * sizeof(float)) == 0);
  ck_assert(memcmp(x, dx, (size_t)n * sizeof(float)) == 0);
  free(x), free(y), free(dx);
}
END_TEST

Suite *kernels_dropout_suite(void) {
  Suite *s = suite_create("kernels_dropout");
  TCase *tc = tcase_create("dropout");
  tcase_add_test(tc, test_dropout_seeds_and_steps);
  tcase_add_test(tc, test_dropout_keep_fraction);
  tcase_add_test(tc, test_dropout_backward_mask);
  tcase_add_test(tc, test_dropout_p_zero);
  suite_add_tcase(s, tc);
  return s;
}
