/* Elementwise kernels: binary ops with numpy broadcasting and unary activations, forward
 * and backward, and the reductions' backward (a broadcast scale).
 *
 * Broadcasting is planned once per call: the output's dims of size 1 are dropped, each
 * operand gets a stride per output dim (0 where it is broadcast), and neighbouring dims are
 * merged wherever every operand stays linear across them. Equal shapes and scalar operands
 * then collapse to one flat loop; a row broadcast ([m, n] op [n]) becomes m runs of n. The
 * innermost dim of every operand has stride 0 or 1, so the inner loops are the four
 * contiguous/scalar combinations, each vectorized. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_internal.h"
#include "kernels.h"

/* ---- broadcast plan ---- */

#define NOPS 3 /* a, b and (for one backward) a third operand */

typedef struct bplan {
  int ndim; /* >= 1 after planning, innermost last */
  int64_t size[TTD_MAX_DIMS];
  int64_t stride[NOPS][TTD_MAX_DIMS]; /* element strides, 0 on broadcast dims */
  int64_t numel;
} bplan;

/* Strides of shape s (ndim <= os->ndim) aligned right against os, 0 where broadcast. */
static void operand_strides(const ttd_kshape *s, const ttd_kshape *os, int64_t *out) {
  int64_t st = 1;
  for (int i = os->ndim - 1; i >= 0; i--) {
    int j = i - (os->ndim - s->ndim);
    int64_t d = j >= 0 ? s->d[j] : 1;
    out[i] = (d == 1) ? 0 : st;
    st *= d;
  }
}

static void bplan_make(bplan *p, int nops, const ttd_kshape *const *shapes, const ttd_kshape *os) {
  int64_t st[NOPS][TTD_MAX_DIMS];
  for (int k = 0; k < nops; k++) operand_strides(shapes[k], os, st[k]);
  memset(p, 0, sizeof(*p));
  p->numel = ttd_kshape_numel(os);
  for (int i = 0; i < os->ndim; i++) {
    if (os->d[i] == 1) continue;
    int merge = p->ndim > 0;
    for (int k = 0; k < nops && merge; k++)
      if (p->stride[k][p->ndim - 1] != st[k][i] * os->d[i]) merge = 0;
    if (merge) {
      p->size[p->ndim - 1] *= os->d[i];
      for (int k = 0; k < nops; k++) p->stride[k][p->ndim - 1] = st[k][i];
    } else {
      p->size[p->ndim] = os->d[i];
      for (int k = 0; k < nops; k++) p->stride[k][p->ndim] = st[k][i];
      p->ndim++;
    }
  }
  if (p->ndim == 0) { /* every dim is 1: one element */
    p->ndim = 1;
    p->size[0] = 1;
  }
}

/* Walks the plan's flat output range [begin, end) as runs along the innermost dim:
 * calls run(ctx, pos, off, len) with off[k] the offset of operand k at output pos. */
typedef void (*bplan_run_fn)(void *ctx, int64_t pos, const int64_t *off, int64_t len);

static void bplan_walk(const bplan *p, int nops, int64_t begin, int64_t end, bplan_run_fn run, void *ctx) {
  int last = p->ndim - 1;
  int64_t inner = p->size[last];
  int64_t idx[TTD_MAX_DIMS] = {0};
  int64_t off[NOPS] = {0};
  int64_t rest = begin / inner, in = begin % inner;
  for (int d = last - 1; d >= 0; d--) {
    idx[d] = rest % p->size[d];
    rest /= p->size[d];
  }
  for (int k = 0; k < nops; k++) {
    off[k] = in * p->stride[k][last];
    for (int d = 0; d < last; d++) off[k] += idx[d] * p->stride[k][d];
  }
  int64_t pos = begin;
  while (pos < end) {
    int64_t len = inner - in;
    if (len > end - pos) len = end - pos;
    run(ctx, pos, off, len);
    pos += len;
    if (pos >= end) break;
    /* next row: back to the start of the inner dim, carry through the outer dims */
    for (int k = 0; k < nops; k++) off[k] -= in * p->stride[k][last];
    in = 0;
    for (int d = last - 1; d >= 0; d--) {
      idx[d]++;
      for (int k = 0; k < nops; k++) off[k] += p->stride[k][d];
      if (idx[d] < p->size[d]) break;
      for (int k = 0; k < nops; k++) off[k] -= idx[d] * p->stride[k][d];
      idx[d] = 0;
    }
  }
}

