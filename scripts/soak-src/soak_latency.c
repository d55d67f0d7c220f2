/* The clients' latency files, gathered into percentiles per operation. */
#include <stdio.h>
#include <stdlib.h>

#include "scripts/bench/bench_common.h"
#include "soak.h"

/* Appends the samples of one file to per-operation arrays. */
static int read_file(const char *path, double **values, long *counts, long *capacity) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  soak_sample s;
  while (fread(&s, sizeof(s), 1, f) == 1) {
    if (s.op < 0 || s.op >= SOAK_OPS) continue;
    for (int k = 0; k < 2; k++) {
      int i = k ? SOAK_OPS : s.op;
      if (counts[i] == capacity[i]) {
        capacity[i] = capacity[i] ? 2 * capacity[i] : 4096;
        values[i] = realloc(values[i], (size_t)capacity[i] * sizeof(double));
        if (!values[i]) bench_die("soak", "out of memory");
      }
      values[i][counts[i]++] = s.seconds;
    }
  }
  fclose(f);
  return 0;
}

int soak_latency_read(const char *dir, int n, soak_latency *out) {
  double *values[SOAK_OPS + 1] = {0};
  long capacity[SOAK_OPS + 1] = {0};
  int rc = 0;
  *out = (soak_latency){0};
  for (int c = 0; c < n && rc == 0; c++) {
    char path[512];
    snprintf(path, sizeof(path), "%s/lat-%d", dir, c);
    rc = read_file(path, values, out->count, capacity);
  }
  for (int i = 0; i <= SOAK_OPS; i++) {
    long m = out->count[i];
    if (m > 0) {
      out->p50[i] = bench_percentile(values[i], (int)m, 50);
      out->p99[i] = bench_percentile(values[i], (int)m, 99);
      out->max[i] = bench_percentile(values[i], (int)m, 100);
    }
    free(values[i]);
  }
  return rc;
}
