/* bench_peak: the machine's own limits, against which the kernels' lines are read. Prints
 * the CPU model and its flags of note, then records
 *   fma_peak_1t, fma_peak_all        GFLOP/s of independent float32 FMAs (the widest vector
 *                                    the CPU has: AVX-512, else AVX2 with FMA, else scalar)
 *   bf16_dot_peak_1t, bf16_dot_peak_all
 *                                    GFLOP/s of AVX-512 BF16 dot products (vdpbf16ps: a pair
 *                                    of bfloat16 products added into each float32 lane), where
 *                                    the CPU has them
 * each against fma_peak_1t, so that the ratio of an _all line is the cores' scaling and the
 * ratio of a bf16 line what bfloat16 buys over float32. Each probe keeps 16 independent
 * accumulators (more than an FMA's latency times its pipes) busy for 2 million steps (5-10 ms);
 * _all runs one thread per online core at once. Each is the best of 25 repetitions back to
 * back (0.15-0.3 s): what else runs (the ttd just started beside it, another guest on the
 * host) only ever lowers a peak, and a median of a few short runs can fall wholly inside such
 * a phase and read half of both cores' peak. (Pauses between repetitions lower it too: a vCPU
 * that halted runs slower for a while.) */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "bench_common.h"

#define ITERS 2000000L /* per repetition: 16 vector FMAs each */
#define REPS 25

typedef double (*probe_fn)(long iters); /* FLOP done */

__attribute__((target("avx512f"))) static double fma_avx512(long iters) {
  __m512 acc[16], x = _mm512_set1_ps(1.0000001f), y = _mm512_set1_ps(0.9999999f);
  for (int i = 0; i < 16; i++) acc[i] = _mm512_set1_ps((float)i);
  for (long n = 0; n < iters; n++) {
#pragma GCC unroll 16 /* the accumulators then live in registers */
    for (int i = 0; i < 16; i++) acc[i] = _mm512_fmadd_ps(acc[i], x, y);
  }
  float sink = 0;
  for (int i = 0; i < 16; i++) sink += _mm512_reduce_add_ps(acc[i]);
  __asm__ volatile("" ::"x"(sink));
  return (double)iters * 16 * 16 * 2;
}

__attribute__((target("avx2,fma"))) static double fma_avx2(long iters) {
  __m256 acc[12], x = _mm256_set1_ps(1.0000001f), y = _mm256_set1_ps(0.9999999f);
  for (int i = 0; i < 12; i++) acc[i] = _mm256_set1_ps((float)i);
  for (long n = 0; n < iters; n++) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; i++) acc[i] = _mm256_fmadd_ps(acc[i], x, y);
  }
  float out[8], sink = 0;
  for (int i = 0; i < 12; i++) {
    _mm256_storeu_ps(out, acc[i]);
    for (int k = 0; k < 8; k++) sink += out[k];
  }
  __asm__ volatile("" ::"x"(sink));
  return (double)iters * 12 * 8 * 2;
}

static double fma_scalar(long iters) {
  volatile float x = 1.0000001f, y = 0.9999999f;
  float acc[8] = {0};
  for (long n = 0; n < iters; n++) {
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) acc[i] = __builtin_fmaf(acc[i], x, y);
  }
  float sink = 0;
  for (int i = 0; i < 8; i++) sink += acc[i];
  __asm__ volatile("" ::"x"(sink));
  return (double)iters * 8 * 2;
}

__attribute__((target("avx512f,avx512bf16"))) static double bf16_dot(long iters) {
  __m512 acc[16];
  __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3f80); /* 1.0 */
  for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
  for (long n = 0; n < iters; n++) {
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  float sink = 0;
  for (int i = 0; i < 16; i++) sink += _mm512_reduce_add_ps(acc[i]);
  __asm__ volatile("" ::"x"(sink));
  return (double)iters * 16 * 32 * 2; /* 32 products a lane pair-wise: 64 FLOP an instruction */
}

typedef struct job {
  probe_fn fn;
  long iters;
  double flop, seconds;
} job;

