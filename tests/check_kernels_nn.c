/* kernels.h, the network half: matmul, linear, conv2d, max/avg pool2d, layer_norm,
 * embedding and dropout. Forwards are checked against direct double-precision references
 * on random inputs of odd sizes, backwards against central finite differences of
 * sum(dy * f(x)) taken through the float forward itself, and the pool must not change
 * any result. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/kernels.h"
#include "suites.h"

/* ---- helpers ---- */

/* A check inside a per-element loop: Check reports every passing ck_assert through a pipe,
 * which millions of elements make slow, so only a failing one reaches Check. */
#define CHECK_EACH(cond, ...)               \
  do {                                      \
    if (!(cond)) ck_abort_msg(__VA_ARGS__); \
  } while (0)

/* splitmix64: a deterministic stream for the randomised tests. */
static uint64_t next_random(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* uniform in [lo, hi) */
static float rand_float(uint64_t *state, float lo, float hi) {
  return lo + (hi - lo) * (float)((double)(next_random(state) >> 11) * 0x1.0p-53);
}

static float *rand_buf(uint64_t *state, int64_t n, float lo, float hi) {
  float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
  ck_assert_ptr_nonnull(x);
  for (int64_t i = 0; i < n; i++) x[i] = rand_float(state, lo, hi);
  return x;
}

/* A buffer full of NaN, so that anything a kernel forgets to write shows. */
static float *nan_buf(int64_t n) {
  float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
  ck_assert_ptr_nonnull(x);
  for (int64_t i = 0; i < n; i++) x[i] = NAN;
  return x;
}

static double *dbuf(int64_t n) {
  double *x = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
  ck_assert_ptr_nonnull(x);
  return x;
}

/* Every got[i] within abs + rel * |want[i]| of want[i]. */
static void assert_close(const char *what, const float *got, const double *want, int64_t n, double rel,
                         double abs_tol) {
  for (int64_t i = 0; i < n; i++) {
    double err = fabs((double)got[i] - want[i]);
    CHECK_EACH(err <= abs_tol + rel * fabs(want[i]), "%s[%lld]: got %.9g, want %.9g", what, (long long)i,
               (double)got[i], want[i]);
  }
}

/* Runs the float forward under test, writing y. */
typedef void (*forward_fn)(void *ctx, float *y);

/* sum(dy * f(x)) in double. */
static double objective(void *ctx, forward_fn f, float *y, const float *dy, int64_t ny) {
  f(ctx, y);
  double s = 0.0;
  for (int64_t i = 0; i < ny; i++) s += (double)dy[i] * (double)y[i];
  return s;
}

/* The analytic gradient grad[np] of sum(dy * f) with respect to param[np] (an input that
 * f reads) against central differences with step h; param is restored. */
static void check_grad(const char *what, void *ctx, forward_fn f, int64_t ny, const float *dy, float *param, int64_t np,
                       const float *grad, float h) {
  float *y = nan_buf(ny);
  for (int64_t i = 0; i < np; i++) {
    float orig = param[i], up = orig + h, down = orig - h;
    param[i] = up;
    double fp = objective(ctx, f, y, dy, ny);
    param[i] = down;
    double fm = objective(ctx, f, y, dy, ny);
    param[i] = orig;
    double fd = (fp - fm) / ((double)up - (double)down);
    CHECK_EACH(fabs(fd - grad[i]) <= 1e-3 + 1e-2 * fabs(fd), "%s[%lld]: analytic %.7g, finite difference %.7g", what,
               (long long)i, (double)grad[i], fd);
  }
  free(y);
}

/* ---- matmul ---- */

/* C = op(A) op(B) for one problem in double: A stored [m,k] (or [k,m] when ta), B [k,n] (or [n,k]). */
static void ref_matmul(const float *a, const float *b, double *c, int64_t m, int64_t n, int64_t k, int ta, int tb) {
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double s = 0.0;
      for (int64_t p = 0; p < k; p++) {
        double av = ta ? a[p * m + i] : a[i * k + p];
        double bv = tb ? b[j * k + p] : b[p * n + j];
        s += av * bv;
      }
      c[i * n + j] = s;
    }
}

/* Tolerance for a float dot product of length k of values in [-1, 1]. */
static double dot_tol(int64_t k) { return 1e-6 * (double)(k + 1); }

/* Odd sizes from 1x1x1 to several K blocks and C tiles, all four transpose combinations, match double. */
START_TEST(test_matmul_forward) {
  static const int64_t sizes[][3] = {{1, 1, 1},    {7, 13, 5},      {65, 33, 129}, {1, 40, 3},
                                     {19, 1, 300}, {131, 530, 301}, {301, 17, 40}};
  uint64_t rng = 1;
  for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++)
    for (int t = 0; t < 4; t++) {
      int64_t m = sizes[s][0], n = sizes[s][1], k = sizes[s][2];
      int ta = t & 1, tb = t >> 1;
      float *a = rand_buf(&rng, m * k, -1, 1), *b = rand_buf(&rng, k * n, -1, 1), *c = nan_buf(m * n);
      double *want = dbuf(m * n);
      ttd_k_matmul(NULL, a, b, c, 1, m, n, k, ta, tb, 0, 0);
      ref_matmul(a, b, want, m, n, k, ta, tb);
      char what[64];
      snprintf(what, sizeof(what), "C %lldx%lldx%lld ta=%d tb=%d", (long long)m, (long long)n, (long long)k, ta, tb);
      assert_close(what, c, want, m * n, 1e-5, dot_tol(k));
      free(a), free(b), free(c), free(want);
    }
}
END_TEST

