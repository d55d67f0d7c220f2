/* The matmul's register-blocked kernels (gemm_micro.c) and panel packers (gemm_pack.c):
 * what the GEMM driver of matmul.c calls. Internal to kernels/. */
#ifndef TTD_KERNELS_GEMM_H
#define TTD_KERNELS_GEMM_H

#include <stdbool.h>
#include <stdint.h>

/* Micro-tile rows; its columns (NR) are the kernel's: 6 x 32 (AVX-512) or 6 x 16 (AVX2) is 12
 * accumulators, enough to keep two FMA pipes busy. */
enum { MR = 6 };

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

/* The product of a linear's forward turned round, C^T = W X^T, with W [n,k] read where it
 * lies (no packing): for i < mr <= MR rows of W (row i at w + i*ldw) and j < nr <= NR rows of
 * X packed as one NR-column B micro-panel over kc steps (xp[p*NR + j] = X(j, p)),
 * c[i*ldc + j] = the sum over p of W(i,p) X(j,p), or c[i*ldc + j] + it when accumulate:
 * the packed micro-kernel of the same ISA, bit for bit, with A's panel replaced by W's rows. */
typedef void (*rows_kernel_fn)(int64_t kc, const float *w, int64_t ldw, const float *restrict xp, float *c,
                               int64_t ldc, int64_t mr, int64_t nr, int accumulate);

/* A micro-kernel and the NR its B panels are packed for. */
typedef struct micro_kernel {
  micro_kernel_fn fn;
  int64_t nr;
  dot_block_fn dot; /* or NULL: this ISA has no dot-product blocks */
  bool pairs;       /* it takes panels of bfloat16 pairs (MODE_BF16_PAIRS), not of floats */
  rows_kernel_fn rows; /* or NULL: this ISA packs the weight of X W^T as any B */
} micro_kernel;

/* Sixteen rows contiguous along p (row j at src + j*ld_src), p in [0, len), interleaved into
 * 16 columns of a panel: dst[p*ld_dst + j] = src[j*ld_src + p]. */
typedef void (*interleave16_fn)(const float *restrict src, int64_t ld_src, int64_t len, float *restrict dst,
                                int64_t ld_dst);

/* The widest kernel this CPU runs (the CPU model is read by a libgcc constructor, so this is
 * safe from any thread), or a narrower one named by TTD_KERNEL_ISA ("avx2", "generic"; the
 * tests run every kernel this way); with bf16_pairs, the kernel ttd_gemm_bf16_pairs names,
 * which takes panels packed as bfloat16 pairs, where it names one (else a float kernel:
 * check .pairs). */
micro_kernel ttd_gemm_pick_kernel(bool bf16_pairs);

/* The micro-kernel over bfloat16 pairs that bfloat16 products go to, or NULL (widened to
 * float32, that ISA's float32 kernel): "avx512bf16" where the CPU has AVX-512 BF16, it pays
 * (ttd_gemm_bf16_dot_gain() >= BF16_DOT_GAIN_MIN) and TTD_KERNEL_ISA names no other ISA, or
 * where TTD_KERNEL_ISA=avx512bf16 and the CPU has it, paying or not; "generic-pairs", the
 * portable one, when TTD_KERNEL_ISA names it (the tests run each path this way). Static. */
const char *ttd_gemm_bf16_pairs(void);

/* The FLOP rate of vdpbf16ps over that of float32 FMAs on this CPU, measured once (16
 * independent accumulators each, about 0.3 ms, on the first call); 0 where the CPU lacks
 * AVX-512 BF16. About 2 where it issues as often as an FMA; 0.49 on an Emerald Rapids guest
 * (family 6 model 207), where a 512 x 512 bfloat16 matmul then ran at 0.58x float32's speed
 * on it and at 1.01x widened. Thread-safe. */
double ttd_gemm_bf16_dot_gain(void);

/* Below this gain bfloat16 products widen to float32 rather than take vdpbf16ps. */
#define BF16_DOT_GAIN_MIN 1.25

/* The widest transposing packer the CPU has, or a narrower one named by TTD_KERNEL_ISA;
 * NULL: interleave row by row. */
interleave16_fn ttd_gemm_pick_interleave16(void);

/* Packs rows [0, mc) x cols [0, kc) of the strided A block at `a` into MR-row micro-panels:
 * panel r holds out[r*kc*MR + p*MR + i] = A(r*MR + i, p), zero past row mc. */
void ttd_gemm_pack_a(const float *restrict a, int64_t rs, int64_t cs, int64_t mc, int64_t kc, float *restrict out);

/* Packs rows [0, kc) x cols [0, nc) of the strided B block at `b` into NR-column
 * micro-panels: panel s holds out[s*kc*NR + p*NR + j] = B(p, s*NR + j), zero past col nc.
 * NR is 16 or 32; interleave16 as ttd_gemm_pick_interleave16 gives. */
void ttd_gemm_pack_b(const float *restrict b, int64_t rs, int64_t cs, int64_t kc, int64_t nc, int64_t NR,
                     float *restrict out, interleave16_fn interleave16);

/* Packs rows [0, rows) x steps [0, kc) of the bfloat16 X(i,p) = x[i*s_i + p*s_p] into R-row
 * panels (R = MR for A; for B, R = NR and its columns are the rows), zero past row `rows` and
 * step kc. Widened, panel r holds out[r*kc*R + p*R + i] = X(r*R + i, p); as pairs, out (as
 * uint32_t) [r*kd*R + d*R + i] = X(., 2d) | X(., 2d + 1) << 16, kd = ceil(kc / 2).
 * interleave16 (or NULL) as for ttd_gemm_pack_b. */
void ttd_gemm_pack_bf16(const uint16_t *restrict x, int64_t s_i, int64_t s_p, int64_t rows, int64_t kc, int64_t R,
                        int pairs, float *restrict out, interleave16_fn interleave16);

/* Packs the float32 X(i,p) = x[i*s_i + p*s_p] (rows [0, rows), steps [0, kc)) as
 * ttd_gemm_pack_bf16 packs pairs, each element rounded to bfloat16 (nearest even) first. R is
 * at most 32. */
void ttd_gemm_pack_f32_pairs(const float *restrict x, int64_t s_i, int64_t s_p, int64_t rows, int64_t kc, int64_t R,
                             float *restrict out, interleave16_fn interleave16);

#endif
