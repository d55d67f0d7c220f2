/* kernels/matmul.c and kernels/linear.c: batched matmul with transposes and broadcast
 * operands, and linear. Forwards are checked against direct double-precision references on
 * random inputs of odd sizes, backwards against central finite differences of
 * sum(dy * f(x)) taken through the float forward itself, and the pool must not change any
 * result. */

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "kernels.h"
#include "kernel_testing.h"
#include "suites.h"

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

/* Odd sizes from 1x1x1 to several K blocks and C tiles (600 x 40 x 530: a column of three
 * tiles over three K blocks, its B packed once and kept), all four transpose combinations,
 * match double. */
static void check_forward_sizes(const char *isa) {
  static const int64_t sizes[][3] = {{1, 1, 1},      {7, 13, 5},    {65, 33, 129}, {1, 40, 3},   {19, 1, 300},
                                     {131, 530, 301}, {301, 17, 40}, {64, 512, 784}, {600, 40, 530}};
  uint64_t rng = 1;
  for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++)
    for (int t = 0; t < 4; t++) {
      int64_t m = sizes[s][0], n = sizes[s][1], k = sizes[s][2];
      int ta = t & 1, tb = t >> 1;
      float *a = kt_rand_buf(&rng, m * k, -1, 1), *b = kt_rand_buf(&rng, k * n, -1, 1), *c = kt_nan_buf(m * n);
      double *want = kt_dzeros(m * n);
      ttd_k_matmul(NULL, a, b, c, 1, m, n, k, ta, tb, 0, 0);
      ref_matmul(a, b, want, m, n, k, ta, tb);
      char what[96];
      snprintf(what, sizeof(what), "%s: C %lldx%lldx%lld ta=%d tb=%d", isa, (long long)m, (long long)n, (long long)k,
               ta, tb);
      kt_expect_close(what, c, want, m * n, 1e-5, kt_dot_tol(k));
      free(a), free(b), free(c), free(want);
    }
}

START_TEST(test_matmul_forward) { check_forward_sizes("widest"); }
END_TEST

/* The narrower micro-kernels and packings (TTD_KERNEL_ISA, as on a CPU without AVX-512 or
 * AVX2) give the same results. Each test runs in its own process, so setenv stays here. */
START_TEST(test_matmul_forward_narrow_isas) {
  const char *isas[] = {"avx2", "generic"};
  for (size_t i = 0; i < 2; i++) {
    setenv("TTD_KERNEL_ISA", isas[i], 1);
    check_forward_sizes(isas[i]);
  }
  unsetenv("TTD_KERNEL_ISA");
}
END_TEST

/* Batch 3 with B broadcast, and A broadcast with B spaced wider than a matrix: each problem is
 * right, also where each problem's columns of tiles keep their B over several K blocks. */
