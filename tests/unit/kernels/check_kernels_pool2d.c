/* kernels/pool2d.c: max and average pool2d and their parameters. Forwards are checked
 * against direct double-precision references on random inputs, backwards against central
 * finite differences of sum(dy * f(x)) taken through the float forward itself. */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "kernel_testing.h"
#include "suites.h"

static ttd_pool2d_params pool_params(int64_t n, int64_t c, int64_t h, int64_t w, int64_t kh, int64_t kw, int64_t sh,
                                     int64_t sw, int64_t ph, int64_t pw) {
  ttd_pool2d_params p = {
      .n = n, .c = c, .h = h, .w = w, .kh = kh, .kw = kw, .stride_h = sh, .stride_w = sw, .pad_h = ph, .pad_w = pw};
  ck_assert_int_eq(ttd_pool2d_params_finish(&p), 0);
  return p;
}

/* Distinct values at least `gap` apart (a shuffled ramp), shifted by `base`: no ties. */
static float *distinct_buf(uint64_t *rng, int64_t n, float gap, float base) {
  float *x = malloc((size_t)n * sizeof(float));
  ck_assert_ptr_nonnull(x);
  for (int64_t i = 0; i < n; i++) x[i] = base + gap * (float)i;
  for (int64_t i = n - 1; i > 0; i--) {
    int64_t j = (int64_t)(kt_next_random(rng) % (uint64_t)(i + 1));
    float t = x[i];
    x[i] = x[j];
    x[j] = t;
  }
  return x;
}

/* The reference max over the valid cells of each window and the plane index of it. */
static void ref_max_pool(const ttd_pool2d_params *p, const float *x, double *y, int32_t *am) {
  for (int64_t pl = 0; pl < p->n * p->c; pl++)
    for (int64_t oi = 0; oi < p->out_h; oi++)
      for (int64_t oj = 0; oj < p->out_w; oj++) {
        double best = -INFINITY;
        int32_t arg = -1;
        for (int64_t ki = 0; ki < p->kh; ki++)
          for (int64_t kj = 0; kj < p->kw; kj++) {
            int64_t ii = oi * p->stride_h - p->pad_h + ki, jj = oj * p->stride_w - p->pad_w + kj;
            if (ii < 0 || ii >= p->h || jj < 0 || jj >= p->w) continue;
            double v = x[pl * p->h * p->w + ii * p->w + jj];
            if (v > best) best = v, arg = (int32_t)(ii * p->w + jj);
          }
        y[(pl * p->out_h + oi) * p->out_w + oj] = best;
        am[(pl * p->out_h + oi) * p->out_w + oj] = arg;
      }
}

/* Padded non-square max pooling: y, argmax match (NULL argmax ok); padding never wins over negatives. */
START_TEST(test_max_pool_forward) {
  ttd_pool2d_params cases[] = {pool_params(2, 3, 7, 6, 3, 2, 2, 1, 1, 1), pool_params(1, 2, 5, 8, 2, 4, 2, 3, 1, 2),
                               pool_params(1, 1, 4, 4, 2, 2, 2, 2, 0, 0)};
  uint64_t rng = 11;
  for (size_t i = 0; i < 3; i++)
    for (int negative = 0; negative < 2; negative++) {
      const ttd_pool2d_params *p = &cases[i];
      int64_t nx = p->n * p->c * p->h * p->w, ny = p->n * p->c * p->out_h * p->out_w;
      float *x = distinct_buf(&rng, nx, 0.01f, negative ? -10.0f : -0.3f);
      float *y = kt_nan_buf(ny);
      int32_t *am = malloc((size_t)ny * sizeof(int32_t)), *want_am = malloc((size_t)ny * sizeof(int32_t));
      double *want = kt_dzeros(ny);
      ttd_k_max_pool2d(NULL, p, x, y, am);
      ref_max_pool(p, x, want, want_am);
      kt_expect_close("y", y, want, ny, 0, 0);
      float *y2 = kt_nan_buf(ny); /* without argmax, the same y */
      ttd_k_max_pool2d(NULL, p, x, y2, NULL);
      ck_assert(memcmp(y, y2, (size_t)ny * sizeof(float)) == 0);
      free(y2);
      for (int64_t o = 0; o < ny; o++) {
        KT_CHECK_EACH(am[o] == want_am[o], "argmax[%lld] = %d, want %d", (long long)o, am[o], want_am[o]);
        KT_CHECK_EACH(!negative || y[o] < 0.0f, "padding won: y[%lld] = %g", (long long)o, (double)y[o]);
      }
      free(x), free(y), free(am), free(want_am), free(want);
    }
}
END_TEST

typedef struct pool_ctx {
  const ttd_pool2d_params *p;
  const float *x;
  int32_t *argmax;
} pool_ctx;

static void max_pool_forward(void *ctx, float *y) {
  pool_ctx *c = ctx;
  ttd_k_max_pool2d(NULL, c->p, c->x, y, c->argmax);
}

static void avg_pool_forward(void *ctx, float *y) {
  pool_ctx *c = ctx;
  ttd_k_avg_pool2d(NULL, c->p, c->x, y);
}

