/* Softmax and log-softmax over the last axis, forward and backward. Rows run in parallel;
 * each row subtracts its max before exponentiating (ttd_kexpf, vectorized) and sums in
 * fixed lanes, so a row's result does not depend on how rows are split across threads. */
#include <math.h>

#include "kernel_internal.h"
#include "kernels.h"

typedef struct softmax_job {
  const float *x, *y, *dy;
  float *out;
  int64_t cols;
  bool is_log;
} softmax_job;

static size_t row_grain(int64_t cols) { return cols >= TTD_KGRAIN ? 1 : (size_t)(TTD_KGRAIN / cols); }

TTD_KHOT static void softmax_row(const float *restrict x, float *restrict y, int64_t n, bool is_log) {
  float m = ttd_kmax_f32(x, n);
  if (is_log) {
    float ls = (float)log(ttd_kexp_sum(x, m, NULL, n));
    for (int64_t i = 0; i < n; i++) y[i] = (x[i] - m) - ls;
  } else {
    float inv = (float)(1.0 / ttd_kexp_sum(x, m, y, n));
    for (int64_t i = 0; i < n; i++) y[i] *= inv;
  }
}

static void softmax_run(void *ctx, size_t begin, size_t end) {
  softmax_job *job = ctx;
  ttd_kcheck check = TTD_KCHECK_INIT;
  for (size_t r = begin; r < end && !ttd_kstop(&check, job->cols); r++)
    softmax_row(job->x + (int64_t)r * job->cols, job->out + (int64_t)r * job->cols, job->cols, job->is_log);
}

static void softmax_any(ttd_pool *pool, const float *x, int64_t rows, int64_t cols, float *y, bool is_log) {
  if (rows <= 0 || cols <= 0) return;
  softmax_job job = {.x = x, .out = y, .cols = cols, .is_log = is_log};
  ttd_pool_parallel_for(pool, (size_t)rows, row_grain(cols), softmax_run, &job);
}

void ttd_k_softmax(ttd_pool *pool, const float *x, int64_t rows, int64_t cols, float *y) {
  softmax_any(pool, x, rows, cols, y, false);
}

void ttd_k_log_softmax(ttd_pool *pool, const float *x, int64_t rows, int64_t cols, float *y) {
  softmax_any(pool, x, rows, cols, y, true);
}

/* sum of a[i] * b[i] in double, 16 float lanes per 1024-element block. */
static inline double dot_f32(const float *restrict a, const float *restrict b, int64_t n) {
  double total = 0.0;
  for (int64_t s = 0; s < n; s += 1024) {
    int64_t len = n - s < 1024 ? n - s : 1024;
    float lane[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= len; i += 16)
      for (int j = 0; j < 16; j++) lane[j] += a[s + i + j] * b[s + i + j];
    for (; i < len; i++) lane[i & 15] += a[s + i] * b[s + i];
    double t = 0.0;
    for (int j = 0; j < 16; j++) t += (double)lane[j];
    total += t;
  }
  return total;
}

/* softmax: dx = y (dy - sum(dy y)); log_softmax: dx = dy - exp(y) sum(dy). */
TTD_KHOT static void softmax_backward_row(const float *restrict y, const float *restrict dy, float *restrict dx,
                                          int64_t n, bool is_log) {
  if (is_log) {
    float s = (float)ttd_ksum_f32(dy, n);
    ttd_kexpf_n(dx, y, 1.0f, 0.0f, n);
    for (int64_t i = 0; i < n; i++) dx[i] = dy[i] - dx[i] * s;
  } else {
    float s = (float)dot_f32(dy, y, n);
    for (int64_t i = 0; i < n; i++) dx[i] = y[i] * (dy[i] - s);
  }
}

static void softmax_backward_run(void *ctx, size_t begin, size_t end) {
  softmax_job *job = ctx;
  ttd_kcheck check = TTD_KCHECK_INIT;
  for (size_t r = begin; r < end && !ttd_kstop(&check, job->cols); r++) {
    int64_t o = (int64_t)r * job->cols;
    softmax_backward_row(job->y + o, job->dy + o, job->out + o, job->cols, job->is_log);
  }
}

static void softmax_backward_any(ttd_pool *pool, const float *y, const float *dy, int64_t rows, int64_t cols, float *dx,
                                 bool is_log) {
  if (rows <= 0 || cols <= 0) return;
  softmax_job job = {.y = y, .dy = dy, .out = dx, .cols = cols, .is_log = is_log};
  ttd_pool_parallel_for(pool, (size_t)rows, row_grain(cols), softmax_backward_run, &job);
}

void ttd_k_softmax_backward(ttd_pool *pool, const float *y, const float *dy, int64_t rows, int64_t cols, float *dx) {
  softmax_backward_any(pool, y, dy, rows, cols, dx, false);
}

void ttd_k_log_softmax_backward(ttd_pool *pool, const float *y, const float *dy, int64_t rows, int64_t cols,
                                float *dx) {
  softmax_backward_any(pool, y, dy, rows, cols, dx, true);
}