START_TEST(test_matmul_batched_broadcast) {
  static const int64_t shapes[][3] = {{9, 21, 17}, {600, 40, 530}};
  const int64_t batch = 3, m = shapes[_i][0], n = shapes[_i][1], k = shapes[_i][2];
  uint64_t rng = 2;
  for (int t = 0; t < 4; t++)
    for (int which = 0; which < 2; which++) {
      int ta = t & 1, tb = t >> 1;
      int64_t as = which == 0 ? m * k : 0, bs = which == 0 ? 0 : k * n + 5;
      float *a = kt_rand_buf(&rng, as ? batch * as : m * k, -1, 1);
      float *b = kt_rand_buf(&rng, bs ? batch * bs : k * n, -1, 1);
      float *c = kt_nan_buf(batch * m * n);
      double *want = kt_dzeros(m * n);
      ttd_k_matmul(NULL, a, b, c, batch, m, n, k, ta, tb, as, bs);
      for (int64_t q = 0; q < batch; q++) {
        ref_matmul(a + q * as, b + q * bs, want, m, n, k, ta, tb);
        kt_expect_close(which ? "C (A broadcast)" : "C (B broadcast)", c + q * m * n, want, m * n, 1e-5, kt_dot_tol(k));
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
  for (int i = 0; i < 12; i++) KT_CHECK_EACH(c[i] == 0.0f, "c[%d] = %g", i, (double)c[i]);
  for (int i = 0; i < 12; i++) c[i] = 42.0f;
  ttd_k_matmul(NULL, a, b, c, 2, 0, 3, 2, 0, 0, 0, 0);
  ttd_k_matmul(NULL, a, b, c, 0, 2, 3, 2, 0, 0, 0, 0);
  for (int i = 0; i < 12; i++) KT_CHECK_EACH(c[i] == 42.0f, "c[%d] = %g", i, (double)c[i]);
  /* the gradient of a broadcast operand over no problems is a zero sum */
  float da[4] = {NAN, NAN, NAN, NAN};
  ttd_k_matmul_backward(NULL, a, b, c, 0, 2, 3, 2, 0, 0, 0, 6, da, NULL);
  for (int i = 0; i < 4; i++) KT_CHECK_EACH(da[i] == 0.0f, "da[%d] = %g", i, (double)da[i]);
  /* a linear of no input features is its bias, on every path of the tiling */
  ttd_pool *pool = ttd_pool_create(2);
  for (int p = 0; p < 2; p++) {
    for (int i = 0; i < 12; i++) c[i] = NAN;
    ttd_k_linear(p ? pool : NULL, a, b, b, 4, 0, 3, c);
    for (int i = 0; i < 12; i++) KT_CHECK_EACH(c[i] == b[i % 3], "pool %d: y[%d] = %g", p, i, (double)c[i]);
  }
  ttd_pool_destroy(pool);
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
      float *a = kt_rand_buf(&rng, na, -1, 1), *b = kt_rand_buf(&rng, nb, -1, 1), *dy = kt_rand_buf(&rng, ny, -1, 1);
      float *da = kt_nan_buf(na), *db = kt_nan_buf(nb);
      c.a = a, c.b = b;
      ttd_k_matmul_backward(NULL, a, b, dy, batch, m, n, k, c.ta, c.tb, c.as, c.bs, da, db);
      kt_check_grad("dA", &c, mm_forward, ny, dy, a, na, da, 1e-2f);
      kt_check_grad("dB", &c, mm_forward, ny, dy, b, nb, db, 1e-2f);
      /* one gradient alone is the same gradient */
      float *da2 = kt_nan_buf(na), *db2 = kt_nan_buf(nb);
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
    float *a = kt_rand_buf(&rng, batch * m * k, -1, 1), *b = kt_rand_buf(&rng, k * n, -1, 1);
    float *dy = kt_rand_buf(&rng, batch * m * n, -1, 1);
    float *da = kt_nan_buf(batch * m * k), *db = kt_nan_buf(k * n);
    ttd_k_matmul_backward(NULL, a, b, dy, batch, m, n, k, ta, tb, m * k, 0, da, db);
    double *want_a = kt_dzeros(batch * m * k), *want_b = kt_dzeros(k * n);
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
    kt_expect_close("dA", da, want_a, batch * m * k, 1e-5, kt_dot_tol(n));
    kt_expect_close("dB", db, want_b, k * n, 1e-5, kt_dot_tol(batch * m));
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
    float *a = kt_rand_buf(&rng, batch * m * k, -1, 1), *b = kt_rand_buf(&rng, k * n, -1, 1);
    float *dy = kt_rand_buf(&rng, batch * m * n, -1, 1);
    float *c1 = kt_nan_buf(batch * m * n), *c4 = kt_nan_buf(batch * m * n);
    float *da1 = kt_nan_buf(batch * m * k), *da4 = kt_nan_buf(batch * m * k), *db1 = kt_nan_buf(k * n),
          *db4 = kt_nan_buf(k * n);
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

/* A few rows against a transposed weight (C = A B^T + bias, A [m,k], B [n,k]: a linear's
 * forward at a small batch). Odd m, n and k under each ISA's kernel match the double sum plus
 * bias, a 4-thread pool gives the same bits, and so does the same A as the first m of 64
 * rows: a row's values do not depend on the batch it runs in (a module called at another
 * batch size gives the values of its compiled one; a path chosen by m would break this). */
START_TEST(test_matmul_few_rows_transposed) {
  static const int64_t ms[] = {1, 2, 3, 17, 32, 33}, ns[] = {1, 10, 17, 40, 515}, ks[] = {1, 7, 9, 17, 511, 513, 1024};
  const char *isas[] = {NULL, "avx2", "generic"};
  const int64_t m_big = 64;
  ttd_pool *pool = ttd_pool_create(4);
  ck_assert_ptr_nonnull(pool);
  uint64_t rng = 31;
  for (size_t v = 0; v < 3; v++) {
    if (isas[v]) setenv("TTD_KERNEL_ISA", isas[v], 1);
    for (size_t mi = 0; mi < 6; mi++)
      for (size_t ni = 0; ni < 5; ni++)
        for (size_t ki = 0; ki < 7; ki++) {
          int64_t m = ms[mi], n = ns[ni], k = ks[ki];
          float *a = kt_rand_buf(&rng, m_big * k, -1, 1), *b = kt_rand_buf(&rng, n * k, -1, 1);
          float *bias = kt_rand_buf(&rng, n, -1, 1), *c = kt_nan_buf(m * n), *c4 = kt_nan_buf(m * n);
          float *c_big = kt_nan_buf(m_big * n);
          double *want = kt_dzeros(m * n);
          ttd_k_matmul_bias(NULL, a, b, bias, c, 1, m, n, k, 0, 1, 0, 0);
          ttd_k_matmul_bias(pool, a, b, bias, c4, 1, m, n, k, 0, 1, 0, 0);
          ttd_k_matmul_bias(pool, a, b, bias, c_big, 1, m_big, n, k, 0, 1, 0, 0);
          ref_matmul(a, b, want, m, n, k, 0, 1);
          for (int64_t i = 0; i < m * n; i++) want[i] += bias[i % n];
          char what[96];
          snprintf(what, sizeof(what), "%s: %lldx%lldx%lld", isas[v] ? isas[v] : "widest", (long long)m,
                   (long long)n, (long long)k);
          kt_expect_close(what, c, want, m * n, 1e-5, kt_dot_tol(k));
          ck_assert_msg(memcmp(c, c4, (size_t)(m * n) * sizeof(float)) == 0, "%s: the pool changed C", what);
          ck_assert_msg(memcmp(c, c_big, (size_t)(m * n) * sizeof(float)) == 0, "%s: rows differ at %lld rows", what,
                        (long long)m_big);
          free(a), free(b), free(bias), free(c), free(c4), free(c_big), free(want);
        }
  }
  unsetenv("TTD_KERNEL_ISA");
  ttd_pool_destroy(pool);
}
END_TEST

/* Which problems take which path (kernels/matmul.c). Dot products: A [m,k] against a
 * transposed B up to K 1024 under AVX2, whatever m. Rows: the same layout at any K up to 192
 * rows of A under AVX-512 (the default ISA where the CPU has it). Nothing else, and neither
 * under the generic kernel. */
START_TEST(test_matmul_paths) {
  int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  int avx512 = __builtin_cpu_supports("avx512f");
  static const struct {
    const char *isa; /* TTD_KERNEL_ISA, or NULL: the CPU's widest */
    int64_t m, k;
    int ta, tb;
    int dot, rows; /* 1: this path where the ISA has it */
  } cases[] = {
      {"avx2", 64, 784, 0, 1, 1, 0},  {"avx2", 64, 1, 0, 1, 1, 0},   {"avx2", 4096, 1024, 0, 1, 1, 0},
      {"avx2", 64, 1025, 0, 1, 0, 0}, {"avx2", 64, 784, 0, 0, 0, 0}, {"avx2", 64, 784, 1, 1, 0, 0},
      {"avx2", 64, 784, 1, 0, 0, 0},  {NULL, 64, 784, 0, 1, 0, 1},   {NULL, 1, 1, 0, 1, 0, 1},
      {NULL, 192, 4096, 0, 1, 0, 1},  {NULL, 193, 784, 0, 1, 0, 0},  {NULL, 64, 784, 0, 0, 0, 0},
      {NULL, 64, 784, 1, 1, 0, 0},    {NULL, 64, 784, 1, 0, 0, 0},   {"generic", 64, 784, 0, 1, 0, 0},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    if (cases[i].isa) setenv("TTD_KERNEL_ISA", cases[i].isa, 1);
    else unsetenv("TTD_KERNEL_ISA");
    bool wide = cases[i].isa == NULL && avx512;
    bool dot = cases[i].isa ? cases[i].dot && avx2 : !avx512 && avx2 && cases[i].ta == 0 && cases[i].tb == 1 &&
                                                        cases[i].k <= 1024;
    const char *want = dot ? "dot" : cases[i].rows && wide ? "rows" : "packed";
    const char *got = ttd_k_matmul_path(cases[i].m, cases[i].k, cases[i].ta, cases[i].tb);
    ck_assert_msg(strcmp(got, want) == 0, "case %zu (%s, m %lld, k %lld, ta %d, tb %d): the %s path, want %s", i,
                  cases[i].isa ? cases[i].isa : "widest", (long long)cases[i].m, (long long)cases[i].k, cases[i].ta,
                  cases[i].tb, got, want);
  }
  unsetenv("TTD_KERNEL_ISA");
}
END_TEST

/* X W^T on the rows path gives the bits of the packed path (X times W^T stored as [k,n]):
 * odd sizes, K over several blocks, 3 problems at odd strides and one past alignment with
 * both operands their own, X broadcast, W broadcast, and one problem alone (X packed once for
 * every task), each with a bias on 1 and 3 threads. The backward's dA = dC B^T, which goes
 * this way, added to what was there (TTD_KGRAD_ADD_A), has the bits of the same sum on the
 * packed path (B stored transposed) and matches old + the double sum. */
START_TEST(test_matmul_rows_bits) {
  static const int64_t shapes[][3] = {{1, 1, 1},      {3, 17, 513},   {17, 3, 1},     {64, 512, 784},   {192, 37, 511},
                                      {5, 70, 1030}, {33, 65, 257}, {40, 6, 16},  {17, 1030, 40}};
  const int64_t batch = 3;
  ttd_pool *pool = ttd_pool_create(3);
  ck_assert_ptr_nonnull(pool);
  uint64_t rng = 71;
  for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
    int64_t m = shapes[si][0], n = shapes[si][1], k = shapes[si][2];
    if (strcmp(ttd_k_matmul_path(m, k, 0, 1), "rows") != 0) continue; /* no AVX-512: nothing goes this way */
    float *x_buf = kt_rand_buf(&rng, 1 + batch * (m * k + 3), -1, 1);
    float *w_buf = kt_rand_buf(&rng, 1 + batch * (n * k + 5), -1, 1);
    float *x = x_buf + 1, *w = w_buf + 1, *bias = kt_rand_buf(&rng, n, -1, 1);
    float *wt = malloc(sizeof(float) * (size_t)(batch * k * n)); /* problem q's W^T, [k,n] */
    for (int64_t q = 0; q < batch; q++)
      for (int64_t j = 0; j < n; j++)
        for (int64_t p = 0; p < k; p++) wt[q * k * n + p * n + j] = w[q * (n * k + 5) + j * k + p];
    float *c_rows = kt_nan_buf(batch * m * n), *c_packed = kt_nan_buf(batch * m * n);
    /* run: 0 both own, 1 X broadcast, 2 W broadcast, 3 one problem */
    for (int run = 0; run < 8; run++) {
      int kind = run / 2, threads = run % 2 ? 3 : 1;
      int64_t problems = kind == 3 ? 1 : batch;
      int64_t xs = kind == 1 ? 0 : m * k + 3, ws = kind == 2 ? 0 : n * k + 5, wts = kind == 2 ? 0 : k * n;
      for (int64_t i = 0; i < batch * m * n; i++) c_rows[i] = c_packed[i] = NAN;
      ttd_k_matmul_bias(NULL, x, wt, bias, c_packed, problems, m, n, k, 0, 0, xs, wts);
      ttd_k_matmul_bias(threads > 1 ? pool : NULL, x, w, bias, c_rows, problems, m, n, k, 0, 1, xs, ws);
      for (int64_t i = 0; i < problems * m * n; i++)
        KT_CHECK_EACH(memcmp(&c_rows[i], &c_packed[i], sizeof(float)) == 0,
                      "%lldx%lldx%lld run %d (%lld problems) on %d thread(s): C[%lld] is %a on the rows path, %a "
                      "packed",
                      (long long)m, (long long)n, (long long)k, run, (long long)problems, threads, (long long)i,
                      (double)c_rows[i], (double)c_packed[i]);
    }
    /* C' = X W' with W' [k,n] = wt: dX = dC' W'^T on the rows path; the same product with W
     * stored [n,k] (trans_b) is dC' W, packed. Both added to the same old dX. */
    float *dc = kt_rand_buf(&rng, m * n, -1, 1), *dx = kt_rand_buf(&rng, m * k, -1, 1);
    float *dx_packed = malloc(sizeof(float) * (size_t)(m * k)), *old = malloc(sizeof(float) * (size_t)(m * k));
    memcpy(old, dx, sizeof(float) * (size_t)(m * k));
    memcpy(dx_packed, dx, sizeof(float) * (size_t)(m * k));
    ttd_k_matmul_backward_add(pool, x, wt, dc, 1, m, n, k, 0, 0, m * k, k * n, dx, NULL, TTD_KGRAD_ADD_A);
    ttd_k_matmul_backward_add(pool, x, w, dc, 1, m, n, k, 0, 1, m * k, k * n, dx_packed, NULL, TTD_KGRAD_ADD_A);
    for (int64_t i = 0; i < m * k; i++)
      KT_CHECK_EACH(memcmp(&dx[i], &dx_packed[i], sizeof(float)) == 0,
                    "%lldx%lldx%lld: dX[%lld] added on the rows path is %a, packed %a", (long long)m, (long long)n,
                    (long long)k, (long long)i, (double)dx[i], (double)dx_packed[i]);
    double *want = kt_dzeros(m * k);
    ref_matmul(dc, wt, want, m, k, n, 0, 1);
    for (int64_t i = 0; i < m * k; i++) want[i] += old[i];
    char what[96];
    snprintf(what, sizeof(what), "dX added, %lldx%lldx%lld", (long long)m, (long long)n, (long long)k);
    kt_expect_close(what, dx, want, m * k, 1e-5, kt_dot_tol(n));
    free(x_buf), free(w_buf), free(bias), free(wt), free(c_rows), free(c_packed), free(dc), free(dx), free(old);
    free(dx_packed), free(want);
  }
  ttd_pool_destroy(pool);
}
END_TEST

/* The dot-product path on operands at odd places: 3 problems spaced wider than a matrix,
 * rows of odd length (K tails), bases one float past alignment, a bias, and C added to (the
 * backward of A B, dA = dC B^T, goes this way). Under AVX2 and the generic kernel each
 * problem matches the double sum, and a 3-thread pool gives the same bits. */
START_TEST(test_matmul_dot_unaligned_batched) {
  static const int64_t shapes[][3] = {{1, 1, 1}, {4, 5, 9}, {7, 13, 31}, {17, 3, 511}, {2, 41, 1024}};
  const char *isas[] = {"avx2", "generic"};
  const int64_t batch = 3;
  ttd_pool *pool = ttd_pool_create(3);
  ck_assert_ptr_nonnull(pool);
  uint64_t rng = 47;
  for (size_t v = 0; v < 2; v++) {
    setenv("TTD_KERNEL_ISA", isas[v], 1);
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
      int64_t m = shapes[si][0], n = shapes[si][1], k = shapes[si][2];
      int64_t as = m * k + 3, bs = n * k + 5;
      float *a_buf = kt_rand_buf(&rng, 1 + batch * as, -1, 1), *b_buf = kt_rand_buf(&rng, 1 + batch * bs, -1, 1);
      float *a = a_buf + 1, *b = b_buf + 1, *bias = kt_rand_buf(&rng, n, -1, 1);
      float *c = kt_nan_buf(batch * m * n), *c3 = kt_nan_buf(batch * m * n);
      double *want = kt_dzeros(m * n);
      char what[96];
      ttd_k_matmul_bias(NULL, a, b, bias, c, batch, m, n, k, 0, 1, as, bs);
      ttd_k_matmul_bias(pool, a, b, bias, c3, batch, m, n, k, 0, 1, as, bs);
      for (int64_t q = 0; q < batch; q++) {
        ref_matmul(a + q * as, b + q * bs, want, m, n, k, 0, 1);
        for (int64_t i = 0; i < m * n; i++) want[i] += bias[i % n];
        snprintf(what, sizeof(what), "%s: C %lldx%lldx%lld problem %lld", isas[v], (long long)m, (long long)n,
                 (long long)k, (long long)q);
        kt_expect_close(what, c + q * m * n, want, m * n, 1e-5, kt_dot_tol(k));
      }
      ck_assert_msg(memcmp(c, c3, (size_t)(batch * m * n) * sizeof(float)) == 0, "%s: the pool changed C", what);
      /* dA (+)= dC B^T of C = A B: A [m,n], B [n,k] (its rows contiguous along k), dC [m,k] */
      float *dc = kt_rand_buf(&rng, batch * m * k, -1, 1), *old = kt_rand_buf(&rng, batch * as, -1, 1);
      float *da = malloc((size_t)(batch * as) * sizeof(float)), *da3 = malloc((size_t)(batch * as) * sizeof(float));
      ck_assert_ptr_nonnull(da);
      ck_assert_ptr_nonnull(da3);
      memcpy(da, old, (size_t)(batch * as) * sizeof(float));
      memcpy(da3, old, (size_t)(batch * as) * sizeof(float));
      ttd_k_matmul_backward_add(NULL, a, b, dc, batch, m, k, n, 0, 0, as, bs, da, NULL, TTD_KGRAD_ADD_A);
      ttd_k_matmul_backward_add(pool, a, b, dc, batch, m, k, n, 0, 0, as, bs, da3, NULL, TTD_KGRAD_ADD_A);
      for (int64_t q = 0; q < batch; q++) {
        for (int64_t i = 0; i < m; i++)
          for (int64_t j = 0; j < n; j++) {
            double s = old[q * as + i * n + j];
            for (int64_t p = 0; p < k; p++) s += (double)dc[q * m * k + i * k + p] * b[q * bs + j * k + p];
            want[i * n + j] = s;
          }
        snprintf(what, sizeof(what), "%s: dA %lldx%lldx%lld problem %lld", isas[v], (long long)m, (long long)n,
                 (long long)k, (long long)q);
        kt_expect_close(what, da + q * as, want, m * n, 1e-5, kt_dot_tol(k));
      }
      ck_assert_msg(memcmp(da, da3, (size_t)(batch * as) * sizeof(float)) == 0, "%s: the pool changed dA", what);
      free(a_buf), free(b_buf), free(bias), free(c), free(c3), free(want), free(dc), free(old), free(da), free(da3);
    }
  }
  unsetenv("TTD_KERNEL_ISA");
  ttd_pool_destroy(pool);
}
END_TEST

/* ---- matmul over bfloat16 operands ---- */

/* n random bfloat16 in [-1, 1] (untracked, free()), and their float32 widening in *out_f. */
static uint16_t *bf16_rand_buf(uint64_t *rng, int64_t n, float **out_f) {
  float *f = kt_rand_buf(rng, n, -1, 1);
  uint16_t *h = malloc((size_t)(n ? n : 1) * sizeof(uint16_t));
  ck_assert_ptr_nonnull(h);
  for (int64_t i = 0; i < n; i++) {
    h[i] = ttd_bf16_from_f32(f[i]);
    f[i] = ttd_f32_from_bf16(h[i]);
  }
  *out_f = f;
  return h;
}

/* Odd sizes from {1, 3, 17, 511, 513} (odd K: the zero pad of the last pair), and even K
 * over 16 and more rows (pairs of a row along K are 32-bit words, transposed 16 rows at a
 * time), all four transposes, under the path TTD_KERNEL_ISA leaves: C matches the double sum
 * of the bfloat16 values to float32 accumulation error, and the float32 matmul of the
 * widened operands. */
static void check_bf16_sizes(const char *isa) {
  static const int64_t sizes[][3] = {{1, 1, 1},     {3, 17, 1},      {17, 3, 513},   {1, 513, 17},
                                     {513, 1, 3},   {511, 17, 513},  {17, 513, 511}, {3, 511, 17},
                                     {35, 50, 514}, {40, 33, 1026}};
  uint64_t rng = 11;
  for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++)
    for (int t = 0; t < 4; t++) {
      int64_t m = sizes[s][0], n = sizes[s][1], k = sizes[s][2];
      int ta = t & 1, tb = t >> 1;
      float *af, *bf;
      uint16_t *a = bf16_rand_buf(&rng, m * k, &af), *b = bf16_rand_buf(&rng, k * n, &bf);
      float *c = kt_nan_buf(m * n), *c32 = kt_nan_buf(m * n);
      double *want = kt_dzeros(m * n), *got32 = kt_dzeros(m * n);
      ttd_k_matmul_bf16(NULL, a, b, NULL, c, 1, m, n, k, ta, tb, 0, 0);
      ttd_k_matmul(NULL, af, bf, c32, 1, m, n, k, ta, tb, 0, 0);
      ref_matmul(af, bf, want, m, n, k, ta, tb);
      for (int64_t i = 0; i < m * n; i++) got32[i] = c32[i];
      char what[96];
      snprintf(what, sizeof(what), "%s (%s): C %lldx%lldx%lld ta=%d tb=%d", isa, ttd_k_matmul_bf16_path(),
               (long long)m, (long long)n, (long long)k, ta, tb);
      kt_expect_close(what, c, want, m * n, 1e-5, kt_dot_tol(k));
      kt_expect_close(what, c, got32, m * n, 1e-5, 2 * kt_dot_tol(k));
      free(a), free(b), free(af), free(bf), free(c), free(c32), free(want), free(got32);
    }
}