/* Batch 3 with B broadcast, and A broadcast with B spaced wider than a matrix: each problem is right. */
START_TEST(test_matmul_batched_broadcast) {
  const int64_t batch = 3, m = 9, n = 21, k = 17;
  uint64_t rng = 2;
  for (int t = 0; t < 4; t++)
    for (int which = 0; which < 2; which++) {
      int ta = t & 1, tb = t >> 1;
      int64_t as = which == 0 ? m * k : 0, bs = which == 0 ? 0 : k * n + 5;
      float *a = rand_buf(&rng, as ? batch * as : m * k, -1, 1);
      float *b = rand_buf(&rng, bs ? batch * bs : k * n, -1, 1);
      float *c = nan_buf(batch * m * n);
      double *want = dbuf(m * n);
      ttd_k_matmul(NULL, a, b, c, batch, m, n, k, ta, tb, as, bs);
      for (int64_t q = 0; q < batch; q++) {
        ref_matmul(a + q * as, b + q * bs, want, m, n, k, ta, tb);
        assert_close(which ? "C (A broadcast)" : "C (B broadcast)", c + q * m * n, want, m * n, 1e-5, dot_tol(k));
      }
      free(a), free(b), free(c), free(want);
    }
}
END_TEST

/* k = 0 gives an all-zero C; m = 0 or batch = 0 writes nothing; batch 0 broadcast grads are 0. */
START_TEST(test_matmul_empty) {
  float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, c[12];
  for (int i = 0; i < 12; i++) c[i] = NAN;
  ttd_k_matmul(NULL, a, b, c, 2, 2, 3, 0, 0, 0, 0, 0);
  for (int i = 0; i < 12; i++) CHECK_EACH(c[i] == 0.0f, "c[%d] = %g", i, (double)c[i]);
  for (int i = 0; i < 12; i++) c[i] = 42.0f;
  ttd_k_matmul(NULL, a, b, c, 2, 0, 3, 2, 0, 0, 0, 0);
  ttd_k_matmul(NULL, a, b, c, 0, 2, 3, 2, 0, 0, 0, 0);
  for (int i = 0; i < 12; i++) CHECK_EACH(c[i] == 42.0f, "c[%d] = %g", i, (double)c[i]);
  /* the gradient of a broadcast operand over no problems is a zero sum */
  float da[4] = {NAN, NAN, NAN, NAN};
  ttd_k_matmul_backward(NULL, a, b, c, 0, 2, 3, 2, 0, 0, 0, 6, da, NULL);
  for (int i = 0; i < 4; i++) CHECK_EACH(da[i] == 0.0f, "da[%d] = %g", i, (double)da[i]);
}
END_TEST

typedef struct mm_ctx {
  const float *a, *b;
  int64_t batch, m, n, k, as, bs;
  int ta, tb;
} mm_ctx;

static void mm_forward(void *ctx, float *y) {
  mm_ctx *c = ctx;
  ttd_k_matmul(NULL, c->a, c->b, y, c->batch, c->m, c->n, c->k, c->ta, c->tb, c->as, c->bs);
}

/* dA, dB match finite differences for all transposes, per-problem and broadcast (batch-summed) operands. */
START_TEST(test_matmul_backward_fd) {
  const int64_t batch = 2, m = 3, n = 4, k = 5;
  uint64_t rng = 3;
  for (int t = 0; t < 4; t++)
    for (int bc = 0; bc < 3; bc++) {
      mm_ctx c = {.batch = batch, .m = m, .n = n, .k = k, .ta = t & 1, .tb = t >> 1};
      c.as = bc == 1 ? 0 : m * k;
      c.bs = bc == 2 ? 0 : k * n;
      int64_t na = c.as ? batch * c.as : m * k, nb = c.bs ? batch * c.bs : k * n, ny = batch * m * n;
      float *a = rand_buf(&rng, na, -1, 1), *b = rand_buf(&rng, nb, -1, 1), *dy = rand_buf(&rng, ny, -1, 1);
      float *da = nan_buf(na), *db = nan_buf(nb);
      c.a = a, c.b = b;
      ttd_k_matmul_backward(NULL, a, b, dy, batch, m, n, k, c.ta, c.tb, c.as, c.bs, da, db);
      check_grad("dA", &c, mm_forward, ny, dy, a, na, da, 1e-2f);
      check_grad("dB", &c, mm_forward, ny, dy, b, nb, db, 1e-2f);
      /* one gradient alone is the same gradient */
      float *da2 = nan_buf(na), *db2 = nan_buf(nb);
      ttd_k_matmul_backward(NULL, a, b, dy, batch, m, n, k, c.ta, c.tb, c.as, c.bs, da2, NULL);
      ttd_k_matmul_backward(NULL, a, b, dy, batch, m, n, k, c.ta, c.tb, c.as, c.bs, NULL, db2);
      ck_assert(memcmp(da, da2, (size_t)na * sizeof(float)) == 0);
      ck_assert(memcmp(db, db2, (size_t)nb * sizeof(float)) == 0);
      free(a), free(b), free(dy), free(da), free(db), free(da2), free(db2);
    }
}
END_TEST

