/* Sum/mean reductions over any set of axes, and permute (their backward, a broadcast scale,
 * is elementwise.c's).
 *
 * A reduction is planned by dropping dims of size 1 and merging neighbours of the same kind
 * (kept or reduced), which leaves alternating kept and reduced dims. Two shapes of work:
 * - innermost dim reduced: each output sums contiguous runs (ttd_ksum_f32 lanes);
 * - innermost dim kept: each output segment (up to SEG neighbours) adds whole row slices,
 *   a contiguous vector loop, into double accumulators.
 * Work items are (output unit, block of the reduced range). Long reductions with few
 * outputs are cut into fixed blocks whose partials are added in block order; the cut depends
 * only on the shape, so results are the same for any thread count.
 *
 * Permute merges the output dims that stay linear in x; when the innermost output dim is
 * strided in x it copies in TILE x TILE tiles (a blocked transpose). */
#include <math.h>
#include <string.h>

#include "kernel_internal.h"
#include "kernels.h"

#define SEG 256           /* output neighbours per segment (innermost dim kept) */
#define RBLOCK 16384      /* reduced elements per block when a reduction is cut */
#define MAX_PARTIALS 4096 /* doubles of partial sums on the caller's stack */
#define TILE 32

typedef struct rplan {
  int nk, nr;
  int64_t ksize[TTD_MAX_DIMS], kstride[TTD_MAX_DIMS]; /* kept dims, x strides */
  int64_t rsize[TTD_MAX_DIMS], rstride[TTD_MAX_DIMS]; /* reduced dims, x strides */
  int64_t ynumel, rnumel;
  int inner_kept; /* the innermost dim (stride 1) is kept */
} rplan;

static void rplan_make(rplan *p, const ttd_kshape *xs, uint32_t axes_mask) {
  memset(p, 0, sizeof(*p));
  int n = 0;
  int64_t size[TTD_MAX_DIMS], stride[TTD_MAX_DIMS];
  int red[TTD_MAX_DIMS];
  int64_t st = 1;
  /* innermost first, merging same-kind neighbours (x is contiguous, so they always merge) */
  for (int i = xs->ndim - 1; i >= 0; i--) {
    int64_t d = xs->d[i];
    int r = (axes_mask >> i) & 1u;
    if (d != 1) {
      if (n > 0 && red[n - 1] == r) {
        size[n - 1] *= d;
      } else {
        size[n] = d;
        stride[n] = st;
        red[n] = r;
        n++;
      }
    }
    st *= d;
  }
  p->ynumel = 1;
  p->rnumel = 1;
  for (int j = n - 1; j >= 0; j--) { /* back to outermost first */
    if (red[j]) {
      p->rsize[p->nr] = size[j];
      p->rstride[p->nr++] = stride[j];
      p->rnumel *= size[j];
    } else {
      p->ksize[p->nk] = size[j];
      p->kstride[p->nk++] = stride[j];
      p->ynumel *= size[j];
    }
  }
  p->inner_kept = n == 0 || !red[0];
}

/* x offset of kept flat index o (over all kept dims, or all but the last with `skip_last`). */
static int64_t kept_offset(const rplan *p, int64_t o, int skip_last) {
  int64_t off = 0;
  for (int d = p->nk - 1 - skip_last; d >= 0; d--) {
    off += (o % p->ksize[d]) * p->kstride[d];
    o /= p->ksize[d];
  }
  return off;
}

/* Walks reduced flat indices: idx/off track the position over the reduced dims. */
typedef struct rwalk {
  int64_t idx[TTD_MAX_DIMS];
  int64_t off;
} rwalk;

static void rwalk_seek(const rplan *p, rwalk *w, int64_t r, int upto) {
  w->off = 0;
  for (int d = upto - 1; d >= 0; d--) {
    w->idx[d] = r % p->rsize[d];
    w->off += w->idx[d] * p->rstride[d];
    r /= p->rsize[d];
  }
}

static void rwalk_next(const rplan *p, rwalk *w, int upto) {
  for (int d = upto - 1; d >= 0; d--) {
    w->off += p->rstride[d];
    if (++w->idx[d] < p->rsize[d]) return;
    w->off -= w->idx[d] * p->rstride[d];
    w->idx[d] = 0;
  }
}

/* Innermost reduced: sum of reduced indices [r0, r1) for the output at x offset base. The
 * innermost reduced dim is contiguous; whole runs go through ttd_ksum_f32. */
TTD_KHOT static double sum_runs(const rplan *p, const float *x, int64_t base, int64_t r0, int64_t r1) {
  int64_t inner = p->rsize[p->nr - 1];
  int64_t in = r0 % inner;
  rwalk w;
  rwalk_seek(p, &w, r0 / inner, p->nr - 1);
  double s = 0.0;
  int64_t r = r0;
  while (r < r1) {
    int64_t len = inner - in < r1 - r ? inner - in : r1 - r;
    s += ttd_ksum_f32(x + base + w.off + in, len);
    r += len;
    in = 0;
    rwalk_next(p, &w, p->nr - 1);
  }
  return s;
}

