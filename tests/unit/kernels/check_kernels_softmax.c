/* kernels/softmax.c: softmax and log_softmax, checked against a double-precision reference
 * and their backwards against central differences of it. */

#include <math.h>
#include <stdint.h>

#include "kernels.h"
#include "kernel_testing.h"
#include "suites.h"

typedef struct sm_ctx {
  int64_t rows, cols;
  int log;
} sm_ctx;

static void ref_softmax(const void *ctx, double *const *in, double *out) {
  const sm_ctx *c = ctx;
  for (int64_t r = 0; r < c->rows; r++) {
    const double *x = in[0] + r * c->cols;
    double *y = out + r * c->cols, m = x[0], s = 0.0;
    for (int64_t j = 1; j < c->cols; j++) m = fmax(m, x[j]);
    for (int64_t j = 0; j < c->cols; j++) s += exp(x[j] - m);
    for (int64_t j = 0; j < c->cols; j++) y[j] = c->log ? x[j] - m - log(s) : exp(x[j] - m) / s;
  }
}

/* softmax and log_softmax match the reference on odd sizes and for logits near +-1000. */
START_TEST(test_softmax_forward) {
  struct {
    int64_t rows, cols;
    double lo, hi;
  } cases[] = {{1, 1, -1, 1},     {3, 7, -3, 3},     {5, 33, -5, 5},     {2, 1023, -8, 8},
               {64, 1000, -4, 4}, {4, 9, 995, 1005}, {4, 9, -1005, -995}};
  uint64_t st = 13;
  for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
    for (int log_ = 0; log_ <= 1; log_++) {
      sm_ctx c = {cases[i].rows, cases[i].cols, log_};
      int64_t n = c.rows * c.cols;
      float *x = kt_random_floats(&st, n, cases[i].lo, cases[i].hi), *y = kt_fbuf(n);
      double *in[1] = {kt_to_double(x, n)}, *want = kt_dbuf(n);
      ref_softmax(&c, in, want);
      if (log_) ttd_k_log_softmax(kt_pool, x, c.rows, c.cols, y);
      else ttd_k_softmax(kt_pool, x, c.rows, c.cols, y);
      kt_expect_close(log_ ? "log_softmax" : "softmax", y, want, n, 1e-5, log_ ? 2e-6 : 1e-9);
    }
  }
}
END_TEST

/* softmax and log_softmax backwards (from y and dy) match central differences. */
START_TEST(test_softmax_backward) {
  int64_t shapes[][2] = {{1, 1}, {1, 7}, {3, 5}, {2, 33}};
  uint64_t st = 14;
  for (size_t i = 0; i < sizeof(shapes) / sizeof(*shapes); i++) {
    for (int log_ = 0; log_ <= 1; log_++) {
      sm_ctx c = {shapes[i][0], shapes[i][1], log_};
      int64_t n = c.rows * c.cols;
      float *x = kt_random_floats(&st, n, -3, 3), *y = kt_fbuf(n), *dy = kt_random_floats(&st, n, -1, 1),
            *dx = kt_fbuf(n);
      double *in[1] = {kt_to_double(x, n)};
      if (log_) {
        ttd_k_log_softmax(kt_pool, x, c.rows, c.cols, y);
        ttd_k_log_softmax_backward(kt_pool, y, dy, c.rows, c.cols, dx);
      } else {
        ttd_k_softmax(kt_pool, x, c.rows, c.cols, y);
        ttd_k_softmax_backward(kt_pool, y, dy, c.rows, c.cols, dx);
      }
      kt_expect_close(log_ ? "log_softmax dx" : "softmax dx", dx,
                      kt_fd_grad(ref_softmax, &c, in, 0, n, kt_to_double(dy, n), n), n, KT_GRAD_RTOL, KT_GRAD_ATOL);
    }
  }
}
END_TEST

Suite *kernels_softmax_suite(void) {
  Suite *s = suite_create("kernels_softmax");
  TCase *tc = tcase_create("softmax");
  tcase_add_checked_fixture(tc, kt_setup, kt_teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_softmax_forward);
  tcase_add_test(tc, test_softmax_backward);
  suite_add_tcase(s, tc);
  return s;
}