/* Past one K block and C tile, B broadcast over batch 3: dA and batch-summed dB match double. */
START_TEST(test_matmul_backward_large) {
  const int64_t batch = 3, m = 65, n = 130, k = 270;
  uint64_t rng = 4;
  for (int t = 0; t < 4; t++) {
    int ta = t & 1, tb = t >> 1;
    float *a = rand_buf(&rng, batch * m * k, -1, 1), *b = rand_buf(&rng, k * n, -1, 1);
    float *dy = rand_buf(&rng, batch * m * n, -1, 1);
    float *da = nan_buf(batch * m * k), *db = nan_buf(k * n);
    ttd_k_matmul_backward(NULL, a, b, dy, batch, m, n, k, ta, tb, m * k, 0, da, db);
    double *want_a = dbuf(batch * m * k), *want_b = dbuf(k * n);
    for (int64_t q = 0; q < batch; q++) {
      const float *aq = a + q * m * k, *dq = dy + q * m * n;
      for (int64_t i = 0; i < m; i++)
        for (int64_t p = 0; p < k; p++) {
          double s = 0.0;
          for (int64_t j = 0; j < n; j++) s += (double)dq[i * n + j] * (tb ? b[j * k + p] : b[p * n + j]);
          want_a[q * m * k + (ta ? p * m + i : i * k + p)] = s;
        }
      for (int64_t p = 0; p < k; p++)
        for (int64_t j = 0; j < n; j++) {
          double s = 0.0;
          for (int64_t i = 0; i < m; i++) s += (double)(ta ? aq[p * m + i] : aq[i * k + p]) * dq[i * n + j];
          want_b[tb ? j * k + p : p * n + j] += s;
        }
    }
    assert_close("dA", da, want_a, batch * m * k, 1e-5, dot_tol(n));
    assert_close("dB", db, want_b, k * n, 1e-5, dot_tol(batch * m));
    free(a), free(b), free(dy), free(da), free(db), free(want_a), free(want_b);
  }
}
END_TEST

/* A NULL pool and a 4-thread pool give bit-identical C, dA and dB. */
START_TEST(test_matmul_pool_identical) {
  ttd_pool *pool = ttd_pool_create(4);
  ck_assert_ptr_nonnull(pool);
  const int64_t batch = 2, m = 200, n = 150, k = 300;
  uint64_t rng = 5;
  for (int t = 0; t < 4; t++) {
    int ta = t & 1, tb = t >> 1;
    float *a = rand_buf(&rng, batch * m * k, -1, 1), *b = rand_buf(&rng, k * n, -1, 1);
    float *dy = rand_buf(&rng, batch * m * n, -1, 1);
    float *c1 = nan_buf(batch * m * n), *c4 = nan_buf(batch * m * n);
    float *da1 = nan_buf(batch * m * k), *da4 = nan_buf(batch * m * k), *db1 = nan_buf(k * n), *db4 = nan_buf(k * n);
    ttd_k_matmul(NULL, a, b, c1, batch, m, n, k, ta, tb, m * k, 0);
    ttd_k_matmul(pool, a, b, c4, batch, m, n, k, ta, tb, m * k, 0);
    ttd_k_matmul_backward(NULL, a, b, dy, batch, m, n, k, ta, tb, m * k, 0, da1, db1);
    ttd_k_matmul_backward(pool, a, b, dy, batch, m, n, k, ta, tb, m * k, 0, da4, db4);
    ck_assert(memcmp(c1, c4, (size_t)(batch * m * n) * sizeof(float)) == 0);
    ck_assert(memcmp(da1, da4, (size_t)(batch * m * k) * sizeof(float)) == 0);
    ck_assert(memcmp(db1, db4, (size_t)(k * n) * sizeof(float)) == 0);
    ck_assert(!isnan(c4[0]) && !isnan(da4[0]) && !isnan(db4[0]));
    free(a), free(b), free(dy), free(c1), free(c4), free(da1), free(da4), free(db1), free(db4);
  }
  ttd_pool_destroy(pool);
}
END_TEST

/* ---- linear ---- */

/* y = x W^T + bias, with and without bias, against the double reference. */
START_TEST(test_linear_forward) {
  static const int64_t sizes[][3] = {{7, 13, 5}, {33, 65, 17}, {1, 1, 1}};
  uint64_t rng = 6;
  for (size_t s = 0; s < 3; s++)
    for (int with_bias = 0; with_bias < 2; with_bias++) {
      int64_t n = sizes[s][0], in = sizes[s][1], out = sizes[s][2];
      float *x = rand_buf(&rng, n * in, -1, 1), *w = rand_buf(&rng, out * in, -1, 1),
            *bias = rand_buf(&rng, out, -1, 1);
      float *y = nan_buf(n * out);
      double *want = dbuf(n * out);
      ttd_k_linear(NULL, x, w, with_bias ? bias : NULL, n, in, out, y);
      for (int64_t i = 0; i < n; i++)
        for (int64_t o = 0; o < out; o++) {
          double acc = with_bias ? bias[o] : 0.0;
          for (int64_t p = 0; p < in; p++) acc += (double)x[i * in + p] * w[o * in + p];
          want[i * out + o] = acc;
        }
      assert_close("y", y, want, n * out, 1e-5, dot_tol(in));
      free(x), free(w), free(bias), free(y), free(want);
    }
}
END_TEST

typedef struct linear_ctx {
  const float *x, *w, *bias;
  int64_t n, in, out;
} linear_ctx;

static void linear_forward(void *ctx, float *y) {
  linear_ctx *c = ctx;
  ttd_k_linear(NULL, c->x, c->w, c->bias, c->n, c->in, c->out, y);
}

/* dx, dW and dbias against finite differences; NULL outputs are skipped. */
START_TEST(test_linear_backward_fd) {
  uint64_t rng = 7;
  linear_ctx c = {.n = 4, .in = 5, .out = 3};
  float *x = rand_buf(&rng, c.n * c.in, -1, 1), *w = rand_buf(&rng, c.out * c.in, -1, 1);
  float *bias = rand_buf(&rng, c.out, -1, 1), *dy = rand_buf(&rng, c.n * c.out, -1, 1);
  float *dx = nan_buf(c.n * c.in), *dw = nan_buf(c.out * c.in), *db = nan_buf(c.out);
  c.x = x, c.w = w, c.bias = bias;
  ttd_k_linear_backward(NULL, x, w, dy, c.n, c.in, c.out, dx, dw, db);
  check_grad("dx", &c, linear_forward, c.n * c.out, dy, x, c.n * c.in, dx, 1e-2f);
  check_grad("dW", &c, linear_forward, c.n * c.out, dy, w, c.out * c.in, dw, 1e-2f);
  check_grad("dbias", &c, linear_forward, c.n * c.out, dy, bias, c.out, db, 1e-2f);
  float *db2 = nan_buf(c.out);
  ttd_k_linear_backward(NULL, x, w, dy, c.n, c.in, c.out, NULL, NULL, db2);
  ck_assert(memcmp(db, db2, (size_t)c.out * sizeof(float)) == 0);
  free(x), free(w), free(bias), free(dy), free(dx), free(dw), free(db), free(db2);
}
END_TEST