/* ---- binary forward ---- */

static inline float bin_apply(ttd_binary_op op, float a, float b) {
  switch (op) {
    case TTD_BIN_ADD: return a + b;
    case TTD_BIN_SUB: return a - b;
    case TTD_BIN_MUL: return a * b;
    case TTD_BIN_DIV: return a / b;
  }
  return 0.0f;
}

TTD_KHOT static void bin_vv(ttd_binary_op op, const float *restrict a, const float *restrict b, float *restrict y,
                            int64_t n) {
  switch (op) {
    case TTD_BIN_ADD: for (int64_t i = 0; i < n; i++) y[i] = a[i] + b[i]; break;
    case TTD_BIN_SUB: for (int64_t i = 0; i < n; i++) y[i] = a[i] - b[i]; break;
    case TTD_BIN_MUL: for (int64_t i = 0; i < n; i++) y[i] = a[i] * b[i]; break;
    case TTD_BIN_DIV: for (int64_t i = 0; i < n; i++) y[i] = a[i] / b[i]; break;
  }
}

TTD_KHOT static void bin_vs(ttd_binary_op op, const float *restrict a, float b, float *restrict y, int64_t n) {
  switch (op) {
    case TTD_BIN_ADD: for (int64_t i = 0; i < n; i++) y[i] = a[i] + b; break;
    case TTD_BIN_SUB: for (int64_t i = 0; i < n; i++) y[i] = a[i] - b; break;
    case TTD_BIN_MUL: for (int64_t i = 0; i < n; i++) y[i] = a[i] * b; break;
    case TTD_BIN_DIV: for (int64_t i = 0; i < n; i++) y[i] = a[i] / b; break;
  }
}

TTD_KHOT static void bin_sv(ttd_binary_op op, float a, const float *restrict b, float *restrict y, int64_t n) {
  switch (op) {
    case TTD_BIN_ADD: for (int64_t i = 0; i < n; i++) y[i] = a + b[i]; break;
    case TTD_BIN_SUB: for (int64_t i = 0; i < n; i++) y[i] = a - b[i]; break;
    case TTD_BIN_MUL: for (int64_t i = 0; i < n; i++) y[i] = a * b[i]; break;
    case TTD_BIN_DIV: for (int64_t i = 0; i < n; i++) y[i] = a / b[i]; break;
  }
}

typedef struct binary_job {
  const bplan *plan;
  ttd_binary_op op;
  const float *a, *b;
  float *y;
  int64_t sa, sb; /* innermost strides: 0 or 1 */
} binary_job;

static void binary_row(void *ctx, int64_t pos, const int64_t *off, int64_t len) {
  binary_job *job = ctx;
  const float *a = job->a + off[0], *b = job->b + off[1];
  float *y = job->y + pos;
  if (job->sa && job->sb) {
    bin_vv(job->op, a, b, y, len);
  } else if (job->sa) {
    bin_vs(job->op, a, *b, y, len);
  } else if (job->sb) {
    bin_sv(job->op, *a, b, y, len);
  } else {
    float v = bin_apply(job->op, *a, *b);
    for (int64_t i = 0; i < len; i++) y[i] = v;
  }
}

static void binary_run(void *ctx, size_t begin, size_t end) {
  binary_job *job = ctx;
  bplan_walk(job->plan, 2, (int64_t)begin, (int64_t)end, binary_row, job);
}

void ttd_k_binary(ttd_pool *pool, ttd_binary_op op, const float *a, const ttd_kshape *as, const float *b,
                  const ttd_kshape *bs, float *out, const ttd_kshape *os) {
  bplan plan;
  const ttd_kshape *shapes[2] = {as, bs};
  bplan_make(&plan, 2, shapes, os);
  if (plan.numel <= 0) return;
  int last = plan.ndim - 1;
  binary_job job = {&plan, op, a, b, out, plan.stride[0][last], plan.stride[1][last]};
  ttd_pool_parallel_for(pool, (size_t)plan.numel, TTD_KGRAIN, binary_run, &job);
}

/* ---- binary backward ---- */

typedef struct scale_job {
  const float *x;
  float *y;
  float s;
} scale_job;

/* No restrict: scale() also runs in place. */
TTD_KHOT static void scale_loop(const float *x, float s, float *y, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = s * x[i];
}

static void scale_run(void *ctx, size_t begin, size_t end) {
  scale_job *job = ctx;
  scale_loop(job->x + begin, job->s, job->y + begin, (int64_t)(end - begin));
}