/* The path this CPU takes by default matches double at odd sizes: AVX-512 BF16 where the CPU
 * has it and it does at least 1.25x the FLOPs of float32 FMAs there (the probe's figure lies
 * in (0, 4], and is 0 without the instruction), else float32. TTD_KERNEL_ISA=avx512bf16
 * takes the instruction wherever the CPU has it, and matches too. */
START_TEST(test_matmul_bf16_forward) {
  double gain = ttd_k_bf16_dot_gain();
  bool has = false;
#if defined(__x86_64__) && defined(__GNUC__)
  has = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw");
#endif
  if (has)
    ck_assert_msg(gain > 0.0 && gain <= 4.0, "vdpbf16ps measured at %g x the FLOPs of FMA", gain);
  else
    ck_assert(gain == 0.0);
  ck_assert_str_eq(ttd_k_matmul_bf16_path(), has && gain >= 1.25 ? "avx512bf16" : "float32");
  check_bf16_sizes("widest");
  setenv("TTD_KERNEL_ISA", "avx512bf16", 1);
  ck_assert_str_eq(ttd_k_matmul_bf16_path(), has ? "avx512bf16" : "float32");
  check_bf16_sizes("avx512bf16");
  unsetenv("TTD_KERNEL_ISA");
}
END_TEST

