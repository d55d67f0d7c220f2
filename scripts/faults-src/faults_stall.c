/* Phase 2: clients that stop reading or sending their stream, the connection left open.
 *   unread Download, session closed  fc_stall.c: CloseSession while its Download is
 *                                    stalled on flow control; the bytes must come back
 *                                    though the stream is still open: at once, or when
 *                                    gRPC next runs that connection (see below)
 *   SIGSTOP mid-download / -upload   the whole client stopped inside a gRPC stream: no
 *                                    KeepAlive either, so the lease must close the session
 *                                    while the process still exists (see stopped_in_stream
 *                                    for the one tensor a stalled socket write may keep) */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "faults.h"
#include "scripts/bench/bench_common.h"

static void unread_download(faults_ctx *ctx) {
  faults_tally *t = faults_tally_add(ctx, "unread Download, closed");
  ft_proc p;
  ft_msg m;
  if (faults_spawn(ctx, &p, "stall", FT_VICTIM, 0, 0)) return;
  if (!faults_check(ctx, ft_proc_expect(&p, FT_MSG_SESSION, &m, 120) == 1, "the stalling client did not start")) {
    ft_proc_destroy(&p);
    return;
  }
  uint64_t session = m.session;
  if (faults_check(ctx, ft_proc_expect(&p, FT_MSG_READY, &m, 120) == 1, "the stalled Download did not start")) {
    ft_sleep(ctx->lease_s * 1.5); /* past a lease: KeepAlive must hold the session open */
    int64_t bytes = faults_session_bytes(ctx, session);
    faults_check(ctx, bytes >= (64 << 20), "a live client's session with an unread stream was closed (%lld bytes)",
                 (long long)bytes);
    double closed_at = bench_now();
    ft_proc_send(&p, 'c');
    faults_check(ctx, ft_proc_expect(&p, FT_MSG_EVENT, &m, 60) == 1 && !strcmp(m.text, "closed"),
                 "the stalling client could not close its session");
    /* The session's close cancels the stream, but gRPC completes its pending send (and drops
     * the slices that point into the tensor) only when it next runs that connection's
     * transport: traced at once in most runs, else 2.0 s later, when the stalled client's
     * gRPC read again (it reads every 2 s while its stream is not polled). Two leases. */
    double back_at = faults_check_quiescent(ctx, t->name, 2 * ctx->lease_s);
    t->injected = 1;
    t->in_call = 1;
    if (back_at > 0) {
      t->bytes = bytes > 0 ? (uint64_t)bytes : 0;
      t->recover_max_s = back_at - closed_at;
    }
  }
  ft_proc_destroy(&p);
}

/* The client stopped inside a stream: its session must close at the lease. A Download's
 * last message may sit in a socket write the stopped client never drains, and gRPC keeps
 * the tensor it points into until the connection closes: that much may stay; everything
 * must be back once the client is SIGKILLed. */
static void stopped_in_stream(faults_ctx *ctx, const char *role, unsigned long long *rng) {
  char name[40];
  snprintf(name, sizeof(name), "SIGSTOP mid-%s", role);
  faults_tally *t = faults_tally_add(ctx, name);
  ft_proc p;
  ft_msg m;
  if (faults_spawn(ctx, &p, role, FT_VICTIM, 0, 0)) return;
  if (faults_check(ctx, ft_proc_expect(&p, FT_MSG_SESSION, &m, 120) == 1, "the %s victim did not start", role)) {
    uint64_t session = m.session, excess = 0;
    int64_t bytes = 0;
    double stopped_at = 0;
    faults_watch *watch = faults_watch_start(ctx);
    int in_call = faults_signal_in_call(ctx, &p, session, SIGSTOP, rng, &bytes, &stopped_at);
    if (in_call < 0) ft_proc_destroy(&p), stopped_at = bench_now(); /* its session goes at the lease */
    faults_watch_add(watch, session, stopped_at);
    faults_watch_finish(ctx, watch, t);
    if (faults_check(ctx, in_call >= 0, "the %s victim never made its call", role)) {
      t->injected = 1;
      t->in_call = in_call;
      faults_check_memory(ctx, name, ctx->lease_s, !strcmp(role, "download") ? 64 << 20 : 0, &excess);
      double killed_at = bench_now();
      ft_proc_destroy(&p);
      double back_at = faults_check_quiescent(ctx, name, ctx->lease_s);
      if (back_at > 0) t->bytes = bytes > 0 ? (uint64_t)bytes : 0;
      snprintf(t->note, sizeof(t->note), "session closed at its lease; %.0f MiB held by the stopped stream "
               "until SIGKILL, back %.3f s after it", (double)excess / (1 << 20), back_at - killed_at);
    }
  }
  ft_proc_destroy(&p);
}

void faults_phase_stall(faults_ctx *ctx) {
  unsigned long long rng = 7;
  unread_download(ctx);
  stopped_in_stream(ctx, "download", &rng);
  stopped_in_stream(ctx, "upload", &rng);
}