/* y = s * x (x == y allowed: the loop reads each element before writing it). */
static void scale(ttd_pool *pool, const float *x, float s, float *y, int64_t n) {
  scale_job job = {x, y, s};
  if (n > 0) ttd_pool_parallel_for(pool, (size_t)n, TTD_KGRAIN, scale_run, &job);
}

/* d(a / b)/db = -dy * ((a / b) / b), torch's formula, with dy dense over the output. */
typedef struct div_db_job {
  const bplan *plan;
  const float *a, *b, *dy;
  float *g;
} div_db_job;

static void div_db_row(void *ctx, int64_t pos, const int64_t *off, int64_t len) {
  div_db_job *job = ctx;
  int last = job->plan->ndim - 1;
  int64_t sa = job->plan->stride[0][last], sb = job->plan->stride[1][last];
  const float *a = job->a + off[0], *b = job->b + off[1], *dy = job->dy + pos;
  float *g = job->g + pos;
  for (int64_t i = 0; i < len; i++) g[i] = -dy[i] * ((a[i * sa] / b[i * sb]) / b[i * sb]);
}

static void div_db_run(void *ctx, size_t begin, size_t end) {
  div_db_job *job = ctx;
  bplan_walk(job->plan, 2, (int64_t)begin, (int64_t)end, div_db_row, job);
}

/* Mask of the output dims that operand shape s is broadcast along. */
static uint32_t broadcast_mask(const ttd_kshape *s, const ttd_kshape *os) {
  uint32_t mask = 0;
  for (int i = 0; i < os->ndim; i++) {
    int j = i - (os->ndim - s->ndim);
    int64_t d = j >= 0 ? s->d[j] : 1;
    if (d == 1 && os->d[i] != 1) mask |= 1u << i;
  }
  return mask;
}

/* The operand of a binary op whose gradient is computed. */
typedef enum operand { OPERAND_A, OPERAND_B } operand;

/* The gradient of each output element with respect to operand `which`, dense over the
 * output, into g. */
static void grad_contribution(ttd_pool *pool, ttd_binary_op op, operand which, const float *a, const ttd_kshape *as,
                              const float *b, const ttd_kshape *bs, const float *dy, const ttd_kshape *os, float *g) {
  int64_t n = ttd_kshape_numel(os);
  switch (op) {
    case TTD_BIN_ADD: scale(pool, dy, 1.0f, g, n); break;
    case TTD_BIN_SUB: scale(pool, dy, which == OPERAND_B ? -1.0f : 1.0f, g, n); break;
    case TTD_BIN_MUL:
      if (which == OPERAND_B) ttd_k_binary(pool, TTD_BIN_MUL, dy, os, a, as, g, os);
      else ttd_k_binary(pool, TTD_BIN_MUL, dy, os, b, bs, g, os);
      break;
    case TTD_BIN_DIV:
      if (which == OPERAND_A) {
        ttd_k_binary(pool, TTD_BIN_DIV, dy, os, b, bs, g, os);
      } else {
        bplan plan;
        const ttd_kshape *shapes[2] = {as, bs};
        bplan_make(&plan, 2, shapes, os);
        div_db_job job = {&plan, a, b, dy, g};
        ttd_pool_parallel_for(pool, (size_t)n, TTD_KGRAIN, div_db_run, &job);
      }
      break;
  }
}

/* Without memory for the dense contribution: accumulate it element by element. */
typedef struct fallback_ctx {
  ttd_binary_op op;
  operand which;
  const float *a, *b, *dy;
  float *dx;
  const bplan *plan;
} fallback_ctx;

static void fallback_row(void *ctx, int64_t pos, const int64_t *off, int64_t len) {
  fallback_ctx *f = ctx;
  int last = f->plan->ndim - 1;
  for (int64_t i = 0; i < len; i++) {
    float av = f->a[off[0] + i * f->plan->stride[0][last]];
    float bv = f->b[off[1] + i * f->plan->stride[1][last]];
    float d = f->dy[pos + i], g = 0.0f;
    switch (f->op) {
      case TTD_BIN_ADD: g = d; break;
      case TTD_BIN_SUB: g = f->which == OPERAND_B ? -d : d; break;
      case TTD_BIN_MUL: g = d * (f->which == OPERAND_B ? av : bv); break;
      case TTD_BIN_DIV: g = f->which == OPERAND_B ? -d * ((av / bv) / bv) : d / bv; break;
    }
    f->dx[off[2] + i * f->plan->stride[2][last]] += g;
  }
}

