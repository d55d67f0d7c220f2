/* Phase 2: clients that stop reading or sending their stream, the connection left open.
 *   unread Download, session closed  fc_stall.c: CloseSession while its Download is
 *                                    stalled on flow control; the card's bytes must come
 *                                    back at once though the stream is still open
 *   SIGSTOP mid-download / -upload   the whole client stopped inside a gRPC stream: no
 *                                    KeepAlive either, so the lease must close the session
 *                                    while the process still exists
 * In both, a socket write the client does not drain keeps the host bytes it points into
 * (gRPC 1.51 ends a write only when the peer reads or the connection goes; an idle
 * client's gRPC reads every 5 s): those show as in flight, not on the card, and must be
 * back once the client is SIGKILLed. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "faults.h"
#include "scripts/bench/bench_common.h"

/* Kills the client, then the host bytes its stalled stream pinned must come back; the note
 * says how many there were and how soon. */
static void kill_then_quiescent(faults_ctx *ctx, ft_proc *p, faults_tally *t, const char *what, uint64_t in_flight) {
  double killed_at = bench_now();
  ft_proc_destroy(p);
  double back_at = faults_check_quiescent(ctx, t->name, ctx->lease_s);
  snprintf(t->note, sizeof(t->note), "%s; %.0f MiB host bytes pinned by the stalled send until SIGKILL, back %.3f s "
           "after it", what, (double)in_flight / (1 << 20), back_at - killed_at);
}

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
    /* The close cancels the stream, which lets go of its tensor at once; its stalled send
     * may keep the host bytes. A quarter lease: the card must not wait for the client. */
    uint64_t in_flight = 0;
    double back_at = faults_check_memory(ctx, t->name, ctx->lease_s / 4, 64 << 20, &in_flight);
    t->injected = 1;
    t->in_call = 1;
    if (back_at > 0) {
      t->bytes = bytes > 0 ? (uint64_t)bytes : 0;
      t->recover_max_s = back_at - closed_at;
    }
    kill_then_quiescent(ctx, &p, t, "card's bytes back at the close", in_flight);
  }
  ft_proc_destroy(&p);
}

/* The client stopped inside a stream: its session must close at the lease, and the card's
 * bytes come back with it. A Download's message may sit in a socket write the stopped
 * client never drains: its host bytes may stay in flight until the client is SIGKILLed. */
static void stopped_in_stream(faults_ctx *ctx, const char *role, unsigned long long *rng) {
  char name[40];
  snprintf(name, sizeof(name), "SIGSTOP mid-%s", role);
  faults_tally *t = faults_tally_add(ctx, name);
  ft_proc p;
  ft_msg m;
  if (faults_spawn(ctx, &p, role, FT_VICTIM, 0, 0)) return;
  if (faults_check(ctx, ft_proc_expect(&p, FT_MSG_SESSION, &m, 120) == 1, "the %s victim did not start", role)) {
    uint64_t session = m.session, in_flight = 0;
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
      faults_check_memory(ctx, name, ctx->lease_s, !strcmp(role, "download") ? 64 << 20 : 0, &in_flight);
      t->bytes = bytes > 0 ? (uint64_t)bytes : 0;
      kill_then_quiescent(ctx, &p, t, "session closed at its lease", in_flight);
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
