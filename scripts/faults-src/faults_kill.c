/* Phase 1: victims SIGKILLed inside their call, ctx->reps of each kind at once (every other
 * one on the shared-memory path). Each is killed a random 20-80% into a call, timed by the
 * call before it; its session must be gone within a lease and the card must hold exactly
 * what the remaining sessions hold. */
#include <signal.h>
#include <stdio.h>

#include "faults.h"
#include "scripts/bench/bench_common.h"

static const char *const ROLES[] = {"upload", "download", "execute", "backward"};

int faults_signal_in_call(faults_ctx *ctx, ft_proc *p, uint64_t session, int sig, unsigned long long *rng,
                          int64_t *out_bytes, double *out_at) {
  *out_bytes = 0;
  *out_at = 0;
  ft_msg m;
  while (ft_proc_recv(p, &m, 0) == 1) {
  } /* drop what it said while the others died: it may be blocked on a full pipe */
  if (ft_proc_expect(p, FT_MSG_END, &m, 120) != 1 || m.code != TT_OK) return -1;
  double duration = m.value[0];
  if (ft_proc_expect(p, FT_MSG_BEGIN, &m, 120) != 1) return -1;
  *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
  ft_sleep(duration * (0.2 + 0.6 * (double)(*rng >> 11) / 9007199254740992.0));
  *out_bytes = faults_session_bytes(ctx, session);
  ft_proc_signal(p, sig);
  *out_at = bench_now();
  int last = FT_MSG_BEGIN;
  while (ft_proc_recv(p, &m, sig == SIGKILL ? 10 : 0.2) == 1) last = m.kind; /* a stopped one says no more */
  if (sig == SIGKILL) ft_proc_wait(p, 10);
  return last == FT_MSG_BEGIN;
}

static void kill_kind(faults_ctx *ctx, const char *role, unsigned long long *rng) {
  char name[40];
  snprintf(name, sizeof(name), "SIGKILL mid-%s", role);
  faults_tally *t = faults_tally_add(ctx, name);
  int n = ctx->reps;
  ft_proc victims[FAULTS_MAX_REPS] = {0};
  uint64_t sessions[FAULTS_MAX_REPS] = {0};
  double killed_at[FAULTS_MAX_REPS] = {0};
  ft_msg m;
  int started = 0;
  for (; started < n; started++) {
    if (faults_spawn(ctx, &victims[started], role, FT_VICTIM, 0, started % 2 == 0)) break;
  }
  for (int i = 0; i < started; i++) {
    if (!faults_check(ctx, ft_proc_expect(&victims[i], FT_MSG_SESSION, &m, 120) == 1 &&
                               ft_proc_expect(&victims[i], FT_MSG_READY, &m, 120) == 1,
                      "%s victim %d did not start: %s", role, i, m.text)) {
      continue;
    }
    sessions[i] = m.session;
  }
  faults_watch *watch = faults_watch_start(ctx);
  for (int i = 0; i < started; i++) {
    if (!sessions[i]) continue;
    int64_t bytes = 0;
    int in_call = faults_signal_in_call(ctx, &victims[i], sessions[i], SIGKILL, rng, &bytes, &killed_at[i]);
    if (!faults_check(ctx, in_call >= 0, "%s victim %d never made its call", role, i)) {
      ft_proc_destroy(&victims[i]);
      continue;
    }
    t->injected++;
    t->in_call += in_call;
    t->bytes += bytes > 0 ? (uint64_t)bytes : 0;
    faults_watch_add(watch, sessions[i], killed_at[i]);
  }
  faults_watch_finish(ctx, watch, t);
  faults_check_quiescent(ctx, name, ctx->lease_s);
  for (int i = 0; i < started; i++) ft_proc_destroy(&victims[i]);
}

void faults_phase_kill(faults_ctx *ctx) {
  unsigned long long rng = 20261122;
  for (size_t k = 0; k < sizeof(ROLES) / sizeof(ROLES[0]); k++) kill_kind(ctx, ROLES[k], &rng);
}