static void grad_one(ttd_pool *pool, ttd_binary_op op, operand which, const float *a, const ttd_kshape *as,
                     const float *b, const ttd_kshape *bs, const float *dy, const ttd_kshape *os, float *dx) {
  const ttd_kshape *xs = which == OPERAND_B ? bs : as;
  int64_t nx = ttd_kshape_numel(xs), ny = ttd_kshape_numel(os);
  if (nx <= 0) return;
  if (ny <= 0) { /* an empty output broadcasts nothing back */
    memset(dx, 0, (size_t)nx * sizeof(float));
    return;
  }
  if (nx == ny) { /* not broadcast: the contribution is the gradient */
    grad_contribution(pool, op, which, a, as, b, bs, dy, os, dx);
    return;
  }
  uint32_t mask = broadcast_mask(xs, os);
  if (op == TTD_BIN_ADD || op == TTD_BIN_SUB) { /* sum dy itself, no temporary */
    ttd_k_reduce(pool, TTD_RED_SUM, dy, os, mask, dx);
    if (op == TTD_BIN_SUB && which == OPERAND_B) scale(pool, dx, -1.0f, dx, nx);
    return;
  }
  float *g = malloc((size_t)ny * sizeof(float));
  if (g) {
    grad_contribution(pool, op, which, a, as, b, bs, dy, os, g);
    ttd_k_reduce(pool, TTD_RED_SUM, g, os, mask, dx);
    free(g);
    return;
  }
  bplan plan;
  const ttd_kshape *shapes[3] = {as, bs, xs};
  bplan_make(&plan, 3, shapes, os);
  memset(dx, 0, (size_t)nx * sizeof(float));
  fallback_ctx f = {op, which, a, b, dy, dx, &plan};
  bplan_walk(&plan, 3, 0, ny, fallback_row, &f);
}

void ttd_k_binary_backward(ttd_pool *pool, ttd_binary_op op, const float *a, const ttd_kshape *as, const float *b,
                           const ttd_kshape *bs, const float *dy, const ttd_kshape *os, float *da, float *db) {
  if (da) grad_one(pool, op, OPERAND_A, a, as, b, bs, dy, os, da);
  if (db) grad_one(pool, op, OPERAND_B, a, as, b, bs, dy, os, db);
}

/* ---- reductions' backward ---- */

void ttd_k_reduce_backward(ttd_pool *pool, ttd_reduce_op op, const float *dy, const ttd_kshape *xs, uint32_t axes_mask,
                           float *dx) {
  ttd_kshape ys = *xs;
  int64_t count = 1;
  for (int i = 0; i < xs->ndim; i++) {
    if ((axes_mask >> i) & 1u) {
      count *= xs->d[i];
      ys.d[i] = 1;
    }
  }
  static const ttd_kshape scalar = {0};
  /* dx = dy broadcast over the reduced dims, divided by the count for a mean (as torch) */
  float k = op == TTD_RED_MEAN ? (float)count : 1.0f;
  ttd_k_binary(pool, op == TTD_RED_MEAN ? TTD_BIN_DIV : TTD_BIN_MUL, dy, &ys, &k, &scalar, dx, xs);
}

/* ---- unary ---- */

#define INV_SQRT2 0.70710678118654752440f
#define INV_SQRT_2PI 0.39894228040143267794f

/* Phi(x) = 0.5 erfc(-x / sqrt 2): the same function as 0.5 (1 + erf(x / sqrt 2)), without
 * the cancellation for negative x. */
static inline float std_normal_cdf(float x) { return 0.5f * erfcf(-x * INV_SQRT2); }

/* torch's threshold_backward(dy, relu(x), 0): 0 where the value is <= 0, else dy, so a NaN
 * input passes its gradient through. */
TTD_KHOT static void relu_backward_loop(const float *restrict x, const float *restrict dy, float *restrict dx,
                                        int64_t n) {
  for (int64_t i = 0; i < n; i++) dx[i] = x[i] <= 0.0f ? 0.0f : dy[i];
}

/* The unary ops whose dx is dy times a factor of one value: y for exp, sigmoid and tanh, x
 * for log. */
typedef enum dy_factor { DY_FACTOR_EXP, DY_FACTOR_SIGMOID, DY_FACTOR_TANH, DY_FACTOR_LOG } dy_factor;

