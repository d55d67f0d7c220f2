/* Modules: a compiled graph and its parameters, on "cpu" (in process, on a local simulated
 * card running the same kernels) or on a card of the daemon (Compile and Execute RPCs).
 *
 * Round trips: on a card, tt_step and tt_zero_grad are queued on the module and ride on its
 * next Execute or Backward (ParameterWork before), small inputs deferred by tt_to travel
 * inline with Execute and small outputs come back inline, and tt_backward leaves its
 * Backward (small gradients inline) for the module's next Execute, so a training step of
 * the seed flow is one call: Execute carrying the previous step's Backward and step. Its
 * errors come back from that Execute, as CUDA's come back from a later call. Anything that
 * reads a parameter or a .grad, or moves the module, sends what is queued first.
 * TTD_INLINE=0 turns all of it off. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/optimizer_options.h"
#include "device/program_run.h"
#include "client_internal.h"
#include "module_internal.h"

/* Modules with queued parameter work, of every client: a flush before a parameter or a .grad
 * is read finds them here. */
static pthread_mutex_t deferred_lock = PTHREAD_MUTEX_INITIALIZER;
static tt_module *deferred_list;

static void unqueue_locked(tt_module *m) {
  if (!m->queued) return;
  for (tt_module **at = &deferred_list; *at; at = &(*at)->next_queued) {
    if (*at == m) {
      *at = m->next_queued;
      break;
    }
  }
  m->queued = 0;
  m->next_queued = NULL;
  atomic_fetch_sub(&m->client->deferred_modules, 1);
}

static void queue_locked(tt_module *m) {
  if (m->queued) return;
  m->queued = 1;
  m->next_queued = deferred_list;
  deferred_list = m;
  atomic_fetch_add(&m->client->deferred_modules, 1);
}

static void loop_leave(tt_module *m) {
  if (m->loop_device < 0) return;
  atomic_fetch_sub(&m->client->training_loops[m->loop_device], 1);
  m->loop_device = -1;
}

void tt_module_loop_enter(tt_module *m) {
  if (m->loop_device >= 0 || !m->training || m->place.is_host || m->place.device >= TT_LOOP_DEVICES) return;
  m->loop_device = m->place.device;
  atomic_fetch_add(&m->client->training_loops[m->loop_device], 1);
}

void tt_param_work_clear(tt_param_work *w) {
  free(w->handles);
  memset(w, 0, sizeof(*w));
}

/* Points req at the optimizer's options: Adam's when adam, else SGD's. */
void tt_module_step_options(Ttd__V1__OptimizerStepRequest *req, int adam, Ttd__V1__SgdOptions *sgd,
                            Ttd__V1__AdamOptions *adam_options) {
  if (adam) {
    req->optimizer_case = TTD__V1__OPTIMIZER_STEP_REQUEST__OPTIMIZER_ADAM;
    req->adam = adam_options;
  } else {
    req->optimizer_case = TTD__V1__OPTIMIZER_STEP_REQUEST__OPTIMIZER_SGD;
    req->sgd = sgd;
  }
}

/* Whether m still has something queued: work, or a Backward waiting. Lock held. */
static void requeue_locked(tt_module *m) {
  if (m->deferred.step || m->deferred.zero || m->waiting_backward) queue_locked(m);
  else unqueue_locked(m);
}

/* Builds the ParameterWork message of d into w for m's parameters. */
static tt_status work_message(tt_module *m, deferred_work d, tt_param_work *w, Ttd__V1__ParameterWork **out_work) {
  memset(w, 0, sizeof(*w));
  *out_work = NULL;
  if (!d.step && !d.zero) return TT_OK;
  w->handles = calloc((size_t)m->n_params + 1, sizeof(uint64_t));
  if (!w->handles) return tt_client_fail(m->client, TT_RESOURCE_EXHAUSTED, "out of host memory");
  for (int i = 0; i < m->n_params; i++) w->handles[i] = m->params[i]->handle;
  ttd__v1__parameter_work__init(&w->work);
  if (d.step) {
    ttd__v1__optimizer_step_request__init(&w->step);
    w->step.parameters = w->handles;
    w->step.n_parameters = (size_t)m->n_params;
    w->adam = d.adam_options;
    w->sgd = d.sgd;
    tt_module_step_options(&w->step, d.adam, &w->sgd, &w->adam);
    w->work.step = &w->step;
  }
  if (d.zero) {
    ttd__v1__zero_grad_request__init(&w->zero);
    w->zero.parameters = w->handles;
    w->zero.n_parameters = (size_t)m->n_params;
    w->work.zero_grad = &w->zero;
  }
  *out_work = &w->work;
  return TT_OK;
}

tt_status tt_module_take_work(tt_module *m, tt_param_work *w, Ttd__V1__ParameterWork **out_work) {
  pthread_mutex_lock(&deferred_lock);
  deferred_work d = m->deferred;
  memset(&m->deferred, 0, sizeof(m->deferred));
  requeue_locked(m);
  pthread_mutex_unlock(&deferred_lock);
  return work_message(m, d, w, out_work);
}

