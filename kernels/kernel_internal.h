/* Helpers shared by the kernel files (not part of the kernel interface).
 *
 * - TTD_KGRAIN: elements per parallel_for chunk for simple streaming loops.
 * - TTD_KHOT: marks a hot inner loop: it is compiled for AVX-512, AVX2 and baseline x86-64
 *   and picked at load time (target_clones), with the loop vectorizer (and unswitching of
 *   loop-invariant branches) on at the build's -O2, and no a * b + c contracted into an FMA
 *   (which only the AVX-512 clone has), so every clone computes the same bits.
 * - ttd_ksum_f32 / ttd_ksum_blocks: sums whose rounding depends only on the data and its
 *   length, never on the pool's thread count, so results are identical on 1 or N threads.
 * - ttd_kexpf, ttd_kmax_f32, ttd_kexp_sum: row primitives that vectorize once inlined into
 *   a TTD_KHOT loop (libm's expf is a call the vectorizer cannot use).
 * - ttd_kcheck: how a long serial loop inside one chunk polls its run's cancellation flag.
 * - ttd_know_ns: the monotonic clock the pool's spins and the kernels' probes count in. */
#ifndef TTD_KERNELS_KERNEL_INTERNAL_H
#define TTD_KERNELS_KERNEL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "thread_pool.h"

#define TTD_KGRAIN 16384

/* Nanoseconds of CLOCK_MONOTONIC. */
static inline int64_t ttd_know_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* A chunk can hold seconds of work (a pool's huge window, a matmul tile's long K, one
 * enormous row), so loops inside it poll the cancellation flag too, about every
 * TTD_KCHECK_OPS operations (a fraction of a millisecond): ttd_kstop counts the work done
 * since the last poll and loads the flag (ttd_pool_cancelled) only past that. */
#define TTD_KCHECK_OPS ((int64_t)1 << 20)

typedef struct ttd_kcheck {
  int64_t left; /* operations until the next poll */
} ttd_kcheck;

#define TTD_KCHECK_INIT {TTD_KCHECK_OPS}

/* Counts ops more operations done; whether the kernel should stop now. */
static inline int ttd_kstop(ttd_kcheck *check, int64_t ops) {
  if ((check->left -= ops) > 0) return 0;
  check->left = TTD_KCHECK_OPS;
  return ttd_pool_cancelled();
}

/* Row primitives below are always inlined, so they take the ISA of the TTD_KHOT clone that
 * calls them. */
#define TTD_KINLINE static inline __attribute__((always_inline))

/* Not under ThreadSanitizer: its instrumented ifunc resolvers run before its runtime is up. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define TTD_KHOT                                              \
  __attribute__((target_clones("avx512f", "avx2", "default"), \
                 optimize("tree-vectorize", "vect-cost-model=dynamic", "unswitch-loops", "fp-contract=off")))
#else
#define TTD_KHOT
#endif

/* Sum of x[0, n) in double. Floats go into 16 fixed lanes per 1024-element block (so the
 * loop vectorizes without reassociation); blocks are added in order in double. */
TTD_KINLINE double ttd_ksum_f32(const float *restrict x, int64_t n) {
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

/* exp(x) in float, written to vectorize (no libm call): Cody-Waite reduction by ln 2, the
 * Cephes degree-6 polynomial (about 1 ulp), and 2^n applied in two halves so results in the
 * subnormal range come out right. Overflow gives +Inf, x below -104 gives 0, NaN stays NaN. */
TTD_KINLINE float ttd_kexpf(float x) {
  const float hi = 88.72283935546875f, lo = -103.97208404541015625f;
  float xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  xc = xc == xc ? xc : 0.0f;
  float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t k = (int32_t)n, k1 = k >> 1, k2 = k - k1; /* each in [-75, 64] */
  uint32_t b1 = (uint32_t)(k1 + 127) << 23, b2 = (uint32_t)(k2 + 127) << 23;
  float s1, s2;
  __builtin_memcpy(&s1, &b1, sizeof(s1));
  __builtin_memcpy(&s2, &b2, sizeof(s2));
  float y = p * s1 * s2;
  y = x > hi ? __builtin_inff() : y;
  y = x < lo ? 0.0f : y;
  return x == x ? y : x;
}

/* y[j] = exp(a * x[j] + b) for 16 elements: ttd_kexpf's steps on GCC vector types (the
 * loop vectorizer will not if-convert its range checks under the default trapping math).
 * Lowered to one AVX-512, two AVX2 or four SSE2 registers by the caller's clone. */
typedef float ttd_v16f __attribute__((vector_size(64)));
typedef int32_t ttd_v16i __attribute__((vector_size(64)));
#define TTD_VSEL(m, a, b) ((ttd_v16f)(((m) & (ttd_v16i)(a)) | (~(m) & (ttd_v16i)(b))))

TTD_KINLINE void ttd_kexpf16(float *y, const float *x, float a, float b) {
  const ttd_v16f zero = {0}, hi = zero + 88.72283935546875f, lo = zero - 103.97208404541015625f;
  ttd_v16f v;
  __builtin_memcpy(&v, x, sizeof(v));
  v = v * a + b;
  ttd_v16i over = v > hi, under = v < lo, nan = v != v;
  ttd_v16f xc = TTD_VSEL(under, lo, v);
  xc = TTD_VSEL(over, hi, xc);
  xc = TTD_VSEL(nan, zero, xc);
  ttd_v16f n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  ttd_v16f r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  ttd_v16f p = zero + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  ttd_v16i k = __builtin_convertvector(n, ttd_v16i), k1 = k >> 1, k2 = k - k1;
  ttd_v16f res = p * (ttd_v16f)((k1 + 127) << 23) * (ttd_v16f)((k2 + 127) << 23);
  res = TTD_VSEL(over, zero + __builtin_inff(), res);
  res = TTD_VSEL(under, zero, res);
  res = TTD_VSEL(nan, v, res);
  __builtin_memcpy(y, &res, sizeof(res));
}

/* y[i] = exp(a * x[i] + b) over [0, n); y may be x. */
TTD_KINLINE void ttd_kexpf_n(float *y, const float *x, float a, float b, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) ttd_kexpf16(y + i, x + i, a, b);
  for (; i < n; i++) y[i] = ttd_kexpf(a * x[i] + b);
}

/* max of x[0, n), n >= 1, in 16 lanes (vectorizes; max is exact, so lanes change nothing). */
TTD_KINLINE float ttd_kmax_f32(const float *restrict x, int64_t n) {
  float lane[16];
  for (int j = 0; j < 16; j++) lane[j] = x[0];
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; j++) lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
  for (; i < n; i++) lane[i & 15] = x[i] > lane[i & 15] ? x[i] : lane[i & 15];
  float m = lane[0];
  for (int j = 1; j < 16; j++) m = lane[j] > m ? lane[j] : m;
  return m;
}

/* sum of exp(x[i] - m) over [0, n) in double: exponentials in blocks of 1024 (into y when
 * it is not NULL, else a stack buffer), each block summed by ttd_ksum_f32. */
TTD_KINLINE double ttd_kexp_sum(const float *restrict x, float m, float *restrict y, int64_t n) {
  float buf[1024];
  double total = 0.0;
  for (int64_t b = 0; b < n; b += 1024) {
    int64_t len = n - b < 1024 ? n - b : 1024;
    float *q = y ? y + b : buf;
    ttd_kexpf_n(q, x + b, 1.0f, -m, len);
    total += ttd_ksum_f32(q, len);
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
