/* ttd_faults: the fault driver behind scripts/faults (see faults.h for the phases).
 *   ttd_faults --ttd BUILD/bin/ttd --dir TMPDIR [--short] [--reps N] [--only PHASE]
 * prints a summary of the faults injected, the bytes recovered and how fast, and what the
 * bystander saw; exits 1 on any failed check. --short runs fewer victims, for CI.
 * Run as "ttd_faults --child ROLE ..." it is one of its own client processes. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "faults.h"
#include "ft_metrics.h"
#include "scripts/bench/bench_common.h"

#define LEASE "2s"
#define LEASE_S 2.0

static const struct {
  const char *role;
  int (*main)(const fc_args *a);
} ROLES[] = {
    {"bystander", fc_bystander_main}, {"upload", fc_victim_main}, {"download", fc_victim_main},
    {"execute", fc_victim_main},      {"backward", fc_victim_main}, {"stall", fc_stall_main},
    {"hog-quota", fc_hog_main},       {"hog-l1", fc_hog_main},     {"reconnect", fc_reconnect_main},
    {"resume-upload", fc_resume_main}, {"resume-forward", fc_resume_main}, {"resume-between", fc_resume_main},
    {"resume-backward", fc_resume_main},
};

static int child_main(int argc, char **argv) {
  fc_args a = {.role = argv[2], .shm = 1};
  for (int i = 3; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--target")) a.target = argv[i + 1];
    else if (!strcmp(argv[i], "--n")) a.n = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--shm")) a.shm = atoi(argv[i + 1]);
  }
  for (size_t i = 0; i < sizeof(ROLES) / sizeof(ROLES[0]); i++) {
    if (!strcmp(ROLES[i].role, a.role)) return ROLES[i].main(&a);
  }
  fprintf(stderr, "ttd_faults: unknown client role '%s'\n", a.role);
  return 2;
}

static void print_summary(faults_ctx *ctx, const double bystander[4], double took_s) {
  printf("\nfaults: %-26s %8s %8s %16s %13s %13s  %s\n", "fault", "injected", "in call", "bytes recovered",
         "fault->freed", "call->freed", "");
  int injected = 0;
  uint64_t bytes = 0;
  double after_fault = 0, after_call = 0;
  for (int i = 0; i < ctx->kinds; i++) {
    faults_tally *t = &ctx->tally[i];
    printf("faults: %-26s %8d %8d %12.1f MiB %11.2f s %11.2f s  %s\n", t->name, t->injected, t->in_call,
           (double)t->bytes / (1 << 20), t->recover_max_s, t->after_call_max_s, t->note);
    injected += t->injected;
    bytes += t->bytes;
    after_fault = t->recover_max_s > after_fault ? t->recover_max_s : after_fault;
    after_call = t->after_call_max_s > after_call ? t->after_call_max_s : after_call;
  }
  printf("faults: %d faults injected, %.1f MiB recovered; every dead client's session closed and its memory freed "
         "within %.2f s of its last call (lease %.1f s, bound %.2f s), %.2f s of the fault\n", injected,
         (double)bytes / (1 << 20), after_call, ctx->lease_s, ctx->recover_bound_s, after_fault);
  printf("faults: bystander: %.0f training steps in %.0f cycles, errors %.0f, losses differing from its first cycle "
         "%.0f\n", bystander[0], bystander[1], bystander[2], bystander[3]);
  printf("faults: %s: %d failed checks, %.0f s\n", ctx->failures ? "FAILED" : "PASS", ctx->failures, took_s);
}

/* Ends the bystander: its figures (steps, cycles, errors, wrong losses) into out. */
static void stop_bystander(faults_ctx *ctx, double out[4]) {
  ft_msg m;
  int got = ft_proc_send(&ctx->bystander, 'q') == 0 && ft_proc_expect(&ctx->bystander, FT_MSG_RESULT, &m, 120) == 1;
  if (faults_check(ctx, got, "the bystander did not report")) memcpy(out, m.value, 4 * sizeof(double));
  faults_check(ctx, ft_proc_wait(&ctx->bystander, 30) == 0 && ctx->bystander.status == 0, "the bystander did not exit");
  faults_check(ctx, got && out[2] == 0 && out[3] == 0 && out[0] > 0,
               "the bystander saw %.0f errors and %.0f wrong losses in %.0f steps", out[2], out[3], out[0]);
  ft_proc_destroy(&ctx->bystander);
}

/* Everything closed: the card empty, and ttd stops cleanly on SIGTERM. */
static void check_end(faults_ctx *ctx) {
  tt_disconnect(ctx->admin);
  ctx->admin = NULL;
  ft_metrics m = {0};
  double until = bench_now() + ctx->lease_s;
  while ((ft_metrics_read(ctx->daemon.admin_port, &m) != 0 || m.used_bytes || m.sessions) && bench_now() < until) {
    ft_sleep(0.01);
  }
  faults_check(ctx, m.used_bytes == 0 && m.sessions == 0, "at the end the card holds %llu bytes in %llu sessions",
               (unsigned long long)m.used_bytes, (unsigned long long)m.sessions);
  int stopped = ft_daemon_stop(&ctx->daemon, SIGTERM, 20) == 0;
  faults_check(ctx, stopped && WIFEXITED(ctx->daemon.status) && WEXITSTATUS(ctx->daemon.status) == 0,
               "ttd did not exit 0 on SIGTERM within 20 s (status 0x%x)", ctx->daemon.status);
}