/* Takes the Backward waiting on m (NULL: none) and the work queued before it. */
static tt_run_ref *take_waiting_backward(tt_module *m, deferred_work *before) {
  pthread_mutex_lock(&deferred_lock);
  tt_run_ref *ref = m->waiting_backward;
  *before = m->backward_before;
  m->waiting_backward = NULL;
  memset(&m->backward_before, 0, sizeof(m->backward_before));
  requeue_locked(m);
  pthread_mutex_unlock(&deferred_lock);
  return ref;
}

tt_status tt_module_defer_backward(tt_module *m, tt_run_ref *ref) {
  for (;;) {
    pthread_mutex_lock(&deferred_lock);
    if (!m->waiting_backward) {
      m->waiting_backward = tt_run_ref_retain(ref);
      ref->backward_waiting = 1;
      m->backward_before = m->deferred; /* queued before the backward: runs before it */
      memset(&m->deferred, 0, sizeof(m->deferred));
      queue_locked(m);
      pthread_mutex_unlock(&deferred_lock);
      return TT_OK;
    }
    pthread_mutex_unlock(&deferred_lock);
    TT_RETURN_IF_FAILED(tt_module_flush_backward(m));
  }
}

tt_status tt_module_flush_backward(tt_module *m) {
  deferred_work before;
  tt_run_ref *ref = take_waiting_backward(m, &before);
  if (!ref) return TT_OK;
  tt_backward_call bc;
  memset(&bc, 0, sizeof(bc));
  tt_status st = tt_backward_call_begin(ref, &bc);
  if (st == TT_OK) st = work_message(m, before, &bc.before, &bc.req.before);
  st = tt_backward_call_send(ref, &bc, st);
  tt_run_ref_release(ref);
  return st;
}

/* Sends m's waiting Backward, then its queued work as OptimizerStep and ZeroGrad calls. */
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

tt_status tt_deferred_flush_for(const tt_tensor *t) {
  tt_client *c = t->client;
  if ((!t->param && !t->borrowed) || atomic_load(&c->deferred_modules) == 0) return TT_OK;
  tt_module *mods[64];
  int n = 0;
  tt_status st = TT_OK;
  do {
    n = 0;
    pthread_mutex_lock(&deferred_lock);
    for (tt_module *m = deferred_list; m && n < 64; m = m->next_queued) {
      /* A module whose last reference is going (refs 0, about to unqueue itself) is skipped. */
      int refs = atomic_load(&m->refs);
      while (m->client == c && refs > 0 && !atomic_compare_exchange_weak(&m->refs, &refs, refs + 1)) {
      }
      if (m->client == c && refs > 0) mods[n++] = m;
    }
    pthread_mutex_unlock(&deferred_lock);
    for (int i = 0; i < n; i++) {
      tt_status one = tt_module_flush(mods[i]);
      if (st == TT_OK) st = one;
      tt_module_unref(mods[i]);
    }
  } while (n == 64);
  return st;
}

void tt_module_run_done(tt_module *m) { m->pending_runs--; }

int tt_module_output_dims(const tt_module *m, int i, int64_t *shape) {
  const ttd_kshape *s = &m->local->values[m->local->outputs[i]].type.shape;
  memcpy(shape, s->d, sizeof(int64_t) * (size_t)s->ndim);
  return s->ndim;
}

void tt_module_set_grad_handles(tt_module *m, const uint64_t *handles, int n) {
  for (int i = 0; i < n && i < m->n_params; i++) {
    if (handles[i]) m->grad_handles[i] = handles[i];
  }
}

void tt_module_train(tt_module *m, int training) { m->training = training != 0; }

/* Frees the daemon's handles of the parameters' .grad (they go with the parameters). */
static void release_grads(tt_module *m) {
  uint64_t handles[256];
  size_t n = 0;
  for (int i = 0; i < m->n_params && n < 256; i++) {
    if (m->grad_handles[i]) handles[n++] = m->grad_handles[i];
    m->grad_handles[i] = 0;
  }
  if (n == 0) return;
  Ttd__V1__FreeRequest req = TTD__V1__FREE_REQUEST__INIT;
  req.handles = handles;
  req.n_handles = n;
  ProtobufCMessage *out = NULL;
  char ignored[256];
  if (tt_rpc_unary_quiet(m->client, TT_RPC_FREE, &req.base, &ttd__v1__free_response__descriptor, &out, ignored,
                         sizeof(ignored)) == TT_OK) {
    protobuf_c_message_free_unpacked(out, NULL);
  }
}