/* TTD_KERNEL_ISA forces the portable path (widen, then a float32 kernel), as on a CPU without
 * the instruction: it says so and gives the same results at every ISA. */
START_TEST(test_matmul_bf16_portable) {
  const char *isas[] = {"avx512", "avx2", "generic"};
  for (size_t i = 0; i < 3; i++) {
    setenv("TTD_KERNEL_ISA", isas[i], 1);
    ck_assert_str_eq(ttd_k_matmul_bf16_path(), "float32");
    check_bf16_sizes(isas[i]);
  }
  unsetenv("TTD_KERNEL_ISA");
}
END_TEST

/* Against the float32 product of the unrounded inputs, bfloat16's tolerance holds: each error
 * within 2^-7 of sum |a||b| (two roundings of 2^-9 each, and float32 accumulation). */
START_TEST(test_matmul_bf16_vs_float32) {
  const int64_t m = 17, n = 33, k = 129;
  uint64_t rng = 12;
  float *a = kt_rand_buf(&rng, m * k, -1, 1), *b = kt_rand_buf(&rng, k * n, -1, 1), *c = kt_nan_buf(m * n);
  uint16_t *ah = malloc((size_t)(m * k) * sizeof(uint16_t)), *bh = malloc((size_t)(k * n) * sizeof(uint16_t));
  ck_assert(ah && bh);
  for (int64_t i = 0; i < m * k; i++) ah[i] = ttd_bf16_from_f32(a[i]);
  for (int64_t i = 0; i < k * n; i++) bh[i] = ttd_bf16_from_f32(b[i]);
  ttd_k_matmul_bf16(NULL, ah, bh, NULL, c, 1, m, n, k, 0, 0, 0, 0);
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double s = 0.0, mag = 0.0;
      for (int64_t p = 0; p < k; p++) {
        s += (double)a[i * k + p] * b[p * n + j];
        mag += fabs((double)a[i * k + p] * b[p * n + j]);
      }
      double err = fabs(c[i * n + j] - s);
      KT_CHECK_EACH(err <= mag / 128.0, "C[%lld,%lld]: got %.9g, want %.9g (err %.3g, sum|ab| %.3g)", (long long)i,
                    (long long)j, (double)c[i * n + j], s, err, mag);
    }
  free(a), free(b), free(c), free(ah), free(bh);
}
END_TEST

