/* Sending what is deferred on a module of a card. tt_backward leaves its Backward waiting for
 * the module's next Execute (forward.c carries it); whatever needs its result first (reading
 * a .grad, moving the module, another Backward) sends it on its own here. Queued parameter
 * work that cannot wait for the next Execute (a parameter or a .grad is read, the module
 * moves) goes as OptimizerStep and ZeroGrad calls. */
#include <string.h>

#include "module/module.h"

tt_status tt_module_defer_backward(tt_module *m, tt_run_ref *ref) {
  while (!tt_module_try_park_backward(m, ref)) TT_RETURN_IF_FAILED(tt_module_flush_backward(m));
  return TT_OK;
}

tt_status tt_module_flush_backward(tt_module *m) {
  tt_queued_work before;
  tt_run_ref *ref = tt_module_take_waiting_backward(m, &before);
  if (!ref) return TT_OK;
  tt_backward_call bc;
  memset(&bc, 0, sizeof(bc));
  tt_status st = tt_backward_call_begin(ref, &bc);
  if (st == TT_OK) st = tt_param_work_build(m, before, &bc.before, &bc.req.before);
  st = tt_backward_call_send(ref, &bc, st);
  tt_run_ref_release(ref);
  return st;
}

void tt_module_cancel_backward(tt_module *m) {
  tt_queued_work before;
  tt_run_ref *waiting = tt_module_take_waiting_backward(m, &before);
  if (!waiting) return;
  tt_backward_call bc;
  memset(&bc, 0, sizeof(bc));
  tt_backward_call_end(waiting, &bc, TT_CANCELLED, NULL, true); /* ends the run, releasing it on the card */
  tt_run_ref_release(waiting);
}

tt_status tt_module_flush(tt_module *m) {
  TT_RETURN_IF_FAILED(tt_module_flush_backward(m));
  tt_param_work w;
  Ttd__V1__ParameterWork *work = NULL;
  TT_RETURN_IF_FAILED(tt_module_take_work(m, &w, &work));
  if (!work) return TT_OK;
  ProtobufCMessage *out = NULL;
  tt_status st = TT_OK;
  if (work->step) {
    st = tt_rpc_unary(m->client, TT_RPC_OPTIMIZER_STEP, &work->step->base, &ttd__v1__optimizer_step_response__descriptor, &out);
    if (st == TT_OK) protobuf_c_message_free_unpacked(out, NULL);
  }
  if (st == TT_OK && work->zero_grad) {
    st = tt_rpc_unary(m->client, TT_RPC_ZERO_GRAD, &work->zero_grad->base, &ttd__v1__zero_grad_response__descriptor, &out);
    if (st == TT_OK) protobuf_c_message_free_unpacked(out, NULL);
  }
  tt_param_work_clear(&w);
  return st;
}

tt_status tt_module_defer_work(tt_module *m, tt_param_op op, tt_optim_kind optim, const Ttd__V1__SgdOptions *sgd,
                               const Ttd__V1__AdamOptions *adam) {
  while (!tt_module_try_queue_work(m, op, optim, sgd, adam)) TT_RETURN_IF_FAILED(tt_module_flush(m));
  return TT_OK;
}

tt_status tt_module_flush_pending(const tt_tensor *t) {
  tt_client *c = t->client;
  if ((!t->param && !t->borrowed) || atomic_load(&c->deferred_modules) == 0) return TT_OK;
  if (t->owner) { /* its own module only: another's work (maybe another thread's, sent in its own order) leaves it be */
    tt_module *own = tt_module_find_queued(c, t->owner);
    if (!own) return TT_OK;
    tt_status st = tt_module_flush(own);
    tt_module_unref(own);
    return st;
  }
  tt_module *mods[64];
  int n = 0;
  tt_status st = TT_OK;
  do {
    n = tt_module_list_queued(c, mods, 64);
    for (int i = 0; i < n; i++) {
      tt_status one = tt_module_flush(mods[i]);
      if (st == TT_OK) st = one;
      tt_module_unref(mods[i]);
    }
  } while (n == 64);
  return st;
}
