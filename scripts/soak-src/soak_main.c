/* ttd_soak: the soak driver behind scripts/soak (see soak.h).
 *   ttd_soak --ttd BUILD/bin/ttd --dir TMPDIR --seconds S [--clients 64] [--think-ms 10]
 *            [--rss-tolerance-mib 64] [--rss-tolerance-pct 10]
 * runs the clients for S seconds, then prints the operations, the unexpected errors, the
 * latency percentiles per operation, and the daemon's RSS after the warm-up and at the end.
 * Exits 1 on any unexpected error, a wrong result, RSS growth beyond the tolerance (RssAnon
 * less the device memory in use, which the simulated card keeps in host memory; allowed:
 * 10% of the RSS after the warm-up, at least 64 MiB), memory left on the card, or a ttd
 * that does not exit 0 on SIGTERM. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "scripts/faults-src/ft_daemon.h"
#include "scripts/faults-src/ft_metrics.h"
#include "scripts/faults-src/ft_proc.h"
#include "scripts/bench/bench_common.h"
#include "soak.h"

#define MAX_CLIENTS 256
#define MIB (1024.0 * 1024.0)

typedef struct sample {
  double t;           /* seconds since the load started */
  long rss_kib, anon_kib;
  uint64_t used;      /* device bytes in use */
} sample;

typedef struct soak {
  ft_daemon daemon;
  ft_proc clients[MAX_CLIENTS];
  int n, think_ms, failures;
  double seconds, tolerance_mib, tolerance_pct; /* growth allowed: the larger of the two */
  double ops, errors, wrong, sessions;
  long idle_kib, idle_anon_kib; /* RSS once the clients have gone */
} soak;

static int child_main(int argc, char **argv) {
  soak_client_args a = {.shm = 1};
  for (int i = 3; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--target")) a.target = argv[i + 1];
    else if (!strcmp(argv[i], "--latency")) a.latency_path = argv[i + 1];
    else if (!strcmp(argv[i], "--seed")) a.seed = strtoull(argv[i + 1], NULL, 10);
    else if (!strcmp(argv[i], "--shm")) a.shm = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--think-ms")) a.think_ms = atoi(argv[i + 1]);
  }
  return a.target && a.latency_path ? soak_client_main(&a) : 2;
}

static int check(soak *s, int ok, const char *what) {
  if (!ok) {
    printf("soak: FAIL: %s\n", what);
    s->failures++;
  }
  return ok;
}

static int spawn(soak *s, int i, const char *self) {
  char seed[16], shm[4], think[16], latency[512];
  snprintf(seed, sizeof(seed), "%d", i);
  snprintf(shm, sizeof(shm), "%d", i % 2);
  snprintf(think, sizeof(think), "%d", s->think_ms);
  snprintf(latency, sizeof(latency), "%s/lat-%d", s->daemon.dir, i);
  char *argv[] = {(char *)self, "--child", "client", "--target", s->daemon.target, "--seed", seed, "--shm", shm,
                  "--think-ms", think, "--latency", latency, NULL};
  return ft_proc_start(&s->clients[i], argv, NULL);
}

/* Prints the clients' error reports that have come in. */
static void relay_events(soak *s) {
  ft_msg m;
  for (int i = 0; i < s->n; i++) {
    while (ft_proc_recv(&s->clients[i], &m, 0) == 1) {
      if (m.kind == FT_MSG_EVENT) printf("soak:   client %d: %s\n", i, m.text);
    }
  }
}

static sample take_sample(soak *s, double t0) {
  ft_metrics m = {0};
  ft_metrics_read(s->daemon.admin_port, &m);
  return (sample){bench_now() - t0, ft_daemon_status_kib(&s->daemon, "VmRSS"),
                  ft_daemon_status_kib(&s->daemon, "RssAnon"), m.used_bytes};
}

/* RssAnon less the card's memory in use, in MiB: the daemon's own memory. */
static double own_mib(const sample *x) { return (double)x->anon_kib / 1024.0 - (double)x->used / MIB; }

/* Medians over samples [from, to): the RSS of a stretch of the run, less noisy than one
 * sample (the card's memory in use and gRPC's buffers move with the load). */
typedef struct rss_window {
  double t0, t1, rss_mib, own_mib, used_mib;
} rss_window;

static rss_window window(const sample *v, int from, int to) {
  double rss[to - from], own[to - from], used[to - from];
  for (int i = from; i < to; i++) {
    rss[i - from] = (double)v[i].rss_kib / 1024;
    own[i - from] = own_mib(&v[i]);
    used[i - from] = (double)v[i].used / MIB;
  }
  int n = to - from;
  return (rss_window){v[from].t, v[to - 1].t, bench_median(rss, n), bench_median(own, n), bench_median(used, n)};
}