TTD_KHOT static void add_row(double *restrict acc, const float *restrict x, int64_t n) {
  for (int64_t i = 0; i < n; i++) acc[i] += (double)x[i];
}

typedef struct reduce_job {
  const rplan *p;
  const float *x;
  float *y;
  double *partial; /* [nb][ynumel] when nb > 1 */
  int64_t units, nb, rblock, segs_per_row;
  double count; /* divisor: rnumel for mean, 1 for sum */
} reduce_job;

static void reduce_item(reduce_job *job, int64_t item, ttd_kcheck *check) {
  const rplan *p = job->p;
  int64_t u = item % job->units, b = item / job->units;
  int64_t r0 = b * job->rblock, r1 = r0 + job->rblock < p->rnumel ? r0 + job->rblock : p->rnumel;
  if (!p->inner_kept) {
    double s = sum_runs(p, job->x, kept_offset(p, u, 0), r0, r1);
    if (job->nb > 1) job->partial[b * p->ynumel + u] = s;
    else job->y[u] = (float)(s / job->count);
    return;
  }
  int64_t lk = p->nk ? p->ksize[p->nk - 1] : 1;
  int64_t row = u / job->segs_per_row, seg = u % job->segs_per_row;
  int64_t k0 = seg * SEG, len = lk - k0 < SEG ? lk - k0 : SEG;
  int64_t o0 = row * lk + k0;
  const float *x = job->x + (p->nk ? kept_offset(p, row, 1) : 0) + k0;
  double acc[SEG];
  for (int64_t j = 0; j < len; j++) acc[j] = 0.0;
  rwalk w;
  rwalk_seek(p, &w, r0, p->nr);
  for (int64_t r = r0; r < r1; r++) {
    if (ttd_kstop(check, len)) return;
    add_row(acc, x + w.off, len);
    rwalk_next(p, &w, p->nr);
  }
  if (job->nb > 1) {
    memcpy(job->partial + b * p->ynumel + o0, acc, (size_t)len * sizeof(double));
  } else {
    for (int64_t j = 0; j < len; j++) job->y[o0 + j] = (float)(acc[j] / job->count);
  }
}

static void reduce_run(void *ctx, size_t begin, size_t end) {
  reduce_job *job = ctx;
  ttd_kcheck check = TTD_KCHECK_INIT;
  for (size_t i = begin; i < end && !ttd_kstop(&check, job->rblock); i++) reduce_item(job, (int64_t)i, &check);
}

void ttd_k_reduce(ttd_pool *pool, ttd_reduce_op op, const float *x, const ttd_kshape *xs, uint32_t axes_mask,
                  float *y) {
  rplan p;
  rplan_make(&p, xs, axes_mask);
  if (p.ynumel <= 0) return;
  if (p.rnumel <= 0) { /* empty reduction: 0, or NaN for a mean (0 / 0, as torch) */
    for (int64_t i = 0; i < p.ynumel; i++) y[i] = op == TTD_RED_MEAN ? NAN : 0.0f;
    return;
  }
  reduce_job job = {.p = &p, .x = x, .y = y, .nb = 1, .rblock = p.rnumel, .segs_per_row = 1};
  job.count = op == TTD_RED_MEAN ? (double)p.rnumel : 1.0;
  int64_t unit_len = 1;
  if (p.inner_kept) {
    int64_t lk = p.nk ? p.ksize[p.nk - 1] : 1;
    job.segs_per_row = (lk + SEG - 1) / SEG;
    job.units = p.ynumel / lk * job.segs_per_row;
    unit_len = lk < SEG ? lk : SEG;
  } else {
    job.units = p.ynumel;
  }
  double partial[MAX_PARTIALS];
  if (p.rnumel > 2 * RBLOCK && p.ynumel <= MAX_PARTIALS / 4) {
    int64_t nb = (p.rnumel + RBLOCK - 1) / RBLOCK;
    if (nb > MAX_PARTIALS / p.ynumel) nb = MAX_PARTIALS / p.ynumel;
    job.rblock = (p.rnumel + nb - 1) / nb;
    job.nb = (p.rnumel + job.rblock - 1) / job.rblock;
    job.partial = partial;
  }
  int64_t work = unit_len * job.rblock;
  size_t grain = work >= TTD_KGRAIN ? 1 : (size_t)(TTD_KGRAIN / work);
  ttd_pool_parallel_for(pool, (size_t)(job.units * job.nb), grain, reduce_run, &job);
  if (job.nb > 1) {
    for (int64_t o = 0; o < p.ynumel; o++) {
      double s = 0.0;
      for (int64_t b = 0; b < job.nb; b++) s += partial[b * p.ynumel + o];
      y[o] = (float)(s / job.count);
    }
  }
}

/* ---- permute ---- */

typedef struct pplan {
  int ndim;
  int64_t size[TTD_MAX_DIMS];
  int64_t xstride[TTD_MAX_DIMS], ystride[TTD_MAX_DIMS];
  int64_t numel;
  int p; /* tiled case: the output dim that is contiguous in x */
  int64_t outer, tiles_p, tiles_q;
} pplan;