/* Max-pool dx (overlapping windows) matches finite differences on tie-free, widely spaced inputs. */
START_TEST(test_max_pool_backward_fd) {
  ttd_pool2d_params p = pool_params(2, 2, 5, 6, 3, 2, 1, 2, 1, 1);
  int64_t nx = p.n * p.c * p.h * p.w, ny = p.n * p.c * p.out_h * p.out_w;
  uint64_t rng = 12;
  float *x = distinct_buf(&rng, nx, 0.05f, -2.0f), *dy = kt_rand_buf(&rng, ny, -1, 1), *y = kt_nan_buf(ny),
        *dx = kt_nan_buf(nx);
  int32_t *am = malloc((size_t)ny * sizeof(int32_t));
  ttd_k_max_pool2d(NULL, &p, x, y, am);
  ttd_k_max_pool2d_backward(NULL, &p, am, dy, dx);
  pool_ctx c = {.p = &p, .x = x, .argmax = malloc((size_t)ny * sizeof(int32_t))};
  kt_check_grad("dx", &c, max_pool_forward, ny, dy, x, nx, dx, 1e-2f);
  free(x), free(dy), free(y), free(dx), free(am), free(c.argmax);
}
END_TEST

/* Average pooling with padding divides by the full window (count_include_pad). */
START_TEST(test_avg_pool_forward) {
  ttd_pool2d_params cases[] = {pool_params(2, 3, 7, 6, 3, 2, 2, 1, 1, 1), pool_params(1, 2, 5, 8, 2, 4, 2, 3, 1, 2)};
  uint64_t rng = 13;
  for (size_t i = 0; i < 2; i++) {
    const ttd_pool2d_params *p = &cases[i];
    int64_t nx = p->n * p->c * p->h * p->w, ny = p->n * p->c * p->out_h * p->out_w;
    float *x = kt_rand_buf(&rng, nx, -1, 1), *y = kt_nan_buf(ny);
    double *want = kt_dzeros(ny);
    ttd_k_avg_pool2d(NULL, p, x, y);
    for (int64_t pl = 0; pl < p->n * p->c; pl++)
      for (int64_t oi = 0; oi < p->out_h; oi++)
        for (int64_t oj = 0; oj < p->out_w; oj++) {
          double s = 0.0;
          for (int64_t ki = 0; ki < p->kh; ki++)
            for (int64_t kj = 0; kj < p->kw; kj++) {
              int64_t ii = oi * p->stride_h - p->pad_h + ki, jj = oj * p->stride_w - p->pad_w + kj;
              if (ii >= 0 && ii < p->h && jj >= 0 && jj < p->w) s += x[pl * p->h * p->w + ii * p->w + jj];
            }
          want[(pl * p->out_h + oi) * p->out_w + oj] = s / (double)(p->kh * p->kw);
        }
    kt_expect_close("y", y, want, ny, 1e-5, 1e-6);
    free(x), free(y), free(want);
  }
}
END_TEST

/* Average-pool dx against finite differences. */
START_TEST(test_avg_pool_backward_fd) {
  ttd_pool2d_params p = pool_params(2, 2, 5, 6, 3, 2, 1, 2, 1, 1);
  int64_t nx = p.n * p.c * p.h * p.w, ny = p.n * p.c * p.out_h * p.out_w;
  uint64_t rng = 14;
  float *x = kt_rand_buf(&rng, nx, -1, 1), *dy = kt_rand_buf(&rng, ny, -1, 1), *dx = kt_nan_buf(nx);
  ttd_k_avg_pool2d_backward(NULL, &p, dy, dx);
  pool_ctx c = {.p = &p, .x = x};
  kt_check_grad("dx", &c, avg_pool_forward, ny, dy, x, nx, dx, 1e-2f);
  free(x), free(dy), free(dx);
}
END_TEST

/* params_finish computes out sizes; refuses stride < 1, padding < 0 or > k/2, too big a window. */
START_TEST(test_pool_params) {
  ttd_pool2d_params p = {
      .n = 1, .c = 1, .h = 7, .w = 6, .kh = 3, .kw = 2, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1};
  ck_assert_int_eq(ttd_pool2d_params_finish(&p), 0);
  ck_assert_int_eq(p.out_h, 4);
  ck_assert_int_eq(p.out_w, 4);
  ttd_pool2d_params bad = p;
  bad.stride_w = 0;
  ck_assert_int_eq(ttd_pool2d_params_finish(&bad), -1);
  bad = p;
  bad.pad_h = -1;
  ck_assert_int_eq(ttd_pool2d_params_finish(&bad), -1);
  bad = p;
  bad.pad_h = 2; /* more than 3 / 2 */
  ck_assert_int_eq(ttd_pool2d_params_finish(&bad), -1);
  bad = p;
  bad.kh = 10;
  bad.pad_h = 1;
  ck_assert_int_eq(ttd_pool2d_params_finish(&bad), -1);
}
END_TEST


Suite *kernels_pool2d_suite(void) {
  Suite *s = suite_create("kernels_pool2d");
  TCase *tc = tcase_create("pool2d");
  tcase_add_test(tc, test_max_pool_forward);
  tcase_add_test(tc, test_max_pool_backward_fd);
  tcase_add_test(tc, test_avg_pool_forward);
  tcase_add_test(tc, test_avg_pool_backward_fd);
  tcase_add_test(tc, test_pool_params);
  suite_add_tcase(s, tc);
  return s;
}
