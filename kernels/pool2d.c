/* 2-d max and average pooling, NCHW (kernels.h). Work is split over the n*c planes. The max
 * forward accepts a NULL argmax (inference). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernel_internal.h"
#include "kernels.h"

/* Besides the output size, a padding of at most half the window (torch's rule), so every
 * window holds at least one input cell. */
int ttd_pool2d_params_finish(ttd_pool2d_params *p) {
  if (p->n < 0 || p->c < 0 || p->h < 1 || p->w < 1 || p->kh < 1 || p->kw < 1) return -1;
  if (p->stride_h < 1 || p->stride_w < 1 || p->pad_h < 0 || p->pad_w < 0) return -1;
  if (2 * p->pad_h > p->kh || 2 * p->pad_w > p->kw) return -1;
  if (p->h + 2 * p->pad_h < p->kh || p->w + 2 * p->pad_w < p->kw) return -1;
  if (p->h * p->w > INT32_MAX) return -1; /* argmax is int32 */
  p->out_h = (p->h + 2 * p->pad_h - p->kh) / p->stride_h + 1;
  p->out_w = (p->w + 2 * p->pad_w - p->kw) / p->stride_w + 1;
  return 0;
}

typedef struct pool_job {
  const ttd_pool2d_params *p;
  const float *x, *dy;
  const int32_t *argmax_in;
  float *y, *dx;
  int32_t *argmax;
} pool_job;

/* The window of output (oi, oj) clipped to the input: rows [*i0, *i1), cols [*j0, *j1). */
static void window(const ttd_pool2d_params *p, int64_t oi, int64_t oj, int64_t *i0, int64_t *i1, int64_t *j0,
                   int64_t *j1) {
  int64_t a = oi * p->stride_h - p->pad_h, b = oj * p->stride_w - p->pad_w;
  *i0 = a < 0 ? 0 : a;
  *i1 = a + p->kh < p->h ? a + p->kh : p->h;
  *j0 = b < 0 ? 0 : b;
  *j1 = b + p->kw < p->w ? b + p->kw : p->w;
}

static void max_tasks(void *ctx, size_t begin, size_t end) {
  const pool_job *j = ctx;
  const ttd_pool2d_params *p = j->p;
  int64_t hw = p->h * p->w, ohw = p->out_h * p->out_w;
  ttd_kcheck check = TTD_KCHECK_INIT;
  for (size_t plane = begin; plane < end; plane++) {
    const float *x = j->x + (int64_t)plane * hw;
    float *y = j->y + (int64_t)plane * ohw;
    int32_t *am = j->argmax ? j->argmax + (int64_t)plane * ohw : NULL;
    for (int64_t oi = 0; oi < p->out_h; oi++)
      for (int64_t oj = 0; oj < p->out_w; oj++) {
        if (ttd_kstop(&check, p->kh * p->kw)) return;
        int64_t i0, i1, j0, j1;
        window(p, oi, oj, &i0, &i1, &j0, &j1);
        int64_t best = -1;
        float v = -INFINITY;
        for (int64_t i = i0; i < i1; i++)
          for (int64_t jj = j0; jj < j1; jj++) {
            float e = x[i * p->w + jj];
            /* the first maximum wins; a NaN wins and stays */
            if (best < 0 || e > v || (isnan(e) && !isnan(v))) {
              best = i * p->w + jj;
              v = e;
            }
          }
        y[oi * p->out_w + oj] = v;
        if (am) am[oi * p->out_w + oj] = (int32_t)best;
      }
  }
}

static void max_backward_tasks(void *ctx, size_t begin, size_t end) {
  const pool_job *j = ctx;
  const ttd_pool2d_params *p = j->p;
  int64_t hw = p->h * p->w, ohw = p->out_h * p->out_w;
  for (size_t plane = begin; plane < end; plane++) {
    float *dx = j->dx + (int64_t)plane * hw;
    const float *dy = j->dy + (int64_t)plane * ohw;
    const int32_t *am = j->argmax_in + (int64_t)plane * ohw;
    memset(dx, 0, (size_t)hw * sizeof(float));
    for (int64_t o = 0; o < ohw; o++)
      if (am[o] >= 0 && am[o] < hw) dx[am[o]] += dy[o];
  }
}

