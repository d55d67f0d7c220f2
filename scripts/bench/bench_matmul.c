/* bench_matmul: the card's matmul kernel (ttd_k_matmul on a ttd_pool) against OpenBLAS
 * cblas_sgemm, in GFLOP/s, C[M,N] = A[M,K] B[K,N] row-major on both sides, on one thread
 * and on every core (a pool of nproc threads; openblas_set_num_threads(nproc)).
 *   bench_matmul
 * records matmul_512_{1t,all}, matmul_64x784x512_{1t,all} (the MLP's batch-64 layer),
 * matmul_64x784x512_tb_{1t,all} (the same against B stored transposed, [512,784], as a
 * linear's forward x W^T multiplies its weight; cblas_sgemm with CblasTrans) and
 * matmul_1024_{1t,all}. Each repetition runs a shape for about 0.2 s; ours and OpenBLAS
 * alternate; results are medians. OpenBLAS is linked into this bench only.
 * Also matmul_512_bf16_1t: ttd_k_matmul_bf16 (bfloat16 inputs, float32 accumulate) against
 * ttd_k_matmul on the same values in float32, one thread, its result checked against the
 * float32 one within bfloat16's tolerance.
 *   bench_matmul --openblas-core
 * prints the core OpenBLAS chose its kernels for (OPENBLAS_CORETYPE, or its own detection),
 * for scripts/bench/bench, which corrects a detection older than the CPU. */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_common.h"
#include "dtype.h"
#include "kernels.h"

#define REP_SECONDS 0.2

typedef struct shape {
  const char *name;
  int64_t m, n, k;
  int trans_b; /* B stored [n,k] */
} shape;

typedef struct problem {
  const shape *s;
  const float *a, *b;
  float *c;
  ttd_pool *pool; /* ours; NULL means OpenBLAS */
  const uint16_t *a16, *b16; /* set: ttd_k_matmul_bf16 on these (pool NULL: one thread) */
} problem;

static void run_once(const problem *p) {
  const shape *s = p->s;
  if (p->a16) {
    ttd_k_matmul_bf16(p->pool, p->a16, p->b16, NULL, p->c, 1, s->m, s->n, s->k, 0, 0, 0, 0);
  } else if (p->pool) {
    ttd_k_matmul(p->pool, p->a, p->b, p->c, 1, s->m, s->n, s->k, 0, s->trans_b, 0, 0);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, s->trans_b ? CblasTrans : CblasNoTrans, (int)s->m, (int)s->n, (int)s->k,
                1.0f, p->a, (int)s->k, p->b, (int)(s->trans_b ? s->k : s->n), 0.0f, p->c, (int)s->n);
  }
}

/* GFLOP/s of `iters` back-to-back runs. */
static double gflops(const problem *p, int iters) {
  double t0 = bench_now();
  for (int i = 0; i < iters; i++) run_once(p);
  double t = bench_now() - t0;
  return 2.0 * (double)p->s->m * (double)p->s->n * (double)p->s->k * iters / t * 1e-9;
}

/* Iterations that take about REP_SECONDS, from a timed first run. */
static int calibrate(const problem *p) {
  double t0 = bench_now();
  run_once(p);
  double t = bench_now() - t0;
  int iters = (int)(REP_SECONDS / (t > 1e-6 ? t : 1e-6));
  return iters < 1 ? 1 : iters > 100000 ? 100000 : iters;
}

static float max_diff(const float *x, const float *y, int64_t n) {
  float d = 0;
  for (int64_t i = 0; i < n; i++) d = fmaxf(d, fabsf(x[i] - y[i]));
  return d;
}

/* matmul_512_bf16_1t: both sides get the same bfloat16 values, one as bfloat16, the other
 * widened to float32. */
