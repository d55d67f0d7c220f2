/* Phase 4: device memory exhausted by one tenant while another trains. The hog tenant fills
 * its session quota with DRAM; the greedy tenant (no quota) fills the card's whole L1 and
 * asks for more DRAM than the card has. Each refusal must be RESOURCE_EXHAUSTED naming what
 * ran out; the bystander (its own tenant, DRAM) trains on meanwhile; then the hogs are
 * SIGKILLed and everything they held must come back within a lease. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "faults.h"
#include "scripts/bench/bench_common.h"

/* Reads a refusal of the hog p: RESOURCE_EXHAUSTED whose message names what. */
static double expect_refusal(faults_ctx *ctx, ft_proc *p, const char *what) {
  ft_msg m;
  int got = ft_proc_expect(p, FT_MSG_EVENT, &m, 120) == 1;
  faults_check(ctx, got && m.code == TT_RESOURCE_EXHAUSTED && strstr(m.text, what),
               "exhausting %s: wanted RESOURCE_EXHAUSTED naming %s, got code %d: %s", what, what, m.code, m.text);
  if (got) printf("faults:   %s refused: %s\n", what, m.text);
  return m.value[0];
}

void faults_phase_exhaust(faults_ctx *ctx) {
  faults_tally *t = faults_tally_add(ctx, "memory exhausted");
  ft_proc hogs[2] = {0};
  uint64_t sessions[2] = {0};
  ft_msg m;
  if (faults_spawn(ctx, &hogs[0], "hog-quota", FT_HOG, 0, 1) || faults_spawn(ctx, &hogs[1], "hog-l1", FT_GREEDY, 0, 1)) {
    return;
  }
  for (int i = 0; i < 2; i++) {
    faults_check(ctx, ft_proc_expect(&hogs[i], FT_MSG_SESSION, &m, 120) == 1, "hog %d did not start", i);
    sessions[i] = m.session;
  }
  double quota_bytes = expect_refusal(ctx, &hogs[0], "quota");
  double l1_bytes = expect_refusal(ctx, &hogs[1], "l1");
  expect_refusal(ctx, &hogs[1], "dram");
  for (int i = 0; i < 2; i++) {
    faults_check(ctx, ft_proc_expect(&hogs[i], FT_MSG_READY, &m, 120) == 1, "hog %d did not settle", i);
  }
  snprintf(t->note, sizeof(t->note), "quota full at %.0f MiB, L1 full at %.0f MiB, DRAM past the card refused",
           quota_bytes / (1 << 20), l1_bytes / (1 << 20));
  ft_sleep(ctx->lease_s); /* the bystander trains with the card's L1 and a quota full */
  for (int i = 0; i < 2; i++) {
    int64_t bytes = faults_session_bytes(ctx, sessions[i]);
    t->bytes += bytes > 0 ? (uint64_t)bytes : 0;
  }
  faults_watch *watch = faults_watch_start(ctx);
  for (int i = 0; i < 2; i++) {
    ft_proc_signal(&hogs[i], SIGKILL);
    faults_watch_add(watch, sessions[i], bench_now());
  }
  t->injected = t->in_call = 2;
  if (faults_watch_finish(ctx, watch, t) == 0) faults_check_quiescent(ctx, t->name, ctx->lease_s);
  for (int i = 0; i < 2; i++) ft_proc_destroy(&hogs[i]);
}