tt_tensor *tt_param_grad(tt_module *m, const char *name) {
  if (!m->place.is_host && tt_module_flush_backward(m) != TT_OK) return NULL; /* its handle comes with the answer */
  for (int i = 0; i < m->n_params; i++) {
    if (strcmp(tt_module_param_name(m, i), name) != 0) continue;
    if (m->place.is_host && m->host_grads[i]) return tt_to(m->host_grads[i], "cpu");
    if (!m->grad_handles[i]) {
      tt_client_fail(m->client, TT_FAILED_PRECONDITION, "parameter '%s' has no gradient yet: call tt_backward first", name);
      return NULL;
    }
    tt_tensor *t = tt_tensor_alloc(m->client);
    if (!t) return NULL;
    tt_tensor_describe(m->client, t, TT_FLOAT32, m->params[i]->shape, m->params[i]->ndim);
    t->place = m->place;
    strcpy(t->device_name, m->device_name);
    t->handle = m->grad_handles[i];
    t->borrowed = 1; /* the daemon keeps .grad with the parameter: freeing this does not free it */
    return t;
  }
  tt_client_fail(m->client, TT_NOT_FOUND, "the module has no parameter '%s'", name ? name : "(null)");
  return NULL;
}


/* The process's own simulated card for modules on "cpu": capacity is host memory. */
static ttd_backend *local_card;
static pthread_once_t local_card_once = PTHREAD_ONCE_INIT;

static void local_card_create(void) {
  ttd_backend_options options = {.devices = 1, .dram_bytes = UINT64_MAX / 2, .l1_bytes = UINT64_MAX / 2, .cores = 0};
  ttd_status_t s = ttd_backend_create("sim", &options, &local_card);
  ttd_status_free(s);
}

static Ttd__V1__ValueSpec *spec_of(const tt_graph_value *v, Ttd__V1__ValueSpec *spec) {
  ttd__v1__value_spec__init(spec);
  spec->name = v->name;
  spec->dtype = (Ttd__V1__DType)v->dtype;
  spec->n_shape = (size_t)v->ndim;
  spec->shape = (int64_t *)v->shape;
  return spec;
}

/* Packs the builder's graph and unpacks it into a copy the module owns. */
static Ttd__V1__Graph *graph_copy(const tt_graph *g) {
  int n_in = 0, n_par = 0;
  for (int i = 0; i < g->n_values; i++) {
    n_in += g->values[i].kind == 0;
    n_par += g->values[i].kind == 1;
  }
  Ttd__V1__ValueSpec *specs = calloc((size_t)g->n_values + 1, sizeof(*specs));
  Ttd__V1__ValueSpec **ins = calloc((size_t)n_in + 1, sizeof(*ins)), **pars = calloc((size_t)n_par + 1, sizeof(*pars));
  char **outs = calloc((size_t)g->n_outputs + 1, sizeof(*outs));
  Ttd__V1__Graph *copy = NULL;
  if (specs && ins && pars && outs) {
    Ttd__V1__Graph graph = TTD__V1__GRAPH__INIT;
    for (int i = 0; i < g->n_values; i++) {
      if (g->values[i].kind == 0) ins[graph.n_inputs++] = spec_of(&g->values[i], &specs[i]);
      if (g->values[i].kind == 1) pars[graph.n_parameters++] = spec_of(&g->values[i], &specs[i]);
    }
    graph.inputs = ins;
    graph.parameters = pars;
    graph.n_nodes = (size_t)g->n_nodes;
    graph.nodes = g->nodes;
    for (int i = 0; i < g->n_outputs; i++) outs[i] = g->values[g->outputs[i]].name;
    graph.n_outputs = (size_t)g->n_outputs;
    graph.outputs = outs;
    size_t len = ttd__v1__graph__get_packed_size(&graph);
    unsigned char *buf = malloc(len ? len : 1);
    if (buf) {
      ttd__v1__graph__pack(&graph, buf);
      copy = ttd__v1__graph__unpack(NULL, len, buf);
      free(buf);
    }
  }
  free(specs);
  free(ins);
  free(pars);
  free(outs);
  return copy;
}

tt_module *tt_compile(tt_client *client, const tt_graph *graph) {
  if (!graph) {
    tt_client_fail(client, TT_INVALID_ARGUMENT, "tt_compile needs a graph");
    return NULL;
  }
  tt_module *m = calloc(1, sizeof(*m));
  if (!m) {
    tt_client_fail(client, TT_RESOURCE_EXHAUSTED, "out of host memory");
    return NULL;
  }
  atomic_init(&m->refs, 1);
  m->client = client;
  m->place.is_host = 1;
  m->training = 1;
  m->loop_device = -1;
  strcpy(m->device_name, "cpu");
  m->graph = graph_copy(graph);
  if (!m->graph) {
    tt_client_fail(client, TT_RESOURCE_EXHAUSTED, "out of host memory");
    tt_module_free(m);
    return NULL;
  }
  ttd_status_t s = ttd_program_compile(m->graph, &m->local);
  if (s) {
    tt_client_fail(client, (tt_status)ttd_status_code(s), "%s", ttd_status_message(s));
    ttd_status_free(s);
    tt_module_free(m);
    return NULL;
  }
  m->n_params = m->local->n_params;
  m->params = calloc((size_t)m->n_params + 1, sizeof(*m->params));
  m->grad_handles = calloc((size_t)m->n_params + 1, sizeof(uint64_t));
  m->host_grads = calloc((size_t)m->n_params + 1, sizeof(tt_tensor *));
  if (!m->params || !m->grad_handles || !m->host_grads) {
    tt_module_free(m);
    return NULL;
  }
  int p = 0;
  for (int i = 0; i < graph->n_values; i++) {
    if (graph->values[i].kind != 1) continue;
    const tt_tensor *init = graph->values[i].init;
    m->params[p] = tt_tensor_from_host(client, init->data, init->dtype, init->shape, init->ndim);
    if (!m->params[p++]) {
      tt_module_free(m);
      return NULL;
    }
    m->params[p - 1]->param = 1;
  }
  return m;
}

