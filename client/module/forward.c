/* tt_forward: the program of the inputs' shapes (shapes.c), in the module's mode (eval, or
 * training at its next dropout step), run on "cpu" in process (local.c) or on a card as one
 * Execute call. An Execute carries, before its forward, the Backward tt_backward left waiting
 * on the module (with the work queued before it) and the work queued since; small deferred
 * inputs travel inside it and small outputs come back inside its answer. */
#include <stdlib.h>
#include <string.h>

#include "module/module.h"

static bool same_place(const tt_place *a, const tt_place *b) {
  return a->is_host == b->is_host && (a->is_host || a->device == b->device);
}

static tt_status check_inputs(tt_module *m, tt_tensor *const *inputs, int n_inputs) {
  if (n_inputs != m->local->n_inputs) {
    return tt_client_fail(m->client, TT_INVALID_ARGUMENT, "the module takes %d inputs, got %d", m->local->n_inputs, n_inputs);
  }
  for (int i = 0; i < n_inputs; i++) {
    if (!inputs[i] || !same_place(&inputs[i]->place, &m->place)) {
      return tt_client_fail(m->client, TT_INVALID_ARGUMENT, "input %d ('%s') is on %s but the module is on %s; tt_to() it first",
                            i, m->local->values[i].name, inputs[i] ? inputs[i]->device_name : "(null)", m->device_name);
    }
  }
  return TT_OK;
}

/* Bytes of all of program's outputs. */
static uint64_t outputs_nbytes(const ttd_program *p) {
  uint64_t total = 0;
  for (int o = 0; o < p->n_outputs; o++) {
    const ttd_value_type *t = &p->values[p->outputs[o]].type;
    total += (uint64_t)ttd_kshape_numel(&t->shape) * ttd_dtype_size(t->dtype);
  }
  return total;
}

/* One Execute request and the storage it points into. */
typedef struct execute_call {
  Ttd__V1__ExecuteRequest req;
  uint64_t *in, *par;                /* input and parameter handles (0: input i is inline) */
  tt_inline_wire *wires;             /* the inline inputs, in order */
  Ttd__V1__InlineTensor **wire_ptrs;
  tt_param_work work;                /* the work queued since the waiting Backward */
  tt_run_ref *waiting;               /* the run whose Backward rides along (one reference), or NULL */
  tt_backward_call carried;
} execute_call;

static void execute_call_free(execute_call *x) {
  tt_param_work_clear(&x->work);
  free(x->in);
  free(x->par);
  free(x->wires);
  free(x->wire_ptrs);
}

/* Execute's inputs: handles, or deferred tensors sent inline (uploaded instead when together
 * they would pass the inline limit). */
static tt_status execute_inputs(execute_call *x, tt_tensor *const *inputs, int n) {
  Ttd__V1__ExecuteRequest *req = &x->req;
  req->n_inline_inputs = 0;
  uint64_t inline_bytes = 0;
  for (int i = 0; i < n; i++) {
    if (!inputs[i]->handle) inline_bytes += inputs[i]->nbytes;
  }
  for (int i = 0; i < n; i++) {
    tt_tensor *t = inputs[i];
    TT_RETURN_IF_FAILED(tt_to_flush_pending(t)); /* a module's parameter or .grad: its queued work first */
    if (!t->handle && inline_bytes > TTD_INLINE_MAX_BYTES) TT_RETURN_IF_FAILED(tt_tensor_materialize(t));
    x->in[i] = t->handle;
    if (x->in[i]) continue;
    size_t k = req->n_inline_inputs++;
    tt_inline_fill(&x->wires[k], t);
    x->wire_ptrs[k] = &x->wires[k].wire;
  }
  return TT_OK;
}

/* Makes the Execute of program p of m on inputs, with what is queued on m riding along: the
 * previous step's Backward (run first, with what was queued before it), then the work queued
 * since (the step), then this forward, in m's mode (which takes a dropout step). */