static void avg_tasks(void *ctx, size_t begin, size_t end) {
  const pool_job *j = ctx;
  const ttd_pool2d_params *p = j->p;
  int64_t hw = p->h * p->w, ohw = p->out_h * p->out_w;
  float scale = 1.0f / (float)(p->kh * p->kw);
  ttd_kcheck check = TTD_KCHECK_INIT;
  for (size_t plane = begin; plane < end; plane++) {
    const float *x = j->x + (int64_t)plane * hw;
    float *y = j->y + (int64_t)plane * ohw;
    for (int64_t oi = 0; oi < p->out_h; oi++)
      for (int64_t oj = 0; oj < p->out_w; oj++) {
        if (ttd_kstop(&check, p->kh * p->kw)) return;
        int64_t i0, i1, j0, j1;
        window(p, oi, oj, &i0, &i1, &j0, &j1);
        float s = 0.0f;
        for (int64_t i = i0; i < i1; i++)
          for (int64_t jj = j0; jj < j1; jj++) s += x[i * p->w + jj];
        y[oi * p->out_w + oj] = s * scale;
      }
  }
}

static void avg_backward_tasks(void *ctx, size_t begin, size_t end) {
  const pool_job *j = ctx;
  const ttd_pool2d_params *p = j->p;
  int64_t hw = p->h * p->w, ohw = p->out_h * p->out_w;
  float scale = 1.0f / (float)(p->kh * p->kw);
  ttd_kcheck check = TTD_KCHECK_INIT;
  for (size_t plane = begin; plane < end; plane++) {
    float *dx = j->dx + (int64_t)plane * hw;
    const float *dy = j->dy + (int64_t)plane * ohw;
    memset(dx, 0, (size_t)hw * sizeof(float));
    for (int64_t oi = 0; oi < p->out_h; oi++)
      for (int64_t oj = 0; oj < p->out_w; oj++) {
        if (ttd_kstop(&check, p->kh * p->kw)) return;
        int64_t i0, i1, j0, j1;
        window(p, oi, oj, &i0, &i1, &j0, &j1);
        float g = dy[oi * p->out_w + oj] * scale;
        for (int64_t i = i0; i < i1; i++)
          for (int64_t jj = j0; jj < j1; jj++) dx[i * p->w + jj] += g;
      }
  }
}

/* Planes per task: about 16K input cells. */
static size_t plane_grain(const ttd_pool2d_params *p) {
  int64_t hw = p->h * p->w;
  return (size_t)(hw >= 16384 ? 1 : 16384 / hw);
}

void ttd_k_max_pool2d(ttd_pool *pool, const ttd_pool2d_params *p, const float *x, float *y, int32_t *argmax) {
  pool_job j = {.p = p, .x = x, .y = y, .argmax = argmax};
  ttd_pool_parallel_for(pool, (size_t)(p->n * p->c), plane_grain(p), max_tasks, &j);
}

void ttd_k_max_pool2d_backward(ttd_pool *pool, const ttd_pool2d_params *p, const int32_t *argmax, const float *dy,
                               float *dx) {
  pool_job j = {.p = p, .argmax_in = argmax, .dy = dy, .dx = dx};
  ttd_pool_parallel_for(pool, (size_t)(p->n * p->c), plane_grain(p), max_backward_tasks, &j);
}

void ttd_k_avg_pool2d(ttd_pool *pool, const ttd_pool2d_params *p, const float *x, float *y) {
  pool_job j = {.p = p, .x = x, .y = y};
  ttd_pool_parallel_for(pool, (size_t)(p->n * p->c), plane_grain(p), avg_tasks, &j);
}

void ttd_k_avg_pool2d_backward(ttd_pool *pool, const ttd_pool2d_params *p, const float *dy, float *dx) {
  pool_job j = {.p = p, .dy = dy, .dx = dx};
  ttd_pool_parallel_for(pool, (size_t)(p->n * p->c), plane_grain(p), avg_backward_tasks, &j);
}
