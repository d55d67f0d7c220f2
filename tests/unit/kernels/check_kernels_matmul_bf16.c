/* Check suite for the matmul over bfloat16 operands (kernels.h: ttd_k_matmul_bf16,
 * ttd_k_matmul_dt, ttd_k_matmul_backward_dt): every path (AVX-512 BF16 where the CPU has it,
 * widened to float32, the portable pairs kernel) against double, against the float32 matmul
 * of the widened operands, and against each other's bits where they must agree. */
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
      uint16_t *a = kt_bf16_rand_buf(&rng, m * k, &af), *b = kt_bf16_rand_buf(&rng, k * n, &bf);
      float *c = kt_nan_buf(m * n), *c32 = kt_nan_buf(m * n);
      double *want = kt_dzeros(m * n), *got32 = kt_dzeros(m * n);
      ttd_k_matmul_bf16(NULL, a, b, NULL, c, 1, m, n, k, ta, tb, 0, 0);
      ttd_k_matmul(NULL, af, bf, c32, 1, m, n, k, ta, tb, 0, 0);
      kt_ref_matmul(af, bf, want, m, n, k, ta, tb);
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
        uint16_t *a = kt_bf16_rand_buf(&rng, 1 + (as ? batch * as : m * k), &af);
        uint16_t *b = kt_bf16_rand_buf(&rng, 1 + (bs ? batch * bs : k * n), &bf);
        float *c = kt_nan_buf(batch * m * n);
        double *want = kt_dzeros(m * n);
        ttd_k_matmul_bf16(NULL, a + 1, b + 1, bias, c, batch, m, n, k, ta, tb, as, bs);
        for (int64_t q = 0; q < batch; q++) {
          kt_ref_matmul(af + 1 + q * as, bf + 1 + q * bs, want, m, n, k, ta, tb);
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

/* A NULL pool and a 4-thread pool give bit-identical C (A packed once for all tasks, too). */
START_TEST(test_matmul_bf16_pool_identical) { kt_check_matmul_pool_identical(4, 64, 530, 785, 14, true); }
END_TEST

/* The portable pairs kernel (TTD_KERNEL_ISA=generic-pairs: vdpbf16ps's arithmetic in C, on
 * panels of pairs) says so and matches double at odd sizes and odd K, and a pool of 4 gives
 * its bits. */
START_TEST(test_matmul_bf16_generic_pairs) {
  setenv("TTD_KERNEL_ISA", "generic-pairs", 1);
  ck_assert_str_eq(ttd_k_matmul_bf16_path(), "generic-pairs");
  check_bf16_sizes("generic-pairs");
  kt_check_matmul_pool_identical(4, 64, 530, 785, 15, true);
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
          kt_ref_matmul(ar + q * as, br + q * bs, want, m, n, k, ta, tb);
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
        if (!ta) kt_ref_matmul(dcr, br, want_a, m, k, n, 0, !tb); /* dA [m,k] = dC B'^T */
        else kt_ref_matmul(br, dcr, want_a, k, m, n, tb, 1);       /* dA [k,m] = B' dC^T */
        if (!tb) kt_ref_matmul(ar, dcr, want_b, k, n, m, !ta, 0); /* dB [k,n] = A'^T dC */
        else kt_ref_matmul(dcr, ar, want_b, n, k, m, 1, ta);       /* dB [n,k] = dC^T A' */
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

Suite *kernels_matmul_bf16_suite(void) {
  Suite *s = suite_create("kernels_matmul_bf16");
  TCase *tc;
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

  return s;
}
