/* Shapes: element counts, numpy broadcasting, and gradient accumulation. */
#include <string.h>

#include "kernel_internal.h"
#include "kernels.h"

int64_t ttd_kshape_numel(const ttd_kshape *s) {
  int64_t n = 1;
  for (int i = 0; i < s->ndim; i++) n *= s->d[i];
  return n;
}

int ttd_broadcast_shape(const ttd_kshape *a, const ttd_kshape *b, ttd_kshape *out) {
  ttd_kshape r;
  memset(&r, 0, sizeof(r));
  if (a->ndim < 0 || b->ndim < 0 || a->ndim > TTD_MAX_DIMS || b->ndim > TTD_MAX_DIMS) {
    memset(out, 0, sizeof(*out));
    return -1;
  }
  r.ndim = a->ndim > b->ndim ? a->ndim : b->ndim;
  for (int i = 0; i < r.ndim; i++) {
    /* align from the right: dim i of the result is dim i - (r.ndim - x.ndim) of x */
    int ia = i - (r.ndim - a->ndim), ib = i - (r.ndim - b->ndim);
    int64_t da = ia >= 0 ? a->d[ia] : 1, db = ib >= 0 ? b->d[ib] : 1;
    if (da < 0 || db < 0 || (da != db && da != 1 && db != 1)) {
      memset(out, 0, sizeof(*out));
      return -1;
    }
    r.d[i] = da == 1 ? db : da; /* a 1 against a 0 gives 0, as numpy */
  }
  *out = r; /* out may be a or b */
  return 0;
}

TTD_KHOT static void accumulate_loop(float *restrict dst, const float *restrict src, int64_t n) {
  for (int64_t i = 0; i < n; i++) dst[i] += src[i];
}

typedef struct accumulate_job {
  float *dst;
  const float *src;
} accumulate_job;

static void accumulate_run(void *ctx, size_t begin, size_t end) {
  accumulate_job *job = ctx;
  accumulate_loop(job->dst + begin, job->src + begin, (int64_t)(end - begin));
}

void ttd_k_accumulate(ttd_pool *pool, float *restrict dst, const float *restrict src, int64_t n) {
  if (n <= 0) return;
  accumulate_job job = {dst, src};
  ttd_pool_parallel_for(pool, (size_t)n, TTD_KGRAIN, accumulate_run, &job);
}
