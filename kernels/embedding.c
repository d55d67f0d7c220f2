/* Embedding lookup and its backward (kernels.h). The indices are client data another call
 * may be rewriting: each one is read once, into a local, and checked there before it
 * addresses the table, whatever an earlier pass saw. */
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"

enum { DTABLE_COLS = 64 }; /* columns of dtable per backward task */

typedef struct emb_job {
  const float *table, *dy;
  const int32_t *indices;
  int64_t n, vocab, dim;
  float *y, *dtable;
  atomic_llong bad; /* gather: the first position found out of range, or -1 */
} emb_job;

static void gather_rows(void *ctx, size_t begin, size_t end) {
  emb_job *j = ctx;
  for (size_t i = begin; i < end; i++) {
    int32_t idx = j->indices[i];
    float *dst = j->y + (int64_t)i * j->dim;
    if (idx < 0 || idx >= j->vocab) { /* changed since the check: refused, the row zeroed */
      long long none = -1;
      atomic_compare_exchange_strong(&j->bad, &none, (long long)i);
      memset(dst, 0, (size_t)j->dim * sizeof(float));
      continue;
    }
    memcpy(dst, j->table + (int64_t)idx * j->dim, (size_t)j->dim * sizeof(float));
  }
}

/* Each task owns a block of dtable columns and scatters every row into it, in index order:
 * no two tasks write the same cell, and the sums do not depend on the pool. */
static void scatter_cols(void *ctx, size_t begin, size_t end) {
  const emb_job *j = ctx;
  for (size_t blk = begin; blk < end; blk++) {
    int64_t c0 = (int64_t)blk * DTABLE_COLS;
    int64_t w = j->dim - c0 < DTABLE_COLS ? j->dim - c0 : DTABLE_COLS;
    for (int64_t v = 0; v < j->vocab; v++) memset(j->dtable + v * j->dim + c0, 0, (size_t)w * sizeof(float));
    for (int64_t i = 0; i < j->n; i++) {
      int32_t idx = j->indices[i];
      if (idx < 0 || idx >= j->vocab) continue; /* the forward refused these */
      float *restrict dst = j->dtable + (int64_t)idx * j->dim + c0;
      const float *restrict src = j->dy + i * j->dim + c0;
      for (int64_t c = 0; c < w; c++) dst[c] += src[c];
    }
  }
}

int ttd_k_embedding(ttd_pool *pool, const float *table, const int32_t *indices, int64_t n, int64_t vocab, int64_t dim,
                    float *y, int64_t *out_bad_index) {
  if (out_bad_index) *out_bad_index = -1;
  for (int64_t i = 0; i < n; i++)
    if (indices[i] < 0 || indices[i] >= vocab) {
      if (out_bad_index) *out_bad_index = i;
      return -1;
    }
  if (n <= 0 || dim <= 0) return 0;
  emb_job j = {.table = table, .indices = indices, .vocab = vocab, .dim = dim, .y = y};
  atomic_init(&j.bad, -1);
  ttd_pool_parallel_for(pool, (size_t)n, (size_t)(dim >= 4096 ? 1 : 4096 / dim), gather_rows, &j);
  long long bad = atomic_load(&j.bad);
  if (bad >= 0) {
    if (out_bad_index) *out_bad_index = bad;
    return -1;
  }
  return 0;
}

void ttd_k_embedding_backward(ttd_pool *pool, const int32_t *indices, const float *dy, int64_t n, int64_t vocab,
                              int64_t dim, float *dtable) {
  if (vocab <= 0 || dim <= 0) return;
  emb_job j = {.dy = dy, .indices = indices, .n = n, .vocab = vocab, .dim = dim, .dtable = dtable};
  ttd_pool_parallel_for(pool, (size_t)((dim + DTABLE_COLS - 1) / DTABLE_COLS), 1, scatter_cols, &j);
}
