/* kernels/layer_norm.c: layer_norm with and without weight and bias. Forwards are checked
 * against direct double-precision references on random inputs, backwards against central
 * finite differences of sum(dy * f(x)) taken through the float forward itself. */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "kernel_testing.h"
#include "suites.h"

/* y, mean, rstd match double for cols 1, 37, 300, weight+bias / weight / neither; mean, rstd may be NULL. */
START_TEST(test_layer_norm_forward) {
  static const int64_t shapes[][2] = {{3, 1}, {5, 37}, {4, 300}};
  uint64_t rng = 15;
  const float eps = 1e-5f;
  for (size_t s = 0; s < 3; s++)
    for (int mode = 0; mode < 3; mode++) {
      int64_t rows = shapes[s][0], cols = shapes[s][1];
      float *x = kt_rand_buf(&rng, rows * cols, -2, 3), *w = kt_rand_buf(&rng, cols, 0.5f, 1.5f);
      float *b = kt_rand_buf(&rng, cols, -1, 1);
      const float *wp = mode < 2 ? w : NULL, *bp = mode < 1 ? b : NULL;
      float *y = kt_nan_buf(rows * cols), *mean = kt_nan_buf(rows), *rstd = kt_nan_buf(rows);
      double *want = kt_dzeros(rows * cols), *want_mean = kt_dzeros(rows), *want_rstd = kt_dzeros(rows);
      ttd_k_layer_norm(NULL, x, wp, bp, rows, cols, eps, y, mean, rstd);
      for (int64_t r = 0; r < rows; r++) {
        double m = 0.0, v = 0.0;
        for (int64_t c = 0; c < cols; c++) m += x[r * cols + c];
        m /= (double)cols;
        for (int64_t c = 0; c < cols; c++) v += (x[r * cols + c] - m) * (x[r * cols + c] - m);
        v /= (double)cols;
        double rs = 1.0 / sqrt(v + eps);
        want_mean[r] = m;
        want_rstd[r] = rs;
        for (int64_t c = 0; c < cols; c++)
          want[r * cols + c] = (x[r * cols + c] - m) * rs * (wp ? wp[c] : 1.0) + (bp ? bp[c] : 0.0);
      }
      kt_expect_close("y", y, want, rows * cols, 1e-4, 1e-5);
      kt_expect_close("mean", mean, want_mean, rows, 1e-5, 1e-6);
      kt_expect_close("rstd", rstd, want_rstd, rows, 1e-5, 1e-6);
      float *y2 = kt_nan_buf(rows * cols); /* without mean and rstd, the same y */
      ttd_k_layer_norm(NULL, x, wp, bp, rows, cols, eps, y2, NULL, NULL);
      ck_assert(memcmp(y, y2, (size_t)(rows * cols) * sizeof(float)) == 0);
      free(y2);
      free(x), free(w), free(b), free(y), free(mean), free(rstd), free(want), free(want_mean), free(want_rstd);
    }
}
END_TEST

typedef struct ln_ctx {
  const float *x, *w, *b;
  int64_t rows, cols;
  float *mean, *rstd;
} ln_ctx;

static void ln_forward(void *ctx, float *y) {
  ln_ctx *c = ctx;
  ttd_k_layer_norm(NULL, c->x, c->w, c->b, c->rows, c->cols, 1e-5f, y, c->mean, c->rstd);
}

/* dx, dweight, dbias match finite differences (cols 7 and 1), weight NULL too; NULL outputs skipped. */
START_TEST(test_layer_norm_backward_fd) {
  static const int64_t shapes[][2] = {{3, 7}, {2, 1}};
  uint64_t rng = 16;
  for (size_t s = 0; s < 2; s++)
    for (int with_weight = 0; with_weight < 2; with_weight++) {
      int64_t rows = shapes[s][0], cols = shapes[s][1], n = rows * cols;
      float *x = kt_rand_buf(&rng, n, -1, 1), *w = kt_rand_buf(&rng, cols, 0.5f, 1.5f),
            *b = kt_rand_buf(&rng, cols, -1, 1);
      float *dy = kt_rand_buf(&rng, n, -1, 1), *y = kt_nan_buf(n), *mean = kt_nan_buf(rows), *rstd = kt_nan_buf(rows);
      float *dx = kt_nan_buf(n), *dw = kt_nan_buf(cols), *db = kt_nan_buf(cols);
      ln_ctx c = {.x = x,
                  .w = with_weight ? w : NULL,
                  .b = b,
                  .rows = rows,
                  .cols = cols,
                  .mean = kt_nan_buf(rows),
                  .rstd = kt_nan_buf(rows)};
      ttd_k_layer_norm(NULL, x, c.w, b, rows, cols, 1e-5f, y, mean, rstd);
      ttd_k_layer_norm_backward(NULL, x, c.w, mean, rstd, dy, rows, cols, dx, dw, db);
      kt_check_grad("dx", &c, ln_forward, n, dy, x, n, dx, 1e-3f);
      kt_check_grad("dweight", &c, ln_forward, n, dy, w, with_weight ? cols : 0, dw, 1e-3f);
      kt_check_grad("dbias", &c, ln_forward, n, dy, b, cols, db, 1e-3f);
      if (!with_weight) { /* with weight NULL, dweight is the gradient at weight = 1 */
        ln_ctx cw = c;
        cw.w = w;
        for (int64_t i = 0; i < cols; i++) w[i] = 1.0f;
        kt_check_grad("dweight (weight NULL)", &cw, ln_forward, n, dy, w, cols, dw, 1e-3f);
      }
      float *dx2 = kt_nan_buf(n), *db2 = kt_nan_buf(cols);
      ttd_k_layer_norm_backward(NULL, x, c.w, mean, rstd, dy, rows, cols, dx2, NULL, NULL);
      ttd_k_layer_norm_backward(NULL, x, c.w, mean, rstd, dy, rows, cols, NULL, NULL, db2);
      ck_assert(memcmp(dx, dx2, (size_t)n * sizeof(float)) == 0);
      ck_assert(memcmp(db, db2, (size_t)cols * sizeof(float)) == 0);
      free(x), free(w), free(b), free(dy), free(y), free(mean), free(rstd), free(dx), free(dw), free(db);
      free(c.mean), free(c.rstd), free(dx2), free(db2);
    }
}
END_TEST


Suite *kernels_layer_norm_suite(void) {
  Suite *s = suite_create("kernels_layer_norm");
  TCase *tc = tcase_create("layer_norm");
  tcase_add_test(tc, test_layer_norm_forward);
  tcase_add_test(tc, test_layer_norm_backward_fd);
  suite_add_tcase(s, tc);
  return s;
}