static tt_status execute_prepare(tt_module *m, const tt_module_program *p, tt_tensor *const *inputs, int n_inputs,
                                 execute_call *x) {
  memset(x, 0, sizeof(*x));
  ttd__v1__execute_request__init(&x->req);
  size_t n = (size_t)n_inputs + 1;
  x->in = calloc(n, sizeof(uint64_t));
  x->par = calloc((size_t)m->n_params + 1, sizeof(uint64_t));
  x->wires = calloc(n, sizeof(*x->wires));
  x->wire_ptrs = calloc(n, sizeof(*x->wire_ptrs));
  if (!x->in || !x->par || !x->wires || !x->wire_ptrs) {
    return tt_client_fail(m->client, TT_RESOURCE_EXHAUSTED, "out of host memory");
  }
  TT_RETURN_IF_FAILED(execute_inputs(x, inputs, n_inputs));
  tt_queued_work before;
  x->waiting = tt_module_take_waiting_backward(m, &before);
  if (x->waiting) {
    x->req.backward = &x->carried.req;
    TT_RETURN_IF_FAILED(tt_backward_call_begin(x->waiting, &x->carried));
    TT_RETURN_IF_FAILED(tt_param_work_build(m, before, &x->carried.before, &x->carried.req.before));
  }
  if (tt_inline_enabled(m->client)) TT_RETURN_IF_FAILED(tt_module_take_work(m, &x->work, &x->req.before));
  for (int i = 0; i < m->n_params; i++) x->par[i] = m->params[i]->handle;
  x->req.program = p->handle;
  x->req.inputs = x->in;
  x->req.n_inputs = (size_t)n_inputs;
  x->req.parameters = x->par;
  x->req.n_parameters = (size_t)m->n_params;
  x->req.keep_for_backward = m->training;
  x->req.inline_inputs = x->wire_ptrs;
  /* Outputs of a module in training, or trained on this card, come back as bytes only (the
   * loss runs on the CPU and backward needs the run, not them); else as handles too. */
  if (tt_inline_enabled(m->client) && outputs_nbytes(p->local) <= TTD_INLINE_MAX_BYTES) {
    x->req.output_mode = m->training || m->loop_device >= 0 ? TTD__V1__OUTPUT_MODE__OUTPUT_MODE_INLINE
                                                            : TTD__V1__OUTPUT_MODE__OUTPUT_MODE_HANDLES_AND_INLINE;
  }
  ttd_run_mode mode = tt_module_next_mode(m);
  x->req.eval = mode.eval;
  x->req.dropout_step = mode.dropout_step;
  return TT_OK;
}

/* A daemon that ignores ExecuteRequest.eval and dropout_step ran the forward in training at
 * step 0: refused when the request asked for anything else. */
static tt_status check_mode(tt_module *m, const Ttd__V1__ExecuteRequest *req, const Ttd__V1__ExecuteResponse *resp) {
  if ((!req->eval && !req->dropout_step) || resp->mode_applied) return TT_OK;
  return tt_client_fail(m->client, TT_UNIMPLEMENTED,
                        "ttd is too old for dropout modes: it ran this forward in training at dropout step 0, not %s; "
                        "upgrade ttd",
                        req->eval ? "in eval mode" : "at the module's dropout step");
}

/* An answer refused here: its run is released and its outputs freed on the card. */
static void discard_answer(tt_module *m, const Ttd__V1__ExecuteResponse *resp) {
  if (resp->run) tt_run_ref_release(tt_run_ref_create(m, NULL, (int)resp->n_outputs, resp->run, NULL));
  uint64_t *handles = calloc(resp->n_outputs + 1, sizeof(uint64_t));
  size_t n = 0;
  for (size_t o = 0; handles && o < resp->n_outputs; o++) {
    if (resp->outputs[o]->handle) handles[n++] = resp->outputs[o]->handle;
  }
  if (n) tt_rpc_free_quiet(m->client, handles, n);
  free(handles);
}

/* Ends the Backward the Execute carried, if any, as the answer (NULL: none, st says why)
 * tells; returns st, or why the answer is refused. */
static tt_status execute_end_carried(tt_module *m, execute_call *x, tt_status st,
                                     const Ttd__V1__ExecuteResponse *answered) {
  if (!x->waiting) return st;
  if (answered && !answered->backward) { /* a daemon that does not know the field ran only the forward */
    st = tt_client_fail(m->client, TT_UNIMPLEMENTED,
                        "ttd ran this Execute but not the Backward it carried (a daemon older than libttclient); "
                        "upgrade ttd, or set TTD_INLINE=0");
    answered = NULL;
  }
  st = tt_backward_call_end(x->waiting, &x->carried, st, answered ? answered->backward : NULL, true);
  tt_run_ref_release(x->waiting);
  x->waiting = NULL;
  return st;
}