typedef struct permute_job {
  const pplan *pl;
  const float *x;
  float *y;
} permute_job;

/* Innermost output dim contiguous in x: copy runs. */
static void permute_runs(void *ctx, size_t begin, size_t end) {
  permute_job *job = ctx;
  const pplan *pl = job->pl;
  int last = pl->ndim - 1;
  int64_t inner = pl->size[last];
  for (int64_t pos = (int64_t)begin; pos < (int64_t)end;) {
    int64_t in = pos % inner, rest = pos / inner, off = in;
    for (int d = last - 1; d >= 0; d--) {
      off += (rest % pl->size[d]) * pl->xstride[d];
      rest /= pl->size[d];
    }
    int64_t len = inner - in < (int64_t)end - pos ? inner - in : (int64_t)end - pos;
    memcpy(job->y + pos, job->x + off, (size_t)len * sizeof(float));
    pos += len;
  }
}

/* Innermost output dim q strided in x: tiles over (p, q), every other dim outside. */
static void permute_tiles(void *ctx, size_t begin, size_t end) {
  permute_job *job = ctx;
  const pplan *pl = job->pl;
  int q = pl->ndim - 1, pd = pl->p;
  int64_t xs_q = pl->xstride[q], ys_p = pl->ystride[pd];
  for (size_t item = begin; item < end; item++) {
    int64_t t = (int64_t)item;
    int64_t tq = t % pl->tiles_q;
    t /= pl->tiles_q;
    int64_t tp = t % pl->tiles_p;
    int64_t o = t / pl->tiles_p;
    int64_t xoff = 0, yoff = 0;
    for (int d = q - 1; d >= 0; d--) {
      if (d == pd) continue;
      int64_t i = o % pl->size[d];
      o /= pl->size[d];
      xoff += i * pl->xstride[d];
      yoff += i * pl->ystride[d];
    }
    int64_t p0 = tp * TILE, p1 = p0 + TILE < pl->size[pd] ? p0 + TILE : pl->size[pd];
    int64_t q0 = tq * TILE, q1 = q0 + TILE < pl->size[q] ? q0 + TILE : pl->size[q];
    for (int64_t i = p0; i < p1; i++) {
      const float *restrict xr = job->x + xoff + i; /* xstride[pd] == 1 */
      float *restrict yr = job->y + yoff + i * ys_p;
      for (int64_t j = q0; j < q1; j++) yr[j] = xr[j * xs_q];
    }
  }
}

void ttd_k_permute(ttd_pool *pool, const float *x, const ttd_kshape *xs, const int *perm, float *y) {
  int n = xs->ndim;
  if (n < 0 || n > TTD_MAX_DIMS) return;
  int64_t xstr[TTD_MAX_DIMS];
  int64_t st = 1;
  unsigned seen = 0;
  for (int i = n - 1; i >= 0; i--) {
    xstr[i] = st;
    st *= xs->d[i];
    if (perm[i] < 0 || perm[i] >= n || (seen >> perm[i]) & 1u) return; /* not a permutation */
    seen |= 1u << perm[i];
  }
  pplan pl;
  memset(&pl, 0, sizeof(pl));
  pl.numel = ttd_kshape_numel(xs);
  if (pl.numel <= 0) return;
  for (int i = 0; i < n; i++) { /* output dims outermost first, merging where x stays linear */
    int64_t d = xs->d[perm[i]], s = xstr[perm[i]];
    if (d == 1) continue;
    if (pl.ndim > 0 && pl.xstride[pl.ndim - 1] == s * d) {
      pl.size[pl.ndim - 1] *= d;
      pl.xstride[pl.ndim - 1] = s;
    } else {
      pl.size[pl.ndim] = d;
      pl.xstride[pl.ndim++] = s;
    }
  }
  if (pl.ndim == 0) {
    pl.ndim = 1;
    pl.size[0] = 1;
    pl.xstride[0] = 1;
  }
  st = 1;
  for (int i = pl.ndim - 1; i >= 0; i--) {
    pl.ystride[i] = st;
    st *= pl.size[i];
  }
  permute_job job = {&pl, x, y};
  int q = pl.ndim - 1;
  if (pl.xstride[q] == 1) {
    ttd_pool_parallel_for(pool, (size_t)pl.numel, TTD_KGRAIN, permute_runs, &job);
    return;
  }
  pl.p = 0;
  for (int i = 0; i < q; i++)
    if (pl.xstride[i] == 1) pl.p = i;
  pl.tiles_p = (pl.size[pl.p] + TILE - 1) / TILE;
  pl.tiles_q = (pl.size[q] + TILE - 1) / TILE;
  pl.outer = pl.numel / (pl.size[pl.p] * pl.size[q]);
  ttd_pool_parallel_for(pool, (size_t)(pl.outer * pl.tiles_p * pl.tiles_q), TTD_KGRAIN / (TILE * TILE), permute_tiles,
                        &job);
}
