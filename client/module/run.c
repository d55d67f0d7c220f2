/* Runs of a training forward and their Backward calls. The outputs of one training forward
 * share a run reference (tensor->run); the last one let go releases the daemon's run (or the
 * in-process one) if no Backward used it. A Backward is built from the output gradients
 * tt_backward accumulated: inline when they fit, else uploaded. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "module/module.h"

/* The shape of output i of ref's forward into shape (the program's: the input dims it ran
 * at); returns its element count, *out_ndim its dims. */
static uint64_t output_shape(const tt_run_ref *ref, int i, int64_t *shape, int *out_ndim) {
  const ttd_kshape *s = &ref->program->values[ref->program->outputs[i]].type.shape;
  memcpy(shape, s->d, sizeof(int64_t) * (size_t)s->ndim);
  *out_ndim = s->ndim;
  uint64_t numel = 1;
  for (int d = 0; d < s->ndim; d++) numel *= (uint64_t)shape[d];
  return numel;
}

static void run_done(tt_module *m) { m->pending_runs--; }

/* ReleaseRun of ref's run, quietly: a run the daemon has already dropped is NOT_FOUND. */
static void release_on_card(const tt_run_ref *ref) {
  Ttd__V1__ReleaseRunRequest req = TTD__V1__RELEASE_RUN_REQUEST__INIT;
  req.run = ref->run;
  ProtobufCMessage *out = NULL;
  char ignored[256];
  if (tt_rpc_unary_quiet(ref->client, TT_RPC_RELEASE_RUN, &req.base, &ttd__v1__release_run_response__descriptor, &out,
                         ignored, sizeof(ignored)) == TT_OK) {
    protobuf_c_message_free_unpacked(out, NULL);
  }
}

static void release_tie(tt_tensor_tie *tie) { tt_run_ref_release((tt_run_ref *)tie); }

tt_run_ref *tt_run_ref_create(tt_module *m, ttd_program *program, int n_outputs, uint64_t run, ttd_run *local_run) {
  tt_run_ref *ref = calloc(1, sizeof(*ref));
  if (ref) ref->output_grads = calloc((size_t)n_outputs + 1, sizeof(float *));
  if (!ref || !ref->output_grads) {
    free(ref);
    tt_client_fail(m->client, TT_RESOURCE_EXHAUSTED, "out of host memory");
    return NULL;
  }
  ref->tie.release = release_tie;
  atomic_init(&ref->refs, 1);
  ref->client = m->client;
  ref->module = tt_module_retain(m); /* outputs may outlive the user's module reference */
  ref->program = program ? ttd_program_retain(program) : NULL; /* m's cache may evict it meanwhile */
  ref->run = run;
  ref->local_run = local_run;
  ref->n_outputs = n_outputs;
  ref->param_version = m->param_version;
  m->pending_runs++;
  return ref;
}

void tt_run_ref_free_local(tt_run_ref *ref) {
  ttd_run_free(ref->local_run);
  ref->local_run = NULL;
  run_done(ref->module);
}

void tt_run_ref_release(tt_run_ref *ref) {
  if (!ref || atomic_fetch_sub(&ref->refs, 1) != 1) return;
  if (ref->local_run) tt_run_ref_free_local(ref);
  if (ref->run) { /* never backpropagated: free its activations on the card */
    run_done(ref->module);
    release_on_card(ref);
  }
  for (int i = 0; ref->output_grads && i < ref->n_outputs; i++) free(ref->output_grads[i]);
  free(ref->output_grads);
  tt_run_ref_unwatch_inputs(ref);
  ttd_program_release(ref->program);
  tt_module_unref(ref->module); /* its reference */
  free(ref);
}

/* The output gradients of a Backward, inline when they fit the inline limit (with the
 * module's queued parameter work riding along); else uploaded, and freed by the Backward
 * itself (its free list). With TTD_INLINE=0: uploaded as tensors, freed after the call. */
typedef struct backward_grads {
  uint64_t *handles;
  tt_tensor **uploaded; /* TTD_INLINE=0: the uploads, freed after the call */
  Ttd__V1__InlineTensor *wires;
  Ttd__V1__InlineTensor **wire_ptrs;
  Ttd__V1__TensorSpec *specs;
  int64_t (*shapes)[TT_MAX_DIMS];
  char (*devices)[16];
} backward_grads;

