/* Batched matrix multiply and its backward (kernels.h).
 *
 * Everything goes through one strided GEMM: C(i,j) = sum_p A(i,p) B(p,j) with arbitrary row
 * and column strides for A and B, a dense C, and a batch that either gives each problem its
 * own C or (C batch stride 0) sums every problem into one C, which is how the backward
 * reduces the gradient of a broadcast operand.
 *
 * The GEMM is blocked the usual way (Goto / BLIS): the work is cut into tiles of C, one
 * task each; a task walks K in blocks of at most KC, packs its A block into MR-row
 * micro-panels and its B block into NR-column micro-panels (zero padded; gemm_pack.c), and
 * runs an MR x NR register-blocked micro-kernel over them (gemm_micro.c; NR is the
 * kernel's: 16 with AVX2, whose B micro-panel then takes half of a 32 KiB L1 rather than all
 * of it; 32 elsewhere). Tasks
 * are split over the pool. When C is cut along N and A is small (a training batch:
 * 64 x 784), A is packed once for every task, in parallel, instead of once per task. The
 * tiles of a column of C come in turn, and a thread that runs several keeps their B packed
 * over all of K; over several K blocks each thread takes whole columns. So B is packed once
 * per column rather than once per tile (on the Zen 3 guest, scripts/bench/ab_matmul against
 * packing per tile: 0.94-0.95x the time at 2048 on two threads, 0.95-0.99x at 1024, none at
 * 512, 0.86-0.95x at 1024 on one; the same source against itself reads 0.97-1.01x).
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
 * On AVX-512, which has no dot-product blocks, X W^T with up to ROWS_M_MAX rows of X goes
 * turned round, C^T = W X^T, with W's rows read where they lie as the micro-kernel's A (no
 * packing of the weight, which at batch 64 is 8 times the size of X) and the tile stored
 * transposed: at 64 x 512 x 784 on the Emerald Rapids guest 0.67x the packed path's time on
 * one thread and 0.79x on two, 0.97x at 192 rows, 1.0x at 256, 1.08x at 512. Its sums are
 * the packed path's, bit for bit, so choosing it by m changes no result.
 *
 * Either operand may instead hold bfloat16 (ttd_k_matmul_dt). The product is then a bfloat16
 * one: a float32 operand is rounded to bfloat16 as it is packed, each product of two bfloat16
 * is exact, and the sums are float32. On a CPU whose AVX-512 BF16 does more FLOPs than its
 * float32 FMAs (measured once: ttd_gemm_bf16_dot_gain) the packs hold bfloat16, K pairs side
 * by side in 32 bits (the layout vdpbf16ps multiplies, a zero past an odd K), so one "packed
 * step" of a panel is two steps of K; elsewhere (or with TTD_KERNEL_ISA set) they hold the
 * bfloat16 values widened to float32 and the float32 micro-kernels run. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "gemm.h"
#include "kernel_internal.h"
#include "kernels.h"

enum {
  KC = 256,     /* largest K block: an NR-column B micro-panel (16 or 32 KiB) stays in L1 */
  MC_MAX = 288, /* rows of C per task (A block: 288 KiB, in L2; amortises packing B) */
  NC_MAX = 512, /* columns of C per task */
  SHARED_A_MAX = 1 << 20, /* floats: A packed once for all tasks up to 4 MiB */
  KEPT_B_MAX = 2 << 20,   /* floats: a task keeps B packed over all of K for its next tiles up to 8 MiB */
  DOT_K_MAX = 1024,        /* dot products up to this K: 3 rows of A and 4 columns of B, 28 KiB, in L1 */
  DOT_A_BYTES = 256 << 10, /* rows of A per dot-product tile: half of a 512 KiB L2 */
  ROWS_M_MAX = 192,        /* rows of X up to which X W^T reads W where it lies (rows_applies) */
};

/* How the product is computed, and so how A and B are packed. */
typedef enum gemm_mode {
  MODE_F32,        /* float32 operands, packed as float32 */
  MODE_BF16_WIDEN, /* bfloat16 products: operands packed as bfloat16 values widened to float32 */
  MODE_BF16_PAIRS, /* bfloat16 products: operands packed as K pairs of bfloat16, for a pairs kernel */
} gemm_mode;

