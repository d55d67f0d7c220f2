/* A client that trains across a graceful restart of ttd (--state-dir): it trains the bench
 * MLP a.n steps alone first, for its reference losses, then again from the same start, and
 * stops at step FC_RESUME_PARK just before one call of the step (its role: resume-upload the
 * batch's upload, resume-forward the forward, resume-between and resume-backward the
 * backward) until the driver says 'g'; the driver stops ttd around that call. The training
 * must go on by itself (libttclient resumes the session), with no error, in the same
 * session, and with the reference's losses bit for bit. The upload and backward clients run
 * with TTD_INLINE=0, so that these are calls of their own; otherwise the batch and the
 * backward ride on the next Execute (the forward's client and the one between see that).
 * Records: BEGIN when stopped (value[0]: that call's usual seconds), BEGIN again just before
 * the call (value[0]: the moment, bench_now()), END after it (value: began, ended, answered
 * by the ttd that took it (1/0)); RESULT: code and text the first error, value = {steps,
 * errors, losses differing from the reference, longest step (s, not counting the stop), a
 * step's usual seconds, instance changed (1/0)}, session the session at the end, after one
 * more call once the driver says 'g' again (the new ttd serves). */
#include <stdlib.h>
#include <string.h>

#include "faults.h"
#include "scripts/bench/bench_common.h"
#include "scripts/bench/bench_mlp.h"

#define MAX_STEPS 64

typedef struct resume_client {
  tt_client *client;
  bench_mlp_stage stage; /* the call to stop before */
  int step;              /* the step running */
  int stopped;           /* 1 once stopped and let go */
  double call_s, calls;  /* the stage's seconds, summed over the reference's calls */
  double call_began, stopped_s;
  char instance[40];
} resume_client;

static void on_stage(void *arg, bench_mlp_stage stage, int done) {
  resume_client *r = arg;
  if (stage != r->stage) return;
  if (!done && r->step == FC_RESUME_PARK && !r->stopped) {
    double at = bench_now();
    ft_report(FT_MSG_BEGIN, 0, tt_session_id(r->client), (double[6]){r->calls ? r->call_s / r->calls : 0}, NULL);
    while (ft_command(120) == 'p') continue; /* anything but 'g' ends the wait too */
    r->stopped = 1;
    snprintf(r->instance, sizeof(r->instance), "%s", tt_instance_id(r->client));
    r->call_began = bench_now();
    r->stopped_s = r->call_began - at;
    ft_report(FT_MSG_BEGIN, 0, tt_session_id(r->client), (double[6]){r->call_began}, NULL);
  } else if (!done) {
    r->call_began = bench_now();
  } else if (r->step == FC_RESUME_PARK && r->stopped == 1) {
    r->stopped = 2;
    int same = strcmp(r->instance, tt_instance_id(r->client)) == 0;
    ft_report(FT_MSG_END, 0, tt_session_id(r->client), (double[6]){r->call_began, bench_now(), same}, NULL);
  } else {
    r->call_s += bench_now() - r->call_began;
    r->calls++;
  }
}

static int compare_doubles(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int fc_resume_main(const fc_args *a) {
  static const struct {
    const char *role;
    bench_mlp_stage stage;
    int inline_calls;
  } STAGES[] = {{"resume-upload", BENCH_MLP_UPLOAD, 0},
                {"resume-forward", BENCH_MLP_FORWARD, 1},
                {"resume-between", BENCH_MLP_BACKWARD, 1},
                {"resume-backward", BENCH_MLP_BACKWARD, 0}};
  resume_client r = {0};
  for (size_t i = 0; i < sizeof(STAGES) / sizeof(STAGES[0]); i++) {
    if (strcmp(a->role, STAGES[i].role)) continue;
    r.stage = STAGES[i].stage;
    if (!STAGES[i].inline_calls) setenv("TTD_INLINE", "0", 1);
  }
  r.client = fc_connect(a, 1);
  int n = a->n > 0 && a->n <= MAX_STEPS ? a->n : MAX_STEPS;
  uint64_t session = tt_session_id(r.client);
  ft_report(FT_MSG_SESSION, 0, session, NULL, NULL);
  float reference[MAX_STEPS];
  double took[MAX_STEPS];
  bench_mlp *m = bench_mlp_create_on(r.client, 64);
  if (!m) fc_die(r.client, "setting up");
  bench_mlp_set_hook(m, on_stage, &r);
  r.step = -1; /* the reference's steps stop nowhere */
  for (int k = 0; k < n; k++) {
    double at = bench_now();
    if (bench_mlp_try_step(m, &reference[k]) != TT_OK) fc_die(r.client, "the reference run");
    took[k] = bench_now() - at;
  }
  bench_mlp_destroy(m);
  qsort(took, (size_t)n, sizeof(took[0]), compare_doubles);
  char instance[40];
  snprintf(instance, sizeof(instance), "%s", tt_instance_id(r.client));
  ft_report(FT_MSG_READY, 0, session, (double[6]){reference[0]}, NULL);

  m = bench_mlp_create_on(r.client, 64);
  if (!m) fc_die(r.client, "setting up again");
  bench_mlp_set_hook(m, on_stage, &r);
  tt_status first = TT_OK;
  char message[200] = "";
  double steps = 0, errors = 0, wrong = 0, longest = 0;
  for (r.step = 0; r.step < n; r.step++) {
    double at = bench_now();
    r.stopped_s = 0;
    float loss = 0;
    tt_status st = bench_mlp_try_step(m, &loss);
    if (st != TT_OK) {
      errors++;
      first = st;
      snprintf(message, sizeof(message), "step %d: %s", r.step, tt_last_error(r.client));
      break;
    }
    steps++;
    double step_s = bench_now() - at - r.stopped_s;
    longest = step_s > longest ? step_s : longest;
    if (memcmp(&loss, &reference[r.step], sizeof(loss)) != 0) {
      wrong++;
      ft_report(FT_MSG_EVENT, TT_DATA_LOSS, tt_session_id(r.client), NULL, "step %d: loss %.9g, alone %.9g", r.step,
                loss, reference[r.step]);
    }
  }
  /* Its steps may all have been answered while the old ttd drained: one more call once the
   * driver says the new ttd serves, so that the session is resumed (and its card bytes
   * accounted) whatever the timing. */
  while (ft_command(120) == 'p') continue;
  int64_t one = 1;
  tt_tensor *d = tt_tensor_empty(r.client, TT_FLOAT32, &one, 1, "tt"); /* an Allocate: a call of its own */
  if (!d && !errors) {
    errors++;
    first = tt_errcode(r.client);
    snprintf(message, sizeof(message), "a call after the restart: %s", tt_last_error(r.client));
  }
  tt_tensor_free(d);
  int changed = strcmp(instance, tt_instance_id(r.client)) != 0;
  ft_report(FT_MSG_RESULT, first, tt_session_id(r.client),
            (double[6]){steps, errors, wrong, longest, took[n / 2], changed}, "%s", message);
  bench_mlp_destroy(m);
  tt_disconnect(r.client);
  return 0;
}
