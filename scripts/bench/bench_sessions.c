/* bench_sessions: many training processes sharing one ttd. Each client is a forked process
 * that connects, builds the MLP (bench_mlp.h, batch 64), warms up, waits at a common start
 * line, then trains a fixed number of steps and reports its start and end times.
 *   bench_sessions --target ADDR [--clients 64] [--steps 50] [--single-steps 300]
 * records sessions_<N>: the aggregate steps/s of N clients at once (all steps over the span
 * from the first start to the last finish) against one client alone, and
 * sessions_<N>_spread: (fastest - slowest) / slowest client's steps/s in percent, against
 * the goal of 10. Medians over $BENCH_SESSION_REPS (default 5) alternating runs of each. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_common.h"
#include "bench_mlp.h"

#define WARMUP_STEPS 3

typedef struct client_result {
  double t0, t1;
  int steps;
} client_result;

static void client_main(const char *target, int steps, int ready_fd, int go_fd, int result_fd) {
  tt_connect_options o;
  tt_connect_options_init(&o);
  o.client_name = "bench_sessions";
  bench_mlp *m = bench_mlp_create(target, &o, 64);
  for (int i = 0; i < WARMUP_STEPS; i++) bench_mlp_step(m);
  char one = 1;
  if (write(ready_fd, &one, 1) != 1) _exit(1);
  close(ready_fd);
  char buf;
  while (read(go_fd, &buf, 1) < 0 && errno == EINTR) {
  } /* EOF: the parent let everyone go */
  client_result r = {.t0 = bench_now(), .steps = steps};
  for (int i = 0; i < steps; i++) bench_mlp_step(m);
  r.t1 = bench_now();
  if (write(result_fd, &r, sizeof(r)) != (ssize_t)sizeof(r)) _exit(1);
  close(result_fd);
  bench_mlp_destroy(m);
  _exit(0);
}

/* Runs n clients of `steps` steps at once; writes their results to out (n entries). */
static void run_group(const char *target, int n, int steps, client_result *out) {
  int ready[2], go[2], result[2];
  if (pipe(ready) || pipe(go) || pipe(result)) bench_die("pipe", strerror(errno));
  pid_t *pids = calloc((size_t)n, sizeof(pid_t));
  fflush(NULL);
  for (int i = 0; i < n; i++) {
    pids[i] = fork();
    if (pids[i] < 0) bench_die("fork", strerror(errno));
    if (pids[i] == 0) {
      close(ready[0]);
      close(go[1]);
      close(result[0]);
      client_main(target, steps, ready[1], go[0], result[1]);
    }
  }
  close(ready[1]);
  close(go[0]);
  close(result[1]);
  int got = 0;
  char buf[256];
  for (ssize_t r; (r = read(ready[0], buf, sizeof(buf))) != 0;)
    if (r > 0) got += (int)r;
    else if (errno != EINTR) break;
  close(ready[0]);
  if (got != n) {
    for (int i = 0; i < n; i++) kill(pids[i], SIGTERM);
    bench_die("starting the clients", "a client failed to connect or to train (see above)");
  }
  close(go[1]); /* everyone starts now */
  size_t want = sizeof(client_result) * (size_t)n, have = 0;
  for (ssize_t r; have < want && (r = read(result[0], (char *)out + have, want - have)) != 0;)
    if (r > 0) have += (size_t)r;
    else if (errno != EINTR) break;
  close(result[0]);
  int failed = have != want;
  for (int i = 0; i < n; i++) {
    int status = 0;
    waitpid(pids[i], &status, 0);
    failed |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
  }
  free(pids);
  if (failed) bench_die("the clients' training", "a client failed (see above)");
}

int main(int argc, char **argv) {
  const char *target = NULL;
  int clients = 64, steps = 50, single_steps = 300, bad = argc % 2 == 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--target")) target = argv[i + 1];
    else if (!strcmp(argv[i], "--clients")) clients = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--single-steps")) single_steps = atoi(argv[i + 1]);
    else bad = 1;
  }
  if (bad || !target || clients < 1 || steps < 1 || single_steps < 1) {
    fprintf(stderr, "usage: bench_sessions --target ADDR [--clients N] [--steps N] [--single-steps N]\n");
    return 2;
  }
  const char *s = getenv("BENCH_SESSION_REPS");
  int reps = s && atoi(s) >= 1 ? atoi(s) : 5;
  double *single = calloc((size_t)reps, sizeof(double)), *aggregate = calloc((size_t)reps, sizeof(double));
  double *spread = calloc((size_t)reps, sizeof(double));
  client_result *res = calloc((size_t)clients, sizeof(client_result));
  for (int r = 0; r < reps; r++) {
    run_group(target, 1, single_steps, res);
    single[r] = res[0].steps / (res[0].t1 - res[0].t0);
    run_group(target, clients, steps, res);
    double first = res[0].t0, last = res[0].t1, fast = 0, slow = 1e300, total = 0;
    for (int i = 0; i < clients; i++) {
      double rate = res[i].steps / (res[i].t1 - res[i].t0);
      first = res[i].t0 < first ? res[i].t0 : first;
      last = res[i].t1 > last ? res[i].t1 : last;
      fast = rate > fast ? rate : fast;
      slow = rate < slow ? rate : slow;
      total += res[i].steps;
    }
    aggregate[r] = total / (last - first);
    spread[r] = (fast - slow) / slow * 100;
    bench_log("run %d: one client %.1f steps/s; %d clients %.1f steps/s together, each %.2f..%.2f steps/s, span %.1f s",
              r + 1, single[r], clients, aggregate[r], slow, fast, last - first);
  }
  char name[64];
  snprintf(name, sizeof(name), "sessions_%d", clients);
  bench_record(name, bench_median(aggregate, reps), bench_median(single, reps), "steps/s", "higher");
  snprintf(name, sizeof(name), "sessions_%d_spread", clients);
  bench_record(name, bench_median(spread, reps), 10, "%", "lower");
  free(single), free(aggregate), free(spread), free(res);
  return 0;
}
