/* Batched matrix multiply and its backward (kernels.h).
 *
 * Everything goes through one strided GEMM: C(i,j) = sum_p A(i,p) B(p,j) with arbitrary row
 * and column strides for A and B, a dense C, and a batch that either gives each problem its
 * own C or (C batch stride 0) sums every problem into one C, which is how the backward
 * reduces the gradient of a broadcast operand.
 *
 * The GEMM is blocked the usual way (Goto / BLIS): the work is cut into tiles of C, one
 * task each; a task walks K in blocks of at most KC, packs its A block into MR-row
 * micro-panels and its B block into NR-column micro-panels (zero padded), and runs an
 * MR x NR register-blocked micro-kernel over them (NR is the kernel's: 16 with AVX2, whose
 * B micro-panel then takes half of a 32 KiB L1 rather than all of it; 32 elsewhere). Tasks
 * are split over the pool. When C is cut along N and A is small (a training batch:
 * 64 x 784), A is packed once for every task, in parallel, instead of once per task. The
 * tiles of a column of C come in turn, and a thread that runs several keeps their B packed
 * over all of K; over several K blocks each thread takes whole columns. So B is packed once
 * per column rather than once per tile (on the Zen 3 guest, paired against packing per
 * tile: 0.83-0.86x the time for squares of 512 to 2048 on two threads, 0.86-0.98x on one).
 *
 * Each C element is summed in the same order whatever the tile sizes or the thread count
 * (K blocks whose size depends only on K, in order; inside a block one accumulator per
 * element), so results do not depend on the pool, nor a row's on how many rows A has: a
 * module run at another batch size gives each example the values of its compiled batch.
 *
 * A against a transposed B with both contiguous along K (x W^T, a linear's forward) goes
 * another way where the ISA has it (AVX2) and K is at most DOT_K_MAX: dot products, 3 rows of
 * A by 4 columns of B in registers, 8 steps of K in the lanes of each, summed across them at
 * the end, with nothing packed: at batch 64 the packed GEMM spends a fifth of its time
 * transposing the weight into B panels that then serve only 64 rows each. Whether a
 * problem goes this way depends on K, the layout and the ISA, never on m, so a row's values
 * still do not depend on how many rows A has.
 *
 * A and B may instead hold bfloat16 (ttd_k_matmul_bf16), summed in float32 all the same. On
 * a CPU with AVX-512 BF16 the packs keep them as bfloat16, K pairs side by side in 32 bits
 * (the layout vdpbf16ps multiplies, a zero past an odd K), so one "packed step" of a panel
 * is two steps of K; elsewhere (or with TTD_KERNEL_ISA set) they are widened to float32 as
 * they are packed and the float32 micro-kernels run. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "kernel_internal.h"
#include "kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

enum {
  MR = 6,       /* micro-tile rows; its columns (NR) are the kernel's: 6 x 32 (AVX-512) or 6 x 16 (AVX2) is
                   12 accumulators, enough to keep two FMA pipes busy */
  KC = 256,     /* largest K block: an NR-column B micro-panel (16 or 32 KiB) stays in L1 */
  MC_MAX = 288, /* rows of C per task (A block: 288 KiB, in L2; amortises packing B) */
  NC_MAX = 512, /* columns of C per task */
  SHARED_A_MAX = 1 << 20, /* floats: A packed once for all tasks up to 4 MiB */
  KEPT_B_MAX = 2 << 20,   /* floats: a task keeps B packed over all of K for its next tiles up to 8 MiB */
  DOT_K_MAX = 1024,        /* dot products up to this K: 3 rows of A and 4 columns of B, 28 KiB, in L1 */
  DOT_A_BYTES = 256 << 10, /* rows of A per dot-product tile: half of a 512 KiB L2 */
};

/* C[mr x nr] (=, or += when accumulate) the product of an MR-row A micro-panel and an
 * NR-column B micro-panel over kd packed steps (a float each, or a pair of bfloat16). */
typedef void (*micro_kernel_fn)(int64_t kd, const void *restrict ap, const void *restrict bp, float *restrict c,
                                int64_t ldc, int64_t mr, int64_t nr, int accumulate);

/* C(i,j) for i < rows <= DOT_ROWS, j < cols <= DOT_COLS: the dot products of rows of A (row i at
 * a + i*lda) and columns of B (column j at b + j*ldb), both contiguous along K, over k steps;
 * then C = it, or C + it when accumulate; then bias[j] added when bias is not NULL. */
typedef void (*dot_block_fn)(int64_t k, const float *a, int64_t lda, const float *b, int64_t ldb, float *c,
                            int64_t ldc, int rows, int cols, const float *bias, int accumulate);

enum { DOT_ROWS = 3, DOT_COLS = 4 };

/* A micro-kernel and the NR its B panels are packed for. */
typedef struct micro_kernel {
  micro_kernel_fn fn;
  int64_t nr;
  dot_block_fn dot; /* or NULL: this ISA has no dot-product blocks */
} micro_kernel;

/* Sixteen rows contiguous along p (row j at src + j*ld_src), p in [0, len), interleaved into
 * 16 columns of a panel: dst[p*ld_dst + j] = src[j*ld_src + p]. */
typedef void (*interleave16_fn)(const float *restrict src, int64_t ld_src, int64_t len, float *restrict dst,
                                int64_t ld_dst);

/* How A and B are held and packed. */
typedef enum gemm_mode {
  MODE_F32,        /* float32, packed as float32 */
  MODE_BF16_WIDEN, /* bfloat16, widened to float32 as packed: any float32 micro-kernel */
  MODE_BF16_PAIRS, /* bfloat16, packed as K pairs: the AVX-512 BF16 micro-kernel */
} gemm_mode;