typedef struct gemm_problem {
  int64_t batch, m, n, k;
  gemm_mode mode;
  bool a_bf16, b_bf16; /* the operand is held as bfloat16 bits (uint16_t), else as float */
  const void *a; /* A(q,i,p) = a[q*a_bs + i*a_rs + p*a_cs] */
  int64_t a_rs, a_cs, a_bs;
  const void *b; /* B(q,p,j) = b[q*b_bs + p*b_rs + j*b_cs] */
  int64_t b_rs, b_cs, b_bs;
  float *c; /* C(q,i,j) = c[q*c_bs + i*ldc + j]; c_bs 0: all q summed into one C */
  int64_t ldc, c_bs;
  int c_accumulate; /* C += the product instead of C = it */
  const float *col_bias; /* or NULL: C(q,i,j) += col_bias[j] once the sum is complete */
  bool col_relu;         /* then C(q,i,j) = max(C(q,i,j), 0), NaN kept (ttd_k_unary's relu) */
  const float *c_mask;   /* or NULL: then C(q,i,j) = 0 where c_mask(q,i,j) <= 0 (C's layout): the
                          * backward of a relu whose output c_mask is (threshold_backward) */
  int64_t kc, mc, nc, m_tiles, n_tiles, outputs; /* blocking and tiling, filled by gemm_run */
  float *a_packed; /* or NULL: A packed for all tasks, K block p0 at a_packed + depth(p0) * round_up(m, MR) */
  micro_kernel_fn kernel;
  int64_t nr; /* the kernel's NR: B panels of nr columns */
  bool dot_layout; /* rows of A and columns of B stored contiguous along K (A [m,k], B [n,k]), whatever the sizes */
  dot_block_fn dot; /* or NULL: the tiles are dot-product blocks (dot_applies), not packed GEMM tiles */
  rows_kernel_fn rows; /* or NULL: the tiles are X W^T with W read where it lies (rows_applies) */
  interleave16_fn interleave16; /* or NULL: interleave_rows */
} gemm_problem;

/* Packed steps for kc steps of K: one float each, or one per pair of bfloat16. */
static int64_t depth(const gemm_problem *g, int64_t kc) { return g->mode == MODE_BF16_PAIRS ? (kc + 1) / 2 : kc; }
/* Element `off` of an operand held as float (bf16 false) or bfloat16 bits. */
static const void *elem_at(const void *base, bool bf16, int64_t off) {
  return (const char *)base + off * (bf16 ? (int64_t)sizeof(uint16_t) : (int64_t)sizeof(float));
}

static int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

/* Packs X(i,p) = x[i*s_i + p*s_p], i in [0, rows), p in [0, kc), held as `bf16` says, into
 * R-row panels for g's micro-kernel: as it is, widened, rounded to bfloat16 or woven into
 * pairs, as g->mode computes. `b`: X is B, transposed (its columns are the panels' rows). */
static void pack_any(const gemm_problem *g, const void *x, bool bf16, int64_t s_i, int64_t s_p, int64_t rows, int64_t kc,
                     int64_t R, bool b, float *out) {
  bool pairs = g->mode == MODE_BF16_PAIRS;
  if (bf16) {
    ttd_gemm_pack_bf16(x, s_i, s_p, rows, kc, R, pairs, out, g->interleave16);
  } else if (pairs) {
    ttd_gemm_pack_f32_pairs(x, s_i, s_p, rows, kc, R, out, g->interleave16);
  } else {
    if (b) ttd_gemm_pack_b(x, s_p, s_i, kc, rows, R, out, g->interleave16);
    else ttd_gemm_pack_a(x, s_i, s_p, rows, kc, out);
    if (g->mode == MODE_BF16_WIDEN) ttd_bf16_round_n(out, (size_t)(round_up(rows, R) * kc));
  }
}

/* Packs A(i,p), i in [0, mc), p in [0, kc), of the operand at `a` (strides as in g) for g's micro-kernel. */
static void pack_a_any(const gemm_problem *g, const void *a, int64_t mc, int64_t kc, float *out) {
  pack_any(g, a, g->a_bf16, g->a_rs, g->a_cs, mc, kc, MR, false, out);
}

/* Packs B(p,j), p in [0, kc), j in [0, nc), likewise. */
static void pack_b_any(const gemm_problem *g, const void *b, int64_t kc, int64_t nc, float *out) {
  pack_any(g, b, g->b_bf16, g->b_cs, g->b_rs, nc, kc, g->nr, true, out);
}

