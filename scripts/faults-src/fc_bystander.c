/* The bystander: trains the bench MLP throughout the faults, cycle after cycle from the same
 * initial parameters, and checks every loss bit for bit against its first cycle (run before
 * any fault). Commands: 'p' pause at a step boundary (answers PAUSED), 'r' resume, 'q' quit
 * (answers RESULT: steps, cycles, errors, wrong losses). An error is counted, reported and
 * survived: the cycle starts again. */
#include <string.h>

#include "faults.h"
#include "scripts/bench/bench_mlp.h"

#define CYCLE_STEPS 12

typedef struct bystander {
  tt_client *client;
  float reference[CYCLE_STEPS];
  double steps, cycles, errors, wrong;
  int quit;
} bystander;

/* Handles commands due at a step boundary. */
static void obey(bystander *b) {
  for (int cmd = ft_command(0); cmd != 0; cmd = ft_command(0)) {
    if (cmd == 'p') {
      ft_report(FT_MSG_PAUSED, 0, tt_session_id(b->client), NULL, NULL);
      do cmd = ft_command(3600);
      while (cmd == 'p');
    }
    if (cmd == 'q' || cmd < 0) {
      b->quit = 1;
      return;
    }
  }
}

/* One cycle from fresh parameters; record: fill the reference instead of checking it. */
static void cycle(bystander *b, int record) {
  bench_mlp *m = bench_mlp_create_on(b->client, 64);
  if (!m) {
    b->errors++;
    ft_report(FT_MSG_EVENT, tt_errcode(b->client), tt_session_id(b->client), NULL, "building the model: %s",
              tt_last_error(b->client));
    return;
  }
  for (int k = 0; k < CYCLE_STEPS && !b->quit; k++) {
    if (!record) obey(b);
    if (b->quit) break;
    float loss = 0;
    tt_status st = bench_mlp_try_step(m, &loss);
    if (st != TT_OK) {
      b->errors++;
      ft_report(FT_MSG_EVENT, st, tt_session_id(b->client), NULL, "step: %s", tt_last_error(b->client));
      break;
    }
    if (record) b->reference[k] = loss;
    else if (memcmp(&loss, &b->reference[k], sizeof(loss)) != 0) {
      b->wrong++;
      ft_report(FT_MSG_EVENT, TT_DATA_LOSS, tt_session_id(b->client), NULL,
                "cycle step %d: loss %.9g, the first cycle had %.9g", k, loss, b->reference[k]);
    }
    b->steps++;
    ft_sleep(0.002); /* leave the cores to the faults now and then */
  }
  bench_mlp_destroy(m);
  b->cycles++;
}

int fc_bystander_main(const fc_args *a) {
  bystander b = {.client = fc_connect(a, 1)};
  ft_report(FT_MSG_SESSION, 0, tt_session_id(b.client), NULL, NULL);
  cycle(&b, 1);
  if (b.errors) return 1;
  ft_report(FT_MSG_READY, 0, tt_session_id(b.client), (double[6]){b.reference[0]}, NULL);
  while (!b.quit) cycle(&b, 0);
  ft_report(FT_MSG_RESULT, 0, tt_session_id(b.client), (double[6]){b.steps, b.cycles, b.errors, b.wrong}, NULL);
  tt_disconnect(b.client);
  return 0;
}