/* Runs the load for s->seconds, a sample a second into out (room for s->seconds + 1);
 * returns how many were taken. */
static int run_load(soak *s, sample *out) {
  double t0 = bench_now(), report_every = s->seconds / 10 > 10 ? s->seconds / 10 : 10, next_report = report_every;
  int n = 0;
  while (bench_now() - t0 < s->seconds && n <= (int)s->seconds) {
    ft_sleep(1.0);
    relay_events(s);
    sample x = take_sample(s, t0);
    if (!check(s, ft_daemon_alive(&s->daemon), "ttd died under load")) break;
    out[n++] = x;
    if (x.t >= next_report) {
      printf("soak: %4.0f s: ttd RSS %.0f MiB (shared %.0f), card memory in use %.0f MiB, RssAnon less it %.0f MiB\n",
             x.t, (double)x.rss_kib / 1024, (double)ft_daemon_status_kib(&s->daemon, "RssShmem") / 1024,
             (double)x.used / MIB, own_mib(&x));
      next_report += report_every;
    }
  }
  return n;
}

/* Stops the clients and adds up their figures. */
static void stop_clients(soak *s) {
  for (int i = 0; i < s->n; i++) ft_proc_send(&s->clients[i], 'q');
  for (int i = 0; i < s->n; i++) {
    ft_msg m;
    int got = ft_proc_expect(&s->clients[i], FT_MSG_RESULT, &m, 120) == 1 && m.code == 0;
    if (!check(s, got, "a client did not finish (no figures or no latency file)")) continue;
    s->ops += m.value[SOAK_R_OPS];
    s->errors += m.value[SOAK_R_ERRORS];
    s->wrong += m.value[SOAK_R_WRONG];
    s->sessions += m.value[SOAK_R_SESSIONS];
    check(s, ft_proc_wait(&s->clients[i], 60) == 0 && s->clients[i].status == 0, "a client did not exit 0");
  }
}

/* Once every client has gone: no session and no device memory left; then SIGTERM must end
 * ttd with status 0. Notes the idle RSS. */
static void stop_daemon(soak *s) {
  ft_metrics m = {0};
  double until = bench_now() + 30;
  while ((ft_metrics_read(s->daemon.admin_port, &m) != 0 || m.sessions || m.used_bytes) && bench_now() < until) {
    ft_sleep(0.05);
  }
  s->idle_kib = ft_daemon_status_kib(&s->daemon, "VmRSS");
  s->idle_anon_kib = ft_daemon_status_kib(&s->daemon, "RssAnon");
  check(s, m.sessions == 0 && m.used_bytes == 0, "sessions or device memory left after every client closed");
  int stopped = ft_daemon_stop(&s->daemon, SIGTERM, 30) == 0;
  check(s, stopped && WIFEXITED(s->daemon.status) && WEXITSTATUS(s->daemon.status) == 0,
        "ttd did not exit 0 on SIGTERM");
}

/* The RSS after the warm-up against the end. ttd keeps freed memory in glibc's arenas
 * (M_MMAP_THRESHOLD 64 MiB, M_TRIM_THRESHOLD 256 MiB: big buffers are reused, not returned),
 * and the arenas take about a minute of this load to reach its working set; so the warm-up
 * is half the run, at least 60 s, and then a tenth of the run (at least 5 samples) right
 * after it and at the end are compared. */
static void check_rss(soak *s, const sample *samples, int taken) {
  int warm = (int)(s->seconds / 2 > 60 ? s->seconds / 2 : 60), span = (int)(s->seconds / 10 > 5 ? s->seconds / 10 : 5);
  if (!check(s, taken >= warm + 2 * span, "the run is too short to compare the RSS after the warm-up with the end "
             "(give 80 seconds or more)")) {
    warm = 0, span = taken / 2 > 0 ? taken / 2 : 1;
  }
  if (taken < 2) return;
  rss_window start = window(samples, warm, warm + span), end = window(samples, taken - span, taken);
  double growth = end.own_mib - start.own_mib, max_rss = 0;
  double tolerance = fmax(s->tolerance_mib, s->tolerance_pct / 100 * start.rss_mib);
  for (int i = warm; i < taken; i++) max_rss = fmax(max_rss, (double)samples[i].rss_kib / 1024);
  check(s, growth <= tolerance, "the daemon's own memory grew beyond the tolerance");
  printf("soak: ttd VmRSS (medians) %.0f MiB at %.0f-%.0f s after the warm-up, %.0f MiB at %.0f-%.0f s, the end "
         "(max %.0f MiB); %.0f MiB idle after the clients left (RssAnon %.0f MiB)\n", start.rss_mib, start.t0,
         start.t1, end.rss_mib, end.t0, end.t1, max_rss, (double)s->idle_kib / 1024, (double)s->idle_anon_kib / 1024);
  printf("soak: card memory in use then %.0f and %.0f MiB; RssAnon less it %.0f -> %.0f MiB: growth %+.1f MiB "
         "(tolerance %.0f MiB: %.0f%% of the RSS after the warm-up, at least %.0f)\n", start.used_mib, end.used_mib,
         start.own_mib, end.own_mib, growth, tolerance, s->tolerance_pct, s->tolerance_mib);
}