TTD_KHOT static void mul3_loop(const float *restrict dy, const float *restrict y, float *restrict dx, int64_t n,
                               dy_factor kind) {
  switch (kind) {
    case DY_FACTOR_EXP: for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * y[i]; break;
    case DY_FACTOR_SIGMOID: for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * (y[i] * (1.0f - y[i])); break;
    case DY_FACTOR_TANH: for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * (1.0f - y[i] * y[i]); break;
    case DY_FACTOR_LOG: for (int64_t i = 0; i < n; i++) dx[i] = dy[i] / y[i]; break; /* log: y is x */
  }
}

TTD_KHOT static void unary_loop(ttd_unary_op op, const float *restrict x, float *restrict y, int64_t n) {
  switch (op) {
    case TTD_UN_RELU: for (int64_t i = 0; i < n; i++) y[i] = x[i] < 0.0f ? 0.0f : x[i]; break; /* NaN stays */
    case TTD_UN_GELU: for (int64_t i = 0; i < n; i++) y[i] = x[i] * std_normal_cdf(x[i]); break;
    case TTD_UN_SIGMOID:
      ttd_kexpf_n(y, x, -1.0f, 0.0f, n);
      for (int64_t i = 0; i < n; i++) y[i] = 1.0f / (1.0f + y[i]);
      break;
    case TTD_UN_TANH: for (int64_t i = 0; i < n; i++) y[i] = tanhf(x[i]); break;
    case TTD_UN_EXP: ttd_kexpf_n(y, x, 1.0f, 0.0f, n); break;
    case TTD_UN_LOG: for (int64_t i = 0; i < n; i++) y[i] = logf(x[i]); break;
  }
}

typedef struct unary_job {
  ttd_unary_op op;
  const float *x, *y, *dy;
  float *out;
} unary_job;

static void unary_run(void *ctx, size_t begin, size_t end) {
  unary_job *job = ctx;
  unary_loop(job->op, job->x + begin, job->out + begin, (int64_t)(end - begin));
}

void ttd_k_unary(ttd_pool *pool, ttd_unary_op op, const float *x, float *y, int64_t n) {
  if (n <= 0) return;
  unary_job job = {op, x, NULL, NULL, y};
  ttd_pool_parallel_for(pool, (size_t)n, TTD_KGRAIN, unary_run, &job);
}

/* Backward over [0, n) of one chunk. Uses y where the derivative is cheapest from it
 * (sigmoid, tanh, exp) and recomputes it from x when y is NULL; relu also accepts x == NULL
 * (then y decides: y <= 0 exactly when x <= 0). */
static void unary_backward_loop(ttd_unary_op op, const float *restrict x, const float *restrict y,
                                const float *restrict dy, float *restrict dx, int64_t n) {
  switch (op) {
    case TTD_UN_RELU: relu_backward_loop(x ? x : y, dy, dx, n); break;
    case TTD_UN_GELU:
      for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        dx[i] = dy[i] * (std_normal_cdf(v) + v * INV_SQRT_2PI * ttd_kexpf(-0.5f * v * v));
      }
      break;
    case TTD_UN_SIGMOID:
    case TTD_UN_TANH:
    case TTD_UN_EXP: {
      dy_factor kind = op == TTD_UN_EXP ? DY_FACTOR_EXP : op == TTD_UN_SIGMOID ? DY_FACTOR_SIGMOID : DY_FACTOR_TANH;
      if (y) {
        mul3_loop(dy, y, dx, n, kind);
      } else {
        float t[256];
        for (int64_t i = 0; i < n; i += 256) {
          int64_t len = n - i < 256 ? n - i : 256;
          unary_loop(op, x + i, t, len);
          mul3_loop(dy + i, t, dx + i, len, kind);
        }
      }
      break;
    }
    case TTD_UN_LOG: mul3_loop(dy, x, dx, n, DY_FACTOR_LOG); break;
  }
}

static void unary_backward_run(void *ctx, size_t begin, size_t end) {
  unary_job *job = ctx;
  unary_backward_loop(job->op, job->x ? job->x + begin : NULL, job->y ? job->y + begin : NULL, job->dy + begin,
                      job->out + begin, (int64_t)(end - begin));
}

void ttd_k_unary_backward(ttd_pool *pool, ttd_unary_op op, const float *x, const float *y, const float *dy, float *dx,
                          int64_t n) {
  if (n <= 0 || !dx) return;
  unary_job job = {op, x, y, dy, dx};
  ttd_pool_parallel_for(pool, (size_t)n, TTD_KGRAIN, unary_backward_run, &job);
}
