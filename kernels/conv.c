/* 2-d convolution, NCHW (kernels.h), as im2col + matmul.
 *
 * Images go in groups of G whose column buffers fit a fixed budget. For a group, im2col
 * writes col[g][K][P] (K = c_in*kh*kw, P = out_h*out_w) and one batched matmul with the
 * weight broadcast, W[c_out, K] x col[g], writes y[g] in place (NCHW is exactly the dense
 * [G, c_out, P] batch layout). The backward runs the matmul backward on the same problem:
 * dW comes out summed over the group's images, dcol is scattered back by col2im. A 1x1,
 * stride 1, unpadded convolution uses x itself as col. G depends on the shapes only, so the
 * result does not depend on the pool. If even one image's buffers cannot be allocated, a
 * direct loop computes the same thing slowly. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_internal.h"
#include "kernels.h"

enum { COL_BUDGET = 1 << 22 }; /* floats per column buffer (16 MiB) */

int ttd_conv2d_params_finish(ttd_conv2d_params *p) {
  if (p->n < 0 || p->c_in < 1 || p->h < 1 || p->w < 1 || p->c_out < 1 || p->kh < 1 || p->kw < 1) return -1;
  if (p->stride_h < 1 || p->stride_w < 1 || p->pad_h < 0 || p->pad_w < 0) return -1;
  int64_t span_h = p->h + 2 * p->pad_h, span_w = p->w + 2 * p->pad_w;
  if (span_h < p->kh || span_w < p->kw) return -1;
  p->out_h = (span_h - p->kh) / p->stride_h + 1;
  p->out_w = (span_w - p->kw) / p->stride_w + 1;
  return 0;
}

static int is_pointwise(const ttd_conv2d_params *p) {
  return p->kh == 1 && p->kw == 1 && p->stride_h == 1 && p->stride_w == 1 && p->pad_h == 0 && p->pad_w == 0;
}

typedef struct conv_job {
  const ttd_conv2d_params *p;
  const float *x, *bias, *dy;
  float *col, *y, *dx, *dbias;
} conv_job;

/* col rows of (image g, channel c) for the tasks [begin, end), task = g * c_in + c. */
static void im2col_tasks(void *ctx, size_t begin, size_t end) {
  const conv_job *j = ctx;
  const ttd_conv2d_params *p = j->p;
  int64_t hw = p->h * p->w, oh = p->out_h, ow = p->out_w, P = oh * ow, K = p->c_in * p->kh * p->kw;
  for (size_t t = begin; t < end; t++) {
    int64_t g = (int64_t)t / p->c_in, c = (int64_t)t % p->c_in;
    const float *x = j->x + (g * p->c_in + c) * hw;
    float *row = j->col + g * K * P + c * p->kh * p->kw * P;
    for (int64_t ki = 0; ki < p->kh; ki++)
      for (int64_t kj = 0; kj < p->kw; kj++, row += P)
        for (int64_t oi = 0; oi < oh; oi++) {
          int64_t ii = oi * p->stride_h - p->pad_h + ki;
          float *restrict out = row + oi * ow;
          if (ii < 0 || ii >= p->h) {
            memset(out, 0, (size_t)ow * sizeof(float));
            continue;
          }
          const float *restrict in = x + ii * p->w;
          for (int64_t oj = 0; oj < ow; oj++) {
            int64_t jj = oj * p->stride_w - p->pad_w + kj;
            out[oj] = (jj >= 0 && jj < p->w) ? in[jj] : 0.0f;
          }
        }
  }
}

/* dx plane of (image g, channel c) from the dcol rows in j->col, for tasks [begin, end). */
static void col2im_tasks(void *ctx, size_t begin, size_t end) {
  const conv_job *j = ctx;
  const ttd_conv2d_params *p = j->p;
  int64_t hw = p->h * p->w, oh = p->out_h, ow = p->out_w, P = oh * ow, K = p->c_in * p->kh * p->kw;
  for (size_t t = begin; t < end; t++) {
    int64_t g = (int64_t)t / p->c_in, c = (int64_t)t % p->c_in;
    float *dx = j->dx + (g * p->c_in + c) * hw;
    const float *row = j->col + g * K * P + c * p->kh * p->kw * P;
    memset(dx, 0, (size_t)hw * sizeof(float));
    for (int64_t ki = 0; ki < p->kh; ki++)
      for (int64_t kj = 0; kj < p->kw; kj++, row += P)
        for (int64_t oi = 0; oi < oh; oi++) {
          int64_t ii = oi * p->stride_h - p->pad_h + ki;
          if (ii < 0 || ii >= p->h) continue;
          const float *in = row + oi * ow;
          float *out = dx + ii * p->w;
          for (int64_t oj = 0; oj < ow; oj++) {
            int64_t jj = oj * p->stride_w - p->pad_w + kj;
            if (jj >= 0 && jj < p->w) out[jj] += in[oj];
          }
        }
  }
}