/* Operands at odd element offsets and odd batch strides (pairs not 4-byte aligned), B
 * broadcast then A broadcast, with a bias: each problem matches double, on every path. */
START_TEST(test_matmul_bf16_unaligned_batched) {
  const int64_t batch = 3, m = 7, n = 37, k = 19;
  const char *isas[] = {NULL, "generic", "generic-pairs", "avx512bf16"};
  uint64_t rng = 13;
  for (size_t v = 0; v < 4; v++) {
    if (isas[v]) setenv("TTD_KERNEL_ISA", isas[v], 1);
    for (int t = 0; t < 4; t++)
      for (int which = 0; which < 2; which++) {
        int ta = t & 1, tb = t >> 1;
        int64_t as = which == 0 ? m * k + 3 : 0, bs = which == 0 ? 0 : k * n + 5;
        float *af, *bf, *bias = kt_rand_buf(&rng, n, -1, 1);
        uint16_t *a = bf16_rand_buf(&rng, 1 + (as ? batch * as : m * k), &af);
        uint16_t *b = bf16_rand_buf(&rng, 1 + (bs ? batch * bs : k * n), &bf);
        float *c = kt_nan_buf(batch * m * n);
        double *want = kt_dzeros(m * n);
        ttd_k_matmul_bf16(NULL, a + 1, b + 1, bias, c, batch, m, n, k, ta, tb, as, bs);
        for (int64_t q = 0; q < batch; q++) {
          ref_matmul(af + 1 + q * as, bf + 1 + q * bs, want, m, n, k, ta, tb);
          for (int64_t i = 0; i < m * n; i++) want[i] += bias[i % n];
          kt_expect_close(which ? "C (A broadcast)" : "C (B broadcast)", c + q * m * n, want, m * n, 1e-5,
                          kt_dot_tol(k + 1));
        }
        free(a), free(b), free(af), free(bf), free(bias), free(c), free(want);
      }
    unsetenv("TTD_KERNEL_ISA");
  }
}
END_TEST

/* C of an m x n x k product (float32, or bfloat16 operands) on the caller alone and on a pool
 * of `threads`, all four transpose combinations: the same bits, and written. */
static void check_pool_identical(int threads, int64_t m, int64_t n, int64_t k, uint64_t rng, bool bf16) {
  ttd_pool *pool = ttd_pool_create(threads);
  ck_assert_ptr_nonnull(pool);
  for (int t = 0; t < 4; t++) {
    int ta = t & 1, tb = t >> 1;
    float *c1 = kt_nan_buf(m * n), *c2 = kt_nan_buf(m * n), *af = NULL, *bf = NULL;
    void *a, *b;
    if (bf16) {
      a = bf16_rand_buf(&rng, m * k, &af), b = bf16_rand_buf(&rng, k * n, &bf);
      ttd_k_matmul_bf16(NULL, a, b, NULL, c1, 1, m, n, k, ta, tb, 0, 0);
      ttd_k_matmul_bf16(pool, a, b, NULL, c2, 1, m, n, k, ta, tb, 0, 0);
    } else {
      a = kt_rand_buf(&rng, m * k, -1, 1), b = kt_rand_buf(&rng, k * n, -1, 1);
      ttd_k_matmul(NULL, a, b, c1, 1, m, n, k, ta, tb, 0, 0);
      ttd_k_matmul(pool, a, b, c2, 1, m, n, k, ta, tb, 0, 0);
    }
    ck_assert(memcmp(c1, c2, (size_t)(m * n) * sizeof(float)) == 0);
    for (int64_t i = 0; i < m * n; i += 997) ck_assert(!isnan(c2[i]));
    ck_assert(!isnan(c2[m * n - 1]));
    free(a), free(b), free(af), free(bf), free(c1), free(c2);
  }
  ttd_pool_destroy(pool);
}

/* A NULL pool and a 4-thread pool give bit-identical C (A packed once for all tasks, too). */
START_TEST(test_matmul_bf16_pool_identical) { check_pool_identical(4, 64, 530, 785, 14, true); }
END_TEST

/* Over several K blocks each thread takes whole columns of tiles and packs their B once (600 x
 * 1100 x 530 on two threads: three columns of three tiles): the same bits as on the caller alone. */
START_TEST(test_matmul_columns_identical) { check_pool_identical(2, 600, 1100, 530, 9, false); }
END_TEST

/* The portable pairs kernel (TTD_KERNEL_ISA=generic-pairs: vdpbf16ps's arithmetic in C, on
 * panels of pairs) says so and matches double at odd sizes and odd K, and a pool of 4 gives
 * its bits. */
START_TEST(test_matmul_bf16_generic_pairs) {
  setenv("TTD_KERNEL_ISA", "generic-pairs", 1);
  ck_assert_str_eq(ttd_k_matmul_bf16_path(), "generic-pairs");
  check_bf16_sizes("generic-pairs");
  check_pool_identical(4, 64, 530, 785, 15, true);
  unsetenv("TTD_KERNEL_ISA");
}
END_TEST

/* Rounds n floats to bfloat16 bits (untracked, free()). */
static uint16_t *bf16_of(const float *f, int64_t n) {
  uint16_t *h = malloc((size_t)(n ? n : 1) * sizeof(uint16_t));
  ck_assert_ptr_nonnull(h);
  for (int64_t i = 0; i < n; i++) h[i] = ttd_bf16_from_f32(f[i]);
  return h;
}

/* The float32 of each rounded to bfloat16 (untracked, free()). */
static float *rounded_of(const float *f, int64_t n) {
  float *r = malloc((size_t)(n ? n : 1) * sizeof(float));
  ck_assert_ptr_nonnull(r);
  for (int64_t i = 0; i < n; i++) r[i] = ttd_f32_from_bf16(ttd_bf16_from_f32(f[i]));
  return r;
}

/* Every path of bfloat16 products: the default, widened, portable pairs, AVX-512 BF16 (where
 * the CPU has it; widest float32 elsewhere). */
static const char *const bf16_isas[] = {NULL, "generic", "generic-pairs", "avx512bf16"};
enum { BF16_ISAS = sizeof(bf16_isas) / sizeof(bf16_isas[0]) };

