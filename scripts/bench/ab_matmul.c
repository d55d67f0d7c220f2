/* ab_matmul: two builds of the matmul kernel in one process, called in turn (see ab_matmul).
 * The symbols of the build under test carry the prefix new_, the baseline's old_. Each
 * pair runs both, the first of them alternating, and the ratio new / old of their times is
 * reported as the median over pairs, with each side's GFLOP/s. The results must be the same
 * bits (the kernels sum each element in one order whatever the build's blocking).
 *
 *   ab_matmul M N K THREADS [PAIRS]   C[M,N] = A[M,K] B[K,N], row-major, on a pool of THREADS
 * With AB_TRANS_B=1 in the environment, B is stored transposed ([N,K]), as a linear's forward
 * multiplies its weight; with AB_TRANS_A=1, A is ([K,M]), as a linear's weight gradient
 * multiplies the output's gradient. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.h"
#include "thread_pool.h"

void new_ttd_k_matmul(ttd_pool *pool, const float *a, const float *b, float *c, int64_t batch, int64_t m, int64_t n,
                      int64_t k, int trans_a, int trans_b, int64_t a_batch_stride, int64_t b_batch_stride);
void old_ttd_k_matmul(ttd_pool *pool, const float *a, const float *b, float *c, int64_t batch, int64_t m, int64_t n,
                      int64_t k, int trans_a, int trans_b, int64_t a_batch_stride, int64_t b_batch_stride);

typedef void (*matmul_fn)(ttd_pool *, const float *, const float *, float *, int64_t, int64_t, int64_t, int64_t, int,
                          int, int64_t, int64_t);

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static int trans_a, trans_b; /* AB_TRANS_A=1: A stored [K,M]; AB_TRANS_B=1: B stored [N,K] */

static double timed(matmul_fn f, ttd_pool *pool, const float *a, const float *b, float *c, int64_t m, int64_t n,
                    int64_t k, int reps) {
  double t0 = now();
  for (int i = 0; i < reps; i++) f(pool, a, b, c, 1, m, n, k, trans_a, trans_b, 0, 0);
  return now() - t0;
}

int main(int argc, char **argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: ab_matmul M N K THREADS [PAIRS]\n");
    return 2;
  }
  int64_t m = atoll(argv[1]), n = atoll(argv[2]), k = atoll(argv[3]);
  int threads = atoi(argv[4]), pairs = argc > 5 ? atoi(argv[5]) : 15;
  const char *ta = getenv("AB_TRANS_A"), *tb = getenv("AB_TRANS_B");
  trans_a = ta && strcmp(ta, "1") == 0;
  trans_b = tb && strcmp(tb, "1") == 0;
  if (m <= 0 || n <= 0 || k <= 0 || threads <= 0 || pairs <= 0 || pairs > 1000) {
    fprintf(stderr, "ab_matmul: M, N, K, THREADS and PAIRS (at most 1000) must be positive\n");
    return 2;
  }
  ttd_pool *pool = threads > 1 ? ttd_pool_create(threads) : NULL;
  float *a = malloc(sizeof(float) * (size_t)(m * k)), *b = malloc(sizeof(float) * (size_t)(k * n));
  float *c_new = malloc(sizeof(float) * (size_t)(m * n)), *c_old = malloc(sizeof(float) * (size_t)(m * n));
  double *ratio = malloc(sizeof(double) * (size_t)pairs * 3), *t_new = ratio + pairs, *t_old = t_new + pairs;
  if (!a || !b || !c_new || !c_old || !ratio) {
    fprintf(stderr, "ab_matmul: out of memory\n");
    return 1;
  }
  for (int64_t i = 0; i < m * k; i++) a[i] = (float)((i * 7) % 13) / 13.0f - 0.5f;
  for (int64_t i = 0; i < k * n; i++) b[i] = (float)((i * 5) % 11) / 11.0f - 0.5f;
  double flop = 2.0 * (double)m * (double)n * (double)k;
  int reps = flop > 4e9 ? 1 : (int)(4e9 / flop) + 1; /* about 4 GFLOP a side per pair */
  timed(new_ttd_k_matmul, pool, a, b, c_new, m, n, k, 1); /* warm both */
  timed(old_ttd_k_matmul, pool, a, b, c_old, m, n, k, 1);
  for (int p = 0; p < pairs; p++) {
    if (p % 2) {
      t_old[p] = timed(old_ttd_k_matmul, pool, a, b, c_old, m, n, k, reps);
      t_new[p] = timed(new_ttd_k_matmul, pool, a, b, c_new, m, n, k, reps);
    } else {
      t_new[p] = timed(new_ttd_k_matmul, pool, a, b, c_new, m, n, k, reps);
      t_old[p] = timed(old_ttd_k_matmul, pool, a, b, c_old, m, n, k, reps);
    }
    ratio[p] = t_new[p] / t_old[p];
  }
  int same = memcmp(c_new, c_old, sizeof(float) * (size_t)(m * n)) == 0;
  qsort(ratio, (size_t)pairs, sizeof(double), cmp);
  qsort(t_new, (size_t)pairs, sizeof(double), cmp);
  qsort(t_old, (size_t)pairs, sizeof(double), cmp);
  printf("%lld x %lld x %lld%s%s on %d thread(s): new/old time %.3f (median of %d pairs, first alternating); "
         "new %.1f, old %.1f GFLOP/s; %s\n",
         (long long)m, (long long)n, (long long)k, trans_a ? " (A transposed)" : "", trans_b ? " (B transposed)" : "",
         threads, ratio[pairs / 2], pairs, flop * reps / t_new[pairs / 2] / 1e9, flop * reps / t_old[pairs / 2] / 1e9,
         same ? "the same bits" : "RESULTS DIFFER");
  free(a), free(b), free(c_new), free(c_old), free(ratio);
  ttd_pool_destroy(pool);
  return same ? 0 : 1;
}