/* y[g, co, :] += bias[co] for tasks [begin, end), task = g * c_out + co. */
static void bias_tasks(void *ctx, size_t begin, size_t end) {
  const conv_job *j = ctx;
  int64_t P = j->p->out_h * j->p->out_w;
  for (size_t t = begin; t < end; t++) {
    float *restrict y = j->y + (int64_t)t * P;
    float b = j->bias[(int64_t)t % j->p->c_out];
    for (int64_t i = 0; i < P; i++) y[i] += b;
  }
}

/* dbias[co] = sum over images and positions of dy, in double, for co in [begin, end). */
static void dbias_tasks(void *ctx, size_t begin, size_t end) {
  const conv_job *j = ctx;
  const ttd_conv2d_params *p = j->p;
  int64_t P = p->out_h * p->out_w;
  for (size_t co = begin; co < end; co++) {
    double s = 0.0;
    for (int64_t g = 0; g < p->n; g++) {
      const float *dy = j->dy + (g * p->c_out + (int64_t)co) * P;
      for (int64_t i = 0; i < P; i++) s += dy[i];
    }
    j->dbias[co] = (float)s;
  }
}

/* Images per group: column buffers of at most COL_BUDGET floats, at least one image. */
static int64_t group_size(const ttd_conv2d_params *p) {
  int64_t per = p->c_in * p->kh * p->kw * p->out_h * p->out_w;
  int64_t g = per > 0 ? COL_BUDGET / per : p->n;
  if (g < 1) g = 1;
  return g < p->n ? g : p->n;
}

int ttd_conv2d_direct(const ttd_conv2d_params *p) {
  return !is_pointwise(p) && p->c_in * p->kh * p->kw * p->out_h * p->out_w > TTD_CONV2D_COLUMNS_MAX;
}

/* The slow path for when no column buffer can be had (a window too large for one): y
 * directly, counting work at each output element, so that a deadline or a kill stops even
 * one huge window within an element's work. */
static void conv_direct(const ttd_conv2d_params *p, const float *x, const float *w, const float *bias, float *y) {
  ttd_kcheck check = TTD_KCHECK_INIT;
  for (int64_t g = 0; g < p->n; g++)
    for (int64_t co = 0; co < p->c_out; co++)
      for (int64_t oi = 0; oi < p->out_h; oi++) {
        for (int64_t oj = 0; oj < p->out_w; oj++) {
          if (ttd_kstop(&check, p->c_in * p->kh * p->kw)) return;
          float s = bias ? bias[co] : 0.0f;
          for (int64_t c = 0; c < p->c_in; c++)
            for (int64_t ki = 0; ki < p->kh; ki++)
              for (int64_t kj = 0; kj < p->kw; kj++) {
                int64_t ii = oi * p->stride_h - p->pad_h + ki, jj = oj * p->stride_w - p->pad_w + kj;
                if (ii < 0 || ii >= p->h || jj < 0 || jj >= p->w) continue;
                s += x[((g * p->c_in + c) * p->h + ii) * p->w + jj] * w[((co * p->c_in + c) * p->kh + ki) * p->kw + kj];
              }
          y[((g * p->c_out + co) * p->out_h + oi) * p->out_w + oj] = s;
        }
      }
}

/* The slow path of the backward: dx and dw directly (each may be NULL), polling as
 * conv_direct does. */
static void conv_backward_direct(const ttd_conv2d_params *p, const float *x, const float *w, const float *dy, float *dx,
                                 float *dw) {
  if (dx) memset(dx, 0, (size_t)(p->n * p->c_in * p->h * p->w) * sizeof(float));
  if (dw) memset(dw, 0, (size_t)(p->c_out * p->c_in * p->kh * p->kw) * sizeof(float));
  ttd_kcheck check = TTD_KCHECK_INIT;
  for (int64_t g = 0; g < p->n; g++)
    for (int64_t co = 0; co < p->c_out; co++)
      for (int64_t oi = 0; oi < p->out_h; oi++) {
        for (int64_t oj = 0; oj < p->out_w; oj++) {
          if (ttd_kstop(&check, p->c_in * p->kh * p->kw)) return;
          float d = dy[((g * p->c_out + co) * p->out_h + oi) * p->out_w + oj];
          for (int64_t c = 0; c < p->c_in; c++)
            for (int64_t ki = 0; ki < p->kh; ki++)
              for (int64_t kj = 0; kj < p->kw; kj++) {
                int64_t ii = oi * p->stride_h - p->pad_h + ki, jj = oj * p->stride_w - p->pad_w + kj;
                if (ii < 0 || ii >= p->h || jj < 0 || jj >= p->w) continue;
                int64_t xi = ((g * p->c_in + c) * p->h + ii) * p->w + jj,
                        wi = ((co * p->c_in + c) * p->kh + ki) * p->kw + kj;
                if (dx) dx[xi] += d * w[wi];
                if (dw) dw[wi] += d * x[xi];
              }
        }
      }
}