/* ---- conv2d ---- */

static void ref_conv(const ttd_conv2d_params *p, const float *x, const float *w, const float *bias, double *y) {
  for (int64_t g = 0; g < p->n; g++)
    for (int64_t co = 0; co < p->c_out; co++)
      for (int64_t oi = 0; oi < p->out_h; oi++)
        for (int64_t oj = 0; oj < p->out_w; oj++) {
          double s = bias ? bias[co] : 0.0;
          for (int64_t c = 0; c < p->c_in; c++)
            for (int64_t ki = 0; ki < p->kh; ki++)
              for (int64_t kj = 0; kj < p->kw; kj++) {
                int64_t ii = oi * p->stride_h - p->pad_h + ki, jj = oj * p->stride_w - p->pad_w + kj;
                if (ii < 0 || ii >= p->h || jj < 0 || jj >= p->w) continue;
                s += (double)x[((g * p->c_in + c) * p->h + ii) * p->w + jj] *
                     w[((co * p->c_in + c) * p->kh + ki) * p->kw + kj];
              }
          y[((g * p->c_out + co) * p->out_h + oi) * p->out_w + oj] = s;
        }
}

static ttd_conv2d_params conv_params(int64_t n, int64_t c_in, int64_t h, int64_t w, int64_t c_out, int64_t kh,
                                     int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
  ttd_conv2d_params p = {.n = n,
                         .c_in = c_in,
                         .h = h,
                         .w = w,
                         .c_out = c_out,
                         .kh = kh,
                         .kw = kw,
                         .stride_h = sh,
                         .stride_w = sw,
                         .pad_h = ph,
                         .pad_w = pw};
  ck_assert_int_eq(ttd_conv2d_params_finish(&p), 0);
  return p;
}

/* Strided, padded, non-square and 1x1 convolutions, with and without bias, match double. */
START_TEST(test_conv_forward) {
  ttd_conv2d_params cases[] = {
      conv_params(2, 3, 7, 6, 4, 3, 2, 2, 2, 1, 1), conv_params(1, 2, 9, 5, 3, 2, 3, 2, 1, 0, 1),
      conv_params(3, 5, 4, 7, 2, 1, 1, 1, 1, 0, 0), conv_params(2, 1, 5, 5, 1, 5, 5, 1, 1, 2, 2),
      conv_params(1, 4, 6, 6, 3, 1, 1, 2, 2, 1, 0),
  };
  uint64_t rng = 8;
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
    for (int with_bias = 0; with_bias < 2; with_bias++) {
      const ttd_conv2d_params *p = &cases[i];
      int64_t nx = p->n * p->c_in * p->h * p->w, nw = p->c_out * p->c_in * p->kh * p->kw;
      int64_t ny = p->n * p->c_out * p->out_h * p->out_w;
      float *x = rand_buf(&rng, nx, -1, 1), *w = rand_buf(&rng, nw, -1, 1), *bias = rand_buf(&rng, p->c_out, -1, 1);
      float *y = nan_buf(ny);
      double *want = dbuf(ny);
      ttd_k_conv2d(NULL, p, x, w, with_bias ? bias : NULL, y);
      ref_conv(p, x, w, with_bias ? bias : NULL, want);
      char what[32];
      snprintf(what, sizeof(what), "case %zu y", i);
      assert_close(what, y, want, ny, 1e-5, dot_tol(p->c_in * p->kh * p->kw));
      free(x), free(w), free(bias), free(y), free(want);
    }
}
END_TEST

typedef struct conv_ctx {
  const ttd_conv2d_params *p;
  const float *x, *w, *bias;
} conv_ctx;

static void conv_forward(void *ctx, float *y) {
  conv_ctx *c = ctx;
  ttd_k_conv2d(NULL, c->p, c->x, c->w, c->bias, y);
}

/* dx, dW, dbias match finite differences (strided padded non-square, and 1x1); NULL outputs skipped. */
START_TEST(test_conv_backward_fd) {
  ttd_conv2d_params cases[] = {conv_params(2, 2, 5, 4, 3, 3, 2, 2, 1, 1, 1),
                               conv_params(2, 3, 3, 2, 2, 1, 1, 1, 1, 0, 0)};
  uint64_t rng = 9;
  for (size_t i = 0; i < 2; i++) {
    const ttd_conv2d_params *p = &cases[i];
    int64_t nx = p->n * p->c_in * p->h * p->w, nw = p->c_out * p->c_in * p->kh * p->kw;
    int64_t ny = p->n * p->c_out * p->out_h * p->out_w;
    float *x = rand_buf(&rng, nx, -1, 1), *w = rand_buf(&rng, nw, -1, 1), *bias = rand_buf(&rng, p->c_out, -1, 1);
    float *dy = rand_buf(&rng, ny, -1, 1);
    float *dx = nan_buf(nx), *dw = nan_buf(nw), *db = nan_buf(p->c_out);
    conv_ctx c = {.p = p, .x = x, .w = w, .bias = bias};
    ttd_k_conv2d_backward(NULL, p, x, w, dy, dx, dw, db);
    check_grad("dx", &c, conv_forward, ny, dy, x, nx, dx, 1e-2f);
    check_grad("dW", &c, conv_forward, ny, dy, w, nw, dw, 1e-2f);
    check_grad("dbias", &c, conv_forward, ny, dy, bias, p->c_out, db, 1e-2f);
    float *dx2 = nan_buf(nx), *dw2 = nan_buf(nw);
    ttd_k_conv2d_backward(NULL, p, x, w, dy, dx2, NULL, NULL);
    ttd_k_conv2d_backward(NULL, p, x, w, dy, NULL, dw2, NULL);
    ck_assert(memcmp(dx, dx2, (size_t)nx * sizeof(float)) == 0);
    ck_assert(memcmp(dw, dw2, (size_t)nw * sizeof(float)) == 0);
    free(x), free(w), free(bias), free(dy), free(dx), free(dw), free(db), free(dx2), free(dw2);
  }
}
END_TEST