static void print_latency(const soak_latency *l) {
  printf("soak: %-14s %9s %10s %10s %10s\n", "operation", "count", "p50 ms", "p99 ms", "max ms");
  for (int i = 0; i <= SOAK_OPS; i++) {
    printf("soak: %-14s %9ld %10.2f %10.2f %10.1f\n", i < SOAK_OPS ? soak_op_names[i] : "all", l->count[i],
           l->p50[i] * 1e3, l->p99[i] * 1e3, l->max[i] * 1e3);
  }
}

int main(int argc, char **argv) {
  if (argc >= 3 && !strcmp(argv[1], "--child")) return child_main(argc, argv);
  static soak s = {.n = 64, .think_ms = 10, .tolerance_mib = 64, .tolerance_pct = 10};
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--ttd")) s.daemon.bin = argv[i + 1];
    else if (!strcmp(argv[i], "--dir")) s.daemon.dir = argv[i + 1];
    else if (!strcmp(argv[i], "--seconds")) s.seconds = atof(argv[i + 1]);
    else if (!strcmp(argv[i], "--clients")) s.n = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--think-ms")) s.think_ms = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--rss-tolerance-mib")) s.tolerance_mib = atof(argv[i + 1]);
    else if (!strcmp(argv[i], "--rss-tolerance-pct")) s.tolerance_pct = atof(argv[i + 1]);
    else s.seconds = -1;
  }
  if (!s.daemon.bin || !s.daemon.dir || s.seconds <= 0 || s.n < 1 || s.n > MAX_CLIENTS || s.think_ms < 0) {
    fprintf(stderr, "usage: ttd_soak --ttd BUILD/bin/ttd --dir TMPDIR --seconds S [--clients 1..%d] [--think-ms N] "
            "[--rss-tolerance-mib M] [--rss-tolerance-pct P]\n", MAX_CLIENTS);
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *args[] = {"--log-level", "warn", NULL};
  memcpy(s.daemon.args, args, sizeof(args));
  char err[512];
  if (ft_daemon_start(&s.daemon, 30, err, sizeof(err)) != 0) bench_die("starting ttd", err);
  printf("soak: ttd (pid %d) on %s; %d clients (half on shared memory, half on gRPC streams), %.0f s, think time "
         "0-%d ms\n", (int)s.daemon.pid, s.daemon.target, s.n, s.seconds, s.think_ms);
  for (int i = 0; i < s.n; i++) {
    if (spawn(&s, i, argv[0]) != 0) bench_die("starting a client", "fork");
  }
  for (int i = 0; i < s.n; i++) {
    ft_msg m;
    if (ft_proc_expect(&s.clients[i], FT_MSG_READY, &m, 120) != 1) bench_die("starting the clients", m.text);
  }
  sample *samples = calloc((size_t)s.seconds + 2, sizeof(sample));
  if (!samples) bench_die("soak", "out of memory");
  int taken = run_load(&s, samples);
  stop_clients(&s);
  stop_daemon(&s);
  soak_latency lat;
  check(&s, soak_latency_read(s.daemon.dir, s.n, &lat) == 0, "a latency file is missing");
  check(&s, s.errors == 0, "unexpected errors");
  printf("\nsoak: %d clients for %.0f s: %.0f operations (%.0f/s), %.0f sessions opened, %.0f unexpected errors "
         "(%.0f wrong results)\n", s.n, s.seconds, s.ops, s.ops / s.seconds, s.sessions, s.errors, s.wrong);
  print_latency(&lat);
  check_rss(&s, samples, taken);
  printf("soak: %s\n", s.failures ? "FAILED" : "PASS");
  for (int i = 0; i < s.n; i++) ft_proc_destroy(&s.clients[i]);
  free(samples);
  return s.failures ? 1 : 0;
}