static void *run_job(void *arg) {
  job *j = arg;
  double t0 = bench_now();
  j->flop = j->fn(j->iters);
  j->seconds = bench_now() - t0;
  return NULL;
}

/* GFLOP/s of fn on `threads` threads at once (their FLOP over the slowest one's time). */
static double gflops(probe_fn fn, int threads) {
  job jobs[256];
  pthread_t t[256];
  for (int i = 0; i < threads; i++) jobs[i] = (job){.fn = fn, .iters = ITERS};
  for (int i = 1; i < threads; i++) pthread_create(&t[i], NULL, run_job, &jobs[i]);
  run_job(&jobs[0]);
  double flop = jobs[0].flop, slowest = jobs[0].seconds;
  for (int i = 1; i < threads; i++) {
    pthread_join(t[i], NULL);
    flop += jobs[i].flop;
    slowest = jobs[i].seconds > slowest ? jobs[i].seconds : slowest;
  }
  return flop / slowest * 1e-9;
}

static double best_gflops(probe_fn fn, int threads) {
  double best = 0.0;
  gflops(fn, threads); /* warm: clocks up, pages in */
  for (int r = 0; r < REPS; r++) {
    double g = gflops(fn, threads);
    best = g > best ? g : best;
  }
  return best;
}

int main(void) {
  char model[128] = "unknown", flags[4096] = "", family[16] = "?", cpu_model[16] = "?";
  FILE *f = fopen("/proc/cpuinfo", "r");
  char line[8192];
  while (f && fgets(line, sizeof(line), f)) {
    if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
      snprintf(model, sizeof(model), "%s", strchr(line, ':') + 2);
      model[strcspn(model, "\n")] = '\0';
    } else if (!strncmp(line, "cpu family", 10) && strchr(line, ':')) {
      snprintf(family, sizeof(family), "%s", strchr(line, ':') + 2);
      family[strcspn(family, "\n")] = '\0';
    } else if (!strncmp(line, "model\t", 6) && strchr(line, ':')) {
      snprintf(cpu_model, sizeof(cpu_model), "%s", strchr(line, ':') + 2);
      cpu_model[strcspn(cpu_model, "\n")] = '\0';
    } else if (!strncmp(line, "flags", 5) && strchr(line, ':') && !flags[0]) {
      snprintf(flags, sizeof(flags), " %s", strchr(line, ':') + 2);
      flags[strcspn(flags, "\n")] = ' ';
    }
  }
  if (f) fclose(f);
  static const char *const noted[] = {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
                                      "amx_bf16"};
  char have[256] = "";
  for (size_t i = 0; i < sizeof(noted) / sizeof(noted[0]); i++) {
    char needle[32];
    snprintf(needle, sizeof(needle), " %s ", noted[i]);
    if (strstr(flags, needle)) snprintf(have + strlen(have), sizeof(have) - strlen(have), " %s", noted[i]);
  }
  int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
  cores = cores < 1 ? 1 : cores > 256 ? 256 : cores;
  __builtin_cpu_init();
  probe_fn fma = __builtin_cpu_supports("avx512f") ? fma_avx512
                 : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? fma_avx2
                                                                                   : fma_scalar;
  const char *width = fma == fma_avx512 ? "AVX-512" : fma == fma_avx2 ? "AVX2" : "scalar";
  bench_log("CPU: %s (family %s model %s), %d cores; flags of note:%s; FMA probe: %s", model, family, cpu_model, cores,
            have[0] ? have : " none", width);
  double one = best_gflops(fma, 1), all = best_gflops(fma, cores);
  bench_record("fma_peak_1t", one, one, "GFLOP/s", "higher");
  bench_record("fma_peak_all", all, one, "GFLOP/s", "higher");
  if (__builtin_cpu_supports("avx512bf16")) {
    bench_record("bf16_dot_peak_1t", best_gflops(bf16_dot, 1), one, "GFLOP/s", "higher");
    bench_record("bf16_dot_peak_all", best_gflops(bf16_dot, cores), one, "GFLOP/s", "higher");
  } else {
    bench_log("no AVX-512 BF16 on this CPU: bf16_dot_peak_* not measured");
  }
  return 0;
}