/* A batch over one column buffer (several groups): y, dx, dW, dbias match double; 4 threads identical. */
START_TEST(test_conv_many_images) {
  ttd_conv2d_params p = conv_params(40, 3, 64, 64, 8, 3, 3, 1, 1, 1, 1);
  int64_t nx = p.n * p.c_in * p.h * p.w, nw = p.c_out * p.c_in * p.kh * p.kw, P = p.out_h * p.out_w;
  int64_t ny = p.n * p.c_out * P;
  uint64_t rng = 10;
  float *x = rand_buf(&rng, nx, -1, 1), *w = rand_buf(&rng, nw, -1, 1), *bias = rand_buf(&rng, p.c_out, -1, 1);
  float *dy = rand_buf(&rng, ny, -1, 1);
  float *y = nan_buf(ny), *dx = nan_buf(nx), *dw = nan_buf(nw), *db = nan_buf(p.c_out);
  ttd_k_conv2d(NULL, &p, x, w, bias, y);
  ttd_k_conv2d_backward(NULL, &p, x, w, dy, dx, dw, db);

  double *want_y = dbuf(ny), *want_dx = dbuf(nx), *want_dw = dbuf(nw), *want_db = dbuf(p.c_out);
  ref_conv(&p, x, w, bias, want_y);
  for (int64_t g = 0; g < p.n; g++)
    for (int64_t co = 0; co < p.c_out; co++)
      for (int64_t oi = 0; oi < p.out_h; oi++)
        for (int64_t oj = 0; oj < p.out_w; oj++) {
          double d = dy[((g * p.c_out + co) * p.out_h + oi) * p.out_w + oj];
          want_db[co] += d;
          for (int64_t c = 0; c < p.c_in; c++)
            for (int64_t ki = 0; ki < p.kh; ki++)
              for (int64_t kj = 0; kj < p.kw; kj++) {
                int64_t ii = oi - p.pad_h + ki, jj = oj - p.pad_w + kj;
                if (ii < 0 || ii >= p.h || jj < 0 || jj >= p.w) continue;
                int64_t xi = ((g * p.c_in + c) * p.h + ii) * p.w + jj, wi = ((co * p.c_in + c) * p.kh + ki) * p.kw + kj;
                want_dx[xi] += d * w[wi];
                want_dw[wi] += d * x[xi];
              }
        }
  assert_close("y", y, want_y, ny, 1e-5, dot_tol(27));
  assert_close("dx", dx, want_dx, nx, 1e-5, dot_tol(72));
  assert_close("dW", dw, want_dw, nw, 1e-4, 1e-2);
  assert_close("dbias", db, want_db, p.c_out, 1e-5, 1e-3);

  ttd_pool *pool = ttd_pool_create(4);
  ck_assert_ptr_nonnull(pool);
  float *y4 = nan_buf(ny), *dx4 = nan_buf(nx), *dw4 = nan_buf(nw), *db4 = nan_buf(p.c_out);
  ttd_k_conv2d(pool, &p, x, w, bias, y4);
  ttd_k_conv2d_backward(pool, &p, x, w, dy, dx4, dw4, db4);
  ck_assert(memcmp(y, y4, (size_t)ny * sizeof(float)) == 0);
  ck_assert(memcmp(dx, dx4, (size_t)nx * sizeof(float)) == 0);
  ck_assert(memcmp(dw, dw4, (size_t)nw * sizeof(float)) == 0);
  ck_assert(memcmp(db, db4, (size_t)p.c_out * sizeof(float)) == 0);
  ttd_pool_destroy(pool);
  free(x), free(w), free(bias), free(dy), free(y), free(dx), free(dw), free(db);
  free(want_y), free(want_dx), free(want_dw), free(want_db), free(y4), free(dx4), free(dw4), free(db4);
}
END_TEST

/* params_finish computes out sizes; refuses stride < 1, padding < 0, too big a window, no channels. */
START_TEST(test_conv_params) {
  ttd_conv2d_params p = {.n = 1,
                         .c_in = 2,
                         .h = 7,
                         .w = 6,
                         .c_out = 3,
                         .kh = 3,
                         .kw = 2,
                         .stride_h = 2,
                         .stride_w = 3,
                         .pad_h = 1,
                         .pad_w = 0};
  ck_assert_int_eq(ttd_conv2d_params_finish(&p), 0);
  ck_assert_int_eq(p.out_h, 4);
  ck_assert_int_eq(p.out_w, 2);
  ttd_conv2d_params bad = p;
  bad.stride_h = 0;
  ck_assert_int_eq(ttd_conv2d_params_finish(&bad), -1);
  bad = p;
  bad.pad_w = -1;
  ck_assert_int_eq(ttd_conv2d_params_finish(&bad), -1);
  bad = p;
  bad.kh = 10;
  ck_assert_int_eq(ttd_conv2d_params_finish(&bad), -1);
  bad = p;
  bad.kw = 7; /* 6 + 0 < 7 */
  ck_assert_int_eq(ttd_conv2d_params_finish(&bad), -1);
  bad = p;
  bad.c_in = 0;
  ck_assert_int_eq(ttd_conv2d_params_finish(&bad), -1);
}
END_TEST