typedef struct gemm_problem {
  int64_t batch, m, n, k;
  gemm_mode mode;
  const void *a; /* A(q,i,p) = a[q*a_bs + i*a_rs + p*a_cs], float or bfloat16 bits (uint16_t) */
  int64_t a_rs, a_cs, a_bs;
  const void *b; /* B(q,p,j) = b[q*b_bs + p*b_rs + j*b_cs] */
  int64_t b_rs, b_cs, b_bs;
  float *c; /* C(q,i,j) = c[q*c_bs + i*ldc + j]; c_bs 0: all q summed into one C */
  int64_t ldc, c_bs;
  int c_accumulate; /* C += the product instead of C = it */
  const float *col_bias; /* or NULL: C(q,i,j) += col_bias[j] once the sum is complete */
  int64_t kc, mc, nc, m_tiles, n_tiles, outputs; /* blocking and tiling, filled by gemm_run */
  float *a_packed; /* or NULL: A packed for all tasks, K block p0 at a_packed + depth(p0) * round_up(m, MR) */
  micro_kernel_fn kernel;
  int64_t nr; /* the kernel's NR: B panels of nr columns */
  bool dot_layout; /* rows of A and columns of B stored contiguous along K (A [m,k], B [n,k]), whatever the sizes */
  dot_block_fn dot; /* or NULL: the tiles are dot-product blocks (dot_applies), not packed GEMM tiles */
  interleave16_fn interleave16; /* or NULL: interleave_rows */
} gemm_problem;

/* clang-format off */
/* Defines a micro-kernel of NR columns for vectors of W floats (gcc vector extensions, so one
 * source serves every ISA): the MR x NR tile goes in passes of CW columns, each with MR x CW/W
 * vector accumulators that stay in registers, the B row of the pass in CW/W more and the
 * broadcast A element in one. Full tiles are stored straight from the accumulators. */
#define TTD_DEFINE_MICRO_KERNEL(name, attr, W, CW, NR)                                                             \
  attr static void name(int64_t kc, const void *restrict ap_, const void *restrict bp_, float *restrict c,       \
                        int64_t ldc, int64_t mr, int64_t nr, int accumulate) {                                     \
    typedef float vec __attribute__((vector_size((W) * sizeof(float))));                                           \
    const float *restrict ap = ap_, *restrict bp = bp_;                                                            \
    enum { V = (CW) / (W) };                                                                                       \
    int full = mr == MR && nr == NR;                                                                               \
    float tile[MR][NR];                                                                                            \
    for (int h = 0; h < NR; h += (CW)) {                                                                           \
      vec acc[MR][V];                                                                                              \
      _Pragma("GCC unroll 6") for (int i = 0; i < MR; i++)                                                         \
        _Pragma("GCC unroll 4") for (int v = 0; v < V; v++) acc[i][v] = (vec){0};                                  \
      for (int64_t p = 0; p < kc; p++) {                                                                           \
        vec b[V];                                                                                                  \
        _Pragma("GCC unroll 4") for (int v = 0; v < V; v++) memcpy(&b[v], bp + p * NR + h + v * (W), sizeof(vec)); \
        _Pragma("GCC unroll 6") for (int i = 0; i < MR; i++) {                                                     \
          float a = ap[p * MR + i];                                                                                \
          _Pragma("GCC unroll 4") for (int v = 0; v < V; v++) acc[i][v] += a * b[v];                               \
        }                                                                                                          \
      }                                                                                                            \
      if (full) {                                                                                                  \
        _Pragma("GCC unroll 6") for (int i = 0; i < MR; i++)                                                       \
          _Pragma("GCC unroll 4") for (int v = 0; v < V; v++) {                                                    \
            float *dst = c + i * ldc + h + v * (W);                                                                \
            vec out = acc[i][v];                                                                                   \
            if (accumulate) {                                                                                      \
              vec old;                                                                                             \
              memcpy(&old, dst, sizeof(old));                                                                      \
              out += old;                                                                                          \
            }                                                                                                      \
            memcpy(dst, &out, sizeof(out));                                                                        \
          }                                                                                                        \
      } else {                                                                                                     \
        for (int i = 0; i < MR; i++) memcpy(&tile[i][h], acc[i], sizeof(acc[i]));                                  \
      }                                                                                                            \
    }                                                                                                              \
    if (full) return;                                                                                              \
    for (int64_t i = 0; i < mr; i++)                                                                               \
      for (int64_t j = 0; j < nr; j++) c[i * ldc + j] = accumulate ? c[i * ldc + j] + tile[i][j] : tile[i][j];     \
  }

/* Any target: 4-float vectors (SSE2 on x86-64, NEON on arm64), 6 x 8 per pass in 12 xmm, four passes. */
TTD_DEFINE_MICRO_KERNEL(micro_kernel_generic, , 4, 8, 32)
/* clang-format on */

#if defined(__x86_64__) && defined(__GNUC__)
/* AVX2 + FMA: 6 x 16 in 12 ymm (the classic Haswell kernel), one pass over 16-column panels.
 * On Zen 3 a step ran 2-9 % faster than with two passes over 32-column panels, whose 32 KiB B
 * micro-panel fills the L1 the A panel also streams through. */
TTD_DEFINE_MICRO_KERNEL(micro_kernel_avx2, __attribute__((target("avx2,fma"))), 8, 16, 16)
/* AVX-512: 6 x 32 in 12 zmm, one pass (6 x 16 in 6 zmm ran at 155 GFLOP/s here, this at 185). */
TTD_DEFINE_MICRO_KERNEL(micro_kernel_avx512, __attribute__((target("avx512f"))), 16, 32, 32)