/* One float32 and one bfloat16 operand (either way round, all four transposes, odd sizes, a
 * K over several blocks, a bias, batched with either operand broadcast, on 1 and 2 threads):
 * the product is the bfloat16 one, the same bits as ttd_k_matmul_bf16 of the float32 operand
 * rounded first, and within float32 accumulation of the double product of the rounded values,
 * on every path. */
START_TEST(test_matmul_dt_mixed) {
  static const int64_t sizes[][4] = {{1, 1, 1, 1},   {3, 17, 1, 1},   {17, 3, 513, 1}, {7, 37, 19, 3},
                                     {64, 530, 1100, 1}, {13, 5, 17, 2}};
  ttd_pool *pool = ttd_pool_create(2);
  ck_assert_ptr_nonnull(pool);
  uint64_t rng = 21;
  for (size_t v = 0; v < BF16_ISAS; v++) {
    if (bf16_isas[v]) setenv("TTD_KERNEL_ISA", bf16_isas[v], 1);
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++)
      for (int t = 0; t < 8; t++) {
        int64_t m = sizes[s][0], n = sizes[s][1], k = sizes[s][2], batch = sizes[s][3];
        int ta = t & 1, tb = (t >> 1) & 1, a_is_f32 = t >> 2;
        int64_t as = batch > 1 && s == 3 ? 0 : m * k, bs = batch > 1 && s == 5 ? 0 : k * n; /* broadcast */
        int64_t a_len = as ? batch * as : m * k, b_len = bs ? batch * bs : k * n;
        float *af = kt_rand_buf(&rng, a_len, -1, 1), *bf = kt_rand_buf(&rng, b_len, -1, 1);
        float *bias = kt_rand_buf(&rng, n, -1, 1), *ar = rounded_of(af, a_len), *br = rounded_of(bf, b_len);
        uint16_t *ah = bf16_of(af, a_len), *bh = bf16_of(bf, b_len);
        float *c = kt_nan_buf(batch * m * n), *want_bits = kt_nan_buf(batch * m * n);
        double *want = kt_dzeros(m * n);
        ttd_pool *p = m * n * k > 100000 ? pool : NULL;
        if (a_is_f32)
          ttd_k_matmul_dt(p, af, TTD_DTYPE_FLOAT32, bh, TTD_DTYPE_BFLOAT16, bias, c, batch, m, n, k, ta, tb, as, bs);
        else
          ttd_k_matmul_dt(p, ah, TTD_DTYPE_BFLOAT16, bf, TTD_DTYPE_FLOAT32, bias, c, batch, m, n, k, ta, tb, as, bs);
        ttd_k_matmul_bf16(p, ah, bh, bias, want_bits, batch, m, n, k, ta, tb, as, bs);
        char what[128];
        snprintf(what, sizeof(what), "%s (%s): %s, C %lldx%lldx%lld x%lld ta=%d tb=%d", bf16_isas[v] ? bf16_isas[v] : "widest",
                 ttd_k_matmul_bf16_path(), a_is_f32 ? "A float32" : "B float32", (long long)m, (long long)n,
                 (long long)k, (long long)batch, ta, tb);
        ck_assert_msg(memcmp(c, want_bits, sizeof(float) * (size_t)(batch * m * n)) == 0,
                      "%s: not the bits of the bfloat16 product", what);
        for (int64_t q = 0; q < batch; q++) {
          ref_matmul(ar + q * as, br + q * bs, want, m, n, k, ta, tb);
          for (int64_t i = 0; i < m * n; i++) want[i] += bias[i % n];
          kt_expect_close(what, c + q * m * n, want, m * n, 1e-5, kt_dot_tol(k + 1));
        }
        free(af), free(bf), free(bias), free(ar), free(br), free(ah), free(bh), free(c), free(want_bits), free(want);
      }
    unsetenv("TTD_KERNEL_ISA");
  }
  ttd_pool_destroy(pool);
}
END_TEST

/* A float32 operand is rounded exactly as ttd_bf16_from_f32 rounds: ties to even, values that
 * round to infinity, infinities and NaNs, read along either layout of A (rows along K, or
 * along M), on every path: with B a column of bfloat16 ones (and a zero), C is the rounded A. */
START_TEST(test_matmul_dt_rounds_as_bf16) {
  enum { M = 67 };
  float a[2 * M];
  uint64_t st = 0x5eed0004u;
  for (int i = 0; i < M; i++) {
    uint32_t u = (uint32_t)(kt_next_random(&st) >> 32) & 0xbfffffffu; /* finite, below 2^64 */
    switch (i % 6) {
      case 0: u = (u & 0xffff0000u) | 0x8000u; break;                 /* a tie */
      case 1: u = (u & 0x80000000u) | 0x7f7f8000u | (u & 0x7fffu); break; /* rounds to infinity */
      case 2: u = (u & 0x80000000u) | 0x7f800000u; break;             /* infinity */
      case 3: u = (u & 0x8000ffffu) | 0x7f800001u; break; /* NaN whose payload rounding alone makes infinity */
      default: u = (u & 0x807fffffu) | 0x3f000000u; break;            /* in [0.5, 1) */
    }
    memcpy(&a[i], &u, sizeof(u));
  }
  uint16_t b[2] = {0x3f80, 0}; /* B [2,1]: 1 then 0 */
  for (size_t v = 0; v < BF16_ISAS; v++) {
    if (bf16_isas[v]) setenv("TTD_KERNEL_ISA", bf16_isas[v], 1);
    for (int ta = 0; ta < 2; ta++) {
      float at[2 * M], c[M];
      for (int i = 0; i < M; i++) { /* A [M,2] = (a, 0), stored as is or transposed */
        at[ta ? i : 2 * i] = a[i];
        at[ta ? M + i : 2 * i + 1] = 0.0f;
      }
      ttd_k_matmul_dt(NULL, at, TTD_DTYPE_FLOAT32, b, TTD_DTYPE_BFLOAT16, NULL, c, 1, M, 1, 2, ta, 0, 0, 0);
      for (int i = 0; i < M; i++) {
        float want = ttd_f32_from_bf16(ttd_bf16_from_f32(a[i]));
        KT_CHECK_EACH(isnan(want) ? isnan(c[i]) : memcmp(&c[i], &want, sizeof(want)) == 0,
                      "%s ta=%d: A[%d] = %a gave %a, want %a", bf16_isas[v] ? bf16_isas[v] : "widest", ta, i,
                      (double)a[i], (double)c[i], (double)want);
      }
    }
    unsetenv("TTD_KERNEL_ISA");
  }
}
END_TEST

/* The backward of a product with one bfloat16 operand: dA and dB are bfloat16 products of
 * the rounded dC and the rounded other operand (within float32 accumulation of double), on
 * every path and all transposes; with TTD_KGRAD_ADD_* they are added to what was there. */