void ttd_k_conv2d(ttd_pool *pool, const ttd_conv2d_params *p, const float *x, const float *w, const float *bias,
                  float *y) {
  int64_t K = p->c_in * p->kh * p->kw, P = p->out_h * p->out_w;
  if (p->n <= 0 || p->c_out <= 0 || P <= 0) return;
  int pointwise = is_pointwise(p);
  int64_t G = group_size(p);
  float *col = NULL;
  if (ttd_conv2d_direct(p)) {
    conv_direct(p, x, w, bias, y);
    return;
  }
  if (!pointwise) {
    while (!(col = malloc((size_t)(G * K * P) * sizeof(float))) && G > 1) G = (G + 1) / 2;
    if (!col) {
      conv_direct(p, x, w, bias, y);
      return;
    }
  }
  for (int64_t n0 = 0; n0 < p->n && !ttd_pool_cancelled(); n0 += G) {
    int64_t g = p->n - n0 < G ? p->n - n0 : G;
    conv_job j = {.p = p, .x = x + n0 * p->c_in * p->h * p->w, .bias = bias, .col = col, .y = y + n0 * p->c_out * P};
    const float *b = j.x;
    if (!pointwise) {
      ttd_pool_parallel_for(pool, (size_t)(g * p->c_in), 1, im2col_tasks, &j);
      b = col;
    }
    ttd_k_matmul(pool, w, b, j.y, g, p->c_out, P, K, 0, 0, 0, K * P);
    if (bias) ttd_pool_parallel_for(pool, (size_t)(g * p->c_out), 1, bias_tasks, &j);
  }
  free(col);
}

void ttd_k_conv2d_backward(ttd_pool *pool, const ttd_conv2d_params *p, const float *x, const float *w, const float *dy,
                           float *dx, float *dw, float *dbias) {
  int64_t K = p->c_in * p->kh * p->kw, P = p->out_h * p->out_w, nw = p->c_out * K;
  if (dbias) {
    conv_job j = {.p = p, .dy = dy, .dbias = dbias};
    ttd_pool_parallel_for(pool, (size_t)p->c_out, 1, dbias_tasks, &j);
  }
  if (!dx && !dw) return;
  if (p->n <= 0) {
    if (dw) memset(dw, 0, (size_t)nw * sizeof(float));
    return;
  }
  if (ttd_conv2d_direct(p)) {
    conv_backward_direct(p, x, w, dy, dx, dw);
    return;
  }
  int pointwise = is_pointwise(p);
  int64_t G = group_size(p);
  /* col (the group's im2col, when dw is wanted), dcol (when dx is), and a dW partial for
   * every group after the first, in one block. */
  float *buf = NULL;
  int64_t col_len, dcol_len, part_len;
  for (;;) {
    col_len = (dw && !pointwise) ? G * K * P : 0;
    dcol_len = (dx && !pointwise) ? G * K * P : 0;
    part_len = (dw && G < p->n) ? nw : 0;
    buf = malloc((size_t)(col_len + dcol_len + part_len + 1) * sizeof(float));
    if (buf || G == 1) break;
    G = (G + 1) / 2;
  }
  if (!buf) {
    conv_backward_direct(p, x, w, dy, dx, dw);
    return;
  }
  float *col = buf, *dcol = buf + col_len, *part = dcol + dcol_len;
  for (int64_t n0 = 0; n0 < p->n && !ttd_pool_cancelled(); n0 += G) {
    int64_t g = p->n - n0 < G ? p->n - n0 : G;
    conv_job j = {
        .p = p, .x = x + n0 * p->c_in * p->h * p->w, .col = col, .dx = dx ? dx + n0 * p->c_in * p->h * p->w : NULL};
    const float *b = j.x;
    if (dw && !pointwise) {
      ttd_pool_parallel_for(pool, (size_t)(g * p->c_in), 1, im2col_tasks, &j);
      b = col;
    }
    float *dw_out = dw ? (n0 == 0 ? dw : part) : NULL;
    float *dcol_out = dx ? (pointwise ? j.dx : dcol) : NULL;
    ttd_k_matmul_backward(pool, w, b, dy + n0 * p->c_out * P, g, p->c_out, P, K, 0, 0, 0, K * P, dw_out, dcol_out);
    if (dw && n0 > 0) ttd_k_accumulate(pool, dw, part, nw);
    if (dx && !pointwise) {
      j.col = dcol;
      ttd_pool_parallel_for(pool, (size_t)(g * p->c_in), 1, col2im_tasks, &j);
    }
  }
  free(buf);
}
