/* The matmul's panel packers (gemm.h): blocks of A and B copied into the micro-panels the
 * micro-kernels stream, zero padded; rows contiguous along K transposed in registers
 * (16 x 16 blocks in zmm, 8 x 8 in ymm, 4 x 4 in xmm), bfloat16 widened to float32 or woven
 * into pairs. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "gemm.h"
#include "kernel_internal.h"

enum { PACK_KC_MAX = 512 }; /* steps of K the bfloat16 packers stage at once: the matmul's largest K block */

typedef float v4f __attribute__((vector_size(4 * sizeof(float))));

/* Four rows r of 4 floats each (r at src + r*ld_src, contiguous) written transposed: column q
 * goes to dst + q*ld_dst. Eight shuffles instead of 16 scalar loads and stores (GCC 12 and
 * clang both have __builtin_shufflevector). */
static inline void transpose4(const float *src, int64_t ld_src, float *dst, int64_t ld_dst) {
  v4f r[4], t[4];
  for (int q = 0; q < 4; q++) memcpy(&r[q], src + q * ld_src, sizeof(v4f));
  t[0] = __builtin_shufflevector(r[0], r[1], 0, 4, 1, 5);
  t[1] = __builtin_shufflevector(r[0], r[1], 2, 6, 3, 7);
  t[2] = __builtin_shufflevector(r[2], r[3], 0, 4, 1, 5);
  t[3] = __builtin_shufflevector(r[2], r[3], 2, 6, 3, 7);
  v4f c[4] = {__builtin_shufflevector(t[0], t[2], 0, 1, 4, 5), __builtin_shufflevector(t[0], t[2], 2, 3, 6, 7),
              __builtin_shufflevector(t[1], t[3], 0, 1, 4, 5), __builtin_shufflevector(t[1], t[3], 2, 3, 6, 7)};
  for (int q = 0; q < 4; q++) memcpy(dst + q * ld_dst, &c[q], sizeof(v4f));
}

/* The same for two rows of 4 floats: column q (2 floats) goes to dst + q*ld_dst. */
static inline void transpose2(const float *src, int64_t ld_src, float *dst, int64_t ld_dst) {
  v4f r0, r1;
  memcpy(&r0, src, sizeof(v4f));
  memcpy(&r1, src + ld_src, sizeof(v4f));
  v4f lo = __builtin_shufflevector(r0, r1, 0, 4, 1, 5), hi = __builtin_shufflevector(r0, r1, 2, 6, 3, 7);
  memcpy(dst, &lo, 2 * sizeof(float));
  memcpy(dst + ld_dst, (float *)&lo + 2, 2 * sizeof(float));
  memcpy(dst + 2 * ld_dst, &hi, 2 * sizeof(float));
  memcpy(dst + 3 * ld_dst, (float *)&hi + 2, 2 * sizeof(float));
}

/* A float that may alias other types: the packers also move 32-bit pairs of bfloat16 as
 * floats (bits copied, never computed). */
typedef float word32 __attribute__((may_alias));

/* dst[p*ld_dst + i] = src[i*ld_src + p] for i < rows, p < len: rows contiguous along p are
 * interleaved into a panel, four (then two) rows and four steps at a time where they fit. */