static void backward_grads_free(backward_grads *g, int n) {
  for (int i = 0; g->uploaded && i < n; i++) tt_tensor_free(g->uploaded[i]);
  free(g->uploaded);
  free(g->handles);
  free(g->wires);
  free(g->wire_ptrs);
  free(g->specs);
  free(g->shapes);
  free(g->devices);
}

/* The total bytes of ref's accumulated output gradients (float32). */
static uint64_t output_grad_bytes(const tt_run_ref *ref) {
  uint64_t total = 0;
  for (int i = 0; i < ref->n_outputs; i++) {
    if (!ref->output_grads[i]) continue;
    int64_t shape[TT_MAX_DIMS];
    int ndim;
    total += output_shape(ref, i, shape, &ndim) * sizeof(float);
  }
  return total;
}

/* Output gradient i (numel float32 of shape) as an inline tensor of g. */
static void fill_inline(backward_grads *g, int i, const tt_place *place, const float *grad, int ndim, uint64_t numel) {
  ttd__v1__inline_tensor__init(&g->wires[i]);
  ttd__v1__tensor_spec__init(&g->specs[i]);
  snprintf(g->devices[i], sizeof(g->devices[i]), "tt:%d", place->device);
  g->specs[i].dtype = TTD__V1__DTYPE__DTYPE_FLOAT32;
  g->specs[i].n_shape = (size_t)ndim;
  g->specs[i].shape = g->shapes[i];
  g->specs[i].device = g->devices[i];
  g->wires[i].spec = &g->specs[i];
  g->wires[i].data.data = (uint8_t *)grad;
  g->wires[i].data.len = (size_t)(numel * sizeof(float));
  g->wire_ptrs[i] = &g->wires[i];
}

static tt_status backward_grads_fill(tt_run_ref *ref, backward_grads *g, Ttd__V1__BackwardRequest *req) {
  tt_client *c = ref->client;
  size_t n = (size_t)ref->n_outputs + 1;
  g->handles = calloc(n, sizeof(*g->handles));
  g->uploaded = calloc(n, sizeof(*g->uploaded));
  g->wires = calloc(n, sizeof(*g->wires));
  g->wire_ptrs = calloc(n, sizeof(*g->wire_ptrs));
  g->specs = calloc(n, sizeof(*g->specs));
  g->shapes = calloc(n, sizeof(*g->shapes));
  g->devices = calloc(n, sizeof(*g->devices));
  if (!g->handles || !g->uploaded || !g->wires || !g->wire_ptrs || !g->specs || !g->shapes || !g->devices) {
    return tt_client_fail(c, TT_RESOURCE_EXHAUSTED, "out of host memory");
  }
  bool fast = tt_inline_enabled(c);
  bool inline_grads = fast && output_grad_bytes(ref) <= TTD_INLINE_MAX_BYTES;
  const tt_place *place = &ref->module->place;
  for (int i = 0; i < ref->n_outputs; i++) {
    if (!ref->output_grads[i]) {
      if (inline_grads) {
        ttd__v1__inline_tensor__init(&g->wires[i]);
        g->wire_ptrs[i] = &g->wires[i];
      }
      continue;
    }
    int ndim;
    uint64_t numel = output_shape(ref, i, g->shapes[i], &ndim);
    if (inline_grads) {
      fill_inline(g, i, place, ref->output_grads[i], ndim, numel);
    } else if (fast) {
      TT_RETURN_IF_FAILED(tt_upload_new(c, place, TT_FLOAT32, TT_FLOAT32, g->shapes[i], ndim, ref->output_grads[i],
                                        numel * sizeof(float), 0, &g->handles[i]));
      req->free = g->handles; /* freed by the Backward that uses them */
    } else {
      tt_tensor *host = tt_tensor_from_host(c, ref->output_grads[i], TT_FLOAT32, g->shapes[i], ndim);
      g->uploaded[i] = host ? tt_to(host, ref->module->device_name) : NULL;
      tt_tensor_free(host);
      if (!g->uploaded[i]) return tt_errcode(c);
      g->handles[i] = g->uploaded[i]->handle;
    }
  }
  if (inline_grads) {
    req->inline_output_grads = g->wire_ptrs;
    req->n_inline_output_grads = (size_t)ref->n_outputs;
  } else {
    req->output_grads = g->handles;
    req->n_output_grads = (size_t)ref->n_outputs;
    if (req->free) req->n_free = (size_t)ref->n_outputs; /* the zeros are skipped */
  }
  return TT_OK;
}