/* The four sums of the lanes of a, b, c and d, each ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)). */
__attribute__((target("avx2,fma"))) static inline __m128 dot_sum4(__m256 a, __m256 b, __m256 c, __m256 d) {
  __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

/* dot_block_fn with AVX2 + FMA: 3 rows of A by 4 columns of B in 12 ymm accumulators, 8 steps of K
 * in their lanes (a tail of K loaded masked, its missing lanes zero in both operands), summed
 * across the lanes at the end. A block of fewer rows or columns repeats its first one and
 * stores only its own. Nothing is packed: each step loads 7 vectors for 12 FMAs, where the
 * packed micro-kernel loads 2 and broadcasts 6. */
__attribute__((target("avx2,fma"))) static void dot_block_avx2(int64_t k, const float *a, int64_t lda, const float *b,
                                                              int64_t ldb, float *c, int64_t ldc, int rows, int cols,
                                                              const float *bias, int accumulate) {
  const float *a0 = a, *a1 = a + (rows > 1 ? lda : 0), *a2 = a + (rows > 2 ? 2 * lda : 0);
  const float *b0 = b, *b1 = b + (cols > 1 ? ldb : 0), *b2 = b + (cols > 2 ? 2 * ldb : 0);
  const float *b3 = b + (cols > 3 ? 3 * ldb : 0);
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c02 = c00, c03 = c00, c10 = c00, c11 = c00, c12 = c00, c13 = c00;
  __m256 c20 = c00, c21 = c00, c22 = c00, c23 = c00;
#define DOT_STEP(LOAD)                                                                                           \
  do {                                                                                                          \
    __m256 w0 = LOAD(b0), w1 = LOAD(b1), w2 = LOAD(b2), w3 = LOAD(b3), x = LOAD(a0);                            \
    c00 = _mm256_fmadd_ps(x, w0, c00), c01 = _mm256_fmadd_ps(x, w1, c01);                                      \
    c02 = _mm256_fmadd_ps(x, w2, c02), c03 = _mm256_fmadd_ps(x, w3, c03);                                      \
    x = LOAD(a1);                                                                                               \
    c10 = _mm256_fmadd_ps(x, w0, c10), c11 = _mm256_fmadd_ps(x, w1, c11);                                      \
    c12 = _mm256_fmadd_ps(x, w2, c12), c13 = _mm256_fmadd_ps(x, w3, c13);                                      \
    x = LOAD(a2);                                                                                               \
    c20 = _mm256_fmadd_ps(x, w0, c20), c21 = _mm256_fmadd_ps(x, w1, c21);                                      \
    c22 = _mm256_fmadd_ps(x, w2, c22), c23 = _mm256_fmadd_ps(x, w3, c23);                                      \
  } while (0)
  int64_t k8 = k & ~(int64_t)7, p = 0;
#define DOT_FULL(ptr) _mm256_loadu_ps((ptr) + p)
  for (; p < k8; p += 8) DOT_STEP(DOT_FULL);
  if (p < k) {
    __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(k - p)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
#define DOT_TAIL(ptr) _mm256_maskload_ps((ptr) + p, mask)
    DOT_STEP(DOT_TAIL);
#undef DOT_TAIL
  }
#undef DOT_FULL
#undef DOT_STEP
  __m128 r[DOT_ROWS] = {dot_sum4(c00, c01, c02, c03), dot_sum4(c10, c11, c12, c13), dot_sum4(c20, c21, c22, c23)};
  for (int i = 0; i < rows; i++) {
    float *dst = c + i * ldc;
    if (cols == DOT_COLS) {
      __m128 out = accumulate ? _mm_add_ps(_mm_loadu_ps(dst), r[i]) : r[i];
      if (bias) out = _mm_add_ps(out, _mm_loadu_ps(bias));
      _mm_storeu_ps(dst, out);
    } else {
      float v[4];
      _mm_storeu_ps(v, r[i]);
      for (int j = 0; j < cols; j++) {
        float out = accumulate ? dst[j] + v[j] : v[j];
        dst[j] = bias ? out + bias[j] : out;
      }
    }
  }
}

/* AVX-512 BF16: the same 6 x 32 tile in 12 zmm, each vdpbf16ps two steps of K (a pair of
 * bfloat16 of A broadcast against 32 pairs of B), so twice the multiply-adds of an FMA. The
 * products of two bfloat16 are exact in float32; subnormals are flushed, as the instruction
 * does. Panels are MODE_BF16_PAIRS packs: 32-bit pairs, low half the even step. */
__attribute__((target("avx512f,avx512bf16"))) static void micro_kernel_avx512bf16(
    int64_t kd, const void *restrict ap_, const void *restrict bp_, float *restrict c, int64_t ldc, int64_t mr,
    int64_t nr, int accumulate) {
  enum { NR = 32 };
  const uint32_t *restrict ap = ap_, *restrict bp = bp_;
  __m512 acc[MR][2];
  _Pragma("GCC unroll 6") for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kd; p++) {
    __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + p * NR), b1 = (__m512bh)_mm512_loadu_si512(bp + p * NR + 16);
    _Pragma("GCC unroll 6") for (int i = 0; i < MR; i++) {
      __m512bh a = (__m512bh)_mm512_set1_epi32((int)ap[p * MR + i]);
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], a, b0);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], a, b1);
    }
  }
  if (mr == MR && nr == NR) {
    _Pragma("GCC unroll 6") for (int i = 0; i < MR; i++) for (int v = 0; v < 2; v++) {
      float *dst = c + i * ldc + 16 * v;
      __m512 out = accumulate ? _mm512_add_ps(acc[i][v], _mm512_loadu_ps(dst)) : acc[i][v];
      _mm512_storeu_ps(dst, out);
    }
    return;
  }
  float tile[MR][NR];
  for (int i = 0; i < MR; i++) {
    _mm512_storeu_ps(&tile[i][0], acc[i][0]);
    _mm512_storeu_ps(&tile[i][16], acc[i][1]);
  }
  for (int64_t i = 0; i < mr; i++)
    for (int64_t j = 0; j < nr; j++) c[i * ldc + j] = accumulate ? c[i * ldc + j] + tile[i][j] : tile[i][j];
}
#endif

/* Whether bfloat16 operands go to the AVX-512 BF16 micro-kernel (MODE_BF16_PAIRS): where the
 * CPU has it and TTD_KERNEL_ISA names no narrower ISA ("avx512", "avx2", "generic" widen to
 * float32 and take that ISA's float32 kernel; the tests run each path this way). */
