/* Layer client/optim: what a training loop uses on top of modules: optimizers (on the card,
 * queued on the module, or on the host), their state in checkpoints, and the progress line.
 * Calls only client/module and the layers below it. */
#ifndef TT_CLIENT_OPTIM_H
#define TT_CLIENT_OPTIM_H

#include "device/optimizer_options.h"
#include "module/module.h"

#define TT_OPTIM_BUFFERS 2 /* state buffers per parameter: SGD's momentum_buffer, Adam's exp_avg and exp_avg_sq */

struct tt_optimizer {
  tt_module *module;
  tt_optim_kind kind;
  Ttd__V1__SgdOptions sgd;          /* its arguments, as the wire takes them */
  Ttd__V1__AdamOptions adam_options;
  bool on_cpu;                      /* update on the host: gradients down, parameters back up */
  float **state[TT_OPTIM_BUFFERS];  /* host optimizer state per parameter (made on first use) */
  int64_t *steps;                   /* host steps per parameter */
  /* Where the state of its steps lives (none for plain SGD): on the host, or beside the
   * module's parameters of one generation on a card. A step elsewhere is refused. */
  bool has_state;
  bool state_on_host;
  uint64_t state_generation;
};

/* Records that o's state now lives where its steps run. */
void tt_optimizer_note_state(tt_optimizer *o);

/* "SGD", "Adam" or "AdamW": torch's class of o. */
const char *tt_optimizer_kind_name(const tt_optimizer *o);

/* The state buffers a parameter of o has once it has stepped: 2 for Adam, 1 for SGD with
 * momentum, else 0. */
int tt_optimizer_buffer_count(const tt_optimizer *o);

/* o's arguments as the backend runs them; checked, errors recorded naming who. */
tt_status tt_optimizer_call(const tt_optimizer *o, const char *who, ttd_optimizer_call *out_call);

/* Whether o's state lives on the host (the module is on "cpu", or o updates there). */
static inline bool tt_optimizer_on_host(const tt_optimizer *o) { return o->on_cpu || o->module->place.is_host; }

#endif
