/* Timing, statistics and result records for the bench programs. */
#define _GNU_SOURCE /* program_invocation_short_name */
#include "bench_common.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

double bench_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double *sorted_copy(const double *v, int n) {
  double *s = malloc(sizeof(double) * (size_t)n);
  if (!s) bench_die("sorting", "out of memory");
  memcpy(s, v, sizeof(double) * (size_t)n);
  qsort(s, (size_t)n, sizeof(double), cmp_double);
  return s;
}

double bench_median(const double *v, int n) {
  double *s = sorted_copy(v, n);
  double m = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
  free(s);
  return m;
}

double bench_percentile(const double *v, int n, double p) {
  double *s = sorted_copy(v, n);
  int rank = (int)ceil(p / 100.0 * n); /* nearest rank, 1-based */
  if (rank < 1) rank = 1;
  if (rank > n) rank = n;
  double x = s[rank - 1];
  free(s);
  return x;
}

void bench_record(const char *name, double ours, double reference, const char *unit, const char *better) {
  double ratio = reference != 0 ? ours / reference : 0;
  printf("{\"name\": \"%s\", \"ours\": %.6g, \"reference\": %.6g, \"unit\": \"%s\", \"ratio\": %.4g, \"better\": \"%s\"}\n",
         name, ours, reference, unit, ratio, better);
  fflush(stdout);
  bench_log("%-24s ours %10.4g  reference %10.4g %-8s ratio %.3f (%s is better)", name, ours, reference, unit, ratio,
            better);
}

void bench_log(const char *fmt, ...) {
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof(line), fmt, ap);
  va_end(ap);
  fprintf(stderr, "  %s: %s\n", program_invocation_short_name, line);
}

void bench_die(const char *what, const char *why) {
  fprintf(stderr, "%s: %s failed: %s\n", program_invocation_short_name, what, why);
  exit(1);
}

int bench_reps(int def) {
  const char *s = getenv("BENCH_REPS");
  int n = s ? atoi(s) : 0;
  return n >= 1 && n <= 99 ? n : def;
}

/* Nanoseconds the threads of pid have run, summed; -1 if they cannot be read. */
static double cpu_ns_of(int pid) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/task", pid);
  DIR *dir = opendir(path);
  if (!dir) return -1;
  double total = 0;
  struct dirent *e;
  while ((e = readdir(dir)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char stat_path[320];
    snprintf(stat_path, sizeof(stat_path), "/proc/%d/task/%s/schedstat", pid, e->d_name);
    FILE *f = fopen(stat_path, "r");
    double ns = 0;
    if (f && fscanf(f, "%lf", &ns) == 1) total += ns;
    if (f) fclose(f);
  }
  closedir(dir);
  return total;
}

double bench_wait_idle(int pid, double max_ms) {
  const double window_ms = 10, busy_share = 0.02;
  double start = bench_now(), before = cpu_ns_of(pid);
  if (before < 0) return -1;
  for (;;) {
    usleep((useconds_t)(window_ms * 1000));
    double after = cpu_ns_of(pid), waited = (bench_now() - start) * 1e3;
    if (after < 0) return -1;
    if (after - before < window_ms * 1e6 * busy_share || waited >= max_ms) return waited;
    before = after;
  }
}

void bench_fill_random(float *v, size_t n, unsigned long long *rng) {
  for (size_t i = 0; i < n; i++) {
    *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
    v[i] = (float)(*rng >> 40) / (float)(1ull << 24);
  }
}