static int pick_bf16_pairs(void) {
  const char *isa = getenv("TTD_KERNEL_ISA");
  if (isa && *isa && strcmp(isa, "avx512bf16") != 0) return 0;
#if defined(__x86_64__) && defined(__GNUC__)
  return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw");
#else
  return 0;
#endif
}

/* The widest kernel this CPU runs (the CPU model is read by a libgcc constructor, so this is
 * safe from any thread), or a narrower one named by TTD_KERNEL_ISA ("avx2", "generic"; the
 * tests run every kernel this way). Chosen at run time, not with target_clones: each ISA
 * needs its own vector width to keep the accumulators in registers (one 64-byte-vector
 * source under target_clones runs at a tenth of the speed in its AVX2 clone). */
static micro_kernel pick_micro_kernel(void) {
  const micro_kernel generic = {micro_kernel_generic, 32, NULL};
  const char *isa = getenv("TTD_KERNEL_ISA");
  if (isa && strcmp(isa, "generic") == 0) return generic;
#if defined(__x86_64__) && defined(__GNUC__)
  if (__builtin_cpu_supports("avx512f") && !(isa && strcmp(isa, "avx2") == 0))
    return (micro_kernel){micro_kernel_avx512, 32, NULL};
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return (micro_kernel){micro_kernel_avx2, 16, dot_block_avx2};
#endif
  return generic;
}

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

/* dst[p*ld_dst + i] = src[i*ld_src + p] for i < rows, p < len: rows contiguous along p are
 * interleaved into a panel, four (then two) rows and four steps at a time where they fit. */