/* The output tensors of an answered Execute of program, sharing its run (when kept for
 * backward), which watches the inputs that require grad. */
static tt_status take_outputs(tt_module *m, ttd_program *program, const Ttd__V1__ExecuteResponse *resp,
                              tt_tensor *const *inputs, int n_inputs, tt_tensor **outputs) {
  tt_run_ref *ref = resp->run ? tt_run_ref_create(m, program, (int)resp->n_outputs, resp->run, NULL) : NULL;
  if (resp->run && !ref) return TT_RESOURCE_EXHAUSTED;
  tt_status st = ref ? tt_run_ref_watch_inputs(ref, inputs, n_inputs) : TT_OK;
  for (size_t o = 0; o < resp->n_outputs; o++) {
    tt_tensor *t = tt_tensor_alloc(m->client);
    const Ttd__V1__TensorSpec *spec = resp->outputs[o]->spec;
    if (!t || tt_tensor_describe(m->client, t, (tt_dtype)spec->dtype, spec->shape, (int)spec->n_shape) != TT_OK) {
      tt_tensor_free(t);
      st = TT_RESOURCE_EXHAUSTED;
      continue;
    }
    t->place = m->place;
    strcpy(t->device_name, m->device_name);
    t->handle = resp->outputs[o]->handle;
    if (ref) {
      t->run = &tt_run_ref_retain(ref)->tie;
      t->output_index = (int)o;
    }
    outputs[o] = t;
    if (o < resp->n_output_data) { /* its bytes came along: tt_to(.., "cpu") needs no Download */
      if (resp->output_data[o].len != t->nbytes || !(t->host_copy = malloc(t->nbytes ? (size_t)t->nbytes : 1))) {
        st = tt_client_fail(m->client, TT_INTERNAL, "ttd returned %zu bytes for output %zu of %llu bytes",
                            resp->output_data[o].len, o, (unsigned long long)t->nbytes);
      } else {
        memcpy(t->host_copy, resp->output_data[o].data, (size_t)t->nbytes);
      }
    }
  }
  tt_run_ref_release(ref); /* the outputs hold it now */
  return st;
}

static tt_status forward_device(tt_module *m, tt_module_program *p, tt_tensor *const *inputs, int n_inputs,
                                tt_tensor **outputs) {
  TT_RETURN_IF_FAILED(tt_module_program_on_card(m, p));
  execute_call x;
  tt_status st = execute_prepare(m, p, inputs, n_inputs, &x);
  ProtobufCMessage *out = NULL;
  if (st == TT_OK) st = tt_rpc_unary(m->client, TT_RPC_EXECUTE, &x.req.base, &ttd__v1__execute_response__descriptor, &out);
  const Ttd__V1__ExecuteResponse *resp = (const Ttd__V1__ExecuteResponse *)out;
  st = execute_end_carried(m, &x, st, st == TT_OK ? resp : NULL);
  if (st == TT_OK) st = check_mode(m, &x.req, resp);
  execute_call_free(&x);
  if (st == TT_OK) {
    st = take_outputs(m, p->local, resp, inputs, n_inputs, outputs);
  } else if (resp) { /* answered, but refused here */
    discard_answer(m, resp);
  }
  if (out) protobuf_c_message_free_unpacked(out, NULL);
  return st;
}

tt_status tt_forward(tt_module *m, tt_tensor *const *inputs, int n_inputs, tt_tensor **outputs) {
  for (int o = 0; o < m->local->n_outputs; o++) outputs[o] = NULL;
  TT_RETURN_IF_FAILED(check_inputs(m, inputs, n_inputs));
  tt_module_program *p = tt_module_program_for(m, inputs, n_inputs);
  if (!p) return tt_errcode(m->client);
  tt_status st = m->place.is_host ? tt_module_forward_local(m, p, inputs, n_inputs, outputs)
                                  : forward_device(m, p, inputs, n_inputs, outputs);
  if (st != TT_OK) {
    for (int o = 0; o < m->local->n_outputs; o++) {
      tt_tensor_free(outputs[o]);
      outputs[o] = NULL;
    }
  }
  return st;
}
