/* Programs per input shape: a module compiled for a [64, 784] input also runs a batch of 1,
 * or an epoch's last 32. A forward whose inputs have the declared dtypes and ranks but other
 * dims runs the graph with its inputs' specs rewritten to those dims, compiled for them: in
 * process always (the output shapes, and the CPU path), and on a card by the daemon's
 * Compile, once per module and dims. Parameters never change shape, so every program of a
 * module takes the same ones. A module keeps TT_MODULE_SHAPES such programs besides the
 * declared one, evicting the least recently used; no call of the daemon releases a program
 * handle, so an evicted one stays in the session (a reference to the tenant's shared
 * program, no device memory) until it closes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "module/module.h"

/* m's graph with its inputs' dims replaced: a shallow copy, pointing into m->graph and dims,
 * with storage of its own (shaped_graph_free). */
typedef struct shaped_graph {
  Ttd__V1__Graph graph;
  Ttd__V1__ValueSpec *specs;
  Ttd__V1__ValueSpec **inputs;
} shaped_graph;

static void shaped_graph_free(shaped_graph *sg) {
  free(sg->specs);
  free(sg->inputs);
}

/* dims: every input's dims one after another, as many per input as it declares. */
static tt_status shaped_graph_make(tt_module *m, const int64_t *dims, shaped_graph *sg) {
  const Ttd__V1__Graph *g = m->graph;
  sg->graph = *g;
  sg->specs = calloc(g->n_inputs + 1, sizeof(*sg->specs));
  sg->inputs = calloc(g->n_inputs + 1, sizeof(*sg->inputs));
  if (!sg->specs || !sg->inputs) return tt_client_fail(m->client, TT_RESOURCE_EXHAUSTED, "out of host memory");
  for (size_t i = 0; i < g->n_inputs; i++) {
    sg->specs[i] = *g->inputs[i];
    sg->specs[i].shape = (int64_t *)dims;
    dims += g->inputs[i]->n_shape;
    sg->inputs[i] = &sg->specs[i];
  }
  sg->graph.inputs = sg->inputs;
  return TT_OK;
}

/* The daemon's Compile of graph: a program handle of this session. */
static tt_status compile_on_card(tt_module *m, Ttd__V1__Graph *graph, uint64_t *out_handle) {
  Ttd__V1__CompileRequest req = TTD__V1__COMPILE_REQUEST__INIT;
  req.graph = graph;
  ProtobufCMessage *out = NULL;
  TT_RETURN_IF_FAILED(tt_rpc_unary(m->client, TT_RPC_COMPILE, &req.base, &ttd__v1__compile_response__descriptor, &out));
  *out_handle = ((Ttd__V1__CompileResponse *)out)->program;
  protobuf_c_message_free_unpacked(out, NULL);
  return TT_OK;
}

tt_status tt_module_program_on_card(tt_module *m, tt_module_program *p) {
  if (p->handle) return TT_OK;
  if (!p->dims) return compile_on_card(m, m->graph, &p->handle);
  shaped_graph sg;
  tt_status st = shaped_graph_make(m, p->dims, &sg);
  if (st == TT_OK) st = compile_on_card(m, &sg.graph, &p->handle);
  shaped_graph_free(&sg);
  return st;
}

/* Whether the inputs differ from the declared dims where only dims may: false for the
 * declared dims, and for another dtype or rank (no program of the graph takes those). */
static bool other_dims(const tt_module *m, tt_tensor *const *inputs, int n) {
  bool differ = false;
  for (int i = 0; i < n; i++) {
    const ttd_value_type *want = &m->local->values[i].type;
    if ((ttd_dtype)inputs[i]->dtype != want->dtype || inputs[i]->ndim != want->shape.ndim) return false;
    differ |= memcmp(inputs[i]->shape, want->shape.d, sizeof(int64_t) * (size_t)want->shape.ndim) != 0;
  }
  return differ;
}

static bool same_dims(const int64_t *dims, tt_tensor *const *inputs, int n) {
  for (int i = 0; i < n; i++) {
    if (memcmp(dims, inputs[i]->shape, sizeof(int64_t) * (size_t)inputs[i]->ndim) != 0) return false;
    dims += inputs[i]->ndim;
  }
  return true;
}