/* ---- pooling ---- */

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
    int64_t j = (int64_t)(next_random(rng) % (uint64_t)(i + 1));
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
      float *y = nan_buf(ny);
      int32_t *am = malloc((size_t)ny * sizeof(int32_t)), *want_am = malloc((size_t)ny * sizeof(int32_t));
      double *want = dbuf(ny);
      ttd_k_max_pool2d(NULL, p, x, y, am);
      ref_max_pool(p, x, want, want_am);
      assert_close("y", y, want, ny, 0, 0);
      float *y2 = nan_buf(ny); /* without argmax, the same y */
      ttd_k_max_pool2d(NULL, p, x, y2, NULL);
      ck_assert(memcmp(y, y2, (size_t)ny * sizeof(float)) == 0);
      free(y2);
      for (int64_t o = 0; o < ny; o++) {
        CHECK_EACH(am[o] == want_am[o], "argmax[%lld] = %d, want %d", (long long)o, am[o], want_am[o]);
        CHECK_EACH(!negative || y[o] < 0.0f, "padding won: y[%lld] = %g", (long long)o, (double)y[o]);
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
  float *x = distinct_buf(&rng, nx, 0.05f, -2.0f), *dy = rand_buf(&rng, ny, -1, 1), *y = nan_buf(ny), *dx = nan_buf(nx);
  int32_t *am = malloc((size_t)ny * sizeof(int32_t));
  ttd_k_max_pool2d(NULL, &p, x, y, am);
  ttd_k_max_pool2d_backward(NULL, &p, am, dy, dx);
  pool_ctx c = {.p = &p, .x = x, .argmax = malloc((size_t)ny * sizeof(int32_t))};
  check_grad("dx", &c, max_pool_forward, ny, dy, x, nx, dx, 1e-2f);
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
    float *x = rand_buf(&rng, nx, -1, 1), *y = nan_buf(ny);
    double *want = dbuf(ny);
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
    assert_close("y", y, want, ny, 1e-5, 1e-6);
    free(x), free(y), free(want);
  }
}
END_TEST

