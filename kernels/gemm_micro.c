/* The matmul's register-blocked kernels (gemm.h), one per ISA, picked at run time.
 *
 * The packed micro-kernels multiply an MR-row A micro-panel by an NR-column B micro-panel
 * (NR 16 with AVX2, whose B micro-panel then takes half of a 32 KiB L1 rather than all of it;
 * 32 elsewhere), one accumulator per element of C held in registers. The dot-product blocks
 * (AVX2) multiply rows of A by columns of B both contiguous along K, 3 by 4 in registers, 8
 * steps of K in the lanes of each, summed across them at the end, with nothing packed. The
 * AVX-512 BF16 kernel takes panels of bfloat16 pairs (vdpbf16ps), two steps of K a step, and
 * a portable kernel does the same arithmetic for the tests. */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gemm.h"
#include "kernel_internal.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

/* clang-format off */
/* Defines a micro-kernel of NR columns for vectors of W floats (gcc vector extensions, so one
 * source serves every ISA): the MR x NR tile goes in passes of CW columns, each with MR x CW/W
 * vector accumulators that stay in registers, the B row of the pass in CW/W more and the
 * broadcast A element in one. Full tiles are stored straight from the accumulators, whose C
 * rows are prefetched before the K loop; the K loop runs four steps a turn (on Zen 3, 512 x
 * 512 x 512 on one thread took 0.86x the time of one step a turn without the prefetch). */
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
      if (full) {                                                                                                  \
        for (int i = 0; i < MR; i++) {                                                                             \
          __builtin_prefetch(c + i * ldc + h, 1, 3);                                                               \
          __builtin_prefetch(c + i * ldc + h + (CW) - 1, 1, 3);                                                    \
        }                                                                                                          \
      }                                                                                                            \
      _Pragma("GCC unroll 4") for (int64_t p = 0; p < kc; p++) {                                                   \
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

/* rows_kernel_fn with AVX-512: micro_kernel_avx512's 6 x 32 tile, its A elements broadcast
 * from six rows of W where they lie (a row past mr repeats row 0, its sums unused): the same
 * FMAs in the same order. Its X panels are 32 wide: it is listed only beside
 * micro_kernel_avx512, whose NR (32) rows_tasks packs them for. */
__attribute__((target("avx512f"))) static void rows_kernel_avx512(int64_t kc, const float *w, int64_t ldw,
                                                                  const float *restrict xp, float *c, int64_t ldc,
                                                                  int64_t mr, int64_t nr, int accumulate) {
  typedef float vec __attribute__((vector_size(16 * sizeof(float))));
  const float *row[MR];
  for (int i = 0; i < MR; i++) row[i] = w + (i < mr ? i * ldw : 0);
  vec acc[MR][2];
  _Pragma("GCC unroll 6") for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = (vec){0};
  _Pragma("GCC unroll 4") for (int64_t p = 0; p < kc; p++) {
    vec b0, b1;
    memcpy(&b0, xp + p * 32, sizeof(vec));
    memcpy(&b1, xp + p * 32 + 16, sizeof(vec));
    _Pragma("GCC unroll 6") for (int i = 0; i < MR; i++) {
      float a = row[i][p];
      acc[i][0] += a * b0;
      acc[i][1] += a * b1;
    }
  }
  float tile[32];
  for (int64_t i = 0; i < mr; i++) {
    float *dst = c + i * ldc;
    if (nr == 32) {
      _Pragma("GCC unroll 2") for (int v = 0; v < 2; v++) {
        vec out = acc[i][v];
        if (accumulate) {
          vec old;
          memcpy(&old, dst + 16 * v, sizeof(old));
          out += old;
        }
        memcpy(dst + 16 * v, &out, sizeof(out));
      }
    } else {
      memcpy(tile, acc[i], sizeof(tile));
      for (int64_t j = 0; j < nr; j++) dst[j] = accumulate ? dst[j] + tile[j] : tile[j];
    }
  }
}

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

/* One half of a bfloat16 pair as float32, a subnormal as zero (vdpbf16ps's DAZ). */
static inline float pair_half(uint32_t pair, int high) {
  uint32_t bits = (high ? pair >> 16 : pair & 0xffffu) << 16;
  if ((bits & 0x7f800000u) == 0) bits &= 0x80000000u;
  float f;
  memcpy(&f, &bits, sizeof(f));
  return f;
}

/* Any target: the AVX-512 BF16 kernel's arithmetic in portable C, on 16-column panels of
 * pairs: per pair, the high product added to C's sum, then the low one (as vdpbf16ps orders
 * them; each product is exact), subnormal operands read as zero; unlike the instruction it
 * keeps subnormal sums. Slow; TTD_KERNEL_ISA=generic-pairs picks it, so that the packing of
 * pairs and its odd-K tail are tested on any CPU. */
static void micro_kernel_generic_pairs(int64_t kd, const void *restrict ap_, const void *restrict bp_,
                                       float *restrict c, int64_t ldc, int64_t mr, int64_t nr, int accumulate) {
  enum { NR = 16 };
  const uint32_t *restrict ap = ap_, *restrict bp = bp_;
  float acc[MR][NR] = {{0}};
  for (int64_t p = 0; p < kd; p++)
    for (int i = 0; i < MR; i++) {
      float a_hi = pair_half(ap[p * MR + i], 1), a_lo = pair_half(ap[p * MR + i], 0);
      for (int j = 0; j < NR; j++) {
        acc[i][j] += a_hi * pair_half(bp[p * NR + j], 1);
        acc[i][j] += a_lo * pair_half(bp[p * NR + j], 0);
      }
    }
  for (int64_t i = 0; i < mr; i++)
    for (int64_t j = 0; j < nr; j++) c[i * ldc + j] = accumulate ? c[i * ldc + j] + acc[i][j] : acc[i][j];
}

#if defined(__x86_64__) && defined(__GNUC__)
enum { PROBE_STEPS = 2048, PROBE_ROUNDS = 7 };

/* Defines name(): the seconds for PROBE_STEPS steps of 16 independent zmm instructions,
 * acc[i] = STEP(acc[i]), the accumulators opaque to the compiler so that it keeps 16 chains. */
#define TTD_DEFINE_PROBE(name, target_isa, STEP)                                                               \
  __attribute__((target(target_isa), noinline)) static double name(void) {                                     \
    __m512 acc[16], x = _mm512_set1_ps(1.0f), y = _mm512_set1_ps(0.5f); /* bfloat16 pairs too: nonzero */   \
    __asm__ volatile("" : "+v"(x), "+v"(y)); /* operands the compiler cannot fold the steps with */              \
    _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) {                                                    \
      acc[i] = _mm512_set1_ps((float)i);                                                                       \
      __asm__ volatile("" : "+v"(acc[i]));                                                                     \
    }                                                                                                          \
    double t0 = (double)ttd_know_ns() * 1e-9;                                                                                   \
    for (int n = 0; n < PROBE_STEPS; n++) {                                                                    \
      _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) acc[i] = STEP(acc[i]);                             \
    }                                                                                                          \
    double t = (double)ttd_know_ns() * 1e-9 - t0;                                                                               \
    _Pragma("GCC unroll 16") for (int i = 1; i < 16; i++) acc[0] = _mm512_add_ps(acc[0], acc[i]);              \
    __asm__ volatile("" ::"v"(acc[0]));                                                                        \
    return t;                                                                                                  \
  }
