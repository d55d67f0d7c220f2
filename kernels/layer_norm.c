/* Layer normalisation over the last dim (kernels.h). Rows are split over the pool for the
 * forward and dx, column blocks for dweight and dbias; sums are taken in double. The
 * forward accepts NULL mean / rstd (inference: nothing to keep for a backward). */
#include <math.h>
#include <stdint.h>

#include "kernel_internal.h"
#include "kernels.h"

enum {
  LANES = 8,       /* independent partial sums, so the row sums vectorize */
  PARAM_COLS = 256 /* columns per dweight/dbias task */
};

/* sum of x[0..n). */
static double row_sum(const float *restrict x, int64_t n) {
  double acc[LANES] = {0};
  int64_t i = 0;
  for (; i + LANES <= n; i += LANES)
    for (int l = 0; l < LANES; l++) acc[l] += x[i + l];
  double s = 0.0;
  for (; i < n; i++) s += x[i];
  for (int l = 0; l < LANES; l++) s += acc[l];
  return s;
}

/* sum of (x[i] - mean)^2 over [0, n). */
static double row_sq_dev(const float *restrict x, int64_t n, double mean) {
  double acc[LANES] = {0};
  int64_t i = 0;
  for (; i + LANES <= n; i += LANES)
    for (int l = 0; l < LANES; l++) {
      double d = x[i + l] - mean;
      acc[l] += d * d;
    }
  double s = 0.0;
  for (; i < n; i++) s += (x[i] - mean) * (x[i] - mean);
  for (int l = 0; l < LANES; l++) s += acc[l];
  return s;
}

typedef struct ln_job {
  const float *x, *weight, *bias, *mean_in, *rstd_in, *dy;
  int64_t rows, cols;
  float eps;
  float *y, *mean, *rstd, *dx, *dweight, *dbias;
} ln_job;

static void forward_rows(void *ctx, size_t begin, size_t end) {
  const ln_job *j = ctx;
  int64_t cols = j->cols;
  ttd_kcheck check = TTD_KCHECK_INIT;
  for (size_t r = begin; r < end && !ttd_kstop(&check, cols); r++) {
    const float *restrict x = j->x + (int64_t)r * cols;
    float *restrict y = j->y + (int64_t)r * cols;
    double mean = row_sum(x, cols) / (double)cols;
    double var = row_sq_dev(x, cols, mean) / (double)cols;
    float m = (float)mean, rs = (float)(1.0 / sqrt(var + (double)j->eps));
    if (j->mean) j->mean[r] = m;
    if (j->rstd) j->rstd[r] = rs;
    const float *restrict w = j->weight, *restrict b = j->bias;
    if (w && b)
      for (int64_t c = 0; c < cols; c++) y[c] = (x[c] - m) * rs * w[c] + b[c];
    else if (w)
      for (int64_t c = 0; c < cols; c++) y[c] = (x[c] - m) * rs * w[c];
    else if (b)
      for (int64_t c = 0; c < cols; c++) y[c] = (x[c] - m) * rs + b[c];
    else
      for (int64_t c = 0; c < cols; c++) y[c] = (x[c] - m) * rs;
  }
}

/* dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * weight, xhat = (x - mean) * rstd. */
static void dx_rows(void *ctx, size_t begin, size_t end) {
  const ln_job *j = ctx;
  int64_t cols = j->cols;
  const float *restrict w = j->weight;
  ttd_kcheck check = TTD_KCHECK_INIT;
  for (size_t r = begin; r < end && !ttd_kstop(&check, cols); r++) {
    const float *restrict x = j->x + (int64_t)r * cols;
    const float *restrict dy = j->dy + (int64_t)r * cols;
    float *restrict dx = j->dx + (int64_t)r * cols;
    float m = j->mean_in[r], rs = j->rstd_in[r];
    double acc_g[LANES] = {0}, acc_gx[LANES] = {0};
    int64_t c = 0;
    for (; c + LANES <= cols; c += LANES)
      for (int l = 0; l < LANES; l++) {
        float g = w ? dy[c + l] * w[c + l] : dy[c + l];
        acc_g[l] += g;
        acc_gx[l] += (double)g * ((x[c + l] - m) * rs);
      }
    double sg = 0.0, sgx = 0.0;
    for (; c < cols; c++) {
      float g = w ? dy[c] * w[c] : dy[c];
      sg += g;
      sgx += (double)g * ((x[c] - m) * rs);
    }
    for (int l = 0; l < LANES; l++) {
      sg += acc_g[l];
      sgx += acc_gx[l];
    }
    float mg = (float)(sg / (double)cols), mgx = (float)(sgx / (double)cols);
    for (c = 0; c < cols; c++) {
      float g = w ? dy[c] * w[c] : dy[c];
      dx[c] = rs * (g - mg - (x[c] - m) * rs * mgx);
    }
  }
}

/* dweight[c] = sum_r dy * xhat, dbias[c] = sum_r dy, for column blocks [begin, end). */
static void param_blocks(void *ctx, size_t begin, size_t end) {
  const ln_job *j = ctx;
  for (size_t blk = begin; blk < end; blk++) {
    int64_t c0 = (int64_t)blk * PARAM_COLS;
    int64_t n = j->cols - c0 < PARAM_COLS ? j->cols - c0 : PARAM_COLS;
    double sw[PARAM_COLS] = {0}, sb[PARAM_COLS] = {0};
    for (int64_t r = 0; r < j->rows; r++) {
      const float *restrict x = j->x + r * j->cols + c0;
      const float *restrict dy = j->dy + r * j->cols + c0;
      float m = j->mean_in[r], rs = j->rstd_in[r];
      for (int64_t c = 0; c < n; c++) {
        sw[c] += (double)dy[c] * ((x[c] - m) * rs);
        sb[c] += dy[c];
      }
    }
    for (int64_t c = 0; c < n; c++) {
      if (j->dweight) j->dweight[c0 + c] = (float)sw[c];
      if (j->dbias) j->dbias[c0 + c] = (float)sb[c];
    }
  }
}

/* Rows per task: about 16K elements. */
static size_t row_grain(int64_t cols) { return (size_t)(cols >= 16384 ? 1 : 16384 / (cols > 0 ? cols : 1)); }

void ttd_k_layer_norm(ttd_pool *pool, const float *x, const float *weight, const float *bias, int64_t rows,
                      int64_t cols, float eps, float *y, float *mean, float *rstd) {
  if (rows <= 0 || cols <= 0) return;
  ln_job j = {.x = x,
              .weight = weight,
              .bias = bias,
              .rows = rows,
              .cols = cols,
              .eps = eps,
              .y = y,
              .mean = mean,
              .rstd = rstd};
  ttd_pool_parallel_for(pool, (size_t)rows, row_grain(cols), forward_rows, &j);
}

void ttd_k_layer_norm_backward(ttd_pool *pool, const float *x, const float *weight, const float *mean,
                               const float *rstd, const float *dy, int64_t rows, int64_t cols, float *dx,
                               float *dweight, float *dbias) {
  if (cols <= 0) return;
  ln_job j = {.x = x,
              .weight = weight,
              .mean_in = mean,
              .rstd_in = rstd,
              .dy = dy,
              .rows = rows,
              .cols = cols,
              .dx = dx,
              .dweight = dweight,
              .dbias = dbias};
  if (dx && rows > 0) ttd_pool_parallel_for(pool, (size_t)rows, row_grain(cols), dx_rows, &j);
  if (dweight || dbias)
    ttd_pool_parallel_for(pool, (size_t)((cols + PARAM_COLS - 1) / PARAM_COLS), 1, param_blocks, &j);
}