static void bench_bf16(int reps, unsigned long long *rng) {
  static const shape s = {"matmul_512_bf16", 512, 512, 512, 0};
  size_t na = (size_t)(s.m * s.k), nb = (size_t)(s.k * s.n), nc = (size_t)(s.m * s.n);
  float *a = malloc(sizeof(float) * na), *b = malloc(sizeof(float) * nb);
  float *c16 = malloc(sizeof(float) * nc), *c32 = malloc(sizeof(float) * nc);
  uint16_t *a16 = malloc(sizeof(uint16_t) * na), *b16 = malloc(sizeof(uint16_t) * nb);
  if (!a || !b || !c16 || !c32 || !a16 || !b16) bench_die("allocating matrices", "out of memory");
  bench_fill_random(a, na, rng);
  bench_fill_random(b, nb, rng);
  for (size_t i = 0; i < na; i++) a[i] = ttd_f32_from_bf16(a16[i] = ttd_bf16_from_f32(a[i]));
  for (size_t i = 0; i < nb; i++) b[i] = ttd_f32_from_bf16(b16[i] = ttd_bf16_from_f32(b[i]));
  ttd_pool *pool = ttd_pool_create(1);
  if (!pool) bench_die("ttd_pool_create", "out of memory");
  problem bf = {.s = &s, .c = c16, .a16 = a16, .b16 = b16}, fp = {.s = &s, .a = a, .b = b, .c = c32, .pool = pool};
  run_once(&bf);
  run_once(&fp);
  /* Products of bfloat16 values are exact in float32: only the sums' order may differ. */
  if (!(max_diff(c16, c32, s.m * s.n) <= 1e-5f * (float)s.k)) bench_die(s.name, "the bfloat16 and float32 results disagree");
  int it_bf = calibrate(&bf), it_fp = calibrate(&fp);
  double *g = calloc((size_t)reps, sizeof(double)), *gr = calloc((size_t)reps, sizeof(double));
  for (int r = 0; r < reps; r++) {
    g[r] = gflops(&bf, it_bf);
    gr[r] = gflops(&fp, it_fp);
  }
  bench_log("matmul_512_bf16_1t takes the %s path (vdpbf16ps does %.2fx the FLOPs of float32 FMAs here)",
            ttd_k_matmul_bf16_path(), ttd_k_bf16_dot_gain());
  bench_record("matmul_512_bf16_1t", bench_median(g, reps), bench_median(gr, reps), "GFLOP/s", "higher");
  free(g), free(gr);
  ttd_pool_destroy(pool);
  free(a), free(b), free(c16), free(c32), free(a16), free(b16);
}

int main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "--openblas-core") == 0) {
    printf("%s\n", openblas_get_corename());
    return 0;
  }
  if (argc != 1) bench_die("usage", "bench_matmul [--openblas-core]");
  static const shape shapes[] = {
      {"matmul_512", 512, 512, 512, 0},
      {"matmul_64x784x512", 64, 512, 784, 0},
      {"matmul_64x784x512_tb", 64, 512, 784, 1},
      {"matmul_1024", 1024, 1024, 1024, 0},
  };
  int reps = bench_reps(9);
  int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (cores < 1) cores = 1;
  unsigned long long rng = 7;
  for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
    const shape *s = &shapes[si];
    float *a = malloc(sizeof(float) * (size_t)(s->m * s->k)), *b = malloc(sizeof(float) * (size_t)(s->k * s->n));
    float *c1 = malloc(sizeof(float) * (size_t)(s->m * s->n)), *c2 = malloc(sizeof(float) * (size_t)(s->m * s->n));
    if (!a || !b || !c1 || !c2) bench_die("allocating matrices", "out of memory");
    bench_fill_random(a, (size_t)(s->m * s->k), &rng);
    bench_fill_random(b, (size_t)(s->k * s->n), &rng);
    for (int all = 0; all <= 1; all++) {
      int threads = all ? cores : 1;
      ttd_pool *pool = ttd_pool_create(threads);
      if (!pool) bench_die("ttd_pool_create", "out of memory");
      openblas_set_num_threads(threads);
      problem ours = {.s = s, .a = a, .b = b, .c = c1, .pool = pool}, blas = {.s = s, .a = a, .b = b, .c = c2};
      run_once(&ours);
      run_once(&blas);
      float diff = max_diff(c1, c2, s->m * s->n);
      if (!(diff <= 1e-3f * (float)s->k)) bench_die(s->name, "ttd_k_matmul and cblas_sgemm disagree");
      int it_ours = calibrate(&ours), it_blas = calibrate(&blas);
      double *g = calloc((size_t)reps, sizeof(double)), *gr = calloc((size_t)reps, sizeof(double));
      double waited = 0, w;
      for (int r = 0; r < reps; r++) {
        if ((w = bench_wait_idle(getpid(), 1000)) > 0) waited += w;
        g[r] = gflops(&ours, it_ours);
        if ((w = bench_wait_idle(getpid(), 1000)) > 0) waited += w;
        gr[r] = gflops(&blas, it_blas);
      }
      if (all) bench_log("%s_all: waited %.0f ms on average for the threads to go idle", s->name, waited / (2 * reps));
      char name[64];
      snprintf(name, sizeof(name), "%s_%s", s->name, all ? "all" : "1t");
      if (!all) bench_log("%s takes the %s path", s->name, ttd_k_matmul_path(s->m, s->k, 0, s->trans_b));
      bench_record(name, bench_median(g, reps), bench_median(gr, reps), "GFLOP/s", "higher");
      free(g), free(gr);
      ttd_pool_destroy(pool);
    }
    free(a), free(b), free(c1), free(c2);
  }
  bench_bf16(reps, &rng);
  return 0;
}