#define PROBE_FMA(acc) _mm512_fmadd_ps(acc, x, y)
#define PROBE_DOT(acc) _mm512_dpbf16_ps(acc, (__m512bh)x, (__m512bh)y)
TTD_DEFINE_PROBE(probe_fma, "avx512f", PROBE_FMA)        /* 32 FLOP an instruction */
TTD_DEFINE_PROBE(probe_dot, "avx512f,avx512bf16", PROBE_DOT) /* 64 FLOP an instruction */

static double dot_gain;
static pthread_once_t dot_gain_once = PTHREAD_ONCE_INIT;

/* The best of PROBE_ROUNDS turns each (about 0.3 ms in all): a pause or another guest only
 * ever slows a turn, and the first turns also wait for the clock to rise. */
static void measure_dot_gain(void) {
  if (!__builtin_cpu_supports("avx512bf16") || !__builtin_cpu_supports("avx512bw")) return;
  double fma = 1e30, dot = 1e30;
  for (int r = 0; r < PROBE_ROUNDS; r++) {
    double f = probe_fma(), d = probe_dot();
    fma = f < fma ? f : fma;
    dot = d < dot ? d : dot;
  }
  dot_gain = dot > 0 ? 2.0 * fma / dot : 0.0;
}
#endif

double ttd_gemm_bf16_dot_gain(void) {
#if defined(__x86_64__) && defined(__GNUC__)
  pthread_once(&dot_gain_once, measure_dot_gain);
  return dot_gain;
#else
  return 0.0;
#endif
}

const char *ttd_gemm_bf16_pairs(void) {
  const char *isa = getenv("TTD_KERNEL_ISA");
  if (isa && strcmp(isa, "generic-pairs") == 0) return "generic-pairs";
  bool forced = isa && strcmp(isa, "avx512bf16") == 0;
  if (isa && *isa && !forced) return NULL;
#if defined(__x86_64__) && defined(__GNUC__)
  if (!__builtin_cpu_supports("avx512bf16") || !__builtin_cpu_supports("avx512bw")) return NULL;
  if (forced || ttd_gemm_bf16_dot_gain() >= BF16_DOT_GAIN_MIN) return "avx512bf16";
#endif
  return NULL;
}

/* Chosen at run time, not with target_clones: each ISA needs its own vector width to keep the
 * accumulators in registers (one 64-byte-vector source under target_clones runs at a tenth of
 * the speed in its AVX2 clone). */
micro_kernel ttd_gemm_pick_kernel(bool bf16_pairs) {
  const micro_kernel generic = {micro_kernel_generic, 32, NULL, false, NULL};
  const char *pairs = bf16_pairs ? ttd_gemm_bf16_pairs() : NULL;
  if (pairs && strcmp(pairs, "generic-pairs") == 0) return (micro_kernel){micro_kernel_generic_pairs, 16, NULL, true, NULL};
#if defined(__x86_64__) && defined(__GNUC__)
  if (pairs) return (micro_kernel){micro_kernel_avx512bf16, 32, NULL, true, NULL};
#endif
  const char *isa = getenv("TTD_KERNEL_ISA");
  if (isa && strcmp(isa, "generic") == 0) return generic;
#if defined(__x86_64__) && defined(__GNUC__)
  if (__builtin_cpu_supports("avx512f") && !(isa && strcmp(isa, "avx2") == 0))
    return (micro_kernel){micro_kernel_avx512, 32, NULL, false, rows_kernel_avx512};
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return (micro_kernel){micro_kernel_avx2, 16, dot_block_avx2, false, NULL};
#endif
  return generic;
}