START_TEST(test_matmul_backward_dt) {
  static const int64_t sizes[][3] = {{7, 13, 5}, {33, 65, 129}, {1, 17, 513}, {70, 530, 300}};
  uint64_t rng = 22;
  for (size_t v = 0; v < BF16_ISAS; v++) {
    if (bf16_isas[v]) setenv("TTD_KERNEL_ISA", bf16_isas[v], 1);
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++)
      for (int t = 0; t < 8; t++) {
        int64_t m = sizes[s][0], n = sizes[s][1], k = sizes[s][2];
        int ta = t & 1, tb = (t >> 1) & 1, a_is_f32 = t >> 2;
        float *af = kt_rand_buf(&rng, m * k, -1, 1), *bf = kt_rand_buf(&rng, k * n, -1, 1);
        float *dc = kt_rand_buf(&rng, m * n, -1, 1);
        float *ar = rounded_of(af, m * k), *br = rounded_of(bf, k * n), *dcr = rounded_of(dc, m * n);
        uint16_t *ah = bf16_of(af, m * k), *bh = bf16_of(bf, k * n);
        const void *a = a_is_f32 ? (const void *)af : ah, *b = a_is_f32 ? (const void *)bh : bf;
        ttd_dtype adt = a_is_f32 ? TTD_DTYPE_FLOAT32 : TTD_DTYPE_BFLOAT16;
        ttd_dtype bdt = a_is_f32 ? TTD_DTYPE_BFLOAT16 : TTD_DTYPE_FLOAT32;
        float *da = kt_nan_buf(m * k), *db = kt_nan_buf(k * n);
        ttd_k_matmul_backward_dt(NULL, a, adt, b, bdt, dc, 1, m, n, k, ta, tb, 0, 0, da, db, 0);
        double *want_a = kt_dzeros(m * k), *want_b = kt_dzeros(k * n);
        if (!ta) ref_matmul(dcr, br, want_a, m, k, n, 0, !tb); /* dA [m,k] = dC B'^T */
        else ref_matmul(br, dcr, want_a, k, m, n, tb, 1);       /* dA [k,m] = B' dC^T */
        if (!tb) ref_matmul(ar, dcr, want_b, k, n, m, !ta, 0); /* dB [k,n] = A'^T dC */
        else ref_matmul(dcr, ar, want_b, n, k, m, 1, ta);       /* dB [n,k] = dC^T A' */
        char what[128];
        snprintf(what, sizeof(what), "%s: %s, %lldx%lldx%lld ta=%d tb=%d", bf16_isas[v] ? bf16_isas[v] : "widest",
                 a_is_f32 ? "A float32" : "B float32", (long long)m, (long long)n, (long long)k, ta, tb);
        kt_expect_close(what, da, want_a, m * k, 1e-5, kt_dot_tol(n));
        kt_expect_close(what, db, want_b, k * n, 1e-5, kt_dot_tol(m));
        float *ga = kt_rand_buf(&rng, m * k, -1, 1), *gb = kt_rand_buf(&rng, k * n, -1, 1);
        for (int64_t i = 0; i < m * k; i++) want_a[i] += ga[i];
        for (int64_t i = 0; i < k * n; i++) want_b[i] += gb[i];
        ttd_k_matmul_backward_dt(NULL, a, adt, b, bdt, dc, 1, m, n, k, ta, tb, 0, 0, ga, gb,
                                 TTD_KGRAD_ADD_A | TTD_KGRAD_ADD_B);
        kt_expect_close(what, ga, want_a, m * k, 1e-5, kt_dot_tol(n + 1));
        kt_expect_close(what, gb, want_b, k * n, 1e-5, kt_dot_tol(m + 1));
        free(af), free(bf), free(dc), free(ar), free(br), free(dcr), free(ah), free(bh), free(da), free(db);
        free(want_a), free(want_b), free(ga), free(gb);
      }
    unsetenv("TTD_KERNEL_ISA");
  }
}
END_TEST

/* k = 0 gives C = bias (or zeros); m = 0 writes nothing. */
START_TEST(test_matmul_bf16_empty) {
  uint16_t a[4] = {0x3f80, 0x4000, 0x4040, 0x4080}, b[4] = {0x3f80, 0x3f80, 0x3f80, 0x3f80};
  float bias[3] = {1, 2, 3}, c[6];
  for (int i = 0; i < 6; i++) c[i] = NAN;
  ttd_k_matmul_bf16(NULL, a, b, bias, c, 1, 2, 3, 0, 0, 0, 0, 0);
  for (int i = 0; i < 6; i++) KT_CHECK_EACH(c[i] == bias[i % 3], "c[%d] = %g", i, (double)c[i]);
  ttd_k_matmul_bf16(NULL, a, b, NULL, c, 1, 0, 3, 2, 0, 0, 0, 0);
  for (int i = 0; i < 6; i++) KT_CHECK_EACH(c[i] == bias[i % 3], "c[%d] = %g", i, (double)c[i]);
  /* 1x2 times 2x1: 1*1 + 2*1, exact on every path */
  ttd_k_matmul_bf16(NULL, a, b, NULL, c, 1, 1, 1, 2, 0, 0, 0, 0);
  ck_assert_float_eq(c[0], 3.0f);
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
      float *x = kt_rand_buf(&rng, n * in, -1, 1), *w = kt_rand_buf(&rng, out * in, -1, 1),
            *bias = kt_rand_buf(&rng, out, -1, 1);
      float *y = kt_nan_buf(n * out);
      double *want = kt_dzeros(n * out);
      ttd_k_linear(NULL, x, w, with_bias ? bias : NULL, n, in, out, y);
      for (int64_t i = 0; i < n; i++)
        for (int64_t o = 0; o < out; o++) {
          double acc = with_bias ? bias[o] : 0.0;
          for (int64_t p = 0; p < in; p++) acc += (double)x[i * in + p] * w[o * in + p];
          want[i * out + o] = acc;
        }
      kt_expect_close("y", y, want, n * out, 1e-5, kt_dot_tol(in));
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
  float *x = kt_rand_buf(&rng, c.n * c.in, -1, 1), *w = kt_rand_buf(&rng, c.out * c.in, -1, 1);
  float *bias = kt_rand_buf(&rng, c.out, -1, 1), *dy = kt_rand_buf(&rng, c.n * c.out, -1, 1);
  float *dx = kt_nan_buf(c.n * c.in), *dw = kt_nan_buf(c.out * c.in), *db = kt_nan_buf(c.out);
  c.x = x, c.w = w, c.bias = bias;
  ttd_k_linear_backward(NULL, x, w, dy, c.n, c.in, c.out, dx, dw, db);
  kt_check_grad("dx", &c, linear_forward, c.n * c.out, dy, x, c.n * c.in, dx, 1e-2f);
  kt_check_grad("dW", &c, linear_forward, c.n * c.out, dy, w, c.out * c.in, dw, 1e-2f);
  kt_check_grad("dbias", &c, linear_forward, c.n * c.out, dy, bias, c.out, db, 1e-2f);
  float *db2 = kt_nan_buf(c.out);
  ttd_k_linear_backward(NULL, x, w, dy, c.n, c.in, c.out, NULL, NULL, db2);
  ck_assert(memcmp(db, db2, (size_t)c.out * sizeof(float)) == 0);
  free(x), free(w), free(bias), free(dy), free(dx), free(dw), free(db), free(db2);
}
END_TEST


