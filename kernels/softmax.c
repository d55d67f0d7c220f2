/* Softmax and log-softmax over the last axis, forward and backward. Rows run in parallel;
 * each row subtracts its max before exponentiating and sums in double, so a row's result
 * does not depend on how rows are split across threads. */
#include <math.h>

#include "kernel_internal.h"
#include "kernels.h"

typedef struct softmax_job {
  const float *x, *y, *dy;
  float *out;
  int64_t cols;
  int is_log;
} softmax_job;

static size_t row_grain(int64_t cols) { return cols >= TTD_KGRAIN ? 1 : (size_t)(TTD_KGRAIN / cols); }

static float row_max(const float *restrict x, int64_t n) {
  float m = x[0];
  for (int64_t i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
  return m;
}

static void softmax_row(const float *restrict x, float *restrict y, int64_t n, int is_log) {
  float m = row_max(x, n);
  double sum = 0.0;
  if (is_log) {
    for (int64_t i = 0; i < n; i++) sum += (double)expf(x[i] - m);
    float ls = (float)log(sum);
    for (int64_t i = 0; i < n; i++) y[i] = (x[i] - m) - ls;
  } else {
    for (int64_t i = 0; i < n; i++) {
      y[i] = expf(x[i] - m);
      sum += (double)y[i];
    }
    float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++) y[i] *= inv;
  }
}

static void softmax_run(void *ctx, size_t begin, size_t end) {
  softmax_job *job = ctx;
  for (size_t r = begin; r < end; r++)
    softmax_row(job->x + (int64_t)r * job->cols, job->out + (int64_t)r * job->cols, job->cols, job->is_log);
}

static void softmax_any(ttd_pool *pool, const float *x, int64_t rows, int64_t cols, float *y, int is_log) {
  if (rows <= 0 || cols <= 0) return;
  softmax_job job = {.x = x, .out = y, .cols = cols, .is_log = is_log};
  ttd_pool_parallel_for(pool, (size_t)rows, row_grain(cols), softmax_run, &job);
}

void ttd_k_softmax(ttd_pool *pool, const float *x, int64_t rows, int64_t cols, float *y) {
  softmax_any(pool, x, rows, cols, y, 0);
}

void ttd_k_log_softmax(ttd_pool *pool, const float *x, int64_t rows, int64_t cols, float *y) {
  softmax_any(pool, x, rows, cols, y, 1);
}

/* softmax: dx = y (dy - sum(dy y)); log_softmax: dx = dy - exp(y) sum(dy). */
static void softmax_backward_row(const float *restrict y, const float *restrict dy, float *restrict dx, int64_t n,
                                 int is_log) {
  double s = 0.0;
  if (is_log) {
    for (int64_t i = 0; i < n; i++) s += (double)dy[i];
    float sf = (float)s;
    for (int64_t i = 0; i < n; i++) dx[i] = dy[i] - expf(y[i]) * sf;
  } else {
    for (int64_t i = 0; i < n; i++) s += (double)dy[i] * (double)y[i];
    float sf = (float)s;
    for (int64_t i = 0; i < n; i++) dx[i] = y[i] * (dy[i] - sf);
  }
}

static void softmax_backward_run(void *ctx, size_t begin, size_t end) {
  softmax_job *job = ctx;
  for (size_t r = begin; r < end; r++) {
    int64_t o = (int64_t)r * job->cols;
    softmax_backward_row(job->y + o, job->dy + o, job->out + o, job->cols, job->is_log);
  }
}

static void softmax_backward_any(ttd_pool *pool, const float *y, const float *dy, int64_t rows, int64_t cols,
                                 float *dx, int is_log) {
  if (rows <= 0 || cols <= 0) return;
  softmax_job job = {.y = y, .dy = dy, .out = dx, .cols = cols, .is_log = is_log};
  ttd_pool_parallel_for(pool, (size_t)rows, row_grain(cols), softmax_backward_run, &job);
}

void ttd_k_softmax_backward(ttd_pool *pool, const float *y, const float *dy, int64_t rows, int64_t cols, float *dx) {
  softmax_backward_any(pool, y, dy, rows, cols, dx, 0);
}

void ttd_k_log_softmax_backward(ttd_pool *pool, const float *y, const float *dy, int64_t rows, int64_t cols,
                                float *dx) {
  softmax_backward_any(pool, y, dy, rows, cols, dx, 1);
}
