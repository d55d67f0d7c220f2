/* Helpers shared by the kernel files (not part of the kernel interface).
 *
 * - TTD_KGRAIN: elements per parallel_for chunk for simple streaming loops.
 * - TTD_KHOT: marks a hot inner loop: it is compiled for AVX-512, AVX2 and baseline x86-64
 *   and picked at load time (target_clones), with the loop vectorizer (and unswitching of
 *   loop-invariant branches) on at the build's -O2.
 * - ttd_ksum_f32 / ttd_ksum_blocks: sums whose rounding depends only on the data and its
 *   length, never on the pool's thread count, so results are identical on 1 or N threads. */
#ifndef TTD_KERNELS_KERNEL_INTERNAL_H
#define TTD_KERNELS_KERNEL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "thread_pool.h"

#define TTD_KGRAIN 16384

/* Not under ThreadSanitizer: its instrumented ifunc resolvers run before its runtime is up. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define TTD_KHOT                                                                      \
  __attribute__((target_clones("avx512f", "avx2", "default"),                         \
                 optimize("tree-vectorize", "vect-cost-model=dynamic", "unswitch-loops")))
#else
#define TTD_KHOT
#endif

/* Sum of x[0, n) in double. Floats go into 16 fixed lanes per 1024-element block (so the
 * loop vectorizes without reassociation); blocks are added in order in double. */
static inline double ttd_ksum_f32(const float *restrict x, int64_t n) {
  double total = 0.0;
  for (int64_t b = 0; b < n; b += 1024) {
    int64_t len = n - b < 1024 ? n - b : 1024;
    const float *p = x + b;
    float lane[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= len; i += 16)
      for (int j = 0; j < 16; j++) lane[j] += p[i + j];
    for (; i < len; i++) lane[i & 15] += p[i];
    double s = 0.0;
    for (int j = 0; j < 16; j++) s += (double)lane[j];
    total += s;
  }
  return total;
}

/* Partial sum of items [begin, end) of some sequence. */
typedef double (*ttd_ksum_block_fn)(void *ctx, int64_t begin, int64_t end);

#define TTD_KSUM_MAX_BLOCKS 256

typedef struct ttd_ksum_blocks_job {
  ttd_ksum_block_fn fn;
  void *ctx;
  int64_t n, block;
  double *partial;
} ttd_ksum_blocks_job;

static inline void ttd_ksum_blocks_run(void *ctx, size_t begin, size_t end) {
  ttd_ksum_blocks_job *job = ctx;
  for (size_t b = begin; b < end; b++) {
    int64_t lo = (int64_t)b * job->block;
    int64_t hi = lo + job->block < job->n ? lo + job->block : job->n;
    job->partial[b] = job->fn(job->ctx, lo, hi);
  }
}

/* Sum of fn over [0, n), cut into blocks of at least min_block items (at most
 * TTD_KSUM_MAX_BLOCKS of them) that run in parallel; the partials are added in order. The
 * cut depends only on n and min_block. */
static inline double ttd_ksum_blocks(ttd_pool *pool, int64_t n, int64_t min_block, ttd_ksum_block_fn fn, void *ctx) {
  if (n <= 0) return 0.0;
  if (min_block < 1) min_block = 1;
  int64_t nblocks = (n + min_block - 1) / min_block;
  if (nblocks > TTD_KSUM_MAX_BLOCKS) nblocks = TTD_KSUM_MAX_BLOCKS;
  int64_t block = (n + nblocks - 1) / nblocks;
  nblocks = (n + block - 1) / block;
  double partial[TTD_KSUM_MAX_BLOCKS];
  ttd_ksum_blocks_job job = {.fn = fn, .ctx = ctx, .n = n, .block = block, .partial = partial};
  ttd_pool_parallel_for(pool, (size_t)nblocks, 1, ttd_ksum_blocks_run, &job);
  double total = 0.0;
  for (int64_t b = 0; b < nblocks; b++) total += partial[b];
  return total;
}

#endif