bool tt_backward_can_wait(const tt_run_ref *ref) {
  return !ref->local_run && ref->run && !ref->grad_inputs && tt_inline_enabled(ref->client) &&
         output_grad_bytes(ref) <= TTD_INLINE_MAX_BYTES;
}

tt_status tt_backward_call_begin(tt_run_ref *ref, tt_backward_call *bc) {
  tt_client *c = ref->client;
  ttd__v1__backward_request__init(&bc->req);
  bc->grads = calloc(1, sizeof(*bc->grads));
  if (!bc->grads) return tt_client_fail(c, TT_RESOURCE_EXHAUSTED, "out of host memory");
  tt_status st = backward_grads_fill(ref, bc->grads, &bc->req);
  if (st != TT_OK && bc->req.free) { /* uploads made before the failure: nothing will use them */
    uint64_t made[64];
    size_t n = 0;
    for (int i = 0; i < ref->n_outputs && n < 64; i++) {
      if (bc->grads->handles[i]) made[n++] = bc->grads->handles[i];
    }
    tt_rpc_free_quiet(c, made, n);
  }
  bc->req.run = ref->run;
  bc->req.keep_run = ref->keep;
  bc->req.input_grads = ref->grad_inputs != NULL;
  return st;
}

/* Records the parameter gradient handles a Backward returned. */
static void set_grad_handles(tt_module *m, const Ttd__V1__BackwardResponse *resp) {
  int n = (int)(resp->n_parameter_grads < 64 ? resp->n_parameter_grads : 64);
  for (int i = 0; i < n && i < m->n_params; i++) {
    uint64_t handle = resp->parameter_grads[i]->handle;
    if (handle) m->grad_handles[i] = handle;
  }
}

tt_status tt_backward_call_end(tt_run_ref *ref, tt_backward_call *bc, tt_status st, const Ttd__V1__BackwardResponse *resp,
                               bool carried) {
  tt_client *c = ref->client;
  /* The Execute may have failed before its Backward ran; a failed Backward keeping the run
   * kept it anyway. */
  if (st != TT_OK && ref->run && (carried || bc->req.keep_run)) release_on_card(ref);
  if (st != TT_OK || !bc->req.keep_run) { /* the daemon frees the activations after Backward, as torch frees the graph */
    if (ref->run) run_done(ref->module);
    ref->run = 0;
  }
  ref->backward_waiting = false;
  if (st == TT_OK && resp) {
    set_grad_handles(ref->module, resp);
    if (tt_inline_enabled(c)) tt_module_loop_enter(ref->module);
    st = tt_run_ref_take_input_grads(ref, resp);
  }
  tt_param_work_clear(&bc->before);
  if (bc->grads) backward_grads_free(bc->grads, ref->n_outputs);
  free(bc->grads);
  bc->grads = NULL;
  for (int i = 0; i < ref->n_outputs; i++) {
    free(ref->output_grads[i]);
    ref->output_grads[i] = NULL;
  }
  return st;
}

tt_status tt_release_run(tt_tensor *output) {
  if (!output) return TT_INVALID_ARGUMENT;
  const tt_tensor *o = output->run ? output : output->from_output;
  tt_run_ref *ref = o ? tt_tensor_run(o) : NULL;
  if (!ref) {
    return tt_client_fail(output->client, TT_INVALID_ARGUMENT,
                          "the tensor is neither an output of a training forward nor a download of one: it has no "
                          "run to release");
  }
  ref->keep = false;
  if (ref->backward_waiting) return TT_OK; /* the Backward waiting for the next Execute frees it */
  if (ref->local_run) tt_run_ref_free_local(ref);
  if (ref->run) {
    run_done(ref->module);
    release_on_card(ref);
    ref->run = 0;
  }
  tt_run_ref_unwatch_inputs(ref);
  return TT_OK;
}

tt_status tt_backward_call_send(tt_run_ref *ref, tt_backward_call *bc, tt_status st) {
  ProtobufCMessage *out = NULL;
  if (st == TT_OK) {
    st = tt_rpc_unary(ref->client, TT_RPC_BACKWARD, &bc->req.base, &ttd__v1__backward_response__descriptor, &out);
  }
  st = tt_backward_call_end(ref, bc, st, st == TT_OK ? (Ttd__V1__BackwardResponse *)out : NULL, false);
  if (out) protobuf_c_message_free_unpacked(out, NULL);
  return st;
}