static void interleave_rows(const word32 *restrict src, int64_t ld_src, int64_t rows, int64_t len,
                            word32 *restrict dst, int64_t ld_dst) {
  int64_t rows4 = rows & ~(int64_t)3, len4 = len & ~(int64_t)3;
  for (int64_t i = 0; i < rows4; i += 4) {
    const word32 *s = src + i * ld_src;
    for (int64_t p = 0; p < len4; p += 4) transpose4(s + p, ld_src, dst + p * ld_dst + i, ld_dst);
    for (int64_t q = 0; q < 4; q++)
      for (int64_t p = len4; p < len; p++) dst[p * ld_dst + i + q] = s[q * ld_src + p];
  }
  int64_t i = rows4;
  if (rows - i >= 2) {
    const word32 *s = src + i * ld_src;
    for (int64_t p = 0; p < len4; p += 4) transpose2(s + p, ld_src, dst + p * ld_dst + i, ld_dst);
    for (int64_t p = len4; p < len; p++) {
      dst[p * ld_dst + i] = s[p];
      dst[p * ld_dst + i + 1] = s[ld_src + p];
    }
    i += 2;
  }
  for (; i < rows; i++) {
    const word32 *s = src + i * ld_src;
    for (int64_t p = 0; p < len; p++) dst[p * ld_dst + i] = s[p];
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
typedef float v16f __attribute__((vector_size(16 * sizeof(float))));
/* 128-bit lanes l0 l1 of a and l2 l3 of b (lane numbers 0-3 in each). */
#define LANES(a, b, l0, l1, l2, l3)                                                                             \
  __builtin_shufflevector(a, b, 4 * (l0), 4 * (l0) + 1, 4 * (l0) + 2, 4 * (l0) + 3, 4 * (l1), 4 * (l1) + 1,        \
                          4 * (l1) + 2, 4 * (l1) + 3, 16 + 4 * (l2), 17 + 4 * (l2), 18 + 4 * (l2), 19 + 4 * (l2), \
                          16 + 4 * (l3), 17 + 4 * (l3), 18 + 4 * (l3), 19 + 4 * (l3))

/* interleave16_fn with AVX-512: 16 x 16 blocks transposed in registers (64 shuffles per
 * 256 floats, against 128 for 4 x 4 blocks), the tail of p with interleave_rows. */
__attribute__((target("avx512f"))) static void interleave16_avx512(const float *restrict src, int64_t ld_src,
                                                                    int64_t len, float *restrict dst, int64_t ld_dst) {
  int64_t len16 = len & ~(int64_t)15;
  for (int64_t p = 0; p < len16; p += 16) {
    v16f v[16], t[16], u[16];
    for (int j = 0; j < 16; j++) memcpy(&v[j], src + j * ld_src + p, sizeof(v16f));
    for (int j = 0; j < 16; j += 2) { /* 32-bit interleave inside lanes */
      t[j] = __builtin_shufflevector(v[j], v[j + 1], 0, 16, 1, 17, 4, 20, 5, 21, 8, 24, 9, 25, 12, 28, 13, 29);
      t[j + 1] = __builtin_shufflevector(v[j], v[j + 1], 2, 18, 3, 19, 6, 22, 7, 23, 10, 26, 11, 27, 14, 30, 15, 31);
    }
    for (int j = 0; j < 16; j += 4) { /* 64-bit interleave: lane L of u[j+k] is rows j..j+3 at column 4L+k */
      for (int h = 0; h < 2; h++) {
        u[j + 2 * h] = __builtin_shufflevector(t[j + h], t[j + h + 2], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13,
                                               28, 29);
        u[j + 2 * h + 1] = __builtin_shufflevector(t[j + h], t[j + h + 2], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27,
                                                   14, 15, 30, 31);
      }
    }
    for (int k = 0; k < 4; k++) { /* column 4L+k gathers lane L of u[k], u[4+k], u[8+k], u[12+k] */
      v16f wa = LANES(u[k], u[4 + k], 0, 1, 0, 1), wb = LANES(u[k], u[4 + k], 2, 3, 2, 3);
      v16f xa = LANES(u[8 + k], u[12 + k], 0, 1, 0, 1), xb = LANES(u[8 + k], u[12 + k], 2, 3, 2, 3);
      v16f out[4] = {LANES(wa, xa, 0, 2, 0, 2), LANES(wa, xa, 1, 3, 1, 3), LANES(wb, xb, 0, 2, 0, 2),
                     LANES(wb, xb, 1, 3, 1, 3)};
      for (int l = 0; l < 4; l++) memcpy(dst + (p + 4 * l + k) * ld_dst, &out[l], sizeof(v16f));
    }
  }
  if (len16 < len) interleave_rows(src + len16, ld_src, 16, len - len16, dst + len16 * ld_dst, ld_dst);
}
#undef LANES

typedef float v8f __attribute__((vector_size(8 * sizeof(float))));
/* interleave16_fn with AVX2: each 8 x 8 block transposed in ymm registers (24 shuffles per
 * 64 floats, against 32 for 4 x 4 blocks in xmm), two blocks of rows per 8 steps of p, the
 * tail of p with interleave_rows. */
__attribute__((target("avx2"))) static void interleave16_avx2(const float *restrict src, int64_t ld_src,
                                                               int64_t len, float *restrict dst, int64_t ld_dst) {
  int64_t len8 = len & ~(int64_t)7;
  for (int64_t p = 0; p < len8; p += 8) {
    for (int r0 = 0; r0 < 16; r0 += 8) {
      v8f v[8], t[8], u[8];
      for (int j = 0; j < 8; j++) memcpy(&v[j], src + (r0 + j) * ld_src + p, sizeof(v8f));
      for (int j = 0; j < 8; j += 2) { /* 32-bit interleave inside 128-bit lanes */
        t[j] = __builtin_shufflevector(v[j], v[j + 1], 0, 8, 1, 9, 4, 12, 5, 13);
        t[j + 1] = __builtin_shufflevector(v[j], v[j + 1], 2, 10, 3, 11, 6, 14, 7, 15);
      }
      for (int j = 0; j < 8; j += 4) { /* 64-bit: lane L of u[j+k] is rows j..j+3 at column 4L+k */
        u[j] = __builtin_shufflevector(t[j], t[j + 2], 0, 1, 8, 9, 4, 5, 12, 13);
        u[j + 1] = __builtin_shufflevector(t[j], t[j + 2], 2, 3, 10, 11, 6, 7, 14, 15);
        u[j + 2] = __builtin_shufflevector(t[j + 1], t[j + 3], 0, 1, 8, 9, 4, 5, 12, 13);
        u[j + 3] = __builtin_shufflevector(t[j + 1], t[j + 3], 2, 3, 10, 11, 6, 7, 14, 15);
      }
      for (int k = 0; k < 4; k++) { /* columns k and 4+k: a lane of rows 0-3 and one of rows 4-7 */
        v8f lo = __builtin_shufflevector(u[k], u[4 + k], 0, 1, 2, 3, 8, 9, 10, 11);
        v8f hi = __builtin_shufflevector(u[k], u[4 + k], 4, 5, 6, 7, 12, 13, 14, 15);
        memcpy(dst + (p + k) * ld_dst + r0, &lo, sizeof(v8f));
        memcpy(dst + (p + 4 + k) * ld_dst + r0, &hi, sizeof(v8f));
      }
    }
  }
  if (len8 < len) interleave_rows(src + len8, ld_src, 16, len - len8, dst + len8 * ld_dst, ld_dst);
}
#endif

interleave16_fn ttd_gemm_pick_interleave16(void) {
  const char *isa = getenv("TTD_KERNEL_ISA");
  if (isa && strcmp(isa, "generic") == 0) return NULL;
#if defined(__x86_64__) && defined(__GNUC__)
  if (__builtin_cpu_supports("avx512f") && !(isa && strcmp(isa, "avx2") == 0)) return interleave16_avx512;
  if (__builtin_cpu_supports("avx2")) return interleave16_avx2;
#endif
  return NULL;
}

void ttd_gemm_pack_a(const float *restrict a, int64_t rs, int64_t cs, int64_t mc, int64_t kc, float *restrict out) {
  for (int64_t r0 = 0; r0 < mc; r0 += MR) {
    float *restrict panel = out + (r0 / MR) * kc * MR;
    int64_t rows = mc - r0 < MR ? mc - r0 : MR;
    if (rows < MR) memset(panel, 0, (size_t)(kc * MR) * sizeof(float));
    if (cs == 1) { /* rows of A contiguous along p */
      interleave_rows(a + r0 * rs, rs, rows, kc, panel, MR);
    } else if (rs != 1) { /* neither stride 1 */
      for (int64_t i = 0; i < rows; i++) {
        const float *src = a + (r0 + i) * rs;
        for (int64_t p = 0; p < kc; p++) panel[p * MR + i] = src[p * cs];
      }
    } else { /* columns contiguous: A is transposed in memory */
      for (int64_t p = 0; p < kc; p++) {
        const float *src = a + p * cs + r0;
        for (int64_t i = 0; i < rows; i++) panel[p * MR + i] = src[i];
      }
    }
  }
}

void ttd_gemm_pack_b(const float *restrict b, int64_t rs, int64_t cs, int64_t kc, int64_t nc, int64_t NR,
                     float *restrict out, interleave16_fn interleave16) {
  for (int64_t s0 = 0; s0 < nc; s0 += NR) {
    float *restrict panel = out + (s0 / NR) * kc * NR;
    int64_t cols = nc - s0 < NR ? nc - s0 : NR;
    if (cols < NR) memset(panel, 0, (size_t)(kc * NR) * sizeof(float));
    if (cs == 1 && cols == NR) { /* rows of B contiguous along j: a fixed-size copy per row */
      if (NR == 16)
        for (int64_t p = 0; p < kc; p++) memcpy(panel + p * 16, b + p * rs + s0, 16 * sizeof(float));
      else
        for (int64_t p = 0; p < kc; p++) memcpy(panel + p * 32, b + p * rs + s0, 32 * sizeof(float));
    } else if (cs == 1) {
      for (int64_t p = 0; p < kc; p++) {
        const float *src = b + p * rs + s0;
        for (int64_t j = 0; j < cols; j++) panel[p * NR + j] = src[j];
      }
    } else if (rs == 1 && cols == NR && interleave16) { /* B transposed in memory (a linear's weight) */
      for (int64_t j = 0; j < NR; j += 16) interleave16(b + (s0 + j) * cs, cs, kc, panel + j, NR);
    } else if (rs == 1) {
      interleave_rows(b + s0 * cs, cs, cols, kc, panel, NR);
    } else {
      for (int64_t j = 0; j < cols; j++) {
        const float *src = b + (s0 + j) * cs;
        for (int64_t p = 0; p < kc; p++) panel[p * NR + j] = src[p * rs];
      }
    }
  }
}


#if defined(__x86_64__) && defined(__GNUC__)
typedef uint16_t v32u16 __attribute__((vector_size(32 * sizeof(uint16_t))));
/* panel[d*32 + i] = src[2d*s_p + i] | src[(2d+1)*s_p + i] << 16 for d < kd, i < 32: two
 * rows of B woven into pairs, 32 at a time with AVX-512 BW (vpermt2w). Only in
 * MODE_BF16_PAIRS, which ttd_gemm_bf16_pairs grants where the CPU has AVX-512 BW. */
__attribute__((target("avx512f,avx512bw"))) static void weave_pairs32_avx512(const uint16_t *restrict src,
                                                                             int64_t s_p, int64_t kd,
                                                                             uint32_t *restrict panel) {
  for (int64_t d = 0; d < kd; d++) {
    v32u16 lo, hi;
    memcpy(&lo, src + 2 * d * s_p, sizeof(lo));
    memcpy(&hi, src + (2 * d + 1) * s_p, sizeof(hi));
    v32u16 w0 = __builtin_shufflevector(lo, hi, 0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39, 8, 40, 9, 41,
                                        10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47);
    v32u16 w1 = __builtin_shufflevector(lo, hi, 16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55, 24,
                                        56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63);
    memcpy(panel + d * 32, &w0, sizeof(w0));
    memcpy(panel + d * 32 + 16, &w1, sizeof(w1));
  }
}
#endif

/* One R-row panel (n <= R <= 32 rows along K, kc <= PACK_KC_MAX) of bfloat16 widened: whole
 * rows widened on the stack, then packed as float32 rows are. Its own frame, so that the
 * other packers do not reserve the buffer. */
static __attribute__((noinline)) void pack_widened_rows(const uint16_t *src, int64_t s_i, int64_t n, int64_t kc,
                                                        int64_t R, float *panel, interleave16_fn interleave16) {
  float rows_f32[32 * PACK_KC_MAX];
  for (int64_t i = 0; i < n; i++) ttd_f32_from_bf16_n(rows_f32 + i * kc, src + i * s_i, (size_t)kc);
  if (R == MR) ttd_gemm_pack_a(rows_f32, kc, 1, n, kc, panel);
  else ttd_gemm_pack_b(rows_f32, 1, kc, kc, n, R, panel, interleave16);
}

void ttd_gemm_pack_bf16(const uint16_t *restrict x, int64_t s_i, int64_t s_p, int64_t rows, int64_t kc, int64_t R,
                        int pairs, float *restrict out, interleave16_fn interleave16) {
  int64_t kd = pairs ? (kc + 1) / 2 : kc, kc2 = kc & ~(int64_t)1;
  for (int64_t r0 = 0; r0 < rows; r0 += R) {
    int64_t n = rows - r0 < R ? rows - r0 : R;
    const uint16_t *src = x + r0 * s_i;
    if (!pairs) {
      float *restrict panel = out + (r0 / R) * kc * R;
      if (n < R) memset(panel, 0, (size_t)(kc * R) * sizeof(float));
      if (s_i == 1) { /* rows of X contiguous along i (B row-major) */
        for (int64_t p = 0; p < kc; p++)
          for (int64_t i = 0; i < n; i++) panel[p * R + i] = ttd_f32_from_bf16(src[p * s_p + i]);
      } else if (s_p == 1 && R <= 32 && kc <= PACK_KC_MAX) { /* rows along K (a linear's weight as B) */
        pack_widened_rows(src, s_i, n, kc, R, panel, interleave16);
      } else {
        for (int64_t i = 0; i < n; i++)
          for (int64_t p = 0; p < kc; p++) panel[p * R + i] = ttd_f32_from_bf16(src[i * s_i + p * s_p]);
      }
      continue;
    }
    uint32_t *restrict panel = (uint32_t *)out + (r0 / R) * kd * R;
    if (n < R) memset(panel, 0, (size_t)(kd * R) * sizeof(uint32_t));
#if defined(__x86_64__) && defined(__GNUC__)
    if (s_i == 1 && n == 32 && R == 32 && __builtin_cpu_supports("avx512bw")) /* B row-major, a full 32-column panel */
      weave_pairs32_avx512(src, s_p, kc2 / 2, panel);
    else
#endif
    if (s_i == 1) { /* two rows of X side by side (B row-major): a widening interleave */
      for (int64_t d = 0; d < kc2 / 2; d++) {
        const uint16_t *lo = src + 2 * d * s_p, *hi = lo + s_p;
        for (int64_t i = 0; i < n; i++) panel[d * R + i] = (uint32_t)lo[i] | (uint32_t)hi[i] << 16;
      }
    } else if (s_p == 1 && s_i % 2 == 0 && (uintptr_t)src % 4 == 0) {
      /* A pair is a 32-bit word, and each row of X a row of words (A row-major, a linear's
       * weight): transposed as floats are, bits unchanged, 16 rows at a time in registers. */
      const word32 *words = (const word32 *)(const void *)src;
      int64_t i = 0, ld = s_i / 2;
      for (; interleave16 && i + 16 <= n; i += 16)
        interleave16((const float *)(words + i * ld), ld, kc2 / 2, (float *)panel + i, R); /* moves by memcpy */
      if (i < n) interleave_rows(words + i * ld, ld, n - i, kc2 / 2, (word32 *)panel + i, R);
    } else if (s_p == 1) { /* pairs of 32 contiguous bits, at any alignment */
      for (int64_t i = 0; i < n; i++)
        for (int64_t d = 0; d < kc2 / 2; d++) {
          uint32_t v;
          memcpy(&v, src + i * s_i + 2 * d, sizeof(v));
          panel[d * R + i] = v; /* x86-64 and arm64 are little-endian: low half is step 2d */
        }
    } else {
      for (int64_t i = 0; i < n; i++)
        for (int64_t d = 0; d < kc2 / 2; d++)
          panel[d * R + i] = (uint32_t)src[i * s_i + 2 * d * s_p] | (uint32_t)src[i * s_i + (2 * d + 1) * s_p] << 16;
    }
    if (kc2 < kc) /* an odd K: the last pair's second half is zero */
      for (int64_t i = 0; i < n; i++) panel[(kd - 1) * R + i] = src[i * s_i + kc2 * s_p];
  }
}

/* panel[d*R + i] = X(i, 2d) | X(i, 2d + 1) << 16 for d < kd, i < n, each narrowed, of a float32
 * X contiguous along i (X(i,p) = src[p*s_p + i]); a zero high half past step kc (odd kc). */
TTD_KHOT static void weave_narrow(const float *restrict src, int64_t s_p, int64_t kc, int64_t n, int64_t R,
                                  uint32_t *restrict panel) {
  for (int64_t d = 0; d < kc / 2; d++) {
    const float *lo = src + 2 * d * s_p, *hi = lo + s_p;
    for (int64_t i = 0; i < n; i++)
      panel[d * R + i] = (uint32_t)ttd_bf16_from_f32(lo[i]) | (uint32_t)ttd_bf16_from_f32(hi[i]) << 16;
  }
  if (kc & 1)
    for (int64_t i = 0; i < n; i++) panel[kc / 2 * R + i] = ttd_bf16_from_f32(src[(kc - 1) * s_p + i]);
}

void ttd_gemm_pack_f32_pairs(const float *restrict x, int64_t s_i, int64_t s_p, int64_t rows, int64_t kc, int64_t R,
                             float *restrict out, interleave16_fn interleave16) {
  if (R > 32) abort(); /* the staging buffer holds 32 rows; the matmul's panels have at most 32 */
  int64_t kd = (kc + 1) / 2;
  _Alignas(64) uint16_t narrowed[32 * PACK_KC_MAX]; /* up to 32 rows of X in bfloat16, laid out as X is read */
  for (int64_t r0 = 0; r0 < rows; r0 += R) {
    int64_t n = rows - r0 < R ? rows - r0 : R;
    const float *src = x + r0 * s_i;
    float *panel = out + (r0 / R) * kd * R;
    if (s_i == 1) { /* contiguous along i: narrowed and woven in one pass */
      if (n < R) memset(panel, 0, (size_t)(kd * R) * sizeof(uint32_t));
      weave_narrow(src, s_p, kc, n, R, (uint32_t *)panel);
      continue;
    }
    for (int64_t p0 = 0; p0 < kc; p0 += PACK_KC_MAX) { /* one block unless kc > PACK_KC_MAX */
      int64_t len = kc - p0 < PACK_KC_MAX ? kc - p0 : PACK_KC_MAX;
      /* one row of X after another, each at an even stride: rows of 32-bit pairs */
      int64_t ld = len + (len & 1);
      for (int64_t i = 0; i < n; i++) {
        if (s_p == 1) ttd_bf16_from_f32_n(narrowed + i * ld, src + i * s_i + p0, (size_t)len);
        else
          for (int64_t p = 0; p < len; p++) narrowed[i * ld + p] = ttd_bf16_from_f32(src[i * s_i + (p0 + p) * s_p]);
      }
      ttd_gemm_pack_bf16(narrowed, ld, 1, n, len, R, 1, panel + p0 / 2 * R, interleave16);
    }
  }
}