static void interleave_rows(const float *restrict src, int64_t ld_src, int64_t rows, int64_t len, float *restrict dst,
                            int64_t ld_dst) {
  int64_t rows4 = rows & ~(int64_t)3, len4 = len & ~(int64_t)3;
  for (int64_t i = 0; i < rows4; i += 4) {
    const float *s = src + i * ld_src;
    for (int64_t p = 0; p < len4; p += 4) transpose4(s + p, ld_src, dst + p * ld_dst + i, ld_dst);
    for (int64_t q = 0; q < 4; q++)
      for (int64_t p = len4; p < len; p++) dst[p * ld_dst + i + q] = s[q * ld_src + p];
  }
  int64_t i = rows4;
  if (rows - i >= 2) {
    const float *s = src + i * ld_src;
    for (int64_t p = 0; p < len4; p += 4) transpose2(s + p, ld_src, dst + p * ld_dst + i, ld_dst);
    for (int64_t p = len4; p < len; p++) {
      dst[p * ld_dst + i] = s[p];
      dst[p * ld_dst + i + 1] = s[ld_src + p];
    }
    i += 2;
  }
  for (; i < rows; i++) {
    const float *s = src + i * ld_src;
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

/* The widest transposing packer the CPU has, or a narrower one named by TTD_KERNEL_ISA. */
static interleave16_fn pick_interleave16(void) {
  const char *isa = getenv("TTD_KERNEL_ISA");
  if (isa && strcmp(isa, "generic") == 0) return NULL;
#if defined(__x86_64__) && defined(__GNUC__)
  if (__builtin_cpu_supports("avx512f") && !(isa && strcmp(isa, "avx2") == 0)) return interleave16_avx512;
  if (__builtin_cpu_supports("avx2")) return interleave16_avx2;
#endif
  return NULL;
}

/* Packs rows [0, mc) x cols [0, kc) of the strided A block at `a` into MR-row micro-panels:
 * panel r holds out[r*kc*MR + p*MR + i] = A(r*MR + i, p), zero past row mc. */
static void pack_a(const float *restrict a, int64_t rs, int64_t cs, int64_t mc, int64_t kc, float *restrict out) {
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

/* Packs rows [0, kc) x cols [0, nc) of the strided B block at `b` into NR-column
 * micro-panels: panel s holds out[s*kc*NR + p*NR + j] = B(p, s*NR + j), zero past col nc.
 * NR is 16 or 32. */
static void pack_b(const float *restrict b, int64_t rs, int64_t cs, int64_t kc, int64_t nc, int64_t NR,
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

/* Packed steps for kc steps of K: one float each, or one per pair of bfloat16. */
static int64_t depth(const gemm_problem *g, int64_t kc) { return g->mode == MODE_BF16_PAIRS ? (kc + 1) / 2 : kc; }

#if defined(__x86_64__) && defined(__GNUC__)
typedef uint16_t v32u16 __attribute__((vector_size(32 * sizeof(uint16_t))));
/* panel[d*32 + i] = src[2d*s_p + i] | src[(2d+1)*s_p + i] << 16 for d < kd, i < 32: two
 * rows of B woven into pairs, 32 at a time with AVX-512 BW (vpermt2w). Only in
 * MODE_BF16_PAIRS, which pick_bf16_pairs grants where the CPU has AVX-512 BW. */
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

/* Packs rows [0, rows) x steps [0, kc) of the bfloat16 X(i,p) = x[i*s_i + p*s_p] into R-row
 * panels (R = MR for A; for B, R = NR and its columns are the rows), zero past row `rows` and
 * step kc. Widened, panel r holds out[r*kc*R + p*R + i] = X(r*R + i, p); as pairs, out (as
 * uint32_t) [r*kd*R + d*R + i] = X(., 2d) | X(., 2d + 1) << 16, kd = ceil(kc / 2). */
static void pack_bf16(const uint16_t *restrict x, int64_t s_i, int64_t s_p, int64_t rows, int64_t kc, int64_t R,
                      int pairs, float *restrict out) {
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
      } else {
        for (int64_t i = 0; i < n; i++)
          for (int64_t p = 0; p < kc; p++) panel[p * R + i] = ttd_f32_from_bf16(src[i * s_i + p * s_p]);
      }
      continue;
    }
    uint32_t *restrict panel = (uint32_t *)out + (r0 / R) * kd * R;
    if (n < R) memset(panel, 0, (size_t)(kd * R) * sizeof(uint32_t));
#if defined(__x86_64__) && defined(__GNUC__)
    if (s_i == 1 && n == 32 && R == 32) /* B row-major, a full 32-column panel */
      weave_pairs32_avx512(src, s_p, kc2 / 2, panel);
    else
#endif
    if (s_i == 1) { /* two rows of X side by side (B row-major): a widening interleave */
      for (int64_t d = 0; d < kc2 / 2; d++) {
        const uint16_t *lo = src + 2 * d * s_p, *hi = lo + s_p;
        for (int64_t i = 0; i < n; i++) panel[d * R + i] = (uint32_t)lo[i] | (uint32_t)hi[i] << 16;
      }
    } else if (s_p == 1) { /* a pair is 32 contiguous bits (A row-major, a linear's weight) */
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

/* Element `off` of a float or bfloat16 operand. */
static const void *elem_at(const gemm_problem *g, const void *base, int64_t off) {
  return (const char *)base + off * (g->mode == MODE_F32 ? (int64_t)sizeof(float) : (int64_t)sizeof(uint16_t));
}

/* Packs A(i,p), i in [0, mc), p in [0, kc), of the operand at `a` (strides as in g) for g's micro-kernel. */
static void pack_a_any(const gemm_problem *g, const void *a, int64_t mc, int64_t kc, float *out) {
  if (g->mode == MODE_F32) pack_a(a, g->a_rs, g->a_cs, mc, kc, out);
  else pack_bf16(a, g->a_rs, g->a_cs, mc, kc, MR, g->mode == MODE_BF16_PAIRS, out);
}

/* Packs B(p,j), p in [0, kc), j in [0, nc), likewise. */
static void pack_b_any(const gemm_problem *g, const void *b, int64_t kc, int64_t nc, float *out) {
  if (g->mode == MODE_F32) pack_b(b, g->b_rs, g->b_cs, kc, nc, g->nr, out, g->interleave16);
  else pack_bf16(b, g->b_cs, g->b_rs, nc, kc, g->nr, g->mode == MODE_BF16_PAIRS, out);
}

/* One element of an operand as float. */
static float elem_f32(const gemm_problem *g, const void *base, int64_t off) {
  return g->mode == MODE_F32 ? ((const float *)base)[off] : ttd_f32_from_bf16(((const uint16_t *)base)[off]);
}

/* Without pack buffers (out of memory): the same tile, computed directly. */
static void tile_unpacked(const gemm_problem *g, int64_t q0, int64_t q1, int64_t i0, int64_t i1, int64_t j0, int64_t j1,
                          float *c) {
  ttd_kcheck check = TTD_KCHECK_INIT;
  for (int64_t i = i0; i < i1; i++)
    for (int64_t j = j0; j < j1; j++) {
      if (ttd_kstop(&check, (q1 - q0) * g->k)) return;
      float s = 0.0f;
      for (int64_t q = q0; q < q1; q++) {
        int64_t a0 = q * g->a_bs + i * g->a_rs, b0 = q * g->b_bs + j * g->b_cs;
        for (int64_t p = 0; p < g->k; p++) s += elem_f32(g, g->a, a0 + p * g->a_cs) * elem_f32(g, g->b, b0 + p * g->b_rs);
      }
      c[i * g->ldc + j] = g->c_accumulate ? c[i * g->ldc + j] + s : s;
    }
}

static int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

/* The epilogue of a finished tile, while it is still in cache: its columns' bias, if any. */
static void add_col_bias(const gemm_problem *g, float *c, int64_t i0, int64_t mc, int64_t j0, int64_t nc) {
  if (!g->col_bias) return;
  for (int64_t i = i0; i < i0 + mc; i++) {
    float *restrict row = c + i * g->ldc + j0;
    const float *restrict bias = g->col_bias + j0;
    for (int64_t j = 0; j < nc; j++) row[j] += bias[j];
  }
}

/* Tasks [begin, end): task t is output o = t / (m_tiles * n_tiles) and one C tile of it, the
 * tiles of a column of tiles in turn. A run of tasks over one problem keeps its B packed over
 * all of K (up to KEPT_B_MAX) while the tiles share their columns: B is packed once per
 * column of tiles rather than once per tile. */
static void gemm_tasks(void *ctx, size_t begin, size_t end) {
  const gemm_problem *g = ctx;
  int64_t kd_max = depth(g, g->k < g->kc ? g->k : g->kc);
  int64_t nc_panels = round_up(g->nc, g->nr);
  size_t a_len = g->a_packed ? 0 : (size_t)(round_up(g->mc, MR) * kd_max);
  bool keep_b = (g->c_bs != 0 || g->batch == 1) && nc_panels * depth(g, g->k) <= KEPT_B_MAX && end - begin > 1;
  size_t b_len = (size_t)(nc_panels * (keep_b ? depth(g, g->k) : kd_max));
  size_t bytes = (a_len + b_len) * sizeof(float);
  float *buf = bytes ? aligned_alloc(64, round_up((int64_t)bytes, 64)) : NULL;
  float *ap = buf, *b_all = buf ? buf + a_len : NULL;
  int64_t kept_q = -1, kept_j0 = -1; /* the B columns b_all holds, packed whole */
  ttd_kcheck check = TTD_KCHECK_INIT;

  for (size_t t = begin; t < end; t++) {
    int64_t tiles = g->m_tiles * g->n_tiles;
    int64_t o = (int64_t)t / tiles, tile = (int64_t)t % tiles;
    int64_t i0 = (tile % g->m_tiles) * g->mc, j0 = (tile / g->m_tiles) * g->nc;
    int64_t mc = g->m - i0 < g->mc ? g->m - i0 : g->mc;
    int64_t nc = g->n - j0 < g->nc ? g->n - j0 : g->nc;
    int64_t q0 = g->c_bs ? o : 0, q1 = g->c_bs ? o + 1 : g->batch;
    float *c = g->c + o * g->c_bs;

    if (g->k == 0) {
      for (int64_t i = i0; !g->c_accumulate && i < i0 + mc; i++) memset(c + i * g->ldc + j0, 0, (size_t)nc * sizeof(float));
      add_col_bias(g, c, i0, mc, j0, nc);
      continue;
    }
    if (!buf) {
      tile_unpacked(g, q0, q1, i0, i0 + mc, j0, j0 + nc, c);
      add_col_bias(g, c, i0, mc, j0, nc);
      continue;
    }
    int first = !g->c_accumulate;
    for (int64_t q = q0; q < q1; q++) {
      int64_t a0 = q * g->a_bs + i0 * g->a_rs, b0 = q * g->b_bs + j0 * g->b_cs;
      bool kept = keep_b && kept_q == q && kept_j0 == j0;
      kept_q = kept_j0 = -1; /* until this tile's B is whole */
      for (int64_t p0 = 0; p0 < g->k; p0 += g->kc) {
        int64_t kc = g->k - p0 < g->kc ? g->k - p0 : g->kc, kd = depth(g, kc);
        if (ttd_kstop(&check, mc * nc * kc)) goto out; /* a block is at most MC_MAX x NC_MAX x KC */
        float *bp = keep_b ? b_all + depth(g, p0) * nc_panels : b_all; /* p0 is even */
        if (!kept) pack_b_any(g, elem_at(g, g->b, b0 + p0 * g->b_rs), kc, nc, bp);
        if (g->a_packed) ap = g->a_packed + depth(g, p0) * round_up(g->m, MR) + i0 * kd; /* p0 is even */
        else pack_a_any(g, elem_at(g, g->a, a0 + p0 * g->a_cs), mc, kc, ap);
        for (int64_t jr = 0; jr < nc; jr += g->nr) {
          int64_t nr = nc - jr < g->nr ? nc - jr : g->nr;
          for (int64_t ir = 0; ir < mc; ir += MR) {
            int64_t mr = mc - ir < MR ? mc - ir : MR;
            g->kernel(kd, ap + ir * kd, bp + jr * kd, c + (i0 + ir) * g->ldc + j0 + jr, g->ldc, mr, nr, !first);
          }
        }
        first = 0;
      }
      if (keep_b) kept_q = q, kept_j0 = j0;
    }
    add_col_bias(g, c, i0, mc, j0, nc);
  }
out:
  free(buf);
}

/* Tasks [begin, end) of a dot-product problem (g->dot): task t is output o = t / (m_tiles *
 * n_tiles) and one C tile of it, walked a block of DOT_COLS columns at a time (their B columns
 * stay in L1) over every block of DOT_ROWS rows (the tile's rows of A stay in L2). */
static void dot_tasks(void *ctx, size_t begin, size_t end) {
  const gemm_problem *g = ctx;
  ttd_kcheck check = TTD_KCHECK_INIT;
  for (size_t t = begin; t < end; t++) {
    int64_t tiles = g->m_tiles * g->n_tiles;
    int64_t o = (int64_t)t / tiles, tile = (int64_t)t % tiles;
    int64_t i0 = (tile / g->n_tiles) * g->mc, j0 = (tile % g->n_tiles) * g->nc;
    int64_t i1 = g->m - i0 < g->mc ? g->m : i0 + g->mc, j1 = g->n - j0 < g->nc ? g->n : j0 + g->nc;
    const float *a = (const float *)g->a + o * g->a_bs, *b = (const float *)g->b + o * g->b_bs;
    float *c = g->c + o * g->c_bs;
    for (int64_t j = j0; j < j1; j += DOT_COLS) {
      if (ttd_kstop(&check, (i1 - i0) * DOT_COLS * g->k)) return;
      int cols = j1 - j < DOT_COLS ? (int)(j1 - j) : DOT_COLS;
      const float *bias = g->col_bias ? g->col_bias + j : NULL;
      for (int64_t i = i0; i < i1; i += DOT_ROWS) {
        int rows = i1 - i < DOT_ROWS ? (int)(i1 - i) : DOT_ROWS;
        g->dot(g->k, a + i * g->a_rs, g->a_rs, b + j * g->b_cs, g->b_cs, c + i * g->ldc + j, g->ldc, rows, cols, bias,
              g->c_accumulate);
      }
    }
  }
}

/* Units [begin, end) of packing A for all tasks: unit u is K block u / panels, MR-row panel
 * u % panels. */
static void pack_a_units(void *ctx, size_t begin, size_t end) {
  const gemm_problem *g = ctx;
  int64_t m_pad = round_up(g->m, MR), panels = m_pad / MR;
  for (size_t u = begin; u < end; u++) {
    int64_t p0 = (int64_t)u / panels * g->kc, r0 = (int64_t)u % panels * MR;
    int64_t kc = g->k - p0 < g->kc ? g->k - p0 : g->kc;
    int64_t rows = g->m - r0 < MR ? g->m - r0 : MR;
    pack_a_any(g, elem_at(g, g->a, p0 * g->a_cs + r0 * g->a_rs), rows, kc,
               g->a_packed + depth(g, p0) * m_pad + r0 * depth(g, kc));
  }
}

/* Whether C = A B goes as dot products (dot_tasks) rather than packed: where the ISA has them,
 * for float32 operands in the dot layout (x W^T, a linear's forward), each problem with its own
 * C, and K's rows of A and columns of B fitting L1 together (DOT_K_MAX). The layout is the
 * operands' storage, not their strides, which a size of 1 can make look alike: so never on m,
 * and a row of C has the same bits whatever the number of rows. */
static bool dot_applies(const gemm_problem *g, dot_block_fn dot) {
  return dot && g->dot_layout && g->a_cs == 1 && g->b_rs == 1 && g->mode == MODE_F32 && g->c_bs != 0 && g->k > 0 &&
         g->k <= DOT_K_MAX;
}

/* Halves g's tiles (their columns, in multiples of nr while more than nc_min, when they are
 * at least as wide as tall or n_first; else their rows, in multiples of mr, down to 4 mr)
 * until there are two per thread or neither may shrink. */
static void split_tiles(ttd_pool *pool, gemm_problem *g, int64_t mr, int64_t nr, int64_t nc_min, bool n_first) {
  int64_t want = 2 * (int64_t)ttd_pool_threads(pool);
  while (g->outputs * g->m_tiles * g->n_tiles < want) {
    if ((n_first || g->nc >= g->mc) && g->nc > nc_min)
      g->nc = round_up(g->nc / 2, nr);
    else if (g->mc > 4 * mr)
      g->mc = round_up(g->mc / 2, mr);
    else
      break;
    g->m_tiles = (g->m + g->mc - 1) / g->mc;
    g->n_tiles = (g->n + g->nc - 1) / g->nc;
  }
}

/* Tiles a dot-product problem (rows of A per tile within DOT_A_BYTES, then more tiles, along N
 * first, until there are two per thread) and runs them over the pool. */
static void dot_run(ttd_pool *pool, gemm_problem *g, dot_block_fn dot) {
  g->dot = dot;
  int64_t mc_max = DOT_A_BYTES / ((int64_t)sizeof(float) * g->k) / DOT_ROWS * DOT_ROWS;
  if (mc_max < DOT_ROWS) mc_max = DOT_ROWS;
  g->m_tiles = (g->m + mc_max - 1) / mc_max;
  g->mc = round_up((g->m + g->m_tiles - 1) / g->m_tiles, DOT_ROWS);
  g->nc = round_up(g->n, DOT_COLS);
  g->n_tiles = 1;
  split_tiles(pool, g, DOT_ROWS, DOT_COLS, 4 * DOT_COLS, true);
  ttd_pool_parallel_for(pool, (size_t)(g->outputs * g->m_tiles * g->n_tiles), 1, dot_tasks, g);
}

/* Picks the blocking and the tiling (more, smaller tiles when there are fewer than two per
 * thread), packs A once when the tiles would each pack it, and runs the tasks over the pool. */
static void gemm_run(ttd_pool *pool, gemm_problem *g) {
  if (g->m <= 0 || g->n <= 0) return;
  if (g->batch <= 0) { /* no problems: nothing to write, or a zero sum */
    if (g->c_bs != 0) return;
    g->batch = 1;
    g->k = 0;
  }
  g->outputs = g->c_bs ? g->batch : 1;
  micro_kernel kernel = pick_micro_kernel();
#if defined(__x86_64__) && defined(__GNUC__)
  if (g->mode == MODE_BF16_PAIRS) kernel = (micro_kernel){micro_kernel_avx512bf16, 32, NULL};
#endif
  g->kernel = kernel.fn;
  g->nr = kernel.nr;
  if (dot_applies(g, kernel.dot)) {
    dot_run(pool, g, kernel.dot);
    return;
  }
  g->interleave16 = pick_interleave16(); /* NR, 16 or 32, is a whole number of its 16 columns */
  int64_t kc_max = g->mode == MODE_BF16_PAIRS ? 2 * KC : KC; /* the same bytes of B panel: KC packed steps */
  int64_t k_blocks = (g->k + kc_max - 1) / kc_max;
  g->kc = k_blocks ? round_up((g->k + k_blocks - 1) / k_blocks, 8) : KC; /* even blocks: no 16-step tail */
  g->m_tiles = (g->m + MC_MAX - 1) / MC_MAX;
  g->n_tiles = (g->n + NC_MAX - 1) / NC_MAX;
  g->mc = round_up((g->m + g->m_tiles - 1) / g->m_tiles, MR);
  g->nc = round_up((g->n + g->n_tiles - 1) / g->n_tiles, g->nr);
  /* A packed once for every task (one problem of a small A): then more tiles along N pack
   * disjoint pieces of B, where more along M would each pack the same B block again (the
   * transposed weight of a linear's forward at batch 256, packed twice, cost 7-10 %). */
  int64_t a_floats = round_up(g->m, MR) * depth(g, g->k);
  bool share_a = g->batch == 1 && g->k > 0 && a_floats <= SHARED_A_MAX;
  split_tiles(pool, g, MR, g->nr, 2 * g->nr, share_a);
  if (share_a && g->n_tiles > 1) {
    g->a_packed = aligned_alloc(64, (size_t)round_up(a_floats * (int64_t)sizeof(float), 64));
    if (g->a_packed) {
      size_t units = (size_t)(round_up(g->m, MR) / MR * ((g->k + g->kc - 1) / g->kc));
      ttd_pool_parallel_for(pool, units, 4, pack_a_units, g);
    }
  }
  /* Over several K blocks, a column of tiles to a thread, so that it packs B once (at one K
   * block, as a training step's weight gradient, single tiles balance better: 1.06x the step's
   * time at batch 64 with columns). */
  size_t columns = (size_t)(g->outputs * g->n_tiles);
  size_t grain = g->k > g->kc && columns >= (size_t)ttd_pool_threads(pool) ? (size_t)g->m_tiles : 1;
  ttd_pool_parallel_for(pool, (size_t)(g->outputs * g->m_tiles * g->n_tiles), grain, gemm_tasks, g);
  free(g->a_packed);
  g->a_packed = NULL;
}

/* C(q) (=, or summed over q when c_bs is 0) A(q) B(q) with the strides as described on
 * gemm_problem; dot_layout as there. */
static void gemm(ttd_pool *pool, int64_t batch, int64_t m, int64_t n, int64_t k, const float *a, int64_t a_rs,
                 int64_t a_cs, int64_t a_bs, const float *b, int64_t b_rs, int64_t b_cs, int64_t b_bs, float *c,
                 int64_t ldc, int64_t c_bs, int accumulate, bool dot_layout) {
  gemm_problem g = {.batch = batch, .m = m, .n = n, .k = k, .a = a, .a_rs = a_rs, .a_cs = a_cs, .a_bs = a_bs};
  g.b = b, g.b_rs = b_rs, g.b_cs = b_cs, g.b_bs = b_bs;
  g.c = c, g.ldc = ldc, g.c_bs = c_bs, g.c_accumulate = accumulate, g.dot_layout = dot_layout;
  gemm_run(pool, &g);
}

/* Row and column strides of op(X) [rows, cols]: X stored [rows, cols], or [cols, rows]
 * when trans. */
static void op_strides(int trans, int64_t rows, int64_t cols, int64_t *rs, int64_t *cs) {
  *rs = trans ? 1 : cols;
  *cs = trans ? rows : 1;
}

void ttd_k_matmul(ttd_pool *pool, const float *a, const float *b, float *c, int64_t batch, int64_t m, int64_t n,
                  int64_t k, int trans_a, int trans_b, int64_t a_batch_stride, int64_t b_batch_stride) {
  ttd_k_matmul_bias(pool, a, b, NULL, c, batch, m, n, k, trans_a, trans_b, a_batch_stride, b_batch_stride);
}

/* ttd_k_matmul_bias over operands held as `mode`. */
static void matmul_bias(ttd_pool *pool, gemm_mode mode, const void *a, const void *b, const float *bias, float *c,
                        int64_t batch, int64_t m, int64_t n, int64_t k, int trans_a, int trans_b,
                        int64_t a_batch_stride, int64_t b_batch_stride) {
  int64_t a_rs, a_cs, b_rs, b_cs;
  op_strides(trans_a, m, k, &a_rs, &a_cs);
  op_strides(trans_b, k, n, &b_rs, &b_cs);
  gemm_problem g = {.batch = batch, .m = m, .n = n, .k = k, .a = a, .a_rs = a_rs, .a_cs = a_cs, .a_bs = a_batch_stride};
  g.mode = mode, g.b = b, g.b_rs = b_rs, g.b_cs = b_cs, g.b_bs = b_batch_stride;
  g.c = c, g.ldc = n, g.c_bs = m * n, g.col_bias = bias, g.dot_layout = !trans_a && trans_b;
  gemm_run(pool, &g);
}

void ttd_k_matmul_bias(ttd_pool *pool, const float *a, const float *b, const float *bias, float *c, int64_t batch,
                       int64_t m, int64_t n, int64_t k, int trans_a, int trans_b, int64_t a_batch_stride,
                       int64_t b_batch_stride) {
  matmul_bias(pool, MODE_F32, a, b, bias, c, batch, m, n, k, trans_a, trans_b, a_batch_stride, b_batch_stride);
}

void ttd_k_matmul_bf16(ttd_pool *pool, const uint16_t *a, const uint16_t *b, const float *bias, float *c,
                       int64_t batch, int64_t m, int64_t n, int64_t k, int trans_a, int trans_b,
                       int64_t a_batch_stride, int64_t b_batch_stride) {
  gemm_mode mode = pick_bf16_pairs() ? MODE_BF16_PAIRS : MODE_BF16_WIDEN;
  matmul_bias(pool, mode, a, b, bias, c, batch, m, n, k, trans_a, trans_b, a_batch_stride, b_batch_stride);
}

const char *ttd_k_matmul_path(int64_t k, int trans_a, int trans_b) {
  gemm_problem g = {.batch = 1, .m = 1, .n = 1, .k = k, .mode = MODE_F32, .c_bs = 1, .dot_layout = !trans_a && trans_b};
  op_strides(trans_a, 1, k, &g.a_rs, &g.a_cs);
  op_strides(trans_b, k, 1, &g.b_rs, &g.b_cs);
  return dot_applies(&g, pick_micro_kernel().dot) ? "dot" : "packed";
}

const char *ttd_k_matmul_bf16_path(void) { return pick_bf16_pairs() ? "avx512bf16" : "float32"; }

/* With A' = op(A) [m,k], B' = op(B) [k,n] and dC [m,n] per problem:
 *   dA' = dC B'^T, stored as is, or transposed (B' dC^T) when trans_a;
 *   dB' = A'^T dC, stored as is, or transposed (dC^T A') when trans_b.
 * The gradient's batch stride is its operand's: 0 sums it over the batch. */
void ttd_k_matmul_backward(ttd_pool *pool, const float *a, const float *b, const float *dc, int64_t batch, int64_t m,
                           int64_t n, int64_t k, int trans_a, int trans_b, int64_t a_batch_stride,
                           int64_t b_batch_stride, float *da, float *db) {
  ttd_k_matmul_backward_add(pool, a, b, dc, batch, m, n, k, trans_a, trans_b, a_batch_stride, b_batch_stride, da, db, 0);
}

void ttd_k_matmul_backward_add(ttd_pool *pool, const float *a, const float *b, const float *dc, int64_t batch,
                               int64_t m, int64_t n, int64_t k, int trans_a, int trans_b, int64_t a_batch_stride,
                               int64_t b_batch_stride, float *da, float *db, unsigned add) {
  int64_t a_rs, a_cs, b_rs, b_cs, mn = m * n;
  int add_a = (add & TTD_KGRAD_ADD_A) != 0, add_b = (add & TTD_KGRAD_ADD_B) != 0;
  op_strides(trans_a, m, k, &a_rs, &a_cs);
  op_strides(trans_b, k, n, &b_rs, &b_cs);
  /* dA's two forms read rows of dC and, B stored [k,n], rows of B, both along n: the dot layout */
  if (da && !trans_a)
    gemm(pool, batch, m, k, n, dc, n, 1, mn, b, b_cs, b_rs, b_batch_stride, da, k, a_batch_stride, add_a, !trans_b);
  if (da && trans_a)
    gemm(pool, batch, k, m, n, b, b_rs, b_cs, b_batch_stride, dc, 1, n, mn, da, m, a_batch_stride, add_a, !trans_b);
  if (db && !trans_b)
    gemm(pool, batch, k, n, m, a, a_cs, a_rs, a_batch_stride, dc, n, 1, mn, db, n, b_batch_stride, add_b, false);
  if (db && trans_b)
    gemm(pool, batch, n, k, m, dc, 1, n, mn, a, a_rs, a_cs, a_batch_stride, db, k, b_batch_stride, add_b, false);
}
