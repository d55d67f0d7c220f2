/* Linear layer (kernels.h): y = x W^T + bias through the matmul kernels. */
#include <stdint.h>

#include "kernels.h"

enum { BIAS_COLS = 256 }; /* columns per dbias task */

typedef struct bias_job {
  const float *dy;
  float *dbias;
  int64_t rows, cols;
  int add; /* dbias += the sums */
} bias_job;

/* dbias[c] = sum over rows of dy[:, c] for the column blocks [begin, end), in double. */
static void sum_columns(void *ctx, size_t begin, size_t end) {
  const bias_job *j = ctx;
  for (size_t blk = begin; blk < end; blk++) {
    int64_t c0 = (int64_t)blk * BIAS_COLS;
    int64_t w = j->cols - c0 < BIAS_COLS ? j->cols - c0 : BIAS_COLS;
    double acc[BIAS_COLS] = {0};
    for (int64_t r = 0; r < j->rows; r++) {
      const float *restrict dy = j->dy + r * j->cols + c0;
      for (int64_t c = 0; c < w; c++) acc[c] += dy[c];
    }
    for (int64_t c = 0; c < w; c++) j->dbias[c0 + c] = j->add ? j->dbias[c0 + c] + (float)acc[c] : (float)acc[c];
  }
}

void ttd_k_linear(ttd_pool *pool, const float *x, const float *w, const float *bias, int64_t n, int64_t in, int64_t out,
                  float *y) {
  ttd_k_linear_dt(pool, x, TTD_DTYPE_FLOAT32, w, TTD_DTYPE_FLOAT32, bias, n, in, out, y);
}

void ttd_k_linear_dt(ttd_pool *pool, const void *x, ttd_dtype x_dtype, const void *w, ttd_dtype w_dtype,
                     const float *bias, int64_t n, int64_t in, int64_t out, float *y) {
  ttd_k_linear_act_dt(pool, x, x_dtype, w, w_dtype, bias, 0, n, in, out, y);
}

void ttd_k_linear_act_dt(ttd_pool *pool, const void *x, ttd_dtype x_dtype, const void *w, ttd_dtype w_dtype,
                         const float *bias, int relu, int64_t n, int64_t in, int64_t out, float *y) {
  ttd_k_matmul_act_dt(pool, x, x_dtype, w, w_dtype, bias, relu, y, 1, n, out, in, 0, 1, 0, 0); /* in the epilogue */
}

void ttd_k_linear_backward(ttd_pool *pool, const float *x, const float *w, const float *dy, int64_t n, int64_t in,
                           int64_t out, float *dx, float *dw, float *dbias) {
  ttd_k_linear_backward_add(pool, x, w, dy, n, in, out, dx, dw, dbias, 0);
}

void ttd_k_linear_backward_add(ttd_pool *pool, const float *x, const float *w, const float *dy, int64_t n, int64_t in,
                               int64_t out, float *dx, float *dw, float *dbias, unsigned add) {
  ttd_k_linear_backward_dt(pool, x, TTD_DTYPE_FLOAT32, w, TTD_DTYPE_FLOAT32, dy, n, in, out, dx, dw, dbias, add);
}

void ttd_k_linear_backward_dt(ttd_pool *pool, const void *x, ttd_dtype x_dtype, const void *w, ttd_dtype w_dtype,
                              const float *dy, int64_t n, int64_t in, int64_t out, float *dx, float *dw, float *dbias,
                              unsigned add) {
  ttd_k_linear_backward_mask_dt(pool, x, x_dtype, w, w_dtype, dy, n, in, out, dx, dw, dbias, add, NULL);
}

void ttd_k_linear_backward_mask_dt(ttd_pool *pool, const void *x, ttd_dtype x_dtype, const void *w, ttd_dtype w_dtype,
                                   const float *dy, int64_t n, int64_t in, int64_t out, float *dx, float *dw,
                                   float *dbias, unsigned add, const float *dx_mask) {
  ttd_k_matmul_backward_mask_dt(pool, x, x_dtype, w, w_dtype, dy, 1, n, out, in, 0, 1, 0, 0, dx, dw,
                                add & (TTD_KGRAD_ADD_A | TTD_KGRAD_ADD_B), dx_mask);
  if (dbias && out > 0) {
    bias_job j = {.dy = dy, .dbias = dbias, .rows = n, .cols = out, .add = (add & TTD_KGRAD_ADD_BIAS) != 0};
    ttd_pool_parallel_for(pool, (size_t)((out + BIAS_COLS - 1) / BIAS_COLS), 1, sum_columns, &j);
  }
}