static void program_drop(tt_module_program *p) {
  ttd_program_release(p->local); /* runs of it hold their own reference */
  free(p->dims);
  memset(p, 0, sizeof(*p));
}

/* A graph refusing the inputs' dims: the error names the first input whose dims differ
 * from the declared ones, both shapes, and then why the graph refused. */
static void explain_refusal(tt_module *m, tt_tensor *const *inputs, int n) {
  tt_status st = tt_errcode(m->client);
  if (st != TT_INVALID_ARGUMENT) return;
  char why[512], want[96], got[96];
  snprintf(why, sizeof(why), "%s", tt_last_error(m->client));
  for (int i = 0; i < n; i++) {
    const ttd_kshape *declared = &m->local->values[i].type.shape;
    if (memcmp(inputs[i]->shape, declared->d, sizeof(int64_t) * (size_t)declared->ndim) == 0) continue;
    ttd_kshape k = {.ndim = inputs[i]->ndim};
    memcpy(k.d, inputs[i]->shape, sizeof(int64_t) * (size_t)k.ndim);
    tt_client_fail(m->client, st,
                   "input %d ('%s') is %s but the module was built for %s; only dims its ops leave free (such as the "
                   "batch) may differ: %s",
                   i, m->local->values[i].name, ttd_kshape_format(&k, got, sizeof(got)),
                   ttd_kshape_format(declared, want, sizeof(want)), why);
    return;
  }
}

/* Compiles the graph for the inputs' dims (on a card, the daemon first: its error is the one
 * reported) into a free slot, or over the least recently used. NULL (recorded) on error. */
static tt_module_program *program_add(tt_module *m, tt_tensor *const *inputs, int n) {
  size_t count = 0;
  for (int i = 0; i < n; i++) count += (size_t)inputs[i]->ndim;
  tt_module_program made = {.dims = malloc(sizeof(int64_t) * (count + 1))};
  if (!made.dims) {
    tt_client_fail(m->client, TT_RESOURCE_EXHAUSTED, "out of host memory");
    return NULL;
  }
  for (int i = 0, k = 0; i < n; k += inputs[i]->ndim, i++) {
    memcpy(made.dims + k, inputs[i]->shape, sizeof(int64_t) * (size_t)inputs[i]->ndim);
  }
  shaped_graph sg;
  tt_status st = shaped_graph_make(m, made.dims, &sg);
  if (st == TT_OK && !m->place.is_host) st = compile_on_card(m, &sg.graph, &made.handle);
  if (st == TT_OK) {
    ttd_status_t s = ttd_program_compile(&sg.graph, &made.local);
    if (s) st = tt_client_fail_status(m->client, s);
  }
  shaped_graph_free(&sg);
  if (st != TT_OK) {
    explain_refusal(m, inputs, n);
    free(made.dims);
    return NULL;
  }
  tt_module_program *slot = &m->shapes[0];
  if (m->n_shapes < TT_MODULE_SHAPES) {
    slot = &m->shapes[m->n_shapes++];
  } else {
    for (int i = 1; i < m->n_shapes; i++) {
      if (m->shapes[i].used < slot->used) slot = &m->shapes[i];
    }
    program_drop(slot);
  }
  *slot = made;
  return slot;
}

tt_module_program *tt_module_program_for(tt_module *m, tt_tensor *const *inputs, int n_inputs) {
  m->forwards++;
  if (!other_dims(m, inputs, n_inputs)) return &m->declared;
  tt_module_program *p = NULL;
  for (int i = 0; i < m->n_shapes && !p; i++) {
    if (same_dims(m->shapes[i].dims, inputs, n_inputs)) p = &m->shapes[i];
  }
  if (!p) p = program_add(m, inputs, n_inputs);
  if (p) p->used = m->forwards;
  return p;
}

void tt_module_programs_clear(tt_module *m) {
  for (int i = 0; i < m->n_shapes; i++) program_drop(&m->shapes[i]);
  m->n_shapes = 0;
}