/* One element of an operand held as `bf16` says, as the product reads it. */
static float elem_f32(const gemm_problem *g, const void *base, bool bf16, int64_t off) {
  if (bf16) return ttd_f32_from_bf16(((const uint16_t *)base)[off]);
  float f = ((const float *)base)[off];
  return g->mode == MODE_F32 ? f : ttd_f32_from_bf16(ttd_bf16_from_f32(f));
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
        for (int64_t p = 0; p < g->k; p++)
          s += elem_f32(g, g->a, g->a_bf16, a0 + p * g->a_cs) * elem_f32(g, g->b, g->b_bf16, b0 + p * g->b_rs);
      }
      c[i * g->ldc + j] = g->c_accumulate ? c[i * g->ldc + j] + s : s;
    }
}

/* The elementwise end of a finished tile of C (c: C of its problem o): the relu of its sums
 * (col_relu), the bits of ttd_k_unary's, or a relu's backward mask (c_mask), those of
 * ttd_k_unary_backward's. */
TTD_KHOT static void relu_tile(const gemm_problem *g, int64_t o, float *c, int64_t i0, int64_t mc, int64_t j0,
                               int64_t nc) {
  if (g->col_relu) {
    for (int64_t i = i0; i < i0 + mc; i++) {
      float *restrict row = c + i * g->ldc + j0;
      for (int64_t j = 0; j < nc; j++) row[j] = row[j] < 0.0f ? 0.0f : row[j];
    }
  }
  if (g->c_mask) {
    for (int64_t i = i0; i < i0 + mc; i++) {
      float *restrict row = c + i * g->ldc + j0;
      const float *restrict mask = g->c_mask + o * g->c_bs + i * g->ldc + j0;
      for (int64_t j = 0; j < nc; j++) row[j] = mask[j] <= 0.0f ? 0.0f : row[j];
    }
  }
}

/* The epilogue of a finished tile of C (c: C of its problem o), while it is still in cache:
 * its columns' bias, if any, then relu_tile's. */
TTD_KHOT static void finish_tile(const gemm_problem *g, int64_t o, float *c, int64_t i0, int64_t mc, int64_t j0,
                                 int64_t nc) {
  if (g->col_bias) {
    for (int64_t i = i0; i < i0 + mc; i++) {
      float *restrict row = c + i * g->ldc + j0;
      const float *restrict bias = g->col_bias + j0;
      for (int64_t j = 0; j < nc; j++) row[j] += bias[j];
    }
  }
  relu_tile(g, o, c, i0, mc, j0, nc);
}

/* Task t of gemm_tasks or rows_tasks: output o and the C tile at (i0, j0), mc x nc, the
 * tiles of a column of tiles in turn. */
typedef struct c_tile {
  int64_t o, i0, j0, mc, nc;
} c_tile;

static c_tile tile_of(const gemm_problem *g, size_t t) {
  int64_t tiles = g->m_tiles * g->n_tiles, tile = (int64_t)t % tiles;
  c_tile c = {.o = (int64_t)t / tiles, .i0 = (tile % g->m_tiles) * g->mc, .j0 = (tile / g->m_tiles) * g->nc};
  c.mc = g->m - c.i0 < g->mc ? g->m - c.i0 : g->mc;
  c.nc = g->n - c.j0 < g->nc ? g->n - c.j0 : g->nc;
  return c;
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
    c_tile at = tile_of(g, t);
    int64_t o = at.o, i0 = at.i0, j0 = at.j0, mc = at.mc, nc = at.nc;
    int64_t q0 = g->c_bs ? o : 0, q1 = g->c_bs ? o + 1 : g->batch;
    float *c = g->c + o * g->c_bs;

    if (g->k == 0) {
      for (int64_t i = i0; !g->c_accumulate && i < i0 + mc; i++) memset(c + i * g->ldc + j0, 0, (size_t)nc * sizeof(float));
      finish_tile(g, o, c, i0, mc, j0, nc);
      continue;
    }
    if (!buf) {
      tile_unpacked(g, q0, q1, i0, i0 + mc, j0, j0 + nc, c);
      finish_tile(g, o, c, i0, mc, j0, nc);
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
        if (!kept) pack_b_any(g, elem_at(g->b, g->b_bf16, b0 + p0 * g->b_rs), kc, nc, bp);
        if (g->a_packed) ap = g->a_packed + depth(g, p0) * round_up(g->m, MR) + i0 * kd; /* p0 is even */
        else pack_a_any(g, elem_at(g->a, g->a_bf16, a0 + p0 * g->a_cs), mc, kc, ap);
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
    finish_tile(g, o, c, i0, mc, j0, nc);
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
    relu_tile(g, o, c, i0, i1 - i0, j0, j1 - j0); /* the dot blocks added the bias */
  }
}