/* The _add forms add each gradient to what its buffer held: old + the written gradient,
 * within a rounding of each element, for every transpose, per-problem and batch-summed
 * operands, one K block and several (k 600), odd sizes, a pool of 3; the gradient not
 * asked to add is written as before, bit for bit. */
START_TEST(test_backward_add) {
  ttd_pool *pool = ttd_pool_create(3);
  ck_assert_ptr_nonnull(pool);
  static const int64_t shapes[][4] = {{1, 1, 1, 1}, {2, 3, 17, 5}, {3, 17, 3, 600}, {1, 64, 130, 513}};
  uint64_t rng = 11;
  for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++)
    for (int t = 0; t < 4; t++)
      for (int bc = 0; bc < 2; bc++) {
        int64_t batch = shapes[si][0], m = shapes[si][1], n = shapes[si][2], k = shapes[si][3];
        int ta = t & 1, tb = t >> 1;
        int64_t as = m * k, bs = bc ? 0 : k * n, na = batch * as, nb = bc ? k * n : batch * bs;
        float *a = kt_rand_buf(&rng, na, -1, 1), *b = kt_rand_buf(&rng, nb, -1, 1);
        float *dy = kt_rand_buf(&rng, batch * m * n, -1, 1);
        float *da = kt_nan_buf(na), *db = kt_nan_buf(nb);
        float *old_a = kt_rand_buf(&rng, na, -1, 1), *old_b = kt_rand_buf(&rng, nb, -1, 1);
        float *acc_a = malloc((size_t)na * sizeof(float)), *acc_b = malloc((size_t)nb * sizeof(float));
        memcpy(acc_a, old_a, (size_t)na * sizeof(float));
        memcpy(acc_b, old_b, (size_t)nb * sizeof(float));
        ttd_k_matmul_backward(pool, a, b, dy, batch, m, n, k, ta, tb, as, bs, da, db);
        for (unsigned add = 1; add <= 2; add++) { /* A then B added to, the other written */
          float *wa = kt_nan_buf(na), *wb = kt_nan_buf(nb);
          float *ga = add == TTD_KGRAD_ADD_A ? acc_a : wa, *gb = add == TTD_KGRAD_ADD_B ? acc_b : wb;
          ttd_k_matmul_backward_add(pool, a, b, dy, batch, m, n, k, ta, tb, as, bs, ga, gb, add);
          ck_assert(memcmp(add == TTD_KGRAD_ADD_A ? wb : wa, add == TTD_KGRAD_ADD_A ? db : da,
                           (size_t)(add == TTD_KGRAD_ADD_A ? nb : na) * sizeof(float)) == 0);
          free(wa), free(wb);
        }
        for (int64_t i = 0; i < na; i++) {
          float want = old_a[i] + da[i];
          ck_assert_msg(fabsf(acc_a[i] - want) <= 1e-5f * (1.0f + fabsf(want)) + 1e-6f * (float)n,
                        "dA[%lld] shape %zu t %d: %g + %g gave %g", (long long)i, si, t, old_a[i], da[i], acc_a[i]);
        }
        for (int64_t i = 0; i < nb; i++) {
          float want = old_b[i] + db[i];
          ck_assert_msg(fabsf(acc_b[i] - want) <= 1e-5f * (1.0f + fabsf(want)) + 1e-6f * (float)(batch * m),
                        "dB[%lld] shape %zu t %d: %g + %g gave %g", (long long)i, si, t, old_b[i], db[i], acc_b[i]);
        }
        free(a), free(b), free(dy), free(da), free(db), free(old_a), free(old_b), free(acc_a), free(acc_b);
      }
  /* linear: dW and dbias added to, dx written; one K block, so old + dW exactly */
  const int64_t rows = 9, in = 13, out = 7;
  float *x = kt_rand_buf(&rng, rows * in, -1, 1), *w = kt_rand_buf(&rng, out * in, -1, 1);
  float *dy = kt_rand_buf(&rng, rows * out, -1, 1);
  float *dx = kt_nan_buf(rows * in), *dw = kt_nan_buf(out * in), *dbias = kt_nan_buf(out);
  ttd_k_linear_backward(pool, x, w, dy, rows, in, out, dx, dw, dbias);
  float *dx2 = kt_nan_buf(rows * in), *gw = kt_rand_buf(&rng, out * in, -1, 1), *gb = kt_rand_buf(&rng, out, -1, 1);
  float *gw0 = malloc(sizeof(float) * out * in), *gb0 = malloc(sizeof(float) * out);
  memcpy(gw0, gw, sizeof(float) * out * in);
  memcpy(gb0, gb, sizeof(float) * out);
  ttd_k_linear_backward_add(pool, x, w, dy, rows, in, out, dx2, gw, gb, TTD_KGRAD_ADD_B | TTD_KGRAD_ADD_BIAS);
  ck_assert(memcmp(dx, dx2, sizeof(float) * rows * in) == 0);
  for (int64_t i = 0; i < out * in; i++) ck_assert_float_eq(gw[i], gw0[i] + dw[i]);
  for (int64_t i = 0; i < out; i++) ck_assert_float_eq(gb[i], gb0[i] + dbias[i]);
  free(x), free(w), free(dy), free(dx), free(dw), free(dbias), free(dx2), free(gw), free(gb), free(gw0), free(gb0);
  ttd_pool_destroy(pool);
}
END_TEST

Suite *kernels_matmul_suite(void) {
  Suite *s = suite_create("kernels_matmul");
  TCase *tc = tcase_create("matmul");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_matmul_forward);
  tcase_add_test(tc, test_matmul_forward_narrow_isas);
  tcase_add_loop_test(tc, test_matmul_batched_broadcast, 0, 2);
  tcase_add_test(tc, test_matmul_empty);
  tcase_add_test(tc, test_matmul_backward_fd);
  tcase_add_test(tc, test_matmul_backward_large);
  tcase_add_test(tc, test_matmul_pool_identical);
  tcase_add_test(tc, test_matmul_columns_identical);
  tcase_add_test(tc, test_matmul_few_rows_transposed);
  tcase_add_test(tc, test_matmul_paths);
  tcase_add_test(tc, test_matmul_rows_bits);
  tcase_add_test(tc, test_matmul_dot_unaligned_batched);
  tcase_add_test(tc, test_backward_add);
  suite_add_tcase(s, tc);

  tc = tcase_create("matmul_bf16");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_matmul_bf16_forward);
  tcase_add_test(tc, test_matmul_bf16_portable);
  tcase_add_test(tc, test_matmul_bf16_vs_float32);
  tcase_add_test(tc, test_matmul_bf16_unaligned_batched);
  tcase_add_test(tc, test_matmul_bf16_pool_identical);
  tcase_add_test(tc, test_matmul_bf16_empty);
  tcase_add_test(tc, test_matmul_bf16_generic_pairs);
  tcase_add_test(tc, test_matmul_dt_mixed);
  tcase_add_test(tc, test_matmul_backward_dt);
  tcase_add_test(tc, test_matmul_dt_rounds_as_bf16);
  suite_add_tcase(s, tc);

  tc = tcase_create("linear");
  tcase_add_test(tc, test_linear_forward);
  tcase_add_test(tc, test_linear_backward_fd);
  suite_add_tcase(s, tc);
  return s;
}