int main(int argc, char **argv) {
  if (argc >= 3 && !strcmp(argv[1], "--child")) return child_main(argc, argv);
  static faults_ctx ctx;
  const char *dir = NULL;
  int is_short = 0;
  const char *only = NULL; /* one phase: kill, stall, exhaust, graceful or restart */
  ctx.self = argv[0];
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--short")) is_short = 1;
    else if (!strcmp(argv[i], "--ttd") && i + 1 < argc) ctx.daemon.bin = argv[++i];
    else if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) ctx.reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
    else ctx.daemon.bin = NULL, i = argc;
  }
  enum { PHASES = 5 };
  static const char *const phases[PHASES] = {"kill", "stall", "exhaust", "graceful", "restart"};
  int run[PHASES] = {1, 1, 1, 1, 1}, chosen = !only;
  for (int i = 0; only && i < PHASES; i++) chosen |= run[i] = !strcmp(only, phases[i]);
  if (!ctx.daemon.bin || !dir || ctx.reps < 0 || ctx.reps > FAULTS_MAX_REPS || !chosen) {
    fprintf(stderr, "usage: ttd_faults --ttd BUILD/bin/ttd --dir TMPDIR [--short] [--reps 1..%d] "
            "[--only kill|stall|exhaust|graceful|restart]\n", FAULTS_MAX_REPS);
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  double started = bench_now();
  ctx.reps = ctx.reps ? ctx.reps : is_short ? 2 : 6;
  ctx.restart_clients = is_short ? 2 : 4;
  ctx.resume_clients = is_short ? 4 : 8;
  ctx.lease_s = LEASE_S;
  ctx.recover_bound_s = LEASE_S * 1.25 + 0.5; /* the lease, the sweep's period (a quarter), slack */
  const ft_tenant tenants[FT_TENANTS] = {
      [FT_ADMIN] = {"admin", "admin"}, [FT_BYSTANDER] = {"bystander", ""}, [FT_VICTIM] = {"victim", ""},
      [FT_HOG] = {"hog", "quota=512M"}, [FT_GREEDY] = {"greedy", ""}};
  memcpy(ctx.tenants, tenants, sizeof(tenants));
  static char tokens[512];
  snprintf(tokens, sizeof(tokens), "%s/tokens", dir);
  if (ft_tenants_write(ctx.tenants, FT_TENANTS, tokens) != 0) bench_die("writing the tokens file", tokens);
  ctx.daemon.dir = dir;
  /* Every phase runs with saved state, as the service does: a graceful stop keeps the
   * sessions, a SIGKILL resumes nothing. */
  static char state[512];
  snprintf(state, sizeof(state), "%s/state-dir", dir);
  if (mkdir(state, 0700) != 0) bench_die("creating the state folder", state);
  ctx.state_dir = state;
  const char *args[] = {"--tokens", tokens, "--lease", LEASE, "--l1", "32M", "--drain-timeout", "5s",
                        "--state-dir", state, NULL};
  memcpy(ctx.daemon.args, args, sizeof(args));
  char err[512];
  if (ft_daemon_start(&ctx.daemon, 30, err, sizeof(err)) != 0) bench_die("starting ttd", err);
  printf("faults: ttd (pid %d) on %s, admin 127.0.0.1:%d, lease %s, L1 32 MiB, state in %s; %d victims per kind\n",
         (int)ctx.daemon.pid, ctx.daemon.target, ctx.daemon.admin_port, LEASE, state, ctx.reps);
  if (faults_admin_connect(&ctx) != 0) return 1;
  ft_msg m;
  if (faults_spawn(&ctx, &ctx.bystander, "bystander", FT_BYSTANDER, 0, 1) ||
      !faults_check(&ctx, ft_proc_expect(&ctx.bystander, FT_MSG_READY, &m, 120) == 1, "the bystander did not start")) {
    return 1;
  }
  printf("faults: bystander training (first loss %.6f)\n", m.value[0]);
  void (*const phase[PHASES])(faults_ctx *) = {faults_phase_kill, faults_phase_stall, faults_phase_exhaust,
                                                faults_phase_graceful, faults_phase_restart};
  const char *what[PHASES] = {"clients SIGKILLed inside their calls", "streams left unread, clients stopped",
                              "device memory exhausted by other tenants",
                              "ttd restarted gracefully under load: every client resumed, nothing lost",
                              "ttd SIGKILLed under load and restarted"};
  double bystander[4] = {0};
  for (int i = 0; i < PHASES; i++) {
    if (i == 4) stop_bystander(&ctx, bystander); /* the SIGKILL ends every session */
    if (!run[i]) continue;
    printf("faults: phase %d: %s\n", i + 1, what[i]);
    phase[i](&ctx);
  }
  check_end(&ctx);
  print_summary(&ctx, bystander, bench_now() - started);
  return ctx.failures ? 1 : 0;
}
