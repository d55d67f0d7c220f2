/* Phase 5: the daemon SIGKILLed under load and started again on the same socket and state
 * folder, which resumes nothing. Each client (fc_reconnect.c) must see a clear error
 * (UNAVAILABLE, or FAILED_PRECONDITION "daemon restarted, tensors are gone" once its resume
 * is refused), get a session of the new instance, have its old handle refused as
 * FAILED_PRECONDITION "daemon restarted", and train again without an error. The driver's
 * own admin session, from the old instance, must be refused the same way. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "faults.h"
#include "scripts/bench/bench_common.h"

#define STEPS_AFTER 20

void faults_phase_restart(faults_ctx *ctx) {
  faults_tally *t = faults_tally_add(ctx, "SIGKILL ttd, restart");
  ft_proc clients[FAULTS_MAX_REPS] = {0};
  int n = ctx->restart_clients, started = 0;
  ft_msg m;
  for (; started < n; started++) {
    if (faults_spawn(ctx, &clients[started], "reconnect", FT_VICTIM, STEPS_AFTER, started % 2 == 0)) break;
  }
  for (int i = 0; i < started; i++) {
    faults_check(ctx, ft_proc_expect(&clients[i], FT_MSG_READY, &m, 120) == 1, "load client %d did not start", i);
  }
  double killed_at = bench_now();
  faults_check(ctx, ft_daemon_stop(&ctx->daemon, SIGKILL, 10) == 0, "ttd did not die of SIGKILL");
  char err[256];
  if (!faults_check(ctx, ft_daemon_start(&ctx->daemon, 30, err, sizeof(err)) == 0, "restarting ttd: %s", err)) {
    for (int i = 0; i < started; i++) ft_proc_destroy(&clients[i]);
    return;
  }
  double up_s = bench_now() - killed_at;
  t->injected = 1;
  /* The old admin session: its first call may meet the broken connection (UNAVAILABLE);
   * once its channel reaches the new daemon, a call in the session must be refused
   * precisely. */
  tt_status st;
  double until = bench_now() + 10;
  int64_t one = 1;
  do {
    tt_tensor *t = tt_tensor_empty(ctx->admin, TT_FLOAT32, &one, 1, "tt");
    st = t ? TT_OK : tt_errcode(ctx->admin);
    tt_tensor_free(t);
  } while (st == TT_UNAVAILABLE && bench_now() < until && (ft_sleep(0.05), 1));
  faults_check(ctx, st == TT_FAILED_PRECONDITION && strstr(tt_last_error(ctx->admin), "daemon restarted"),
               "the old instance's admin session: wanted FAILED_PRECONDITION 'daemon restarted', got %s: %s",
               tt_status_name(st), tt_last_error(ctx->admin));
  printf("faults:   old admin session refused: %s\n", tt_last_error(ctx->admin));
  faults_admin_connect(ctx);
  int unavailable = 0, precondition = 0, refused = 0;
  double reconnect_max = 0;
  for (int i = 0; i < started; i++) {
    if (!faults_check(ctx, ft_proc_expect(&clients[i], FT_MSG_RESULT, &m, 120) == 1, "load client %d hung", i)) continue;
    unavailable += m.code == TT_UNAVAILABLE;
    precondition += m.code == TT_FAILED_PRECONDITION;
    refused += m.value[1] == 1;
    faults_check(ctx, (m.code == TT_UNAVAILABLE || m.code == TT_FAILED_PRECONDITION) && m.text[0],
                 "load client %d: an unclear first error %s: '%s'", i, tt_status_name(m.code), m.text);
    faults_check(ctx, m.value[1] == 1 && m.value[4] == 1, "load client %d: the old instance's handle was not refused "
                 "precisely, or the new session is of the old instance", i);
    faults_check(ctx, m.value[2] == STEPS_AFTER && m.value[3] == 0, "load client %d: %g errors after reconnecting", i,
                 m.value[3]);
    printf("faults:   load client %d: first error %s: %s; new session after %.2f s\n", i, tt_status_name(m.code),
           m.text, m.value[0]);
    t->in_call++;
    reconnect_max = m.value[0] > reconnect_max ? m.value[0] : reconnect_max;
  }
  for (int i = 0; i < started; i++) {
    faults_check(ctx, ft_proc_wait(&clients[i], 30) == 0 && clients[i].status == 0, "load client %d did not exit", i);
    ft_proc_destroy(&clients[i]);
  }
  snprintf(t->note, sizeof(t->note), "%d clients: %d UNAVAILABLE, %d FAILED_PRECONDITION; old handles refused %d/%d; "
           "ttd back in %.2f s, each client in a new session within %.2f s of its error", started, unavailable,
           precondition, refused, started, up_s, reconnect_max);
  faults_check_quiescent(ctx, t->name, ctx->lease_s);
}