tt_module *tt_module_retain(tt_module *m) {
  atomic_fetch_add(&m->refs, 1);
  return m;
}

/* The user lets the module go: a Backward waiting for its next Execute will never be sent,
 * so its run is released (its reference on the module with it). */
void tt_module_free(tt_module *m) {
  if (!m) return;
  deferred_work before;
  tt_run_ref *waiting = take_waiting_backward(m, &before);
  if (waiting) {
    tt_backward_call bc;
    memset(&bc, 0, sizeof(bc));
    tt_backward_call_end(waiting, &bc, TT_CANCELLED, NULL, 1); /* ends the run, releasing it on the card */
    tt_run_ref_release(waiting);
  }
  tt_module_unref(m);
}

void tt_module_unref(tt_module *m) {
  if (!m || atomic_fetch_sub(&m->refs, 1) != 1) return;
  pthread_mutex_lock(&deferred_lock);
  unqueue_locked(m); /* queued work dies with the parameters */
  pthread_mutex_unlock(&deferred_lock);
  loop_leave(m);
  if (m->grad_handles) release_grads(m);
  for (int i = 0; m->params && i < m->n_params; i++) tt_tensor_free(m->params[i]);
  free(m->params);
  free(m->grad_handles);
  for (int i = 0; m->host_grads && i < m->n_params; i++) tt_tensor_free(m->host_grads[i]);
  free(m->host_grads);
  ttd_program_release(m->local);
  if (m->graph) ttd__v1__graph__free_unpacked(m->graph, NULL);
  free(m);
}

/* A tensor becoming one of m's parameters: on a card it needs its handle now (a deferred
 * tt_to is uploaded) and no host copy (optimizers write parameters in place). */
static tt_tensor *place_param(tt_tensor *t) {
  if (!t) return NULL;
  if (!t->place.is_host && tt_tensor_materialize(t) != TT_OK) {
    tt_tensor_free(t);
    return NULL;
  }
  if (!t->place.is_host && atomic_load(&t->refs) == 1) {
    tt_inline_host_copy_free(t);
  }
  t->param = 1;
  return t;
}

tt_status tt_module_to(tt_module *m, const char *device) {
  TT_RETURN_IF_FAILED(tt_module_flush_backward(m)); /* a waiting Backward is a pending run too */
  if (m->pending_runs > 0) {
    return tt_client_fail(m->client, TT_FAILED_PRECONDITION,
                          "the module has %d forward run(s) pending; call tt_backward on their loss or free their outputs "
                          "before moving it",
                          m->pending_runs);
  }
  tt_place place;
  if (tt_place_parse(device, &place) != 0 || place.l1) {
    return tt_client_fail(m->client, TT_INVALID_ARGUMENT, "module device '%s' is not valid; use cpu, tt or tt:N",
                          device ? device : "(null)");
  }
  TT_RETURN_IF_FAILED(tt_module_flush(m));
  tt_tensor **moved = calloc((size_t)m->n_params + 1, sizeof(*moved));
  if (!moved) return tt_client_fail(m->client, TT_RESOURCE_EXHAUSTED, "out of host memory");
  for (int i = 0; i < m->n_params; i++) {
    moved[i] = place_param(tt_to(m->params[i], device));
    if (!moved[i]) {
      for (int k = 0; k < i; k++) tt_tensor_free(moved[k]);
      free(moved);
      return tt_errcode(m->client); /* tt_to said why; the module stays where it was */
    }
  }
  for (int i = 0; i < m->n_params; i++) tt_tensor_free(m->params[i]);
  free(m->params);
  m->params = moved;
  release_grads(m); /* .grad belonged to the old tensors */
  for (int i = 0; i < m->n_params; i++) {
    tt_tensor_free(m->host_grads[i]);
    m->host_grads[i] = NULL;
  }
  loop_leave(m);
  m->place = place;
  tt_place_format(&place, m->device_name, sizeof(m->device_name));
  return TT_OK;
}

const char *tt_module_device(const tt_module *m) { return m->device_name; }
int tt_module_param_count(const tt_module *m) { return m->n_params; }