/* Average-pool dx against finite differences. */
START_TEST(test_avg_pool_backward_fd) {
  ttd_pool2d_params p = pool_params(2, 2, 5, 6, 3, 2, 1, 2, 1, 1);
  int64_t nx = p.n * p.c * p.h * p.w, ny = p.n * p.c * p.out_h * p.out_w;
  uint64_t rng = 14;
  float *x = rand_buf(&rng, nx, -1, 1), *dy = rand_buf(&rng, ny, -1, 1), *dx = nan_buf(nx);
  ttd_k_avg_pool2d_backward(NULL, &p, dy, dx);
  pool_ctx c = {.p = &p, .x = x};
  check_grad("dx", &c, avg_pool_forward, ny, dy, x, nx, dx, 1e-2f);
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

/* ---- layer_norm ---- */

/* y, mean, rstd match double for cols 1, 37, 300, weight+bias / weight / neither; mean, rstd may be NULL. */
START_TEST(test_layer_norm_forward) {
  static const int64_t shapes[][2] = {{3, 1}, {5, 37}, {4, 300}};
  uint64_t rng = 15;
  const float eps = 1e-5f;
  for (size_t s = 0; s < 3; s++)
    for (int mode = 0; mode < 3; mode++) {
      int64_t rows = shapes[s][0], cols = shapes[s][1];
      float *x = rand_buf(&rng, rows * cols, -2, 3), *w = rand_buf(&rng, cols, 0.5f, 1.5f);
      float *b = rand_buf(&rng, cols, -1, 1);
      const float *wp = mode < 2 ? w : NULL, *bp = mode < 1 ? b : NULL;
      float *y = nan_buf(rows * cols), *mean = nan_buf(rows), *rstd = nan_buf(rows);
      double *want = dbuf(rows * cols), *want_mean = dbuf(rows), *want_rstd = dbuf(rows);
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
      assert_close("y", y, want, rows * cols, 1e-4, 1e-5);
      assert_close("mean", mean, want_mean, rows, 1e-5, 1e-6);
      assert_close("rstd", rstd, want_rstd, rows, 1e-5, 1e-6);
      float *y2 = nan_buf(rows * cols); /* without mean and rstd, the same y */
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
      float *x = rand_buf(&rng, n, -1, 1), *w = rand_buf(&rng, cols, 0.5f, 1.5f), *b = rand_buf(&rng, cols, -1, 1);
      float *dy = rand_buf(&rng, n, -1, 1), *y = nan_buf(n), *mean = nan_buf(rows), *rstd = nan_buf(rows);
      float *dx = nan_buf(n), *dw = nan_buf(cols), *db = nan_buf(cols);
      ln_ctx c = {.x = x,
                  .w = with_weight ? w : NULL,
                  .b = b,
                  .rows = rows,
                  .cols = cols,
                  .mean = nan_buf(rows),
                  .rstd = nan_buf(rows)};
      ttd_k_layer_norm(NULL, x, c.w, b, rows, cols, 1e-5f, y, mean, rstd);
      ttd_k_layer_norm_backward(NULL, x, c.w, mean, rstd, dy, rows, cols, dx, dw, db);
      check_grad("dx", &c, ln_forward, n, dy, x, n, dx, 1e-3f);
      check_grad("dweight", &c, ln_forward, n, dy, w, with_weight ? cols : 0, dw, 1e-3f);
      check_grad("dbias", &c, ln_forward, n, dy, b, cols, db, 1e-3f);
      if (!with_weight) { /* with weight NULL, dweight is the gradient at weight = 1 */
        ln_ctx cw = c;
        cw.w = w;
        for (int64_t i = 0; i < cols; i++) w[i] = 1.0f;
        check_grad("dweight (weight NULL)", &cw, ln_forward, n, dy, w, cols, dw, 1e-3f);
      }
      float *dx2 = nan_buf(n), *db2 = nan_buf(cols);
      ttd_k_layer_norm_backward(NULL, x, c.w, mean, rstd, dy, rows, cols, dx2, NULL, NULL);
      ttd_k_layer_norm_backward(NULL, x, c.w, mean, rstd, dy, rows, cols, NULL, NULL, db2);
      ck_assert(memcmp(dx, dx2, (size_t)n * sizeof(float)) == 0);
      ck_assert(memcmp(db, db2, (size_t)cols * sizeof(float)) == 0);
      free(x), free(w), free(b), free(dy), free(y), free(mean), free(rstd), free(dx), free(dw), free(db);
      free(c.mean), free(c.rstd), free(dx2), free(db2);
    }
}
END_TEST

/* ---- embedding ---- */

/* Rows are gathered by index, repeats included. */
START_TEST(test_embedding_forward) {
  const int64_t vocab = 11, dim = 7, n = 9;
  uint64_t rng = 17;
  float *table = rand_buf(&rng, vocab * dim, -1, 1), *y = nan_buf(n * dim);
  int32_t idx[9] = {3, 0, 10, 3, 7, 7, 1, 10, 5};
  int64_t bad = 123;
  ck_assert_int_eq(ttd_k_embedding(NULL, table, idx, n, vocab, dim, y, &bad), 0);
  for (int64_t i = 0; i < n; i++)
    for (int64_t d = 0; d < dim; d++)
      CHECK_EACH(y[i * dim + d] == table[idx[i] * dim + d], "y[%lld][%lld] is not table row %d", (long long)i,
                 (long long)d, idx[i]);
  free(table), free(y);
}
END_TEST

/* An index of -1 or vocab returns -1 with the position of the first bad one. */
START_TEST(test_embedding_bad_index) {
  const int64_t vocab = 5, dim = 3;
  float table[15] = {0}, y[18];
  int32_t idx1[6] = {0, 4, 2, 5, -1, 1}, idx2[6] = {1, -1, 2, 3, 9, 0};
  int64_t bad = 123;
  ck_assert_int_eq(ttd_k_embedding(NULL, table, idx1, 6, vocab, dim, y, &bad), -1);
  ck_assert_int_eq(bad, 3);
  ck_assert_int_eq(ttd_k_embedding(NULL, table, idx2, 6, vocab, dim, y, &bad), -1);
  ck_assert_int_eq(bad, 1);
  ck_assert_int_eq(ttd_k_embedding(NULL, table, idx2, 1, vocab, dim, y, &bad), 0);
}
END_TEST

/* dtable is the scatter-add of dy (repeats summed, zero elsewhere), identical with 4 threads. */
START_TEST(test_embedding_backward) {
  const int64_t vocab = 11, dim = 150, n = 9;
  uint64_t rng = 18;
  int32_t idx[9] = {3, 0, 10, 3, 7, 7, 1, 3, 5};
  float *dy = rand_buf(&rng, n * dim, -1, 1), *dt = nan_buf(vocab * dim), *dt4 = nan_buf(vocab * dim);
  double *want = dbuf(vocab * dim);
  for (int64_t i = 0; i < n; i++)
    for (int64_t d = 0; d < dim; d++) want[idx[i] * dim + d] += dy[i * dim + d];
  ttd_k_embedding_backward(NULL, idx, dy, n, vocab, dim, dt);
  assert_close("dtable", dt, want, vocab * dim, 1e-6, 1e-6);
  ttd_pool *pool = ttd_pool_create(4);
  ck_assert_ptr_nonnull(pool);
  ttd_k_embedding_backward(pool, idx, dy, n, vocab, dim, dt4);
  ck_assert(memcmp(dt, dt4, (size_t)(vocab * dim) * sizeof(float)) == 0);
  ttd_pool_destroy(pool);
  free(dy), free(dt), free(dt4), free(want);
}
END_TEST

/* ---- dropout ---- */

static float *ones(int64_t n) {
  float *x = malloc((size_t)n * sizeof(float));
  ck_assert_ptr_nonnull(x);
  for (int64_t i = 0; i < n; i++) x[i] = 1.0f;
  return x;
}

/* The same seed gives the same mask (also across pools); another seed another mask. */
START_TEST(test_dropout_seeds) {
  const int64_t n = 100000;
  float *x = ones(n), *y1 = nan_buf(n), *y2 = nan_buf(n), *y3 = nan_buf(n);
  ttd_pool *pool = ttd_pool_create(4);
  ck_assert_ptr_nonnull(pool);
  ttd_k_dropout(NULL, x, n, 0.5f, 42, y1);
  ttd_k_dropout(pool, x, n, 0.5f, 42, y2);
  ck_assert(memcmp(y1, y2, (size_t)n * sizeof(float)) == 0);
  ttd_k_dropout(NULL, x, n, 0.5f, 43, y3);
  int64_t differ = 0;
  for (int64_t i = 0; i < n; i++) differ += (y1[i] == 0.0f) != (y3[i] == 0.0f);
  /* independent masks at p = 0.5 disagree on about half the elements */
  ck_assert_msg(differ > n / 2 - 1500 && differ < n / 2 + 1500, "masks of seeds 42 and 43 differ at %lld of %lld",
                (long long)differ, (long long)n);
  ttd_pool_destroy(pool);
  free(x), free(y1), free(y2), free(y3);
}
END_TEST

/* Over 1e5 elements the kept fraction is within 3 sigma of 1 - p; kept values are x / (1 - p). */
START_TEST(test_dropout_keep_fraction) {
  const int64_t n = 100000;
  const float ps[] = {0.1f, 0.3f, 0.5f, 0.9f};
  uint64_t rng = 19;
  float *x = rand_buf(&rng, n, 0.5f, 1.5f), *y = nan_buf(n);
  for (size_t t = 0; t < 4; t++) {
    float p = ps[t];
    ttd_k_dropout(NULL, x, n, p, 1000 + t, y);
    int64_t kept = 0;
    for (int64_t i = 0; i < n; i++) {
      if (y[i] == 0.0f) continue;
      kept++;
      CHECK_EACH(fabsf(y[i] - x[i] / (1.0f - p)) <= 1e-6f * fabsf(y[i]), "y[%lld] = %g for x = %g, p = %g",
                 (long long)i, (double)y[i], (double)x[i], (double)p);
    }
    double expect = (double)n * (1.0 - p), sigma = sqrt((double)n * p * (1.0 - p));
    ck_assert_msg(fabs((double)kept - expect) <= 3.0 * sigma, "p = %g: kept %lld, expected %.0f +- %.0f", (double)p,
                  (long long)kept, expect, 3.0 * sigma);
  }
  free(x), free(y);
}
END_TEST

/* The backward drops exactly the forward's elements and scales the rest the same way. */
START_TEST(test_dropout_backward_mask) {
  const int64_t n = 4099;
  uint64_t rng = 20;
  float *x = rand_buf(&rng, n, -1, 1), *dy = rand_buf(&rng, n, -1, 1), *y = nan_buf(n), *dx = nan_buf(n);
  ttd_k_dropout(NULL, x, n, 0.37f, 7, y);
  ttd_k_dropout_backward(NULL, dy, n, 0.37f, 7, dx);
  int64_t dropped = 0;
  for (int64_t i = 0; i < n; i++) {
    int kept = y[i] != 0.0f;
    dropped += !kept;
    double want = kept ? dy[i] / (1.0 - 0.37f) : 0.0;
    CHECK_EACH(fabs(dx[i] - want) <= 1e-6 * fabs(want) && (dx[i] == 0.0f) == !kept, "dx[%lld] = %g, y = %g, dy = %g",
               (long long)i, (double)dx[i], (double)y[i], (double)dy[i]);
  }
  ck_assert_int_gt(dropped, 0);
  free(x), free(dy), free(y), free(dx);
}
END_TEST

/* p = 0 is the identity bit for bit (negative zero, infinity, NaN), forward and backward. */
START_TEST(test_dropout_p_zero) {
  const int64_t n = 1000;
  uint64_t rng = 21;
  float *x = rand_buf(&rng, n, -5, 5), *y = nan_buf(n), *dx = nan_buf(n);
  x[0] = -0.0f;
  x[1] = INFINITY;
  x[2] = NAN;
  ttd_k_dropout(NULL, x, n, 0.0f, 99, y);
  ttd_k_dropout_backward(NULL, x, n, 0.0f, 99, dx);
  ck_assert(memcmp(x, y, (size_t)n * sizeof(float)) == 0);
  ck_assert(memcmp(x, dx, (size_t)n * sizeof(float)) == 0);
  free(x), free(y), free(dx);
}
END_TEST

Suite *kernels_nn_suite(void) {
  Suite *s = suite_create("kernels_nn");
  TCase *tc = tcase_create("matmul");
  tcase_add_test(tc, test_matmul_forward);
  tcase_add_test(tc, test_matmul_batched_broadcast);
  tcase_add_test(tc, test_matmul_empty);
  tcase_add_test(tc, test_matmul_backward_fd);
  tcase_add_test(tc, test_matmul_backward_large);
  tcase_add_test(tc, test_matmul_pool_identical);
  tcase_set_timeout(tc, 60);
  suite_add_tcase(s, tc);

  tc = tcase_create("linear");
  tcase_add_test(tc, test_linear_forward);
  tcase_add_test(tc, test_linear_backward_fd);
  suite_add_tcase(s, tc);

  tc = tcase_create("conv2d");
  tcase_add_test(tc, test_conv_forward);
  tcase_add_test(tc, test_conv_backward_fd);
  tcase_add_test(tc, test_conv_many_images);
  tcase_add_test(tc, test_conv_params);
  tcase_set_timeout(tc, 60);
  suite_add_tcase(s, tc);

  tc = tcase_create("pool2d");
  tcase_add_test(tc, test_max_pool_forward);
  tcase_add_test(tc, test_max_pool_backward_fd);
  tcase_add_test(tc, test_avg_pool_forward);
  tcase_add_test(tc, test_avg_pool_backward_fd);
  tcase_add_test(tc, test_pool_params);
  suite_add_tcase(s, tc);

  tc = tcase_create("layer_norm");
  tcase_add_test(tc, test_layer_norm_forward);
  tcase_add_test(tc, test_layer_norm_backward_fd);
  suite_add_tcase(s, tc);

  tc = tcase_create("embedding");
  tcase_add_test(tc, test_embedding_forward);
  tcase_add_test(tc, test_embedding_bad_index);
  tcase_add_test(tc, test_embedding_backward);
  suite_add_tcase(s, tc);

  tc = tcase_create("dropout");
  tcase_add_test(tc, test_dropout_seeds);
  tcase_add_test(tc, test_dropout_keep_fraction);
  tcase_add_test(tc, test_dropout_backward_mask);
  tcase_add_test(tc, test_dropout_p_zero);
  suite_add_tcase(s, tc);
  return s;
}
