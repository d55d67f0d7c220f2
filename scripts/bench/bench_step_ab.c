/* bench_step_ab: two training steps timed in turn, for a change too small for two runs of
 * `make bench` to tell apart on a guest whose speed moves in phases of seconds. Side a and
 * side b are each a ttd (--a, --b; the same address twice compares dtypes on one daemon) and
 * a parameter dtype (--dtype-a, --dtype-b: f32 or bf16); both run the batch-N step of the
 * 784-512-10 MLP (bench_mlp_create_dtype: equal starting values). Each pair times `steps`
 * steps of each side, a first then b, then b first, alternating; it prints the median of
 * the pairs' time ratios a/b and their range.
 *
 *   build/bin/bench_step_ab --a unix:/tmp/new.sock --b unix:/tmp/old.sock --dtype-a bf16 \
 *     --dtype-b bf16 --batch 256 --steps 30 --pairs 10 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scripts/bench/bench_common.h"
#include "scripts/bench/bench_mlp.h"

static tt_dtype dtype_of(const char *name) {
  if (!strcmp(name, "f32")) return TT_FLOAT32;
  if (!strcmp(name, "bf16")) return TT_BFLOAT16;
  fprintf(stderr, "bench_step_ab: dtype '%s' is neither f32 nor bf16\n", name);
  exit(2);
}

/* Milliseconds per step over `steps` steps. */
static double timed(bench_mlp *m, int steps) {
  double t0 = bench_now();
  for (int i = 0; i < steps; i++) bench_mlp_step(m);
  return (bench_now() - t0) * 1e3 / steps;
}

int main(int argc, char **argv) {
  const char *target[2] = {NULL, NULL}, *dtype[2] = {"f32", "f32"};
  int batch = 256, steps = 30, pairs = 10, bad = argc % 2 == 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--a")) target[0] = argv[i + 1];
    else if (!strcmp(argv[i], "--b")) target[1] = argv[i + 1];
    else if (!strcmp(argv[i], "--dtype-a")) dtype[0] = argv[i + 1];
    else if (!strcmp(argv[i], "--dtype-b")) dtype[1] = argv[i + 1];
    else if (!strcmp(argv[i], "--batch")) batch = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--pairs")) pairs = atoi(argv[i + 1]);
    else bad = 1;
  }
  if (bad || !target[0] || !target[1] || batch < 1 || steps < 1 || pairs < 1) {
    fprintf(stderr, "usage: bench_step_ab --a ADDR --b ADDR [--dtype-a f32|bf16] [--dtype-b f32|bf16] [--batch N] "
                    "[--steps N] [--pairs N]\n");
    return 2;
  }
  bench_mlp *m[2];
  for (int s = 0; s < 2; s++) {
    tt_client *c = NULL;
    if (tt_connect(target[s], NULL, &c) != TT_OK) bench_die("tt_connect", tt_last_error(c));
    m[s] = bench_mlp_create_dtype(c, batch, dtype_of(dtype[s]));
    if (!m[s]) bench_die("the model", tt_last_error(c));
    for (int i = 0; i < 5; i++) bench_mlp_step(m[s]); /* warm */
  }
  double *ratio = calloc((size_t)pairs, sizeof(double)), lo = 0, hi = 0;
  if (!ratio) bench_die("calloc", "out of memory");
  for (int p = 0; p < pairs; p++) {
    double ms[2];
    int first = p % 2; /* a first, then b first */
    ms[first] = timed(m[first], steps);
    ms[!first] = timed(m[!first], steps);
    ratio[p] = ms[0] / ms[1];
    if (!p || ratio[p] < lo) lo = ratio[p];
    if (!p || ratio[p] > hi) hi = ratio[p];
  }
  printf("batch %d, %s on %s against %s on %s: a/b time %.3f (median of %d pairs of %d steps; range %.3f-%.3f)\n",
         batch, dtype[0], target[0], dtype[1], target[1], bench_median(ratio, pairs), pairs, steps, lo, hi);
  free(ratio);
  return 0;
}