const char *tt_module_param_name(const tt_module *m, int index) {
  if (index < 0 || index >= m->n_params) return NULL;
  return m->local->values[ttd_program_param_value(m->local, index)].name;
}

tt_tensor *tt_module_param(tt_module *m, const char *name) {
  for (int i = 0; i < m->n_params; i++) {
    if (strcmp(tt_module_param_name(m, i), name) == 0) return tt_to(m->params[i], m->device_name);
  }
  tt_client_fail(m->client, TT_NOT_FOUND, "the module has no parameter '%s'", name ? name : "(null)");
  return NULL;
}

static int same_place(const tt_place *a, const tt_place *b) {
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

/* A local card tensor holding a copy of a host tensor. */
static ttd_tensor *to_local(const tt_tensor *t) {
  ttd_tensor_spec spec = {.dtype = (ttd_dtype)t->dtype, .ndim = t->ndim, .location = TTD_MEM_DRAM};
  memcpy(spec.shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
  ttd_tensor *out = NULL;
  ttd_status_t s = ttd_tensor_spec_finish(&spec);
  if (!s) s = ttd_tensor_create(local_card, NULL, &spec, &out);
  if (!s) s = local_card->vtable->buffer_write(local_card, out->buffer, 0, t->data, t->nbytes);
  if (s) {
    ttd_tensor_release(out);
    out = NULL;
  }
  ttd_status_free(s);
  return out;
}

/* A run shared by a training forward's outputs; one reference for the caller. */
static tt_run_ref *new_run_ref(tt_module *m, int n_outputs, uint64_t run, ttd_run *local_run) {
  tt_run_ref *ref = calloc(1, sizeof(*ref));
  if (ref) ref->output_grads = calloc((size_t)n_outputs + 1, sizeof(float *));
  if (!ref || !ref->output_grads) {
    free(ref);
    tt_client_fail(m->client, TT_RESOURCE_EXHAUSTED, "out of host memory");
    return NULL;
  }
  atomic_init(&ref->refs, 1);
  ref->client = m->client;
  ref->module = tt_module_retain(m); /* outputs may outlive the user's module reference */
  ref->run = run;
  ref->local_run = local_run;
  ref->n_outputs = n_outputs;
  m->pending_runs++;
  return ref;
}

void tt_module_release_local(tt_module *m, tt_run_ref *ref) {
  ttd_run_free(ref->local_run);
  ref->local_run = NULL;
  tt_module_run_done(m);
}

tt_status tt_module_backward_local(tt_module *m, tt_run_ref *ref) {
  ttd_run *run = ref->local_run;
  const ttd_program *p = run->program;
  ttd_tensor **out_grads = calloc((size_t)p->n_outputs + 1, sizeof(*out_grads));
  ttd_tensor **param_grads = calloc((size_t)p->n_params + 1, sizeof(*param_grads));
  tt_status st = out_grads && param_grads ? TT_OK : tt_client_fail(m->client, TT_RESOURCE_EXHAUSTED, "out of host memory");
  for (int o = 0; st == TT_OK && o < p->n_outputs; o++) {
    if (!ref->output_grads[o]) continue;
    const ttd_tensor *out = run->values[p->outputs[o]];
    ttd_tensor_spec spec = out->spec;
    ttd_status_t s = ttd_tensor_create(local_card, NULL, &spec, &out_grads[o]);
    if (!s) s = local_card->vtable->buffer_write(local_card, out_grads[o]->buffer, 0, ref->output_grads[o], spec.nbytes);
    if (s) st = tt_client_fail(m->client, (tt_status)ttd_status_code(s), "%s", ttd_status_message(s));
    ttd_status_free(s);
  }
  if (st == TT_OK) {
    ttd_status_t s = ttd_run_backward(run, local_card, out_grads, param_grads, NULL);
    if (s) st = tt_client_fail(m->client, (tt_status)ttd_status_code(s), "%s", ttd_status_message(s));
    ttd_status_free(s);
  }
  for (int i = 0; st == TT_OK && i < p->n_params; i++) { /* accumulate into the module's host .grad */
    if (!param_grads[i]) continue;
    if (!m->host_grads[i]) {
      m->host_grads[i] = tt_tensor_from_host(m->client, NULL, TT_FLOAT32, m->params[i]->shape, m->params[i]->ndim);
      if (!m->host_grads[i]) {
        st = TT_RESOURCE_EXHAUSTED;
        break;
      }
    }
    float *g = malloc(param_grads[i]->spec.nbytes + 4), *acc = m->host_grads[i]->data;
    if (!g) {
      st = tt_client_fail(m->client, TT_RESOURCE_EXHAUSTED, "out of host memory");
      break;
    }
    local_card->vtable->buffer_read(local_card, param_grads[i]->buffer, 0, g, param_grads[i]->spec.nbytes);
    for (uint64_t k = 0; k < param_grads[i]->spec.numel; k++) acc[k] += g[k];
    free(g);
  }
  for (int o = 0; out_grads && o < p->n_outputs; o++) ttd_tensor_release(out_grads[o]);
  for (int i = 0; param_grads && i < p->n_params; i++) ttd_tensor_release(param_grads[i]);
  free(out_grads);
  free(param_grads);
  for (int o = 0; o < ref->n_outputs; o++) {
    free(ref->output_grads[o]);
    ref->output_grads[o] = NULL;
  }
  tt_module_release_local(m, ref); /* as torch frees the graph after backward */
  return st;
}

static tt_status forward_cpu(tt_module *m, tt_tensor *const *inputs, int n_inputs, tt_tensor **outputs) {
  pthread_once(&local_card_once, local_card_create);
  if (!local_card) return tt_client_fail(m->client, TT_RESOURCE_EXHAUSTED, "cannot start the in-process card");
  int n = n_inputs + m->n_params;
  ttd_tensor **local = calloc((size_t)n + 1, sizeof(*local));
  tt_status st = local ? TT_OK : TT_RESOURCE_EXHAUSTED;
  for (int i = 0; i < n && st == TT_OK; i++) {
    local[i] = to_local(i < n_inputs ? inputs[i] : m->params[i - n_inputs]);
    if (!local[i]) st = tt_client_fail(m->client, TT_RESOURCE_EXHAUSTED, "out of host memory");
  }
  ttd_run *run = NULL;
  if (st == TT_OK) {
    ttd_status_t s = ttd_run_forward(local_card, NULL, m->local, local, n_inputs, local + n_inputs, m->n_params, &run);
    if (s) st = tt_client_fail(m->client, (tt_status)ttd_status_code(s), "%s", ttd_status_message(s));
    ttd_status_free(s);
  }
  for (int o = 0; st == TT_OK && o < m->local->n_outputs; o++) {
    const ttd_tensor *t = run->values[m->local->outputs[o]];
    outputs[o] = tt_tensor_from_host(m->client, NULL, (tt_dtype)t->spec.dtype, t->spec.shape, t->spec.ndim);
    if (!outputs[o]) st = TT_RESOURCE_EXHAUSTED;
    else local_card->vtable->buffer_read(local_card, t->buffer, 0, outputs[o]->data, t->spec.nbytes);
  }
  tt_run_ref *ref = st == TT_OK && m->training ? new_run_ref(m, m->local->n_outputs, 0, run) : NULL;
  if (ref) {
    run = NULL; /* the outputs keep it for backward */
    for (int o = 0; o < m->local->n_outputs; o++) {
      outputs[o]->run = tt_run_ref_retain(ref);
      outputs[o]->output_index = o;
    }
    tt_run_ref_release(ref);
  }
  ttd_run_free(run);
  for (int i = 0; local && i < n; i++) ttd_tensor_release(local[i]);
  free(local);
  return st;
}

static tt_status ensure_program(tt_module *m) {
  if (m->program) return TT_OK;
  Ttd__V1__CompileRequest req = TTD__V1__COMPILE_REQUEST__INIT;
  req.graph = m->graph;
  ProtobufCMessage *out = NULL;
  tt_status st = tt_rpc_unary(m->client, TT_RPC_COMPILE, &req.base, &ttd__v1__compile_response__descriptor, &out);
  if (st != TT_OK) return st;
  m->program = ((Ttd__V1__CompileResponse *)out)->program;
  protobuf_c_message_free_unpacked(out, NULL);
  return TT_OK;
}

/* Bytes of all of m's outputs. */
static uint64_t outputs_nbytes(const tt_module *m) {
  uint64_t total = 0;
  for (int o = 0; o < m->local->n_outputs; o++) {
    const ttd_value_type *t = &m->local->values[m->local->outputs[o]].type;
    total += (uint64_t)ttd_kshape_numel(&t->shape) * ttd_dtype_size(t->dtype);
  }
  return total;
}

/* Execute's inputs: handles, or deferred tensors sent inline (uploaded instead when together
 * they would pass the inline limit). in[i] is 0 for inline input i; wires hold the inline
 * ones in order. */
static tt_status execute_inputs(tt_tensor *const *inputs, int n, uint64_t *in, tt_inline_wire *wires,
                                Ttd__V1__InlineTensor **wire_ptrs, size_t *out_n_inline) {
  *out_n_inline = 0;
  uint64_t inline_bytes = 0;
  for (int i = 0; i < n; i++) {
    if (!inputs[i]->handle) inline_bytes += inputs[i]->nbytes;
  }
  for (int i = 0; i < n; i++) {
    tt_tensor *t = inputs[i];
    if (!t->handle && inline_bytes > TTD_INLINE_MAX_BYTES) TT_RETURN_IF_FAILED(tt_tensor_materialize(t));
    in[i] = t->handle;
    if (in[i]) continue;
    size_t k = (*out_n_inline)++;
    tt_inline_fill(&wires[k], t);
    wire_ptrs[k] = &wires[k].wire;
  }
  return TT_OK;
}

static tt_status forward_device(tt_module *m, tt_tensor *const *inputs, int n_inputs, tt_tensor **outputs) {
  TT_RETURN_IF_FAILED(ensure_program(m));
  size_t n = (size_t)n_inputs + 1;
  uint64_t *in = calloc(n, sizeof(uint64_t)), *par = calloc((size_t)m->n_params + 1, sizeof(uint64_t));
  tt_inline_wire *wires = calloc(n, sizeof(*wires));
  Ttd__V1__InlineTensor **wire_ptrs = calloc(n, sizeof(*wire_ptrs));
  tt_param_work work_storage;
  memset(&work_storage, 0, sizeof(work_storage));
  Ttd__V1__ExecuteRequest req = TTD__V1__EXECUTE_REQUEST__INIT;
  tt_status st = in && par && wires && wire_ptrs
                     ? TT_OK
                     : tt_client_fail(m->client, TT_RESOURCE_EXHAUSTED, "out of host memory");
  if (st == TT_OK) st = execute_inputs(inputs, n_inputs, in, wires, wire_ptrs, &req.n_inline_inputs);
  int inline_outputs = tt_inline_enabled(m->client) && outputs_nbytes(m) <= TTD_INLINE_MAX_BYTES;
  /* The previous step's Backward rides along (run first, with what was queued before it),
   * then the work queued since (the step), then this forward. */
  tt_backward_call carried;
  memset(&carried, 0, sizeof(carried));
  deferred_work carried_before;
  tt_run_ref *waiting = st == TT_OK ? take_waiting_backward(m, &carried_before) : NULL;
  if (waiting) {
    st = tt_backward_call_begin(waiting, &carried);
    if (st == TT_OK) st = work_message(m, carried_before, &carried.before, &carried.req.before);
    req.backward = &carried.req;
  }
  if (st == TT_OK && tt_inline_enabled(m->client)) st = tt_module_take_work(m, &work_storage, &req.before);
  ProtobufCMessage *out = NULL;
  if (st == TT_OK) {
    for (int i = 0; i < m->n_params; i++) par[i] = m->params[i]->handle;
    req.program = m->program;
    req.inputs = in;
    req.n_inputs = (size_t)n_inputs;
    req.parameters = par;
    req.n_parameters = (size_t)m->n_params;
    req.keep_for_backward = m->training;
    req.inline_inputs = wire_ptrs;
    /* Outputs of a module in training, or trained on this card, come back as bytes only (the
     * loss runs on the CPU and backward needs the run, not them); else as handles too. */
    if (inline_outputs) {
      req.output_mode = m->training || m->loop_device >= 0 ? TTD__V1__OUTPUT_MODE__OUTPUT_MODE_INLINE
                                                           : TTD__V1__OUTPUT_MODE__OUTPUT_MODE_HANDLES_AND_INLINE;
    }
    st = tt_rpc_unary(m->client, TT_RPC_EXECUTE, &req.base, &ttd__v1__execute_response__descriptor, &out);
  }
  if (waiting) {
    const Ttd__V1__ExecuteResponse *answered = st == TT_OK ? (const Ttd__V1__ExecuteResponse *)out : NULL;
    if (answered && !answered->backward) { /* a daemon that does not know the field ran only the forward */
      st = tt_client_fail(m->client, TT_UNIMPLEMENTED,
                          "ttd ran this Execute but not the Backward it carried (a daemon older than libttclient); "
                          "upgrade ttd, or set TTD_INLINE=0");
      answered = NULL;
    }
    tt_backward_call_end(waiting, &carried, st, answered ? answered->backward : NULL, 1);
    tt_run_ref_release(waiting);
  }
  tt_param_work_clear(&work_storage);
  free(in);
  free(par);
  free(wires);
  free(wire_ptrs);
  if (st != TT_OK) {
    if (out) { /* answered, but refused here: its run is released on the card */
      const Ttd__V1__ExecuteResponse *refused = (const Ttd__V1__ExecuteResponse *)out;
      if (refused->run) tt_run_ref_release(new_run_ref(m, (int)refused->n_outputs, refused->run, NULL));
      protobuf_c_message_free_unpacked(out, NULL);
    }
    return st;
  }
  Ttd__V1__ExecuteResponse *resp = (Ttd__V1__ExecuteResponse *)out;
  tt_run_ref *ref = resp->run ? new_run_ref(m, (int)resp->n_outputs, resp->run, NULL) : NULL;
  if (resp->run && !ref) {
    protobuf_c_message_free_unpacked(out, NULL);
    return TT_RESOURCE_EXHAUSTED;
  }
  for (size_t o = 0; o < resp->n_outputs; o++) {
    tt_tensor *t = tt_tensor_alloc(m->client);
    const Ttd__V1__TensorSpec *spec = resp->outputs[o]->spec;
    if (t && tt_tensor_describe(m->client, t, (tt_dtype)spec->dtype, spec->shape, (int)spec->n_shape) == TT_OK) {
      t->place = m->place;
      strcpy(t->device_name, m->device_name);
      t->handle = resp->outputs[o]->handle;
      if (ref) {
        t->run = tt_run_ref_retain(ref);
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
    } else {
      tt_tensor_free(t);
      st = TT_RESOURCE_EXHAUSTED;
    }
  }
  protobuf_c_message_free_unpacked(out, NULL);
  tt_run_ref_release(ref); /* the outputs hold it now */
  return st;
}

tt_status tt_forward(tt_module *m, tt_tensor *const *inputs, int n_inputs, tt_tensor **outputs) {
  for (int o = 0; o < m->local->n_outputs; o++) outputs[o] = NULL;
  TT_RETURN_IF_FAILED(check_inputs(m, inputs, n_inputs));
  tt_status st = m->place.is_host ? forward_cpu(m, inputs, n_inputs, outputs) : forward_device(m, inputs, n_inputs, outputs);
  if (st != TT_OK) {
    for (int o = 0; o < m->local->n_outputs; o++) {
      tt_tensor_free(outputs[o]);
      outputs[o] = NULL;
    }
  }
  return st;
}

/* Queues a step (with its options) or a zeroing on the module; work that cannot follow what
 * is queued (a second step, a step after a zeroing) sends what is queued first. */
tt_status tt_module_defer_work(tt_module *m, int step, int adam, const Ttd__V1__SgdOptions *sgd,
                               const Ttd__V1__AdamOptions *adam_options) {
  for (;;) {
    pthread_mutex_lock(&deferred_lock);
    deferred_work *d = &m->deferred;
    if (!step || (!d->step && !d->zero)) {
      if (step) {
        d->step = 1;
        d->adam = adam;
        d->sgd = *sgd;
        d->adam_options = *adam_options;
      } else {
        d->zero = 1;
      }
      queue_locked(m);
      pthread_mutex_unlock(&deferred_lock);
      return TT_OK;
    }
    pthread_mutex_unlock(&deferred_lock);
    TT_RETURN_IF_FAILED(tt_module_flush(m));
  }
}


/* ---- checkpoints ---- */

tt_status tt_module_save(tt_module *m, const char *path) {
  tt_tensor **host = calloc((size_t)m->n_params + 1, sizeof(*host));
  const char **names = calloc((size_t)m->n_params + 1, sizeof(*names));
  tt_status st = host && names ? TT_OK : tt_client_fail(m->client, TT_RESOURCE_EXHAUSTED, "out of host memory");
  for (int i = 0; st == TT_OK && i < m->n_params; i++) {
    names[i] = tt_module_param_name(m, i);
    host[i] = tt_to(m->params[i], "cpu");
    if (!host[i]) st = tt_errcode(m->client);
  }
  if (st == TT_OK) st = tt_safetensors_save(m->client, path, names, host, m->n_params);
  for (int i = 0; host && i < m->n_params; i++) tt_tensor_free(host[i]);
  free(host);
  free(names);
  return st;
}

tt_status tt_module_load(tt_module *m, const char *path) {
  tt_safetensors *file = NULL;
  TT_RETURN_IF_FAILED(tt_safetensors_open(m->client, path, &file));
  tt_tensor **loaded = calloc((size_t)m->n_params + 1, sizeof(*loaded));
  tt_status st = loaded ? TT_OK : tt_client_fail(m->client, TT_RESOURCE_EXHAUSTED, "out of host memory");
  for (int i = 0; st == TT_OK && i < m->n_params; i++) {
    const char *name = tt_module_param_name(m, i);
    tt_tensor *host = tt_safetensors_get(file, name);
    const tt_tensor *want = m->params[i];
    if (!host) {
      st = tt_client_fail(m->client, TT_INVALID_ARGUMENT, "checkpoint %s has no parameter '%s'", path, name);
    } else if (host->dtype != want->dtype || host->ndim != want->ndim ||
               memcmp(host->shape, want->shape, sizeof(int64_t) * (size_t)want->ndim) != 0) {
      st = tt_client_fail(m->client, TT_INVALID_ARGUMENT, "checkpoint %s: parameter '%s' has another dtype or shape than the module's",
                          path, name);
    } else {
      loaded[i] = place_param(tt_to(host, m->device_name));
      if (!loaded[i]) st = tt_errcode(m->client);
    }
    tt_tensor_free(host);
  }
  tt_safetensors_close(file);
  if (st == TT_OK) st = tt_module_flush(m); /* queued work applies to the parameters it was queued for */
  if (st == TT_OK) {
    release_grads(m);
    for (int i = 0; i < m->n_params; i++) {
      tt_tensor_free(m->params[i]);
      m->params[i] = loaded[i];
    }
  } else {
    for (int i = 0; loaded && i < m->n_params; i++) tt_tensor_free(loaded[i]);
  }
  free(loaded);
  return st;
}
