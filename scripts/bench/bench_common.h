/* What every bench program shares: a monotonic clock, medians and percentiles, and the
 * result record. Each program prints its results to stdout as one JSON object per line,
 *   {"name": "...", "ours": X, "reference": Y, "unit": "...", "ratio": X/Y, "better": "higher"|"lower"}
 * and everything else (progress, errors) to stderr; scripts/bench/bench gathers the lines
 * into results.json. Not thread-safe where noted; the bench programs are single-threaded. */
#ifndef TTD_BENCH_COMMON_H
#define TTD_BENCH_COMMON_H

#include <stddef.h>

/* Seconds on CLOCK_MONOTONIC (comparable across the processes of one host). */
double bench_now(void);

/* Median of v[0..n) (n >= 1); v is left unchanged. */
double bench_median(const double *v, int n);

/* The p-th percentile (0..100, nearest rank) of v[0..n) (n >= 1); v is left unchanged. */
double bench_percentile(const double *v, int n, double p);

/* Prints one result line to stdout and flushes it. better: "higher" or "lower".
 * ratio = ours / reference (0 when reference is 0). Not thread-safe. */
void bench_record(const char *name, double ours, double reference, const char *unit, const char *better);

/* printf-style progress line to stderr, prefixed with the program name. */
void bench_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Prints "bench: <what> failed: <why>" to stderr and exits 1. */
void bench_die(const char *what, const char *why) __attribute__((noreturn));

/* The number of repetitions: $BENCH_REPS if set (1..99), else def. */
int bench_reps(int def);

/* Waits until process pid stops using the CPU: its threads together ran less than 2 % of
 * a 10 ms window (from /proc/PID/task/N/schedstat). Gives up after max_ms. Returns the ms
 * waited, or -1 if pid's threads cannot be read. One side of an alternating comparison
 * leaves threads spinning after its turn (OpenBLAS under PyTorch yields in a loop for about
 * 2^28 cycles, a pool spins briefly): measured without waiting, the other side's turn
 * shares the cores with them. */
double bench_wait_idle(int pid, double max_ms);

/* Fills n floats with uniform values in [0, 1) from a fixed-seed generator state *rng. */
void bench_fill_random(float *v, size_t n, unsigned long long *rng);

#endif