/* Tasks [begin, end) of X W^T with W read where it lies (g->rows; A is X [m,k], B is W^T
 * with W [n,k]): task t is output o = t / (m_tiles * n_tiles) and one C tile of it, computed
 * turned round, C^T = W X^T, into a buffer, then transposed into C. Per K block the tile's
 * rows of X are packed as B micro-panels (NR rows of X each, kept in L1 in turn) and each
 * meets every MR rows of the tile's W. The blocks, the order of the sums and the bias are
 * gemm_tasks', so C has the bits the packed path gives. */
static void rows_tasks(void *ctx, size_t begin, size_t end) {
  const gemm_problem *g = ctx;
  int64_t kc_max = g->k < g->kc ? g->k : g->kc, ldt = round_up(g->mc, g->nr);
  size_t x_len = g->a_packed ? 0 : (size_t)(ldt * kc_max), t_len = (size_t)(round_up(g->nc, 16) * ldt);
  float *xp = aligned_alloc(64, (size_t)round_up((int64_t)((x_len + t_len) * sizeof(float)), 64));
  float *ct = xp ? xp + x_len : NULL; /* C^T of the tile: ct[i*ldt + j] = C(i0 + j, j0 + i) */
  ttd_kcheck check = TTD_KCHECK_INIT;
  for (size_t t = begin; t < end; t++) {
    c_tile at = tile_of(g, t);
    int64_t o = at.o, i0 = at.i0, j0 = at.j0, mc = at.mc, nc = at.nc;
    float *c = g->c + o * g->c_bs + i0 * g->ldc + j0;
    if (!xp) {
      tile_unpacked(g, o, o + 1, i0, i0 + mc, j0, j0 + nc, g->c + o * g->c_bs);
      finish_tile(g, o, g->c + o * g->c_bs, i0, mc, j0, nc);
      continue;
    }
    if (g->c_accumulate)
      for (int64_t i = 0; i < nc; i++)
        for (int64_t j = 0; j < mc; j++) ct[i * ldt + j] = c[j * g->ldc + i];
    const float *x = (const float *)g->a + o * g->a_bs + i0 * g->a_rs;
    const float *w = (const float *)g->b + o * g->b_bs + j0 * g->b_cs;
    for (int64_t p0 = 0; p0 < g->k; p0 += g->kc) {
      int64_t kc = g->k - p0 < g->kc ? g->k - p0 : g->kc;
      if (ttd_kstop(&check, mc * nc * kc)) goto out;
      const float *xb = g->a_packed ? g->a_packed + p0 * round_up(g->m, g->nr) + i0 * kc : xp;
      if (!g->a_packed) ttd_gemm_pack_b(x + p0, 1, g->a_rs, kc, mc, g->nr, xp, g->interleave16); /* B(p,j) = X(j,p) */
      for (int64_t jr = 0; jr < mc; jr += g->nr) {
        int64_t nr = mc - jr < g->nr ? mc - jr : g->nr;
        for (int64_t ir = 0; ir < nc; ir += MR) {
          int64_t mr = nc - ir < MR ? nc - ir : MR;
          g->rows(kc, w + ir * g->b_cs + p0, g->b_cs, xb + jr * kc, ct + ir * ldt + jr, ldt, mr, nr,
                  g->c_accumulate || p0 > 0);
        }
      }
    }
    int64_t nc16 = g->interleave16 ? nc & ~(int64_t)15 : 0;
    for (int64_t i = 0; i < nc16; i += 16) g->interleave16(ct + i * ldt, ldt, mc, c + i, g->ldc);
    for (int64_t i = nc16; i < nc; i++)
      for (int64_t j = 0; j < mc; j++) c[j * g->ldc + i] = ct[i * ldt + j];
    finish_tile(g, o, g->c + o * g->c_bs, i0, mc, j0, nc);
  }
out:
  free(xp);
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
    pack_a_any(g, elem_at(g->a, g->a_bf16, p0 * g->a_cs + r0 * g->a_rs), rows, kc,
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

/* Units [begin, end) of packing X for every rows_tasks task: unit u is K block u / panels,
 * NR-row panel u % panels, packed as rows_tasks packs it, K block p0 at a_packed + p0 *
 * round_up(m, nr). */
static void pack_x_units(void *ctx, size_t begin, size_t end) {
  const gemm_problem *g = ctx;
  int64_t m_pad = round_up(g->m, g->nr), panels = m_pad / g->nr;
  for (size_t u = begin; u < end; u++) {
    int64_t p0 = (int64_t)u / panels * g->kc, r0 = (int64_t)u % panels * g->nr;
    int64_t kc = g->k - p0 < g->kc ? g->k - p0 : g->kc;
    int64_t rows = g->m - r0 < g->nr ? g->m - r0 : g->nr;
    ttd_gemm_pack_b((const float *)g->a + r0 * g->a_rs + p0, 1, g->a_rs, kc, rows, g->nr,
                    g->a_packed + p0 * m_pad + r0 * kc, g->interleave16);
  }
}

/* Whether C = A B goes as X W^T with W read where it lies (rows_tasks) rather than packed:
 * where the ISA has a rows kernel, in the layout and cases dot products take, at any K, for
 * up to ROWS_M_MAX rows of X. Packing W costs the same whatever m; the rows path instead
 * reads W's rows once per NR rows of X and stores C turned round. With its bits the packed
 * path's, the choice may depend on m: no result changes with it. */
static bool rows_applies(const gemm_problem *g, rows_kernel_fn rows) {
  return rows && g->dot_layout && g->a_cs == 1 && g->b_rs == 1 && g->mode == MODE_F32 && g->c_bs != 0 && g->k > 0 &&
         g->m <= ROWS_M_MAX;
}

/* Tiles an X W^T problem for rows_tasks (MC_MAX rows of X and NC_MAX rows of W a tile; then
 * more tiles, along W's rows first, so that each task packs only X, until there are two
 * per thread) and runs them over the pool. */
static void rows_run(ttd_pool *pool, gemm_problem *g, rows_kernel_fn rows) {
  g->rows = rows;
  g->m_tiles = (g->m + MC_MAX - 1) / MC_MAX;
  g->n_tiles = (g->n + NC_MAX - 1) / NC_MAX;
  g->mc = round_up((g->m + g->m_tiles - 1) / g->m_tiles, g->nr);
  g->nc = round_up((g->n + g->n_tiles - 1) / g->n_tiles, MR);
  split_tiles(pool, g, g->nr, MR, 4 * MR, true);
  /* X packed once for every task (one problem; its tiles all along W's rows pack the same X) */
  int64_t m_pad = round_up(g->m, g->nr);
  if (g->outputs == 1 && g->batch == 1 && g->n_tiles > 1 && m_pad * g->k <= SHARED_A_MAX) {
    g->a_packed = aligned_alloc(64, (size_t)round_up(m_pad * g->k * (int64_t)sizeof(float), 64));
    if (g->a_packed)
      ttd_pool_parallel_for(pool, (size_t)(m_pad / g->nr * ((g->k + g->kc - 1) / g->kc)), 1, pack_x_units, g);
  }
  ttd_pool_parallel_for(pool, (size_t)(g->outputs * g->m_tiles * g->n_tiles), 1, rows_tasks, g);
  free(g->a_packed);
  g->a_packed = NULL;
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
  micro_kernel kernel = ttd_gemm_pick_kernel(g->mode == MODE_BF16_PAIRS);
  if (g->mode == MODE_BF16_PAIRS && !kernel.pairs) g->mode = MODE_BF16_WIDEN; /* TTD_KERNEL_ISA changed since */
  g->kernel = kernel.fn;
  g->nr = kernel.nr;
  if (dot_applies(g, kernel.dot)) {
    dot_run(pool, g, kernel.dot);
    return;
  }
  g->interleave16 = ttd_gemm_pick_interleave16(); /* NR, 16 or 32, is a whole number of its 16 columns */
  int64_t kc_max = g->mode == MODE_BF16_PAIRS ? 2 * KC : KC; /* the same bytes of B panel: KC packed steps */
  int64_t k_blocks = (g->k + kc_max - 1) / kc_max;
  g->kc = k_blocks ? round_up((g->k + k_blocks - 1) / k_blocks, 8) : KC; /* even blocks: no 16-step tail */
  if (rows_applies(g, kernel.rows)) {
    rows_run(pool, g, kernel.rows);
    return;
  }
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

/* How the product of operands held as a_dtype and b_dtype is computed: float32, or a
 * bfloat16 product when either is bfloat16. */
static gemm_mode mode_of(ttd_dtype a_dtype, ttd_dtype b_dtype) {
  if (a_dtype != TTD_DTYPE_BFLOAT16 && b_dtype != TTD_DTYPE_BFLOAT16) return MODE_F32;
  return ttd_gemm_bf16_pairs() ? MODE_BF16_PAIRS : MODE_BF16_WIDEN;
}

/* C(q) (=, or summed over q when c_bs is 0) A(q) B(q) with the strides as described on
 * gemm_problem, computed as `mode`; dot_layout as there. */
static void gemm(ttd_pool *pool, gemm_mode mode, int64_t batch, int64_t m, int64_t n, int64_t k, const void *a,
                 bool a_bf16, int64_t a_rs, int64_t a_cs, int64_t a_bs, const void *b, bool b_bf16, int64_t b_rs,
                 int64_t b_cs, int64_t b_bs, float *c, int64_t ldc, int64_t c_bs, const float *col_bias, bool col_relu,
                 const float *c_mask, int accumulate, bool dot_layout) {
  gemm_problem g = {.batch = batch, .m = m, .n = n, .k = k, .mode = mode, .a_bf16 = a_bf16, .b_bf16 = b_bf16};
  g.a = a, g.a_rs = a_rs, g.a_cs = a_cs, g.a_bs = a_bs;
  g.b = b, g.b_rs = b_rs, g.b_cs = b_cs, g.b_bs = b_bs;
  g.c = c, g.ldc = ldc, g.c_bs = c_bs, g.col_bias = col_bias, g.col_relu = col_relu, g.c_mask = c_mask;
  g.c_accumulate = accumulate;
  g.dot_layout = dot_layout;
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

void ttd_k_matmul_bias(ttd_pool *pool, const float *a, const float *b, const float *bias, float *c, int64_t batch,
                       int64_t m, int64_t n, int64_t k, int trans_a, int trans_b, int64_t a_batch_stride,
                       int64_t b_batch_stride) {
  ttd_k_matmul_dt(pool, a, TTD_DTYPE_FLOAT32, b, TTD_DTYPE_FLOAT32, bias, c, batch, m, n, k, trans_a, trans_b,
                  a_batch_stride, b_batch_stride);
}

void ttd_k_matmul_dt(ttd_pool *pool, const void *a, ttd_dtype a_dtype, const void *b, ttd_dtype b_dtype,
                     const float *bias, float *c, int64_t batch, int64_t m, int64_t n, int64_t k, int trans_a,
                     int trans_b, int64_t a_batch_stride, int64_t b_batch_stride) {
  ttd_k_matmul_act_dt(pool, a, a_dtype, b, b_dtype, bias, 0, c, batch, m, n, k, trans_a, trans_b, a_batch_stride,
                      b_batch_stride);
}

void ttd_k_matmul_act_dt(ttd_pool *pool, const void *a, ttd_dtype a_dtype, const void *b, ttd_dtype b_dtype,
                         const float *bias, int relu, float *c, int64_t batch, int64_t m, int64_t n, int64_t k,
                         int trans_a, int trans_b, int64_t a_batch_stride, int64_t b_batch_stride) {
  int64_t a_rs, a_cs, b_rs, b_cs;
  op_strides(trans_a, m, k, &a_rs, &a_cs);
  op_strides(trans_b, k, n, &b_rs, &b_cs);
  gemm(pool, mode_of(a_dtype, b_dtype), batch, m, n, k, a, a_dtype == TTD_DTYPE_BFLOAT16, a_rs, a_cs, a_batch_stride,
       b, b_dtype == TTD_DTYPE_BFLOAT16, b_rs, b_cs, b_batch_stride, c, n, m * n, bias, relu != 0, NULL, 0,
       !trans_a && trans_b);
}

void ttd_k_matmul_bf16(ttd_pool *pool, const uint16_t *a, const uint16_t *b, const float *bias, float *c,
                       int64_t batch, int64_t m, int64_t n, int64_t k, int trans_a, int trans_b,
                       int64_t a_batch_stride, int64_t b_batch_stride) {
  ttd_k_matmul_dt(pool, a, TTD_DTYPE_BFLOAT16, b, TTD_DTYPE_BFLOAT16, bias, c, batch, m, n, k, trans_a, trans_b,
                  a_batch_stride, b_batch_stride);
}

const char *ttd_k_matmul_path(int64_t m, int64_t k, int trans_a, int trans_b) {
  gemm_problem g = {.batch = 1, .m = m, .n = 1, .k = k, .mode = MODE_F32, .c_bs = 1, .dot_layout = !trans_a && trans_b};
  op_strides(trans_a, m, k, &g.a_rs, &g.a_cs);
  op_strides(trans_b, k, 1, &g.b_rs, &g.b_cs);
  micro_kernel kernel = ttd_gemm_pick_kernel(false);
  if (dot_applies(&g, kernel.dot)) return "dot";
  return rows_applies(&g, kernel.rows) ? "rows" : "packed";
}

const char *ttd_k_matmul_bf16_path(void) {
  const char *pairs = ttd_gemm_bf16_pairs();
  return pairs ? pairs : "float32";
}

double ttd_k_bf16_dot_gain(void) { return ttd_gemm_bf16_dot_gain(); }

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
  ttd_k_matmul_backward_dt(pool, a, TTD_DTYPE_FLOAT32, b, TTD_DTYPE_FLOAT32, dc, batch, m, n, k, trans_a, trans_b,
                           a_batch_stride, b_batch_stride, da, db, add);
}

void ttd_k_matmul_backward_dt(ttd_pool *pool, const void *a, ttd_dtype a_dtype, const void *b, ttd_dtype b_dtype,
                              const float *dc, int64_t batch, int64_t m, int64_t n, int64_t k, int trans_a,
                              int trans_b, int64_t a_batch_stride, int64_t b_batch_stride, float *da, float *db,
                              unsigned add) {
  ttd_k_matmul_backward_mask_dt(pool, a, a_dtype, b, b_dtype, dc, batch, m, n, k, trans_a, trans_b, a_batch_stride,
                                b_batch_stride, da, db, add, NULL);
}

void ttd_k_matmul_backward_mask_dt(ttd_pool *pool, const void *a, ttd_dtype a_dtype, const void *b, ttd_dtype b_dtype,
                                   const float *dc, int64_t batch, int64_t m, int64_t n, int64_t k, int trans_a,
                                   int trans_b, int64_t a_batch_stride, int64_t b_batch_stride, float *da, float *db,
                                   unsigned add, const float *da_mask) {
  int64_t a_rs, a_cs, b_rs, b_cs, mn = m * n;
  int add_a = (add & TTD_KGRAD_ADD_A) != 0, add_b = (add & TTD_KGRAD_ADD_B) != 0;
  gemm_mode mode = mode_of(a_dtype, b_dtype);
  bool a16 = a_dtype == TTD_DTYPE_BFLOAT16, b16 = b_dtype == TTD_DTYPE_BFLOAT16;
  op_strides(trans_a, m, k, &a_rs, &a_cs);
  op_strides(trans_b, k, n, &b_rs, &b_cs);
  /* dA's two forms read rows of dC and, B stored [k,n], rows of B, both along n: the dot layout */
  if (da && !trans_a)
    gemm(pool, mode, batch, m, k, n, dc, false, n, 1, mn, b, b16, b_cs, b_rs, b_batch_stride, da, k, a_batch_stride, NULL,
         false, da_mask, add_a, !trans_b);
  if (da && trans_a)
    gemm(pool, mode, batch, k, m, n, b, b16, b_rs, b_cs, b_batch_stride, dc, false, 1, n, mn, da, m, a_batch_stride, NULL,
         false, da_mask, add_a, !trans_b);
  if (db && !trans_b)
    gemm(pool, mode, batch, k, n, m, a, a16, a_cs, a_rs, a_batch_stride, dc, false, n, 1, mn, db, n, b_batch_stride, NULL,
         false, NULL, add_b, false);
  if (db && trans_b)
    gemm(pool, mode, batch, n, k, m, dc, false, 1, n, mn, a, a16, a_rs, a_cs, a_batch_stride, db, k, b_batch_stride, NULL,
         false, NULL, add_b, false);
}
