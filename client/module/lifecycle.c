/* Modules: a compiled graph and its parameters, on "cpu" (in process, on a local simulated
 * card running the same kernels, local.c) or on a card of the daemon (Compile and Execute,
 * forward.c). Here: making one, letting it go, moving it, and its parameters and .grad.
 *
 * On a card, tt_step and tt_zero_grad are queued on the module and ride on its next Execute
 * or Backward (param_work.c), small inputs deferred by tt_to travel inline with Execute and
 * small outputs come back inline, and tt_backward leaves its Backward (small gradients
 * inline) for the module's next Execute, so a training step is one call: Execute carrying
 * the previous step's Backward and step. Its errors come back from that Execute, as CUDA's
 * come back from a later call. Anything that reads a parameter or a .grad, or moves the
 * module, sends what is queued first (deferred.c). TTD_INLINE=0 turns all of it off. */
#include <stdlib.h>
#include <string.h>

#include "module/module.h"

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
    n_in += g->values[i].kind == TT_GRAPH_INPUT;
    n_par += g->values[i].kind == TT_GRAPH_PARAM;
  }
  Ttd__V1__ValueSpec *specs = calloc((size_t)g->n_values + 1, sizeof(*specs));
  Ttd__V1__ValueSpec **ins = calloc((size_t)n_in + 1, sizeof(*ins)), **pars = calloc((size_t)n_par + 1, sizeof(*pars));
  char **outs = calloc((size_t)g->n_outputs + 1, sizeof(*outs));
  Ttd__V1__Graph *copy = NULL;
  if (specs && ins && pars && outs) {
    Ttd__V1__Graph graph = TTD__V1__GRAPH__INIT;
    for (int i = 0; i < g->n_values; i++) {
      if (g->values[i].kind == TT_GRAPH_INPUT) ins[graph.n_inputs++] = spec_of(&g->values[i], &specs[i]);
      if (g->values[i].kind == TT_GRAPH_PARAM) pars[graph.n_parameters++] = spec_of(&g->values[i], &specs[i]);
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
  static atomic_uint_fast64_t next_key = 1;
  m->key = atomic_fetch_add(&next_key, 1);
  m->client = client;
  m->place.is_host = true;
  m->training = true;
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
    tt_client_fail_status(client, s);
    tt_module_free(m);
    return NULL;
  }
  m->declared.local = m->local;
  m->n_params = m->local->n_params;
  m->params = calloc((size_t)m->n_params + 1, sizeof(*m->params));
  m->grad_handles = calloc((size_t)m->n_params + 1, sizeof(uint64_t));
  m->host_grads = calloc((size_t)m->n_params + 1, sizeof(tt_tensor *));
  if (!m->params || !m->grad_handles || !m->host_grads) {
    tt_client_fail(client, TT_RESOURCE_EXHAUSTED, "out of host memory");
    tt_module_free(m);
    return NULL;
  }
  int p = 0;
  for (int i = 0; i < graph->n_values; i++) {
    if (graph->values[i].kind != TT_GRAPH_PARAM) continue;
    const tt_tensor *init = graph->values[i].init;
    m->params[p] = tt_tensor_from_host(client, init->data, init->dtype, init->shape, init->ndim);
    if (!m->params[p++]) {
      tt_module_free(m);
      return NULL;
    }
    m->params[p - 1]->param = true;
    m->params[p - 1]->owner = m->key;
  }
  tt_to_set_pending_flush(tt_module_flush_pending); /* reading a parameter sends queued work first */
  return m;
}

/* The user lets the module go: the Backward waiting for its next Execute and the work queued
 * after it are sent now, as on "cpu" they ran when called (the parameters may outlive the
 * module). Should that fail, the Backward's run is released and the work dropped. */
void tt_module_free(tt_module *m) {
  if (!m) return;
  if (tt_module_flush(m) != TT_OK) {
    tt_module_cancel_backward(m);
    tt_module_drop_work(m);
  }
  tt_module_unref(m);
}

void tt_module_train(tt_module *m, int training) { m->training = training != 0; }

ttd_run_mode tt_module_next_mode(tt_module *m) {
  ttd_run_mode mode = {.eval = !m->training};
  if (m->training) mode.dropout_step = m->dropout_step++;
  return mode;
}

tt_tensor *tt_module_place_param(const tt_module *m, tt_tensor *t) {
  if (!t) return NULL;
  if (!t->place.is_host && tt_tensor_materialize(t) != TT_OK) {
    tt_tensor_free(t);
    return NULL;
  }
  if (!t->place.is_host && atomic_load(&t->refs) == 1) {
    tt_tensor_host_copy_free(t);
  }
  t->param = true;
  t->owner = m->key;
  return t;
}

tt_status tt_module_to(tt_module *m, const char *device) {
  tt_place place;
  if (tt_place_parse(device, &place) != 0 || place.l1) {
    return tt_client_fail(m->client, TT_INVALID_ARGUMENT, "module device '%s' is not valid; use cpu, tt or tt:N",
                          device ? device : "(null)");
  }
  if (place.is_host == m->place.is_host && (place.is_host || place.device == m->place.device)) {
    return TT_OK; /* where it is: as torch's, nothing moves and .grad and optimizer state stay */
  }
  TT_RETURN_IF_FAILED(tt_module_flush_backward(m)); /* a waiting Backward is a pending run too */
  if (m->pending_runs > 0) {
    return tt_client_fail(m->client, TT_FAILED_PRECONDITION,
                          "the module has %d forward run(s) pending; call tt_backward on their loss or free their outputs "
                          "before moving it",
                          m->pending_runs);
  }
  TT_RETURN_IF_FAILED(tt_module_flush(m));
  tt_tensor **moved = calloc((size_t)m->n_params + 1, sizeof(*moved));
  if (!moved) return tt_client_fail(m->client, TT_RESOURCE_EXHAUSTED, "out of host memory");
  for (int i = 0; i < m->n_params; i++) {
    moved[i] = tt_module_place_param(m, tt_to(m->params[i], device));
    if (!moved[i]) {
      for (int k = 0; k < i; k++) tt_tensor_free(moved[k]);
      free(moved);
      return tt_errcode(m->client); /* tt_to said why; the module stays where it was */
    }
  }
  for (int i = 0; i < m->n_params; i++) tt_tensor_free(m->params[i]);
  free(m->params);
  m->params = moved;
  m->param_generation++;
  tt_module_release_grads(m); /* .grad belonged to the old tensors */
  for (int i = 0; i < m->n_params; i++) {
    tt_tensor_free(m->host_grads[i]);
    m->host_grads[i] = NULL;
  }
  tt_module_loop_leave(m);
  m->place = place;
  tt_place_format(&place, m->device_name, sizeof(m->device_name));
  return TT_OK;
}

const char *tt_module_device(const tt_module *m) { return m->device_name; }
int tt_module_param_count(const tt_module *m) { return m->n_params; }
int tt_module_output_count(const tt_module *m) { return m ? m->local->n_outputs : -1; }

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
    t->borrowed = true; /* the daemon keeps .grad with the parameter: freeing this does not free it */
    t->owner = m->key;
    return t;
  }
  tt_client_fail(m->client, TT_NOT_FOUND, "the module has no parameter '%s'", name ? name : "(null)");
  return NULL;
}
