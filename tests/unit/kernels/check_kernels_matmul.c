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
      kt_ref_matmul(a, b, want, m, n, k, ta, tb);
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
        kt_ref_matmul(a + q * as, b + q * bs, want, m, n, k, ta, tb);
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
          kt_ref_matmul(a, b, want, m, n, k, 0, 1);
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
    kt_ref_matmul(dc, wt, want, m, k, n, 0, 1);
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
        kt_ref_matmul(a + q * as, b + q * bs, want, m, n, k, 0, 1);
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

/* Over several K blocks each thread takes whole columns of tiles and packs their B once (600 x
 * 1100 x 530 on two threads: three columns of three tiles): the same bits as on the caller alone. */
START_TEST(test_matmul_columns_identical) {
  kt_check_matmul_pool_identical(2, 600, 1100, 530, 9, false);
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

/* One case of a fused-linear test: a linear of n rows, in and out features, the weight
 * float32 or (bf16_w) bfloat16, `flag` the test's other variant, on pool (or none); isa names
 * TTD_KERNEL_ISA's setting for messages. */
typedef struct linear_case {
  const char *isa;
  ttd_pool *pool;
  int64_t n, in, out;
  int bf16_w, flag;
  uint64_t *rng;
} linear_case;

/* Runs fn on each case: under every ISA (the CPU's widest, "avx2", "generic"), each of
 * sizes, a float32 and a bfloat16 weight, flag 0 and 1, on 1 and on 3 threads. */
static void for_each_linear_case(const int64_t (*sizes)[3], size_t n_sizes, uint64_t seed,
                                 void (*fn)(const linear_case *c)) {
  const char *isas[] = {NULL, "avx2", "generic"};
  ttd_pool *pool3 = ttd_pool_create(3);
  ck_assert_ptr_nonnull(pool3);
  uint64_t rng = seed;
  for (size_t v = 0; v < 3; v++) {
    if (isas[v]) setenv("TTD_KERNEL_ISA", isas[v], 1);
    else unsetenv("TTD_KERNEL_ISA");
    for (size_t s = 0; s < n_sizes; s++)
      for (int variant = 0; variant < 8; variant++) {
        linear_case c = {.isa = isas[v] ? isas[v] : "widest", .pool = variant & 4 ? pool3 : NULL, .n = sizes[s][0],
                         .in = sizes[s][1], .out = sizes[s][2], .bf16_w = variant & 1, .flag = (variant >> 1) & 1,
                         .rng = &rng};
        fn(&c);
      }
  }
  unsetenv("TTD_KERNEL_ISA");
  ttd_pool_destroy(pool3);
}

/* The weight w [out, in] as the case hands it to the kernels: w itself, or its bfloat16 copy
 * in *w16 (freed by the caller; NULL when none); *dtype says which. */
static const void *case_weight(const linear_case *c, const float *w, uint16_t **w16, ttd_dtype *dtype) {
  *w16 = NULL;
  *dtype = c->bf16_w ? TTD_DTYPE_BFLOAT16 : TTD_DTYPE_FLOAT32;
  if (!c->bf16_w) return w;
  *w16 = malloc((size_t)(c->out * c->in) * sizeof(uint16_t));
  ck_assert_ptr_nonnull(*w16);
  ttd_bf16_from_f32_n(*w16, w, (size_t)(c->out * c->in));
  return *w16;
}

/* Bit for bit; a difference is reported at its first element. (Compared whole first: each
 * assertion Check passes costs a write to its parent process.) */
static void expect_bits(const linear_case *c, const char *what, const float *got, const float *want, int64_t count) {
  if (count <= 0 || memcmp(got, want, (size_t)count * sizeof(float)) == 0) return;
  for (int64_t i = 0; i < count; i++) {
    if (memcmp(&got[i], &want[i], sizeof(float)) == 0) continue;
    ck_abort_msg(
                  "%s, %lldx%lldx%lld, bf16 weight %d, flag %d, %d threads: %s[%lld] is %g, want %g", c->isa,
                  (long long)c->n, (long long)c->in, (long long)c->out, c->bf16_w, c->flag, c->pool ? 3 : 1, what,
                  (long long)i, got[i], want[i]);
  }
}

/* flag: with a bias. Row 1 (where there is one) is NaN, which the relu keeps. */
static void linear_relu_case(const linear_case *c) {
  int64_t n = c->n, in = c->in, out = c->out;
  float *x = kt_rand_buf(c->rng, n * in, -1, 1), *w = kt_rand_buf(c->rng, out * in, -1, 1),
        *bias = kt_rand_buf(c->rng, out, -1, 1);
  if (n > 2) x[in + 1] = NAN;
  uint16_t *w16;
  ttd_dtype wdt;
  const void *wp = case_weight(c, w, &w16, &wdt);
  const float *b = c->flag ? bias : NULL;
  float *linear = kt_nan_buf(n * out), *want = kt_nan_buf(n * out), *got = kt_nan_buf(n * out);
  ttd_k_linear_dt(c->pool, x, TTD_DTYPE_FLOAT32, wp, wdt, b, n, in, out, linear);
  ttd_k_linear_act_dt(c->pool, x, TTD_DTYPE_FLOAT32, wp, wdt, b, 0, n, in, out, got);
  expect_bits(c, "relu 0: y", got, linear, n * out);
  ttd_k_unary(c->pool, TTD_UN_RELU, linear, want, n * out);
  ttd_k_linear_act_dt(c->pool, x, TTD_DTYPE_FLOAT32, wp, wdt, b, 1, n, in, out, got);
  expect_bits(c, "y", got, want, n * out);
  if (n > 2) ck_assert(isnan(got[out]));
  free(x), free(w), free(w16), free(bias), free(linear), free(want), free(got);
}

/* A linear with its relu in the epilogue (ttd_k_linear_act_dt) has the bits of the linear and
 * then ttd_k_unary's relu: under every ISA and on each of its paths (dot products on AVX2,
 * the rows path on AVX-512 at 64 rows, the packed GEMM), with and without a bias, a float32
 * or a bfloat16 weight, NaN rows, and on 1 and 3 threads. With relu 0 it is the linear. */
START_TEST(test_linear_relu_bits) {
  static const int64_t sizes[][3] = {{1, 1, 1}, {7, 13, 5}, {3, 17, 513}, {64, 784, 512}, {257, 129, 33}};
  for_each_linear_case(sizes, sizeof(sizes) / sizeof(sizes[0]), 11, linear_relu_case);
}
END_TEST

/* flag: dx added to (TTD_KGRAD_ADD_A) rather than written. The mask holds +0.0, -0.0 and
 * NaN besides random values. */
static void backward_mask_case(const linear_case *c) {
  int64_t n = c->n, in = c->in, out = c->out;
  float *x = kt_rand_buf(c->rng, n * in, -1, 1), *w = kt_rand_buf(c->rng, out * in, -1, 1),
        *dy = kt_rand_buf(c->rng, n * out, -1, 1), *mask = kt_rand_buf(c->rng, n * in, -1, 1),
        *unmasked = kt_rand_buf(c->rng, n * in, -1, 1); /* dx's old values, for the add */
  mask[0] = 0.0f;
  if (n * in > 2) mask[1] = -0.0f, mask[2] = NAN;
  uint16_t *w16;
  ttd_dtype wdt;
  const void *wp = case_weight(c, w, &w16, &wdt);
  size_t dx_bytes = (size_t)(n * in) * sizeof(float);
  float *got = malloc(dx_bytes), *want = kt_nan_buf(n * in), *dw_want = kt_nan_buf(out * in),
        *dw_got = kt_nan_buf(out * in), *db_want = kt_nan_buf(out), *db_got = kt_nan_buf(out);
  ck_assert_ptr_nonnull(got);
  memcpy(got, unmasked, dx_bytes);
  unsigned flags = c->flag ? TTD_KGRAD_ADD_A : 0;
  ttd_k_linear_backward_dt(c->pool, x, TTD_DTYPE_FLOAT32, wp, wdt, dy, n, in, out, unmasked, dw_want, db_want, flags);
  ttd_k_unary_backward(c->pool, TTD_UN_RELU, mask, NULL, unmasked, want, n * in);
  ttd_k_linear_backward_mask_dt(c->pool, x, TTD_DTYPE_FLOAT32, wp, wdt, dy, n, in, out, got, dw_got, db_got, flags,
                                mask);
  expect_bits(c, "dx", got, want, n * in);
  expect_bits(c, "dw", dw_got, dw_want, out * in);
  expect_bits(c, "dbias", db_got, db_want, out);
  ck_assert(got[0] == 0.0f && (n * in <= 2 || (got[1] == 0.0f && got[2] == unmasked[2])));
  free(x), free(w), free(w16), free(dy), free(mask), free(unmasked), free(got), free(want);
  free(dw_want), free(dw_got), free(db_want), free(db_got);
}

/* A linear's backward with dx masked by a relu's output (ttd_k_linear_backward_mask_dt) has
 * the bits of the backward and then ttd_k_unary_backward's relu over dx: under every ISA, odd
 * sizes and K over several blocks, a float32 or bfloat16 weight, 1 and 3 threads, a mask with
 * +0.0, -0.0 and NaN in it, dx written or added to (the mask then applies to the sum); dw and
 * dbias are the unmasked backward's. */
START_TEST(test_linear_backward_mask_bits) {
  static const int64_t sizes[][3] = {{1, 1, 1}, {7, 13, 5}, {3, 513, 17}, {64, 512, 10}, {257, 33, 129}};
  for_each_linear_case(sizes, sizeof(sizes) / sizeof(sizes[0]), 12, backward_mask_case);
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

  tc = tcase_create("linear");
  tcase_add_test(tc, test_linear_forward);
  tcase_add_test(tc, test_linear_relu_bits);
  tcase_add_test(tc, test_linear_backward_mask_bits);
  tcase_add_test(tc, test_linear_backward_fd);
  suite_add_tcase(s, tc);
  return s;
}
