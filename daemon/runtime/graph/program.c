#include "graph/program.h"

#include <stdlib.h>
#include <string.h>

#include "graph/tensor_spec.h"

/* ---- a string -> index map for value names (open addressing) ---- */

typedef struct name_map {
  const char **keys;
  int *values;
  size_t capacity;
} name_map;

static uint64_t hash_bytes(const void *data, size_t len) {
  const unsigned char *p = data;
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * 0x100000001b3ull;
  return h ? h : 1;
}

static int name_map_init(name_map *m, size_t count) {
  m->capacity = 16;
  while (m->capacity < count * 2) m->capacity *= 2;
  m->keys = calloc(m->capacity, sizeof(*m->keys));
  m->values = calloc(m->capacity, sizeof(*m->values));
  return m->keys && m->values ? 0 : -1;
}

static void name_map_free(name_map *m) {
  free(m->keys);
  free(m->values);
}

/* Returns the index stored for key, or -1; with insert >= 0, stores it if absent. */
static int name_map_find(name_map *m, const char *key, int insert) {
  size_t i = hash_bytes(key, strlen(key)) & (m->capacity - 1);
  while (m->keys[i]) {
    if (strcmp(m->keys[i], key) == 0) return m->values[i];
    i = (i + 1) & (m->capacity - 1);
  }
  if (insert >= 0) {
    m->keys[i] = key;
    m->values[i] = insert;
  }
  return -1;
}

/* ---- compile ---- */

ttd_program *ttd_program_retain(ttd_program *program) {
  atomic_fetch_add(&program->refs, 1);
  return program;
}

void ttd_program_release(ttd_program *program) {
  if (!program || atomic_fetch_sub(&program->refs, 1) != 1) return;
  for (int i = 0; i < program->n_values; i++) free(program->values[i].name);
  free(program->values);
  free(program->nodes);
  free(program->outputs);
  free(program->key);
  free(program);
}

static ttd_status_t invalid(const char *fmt, const char *name, const char *detail) {
  return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, fmt, name, detail);
}

static ttd_status_t read_value_spec(const Ttd__V1__ValueSpec *spec, const char *what, size_t index,
                                    ttd_program_value *out) {
  if (!spec->name || !spec->name[0]) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                           "graph %s %zu has no name; give each input and parameter a name for nodes to read it by",
                           what, index);
  }
  ttd_tensor_spec ts = {.dtype = (ttd_dtype)spec->dtype, .ndim = (int)spec->n_shape};
  if (spec->n_shape > TTD_MAX_DIMS) return invalid("%s '%.128s' has more than 8 dims", what, spec->name);
  for (size_t i = 0; i < spec->n_shape; i++) ts.shape[i] = spec->shape[i];
  ttd_status_t s = ttd_tensor_spec_finish(&ts);
  if (s) {
    ttd_status_t named = ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "%s '%.128s': %s", what, spec->name, ttd_status_message(s));
    ttd_status_free(s);
    return named;
  }
  out->name = strdup(spec->name);
  if (!out->name) return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  out->type.dtype = ts.dtype;
  out->type.shape.ndim = ts.ndim;
  memcpy(out->type.shape.d, ts.shape, sizeof(int64_t) * (size_t)ts.ndim);
  return TTD_OK;
}

/* A node's inferred output must be a tensor a device could hold: at most 2^63 elements and
 * bytes, as any tensor (so later sizes computed from it cannot overflow). */
static ttd_status_t check_output_size(const Ttd__V1__Node *node, const ttd_value_type *type) {
  ttd_tensor_spec ts = {.dtype = type->dtype, .ndim = type->shape.ndim};
  memcpy(ts.shape, type->shape.d, sizeof(int64_t) * (size_t)ts.ndim);
  ttd_status_t s = ttd_tensor_spec_finish(&ts);
  if (!s) return TTD_OK;
  char shape[192];
  ttd_status_t named = ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "node '%.128s' (%.32s): its output %s: %s", node->name,
                                       node->op, ttd_kshape_format(&type->shape, shape, sizeof(shape)),
                                       ttd_status_message(s));
  ttd_status_free(s);
  return named;
}

/* Orders nodes so every node comes after the nodes it reads (Kahn). order[i] = graph
 * node index. INVALID_ARGUMENT naming a node on a cycle. */
static ttd_status_t topo_sort(const Ttd__V1__Graph *g, name_map *names, int first_node_value, int *order) {
  size_t n = g->n_nodes;
  int *indegree = calloc(n ? n : 1, sizeof(int));
  int *users_start = calloc(n + 1, sizeof(int));
  int *users = NULL;
  size_t edges = 0;
  ttd_status_t status = TTD_OK;
  if (!indegree || !users_start) goto oom;
  for (size_t i = 0; i < n; i++) {
    for (size_t k = 0; k < g->nodes[i]->n_inputs; k++) {
      int v = name_map_find(names, g->nodes[i]->inputs[k], -1);
      if (v >= first_node_value) {
        indegree[i]++;
        users_start[v - first_node_value + 1]++;
        edges++;
      }
    }
  }
  for (size_t i = 0; i < n; i++) users_start[i + 1] += users_start[i];
  users = malloc((edges ? edges : 1) * sizeof(int));
  int *fill = calloc(n ? n : 1, sizeof(int));
  if (!users || !fill) {
    free(fill);
    goto oom;
  }
  for (size_t i = 0; i < n; i++) {
    for (size_t k = 0; k < g->nodes[i]->n_inputs; k++) {
      int v = name_map_find(names, g->nodes[i]->inputs[k], -1);
      if (v >= first_node_value) {
        int src = v - first_node_value;
        users[users_start[src] + fill[src]++] = (int)i;
      }
    }
  }
  free(fill);
  size_t head = 0, tail = 0;
  for (size_t i = 0; i < n; i++) {
    if (indegree[i] == 0) order[tail++] = (int)i;
  }
  while (head < tail) {
    int u = order[head++];
    for (int e = users_start[u]; e < users_start[u + 1]; e++) {
      if (--indegree[users[e]] == 0) order[tail++] = users[e];
    }
  }
  if (tail < n) {
    /* Walk back from a blocked node through blocked inputs until a node repeats: that
     * node lies on a cycle (a blocked node's own blocker may only be downstream of one). */
    size_t u = 0;
    while (indegree[u] == 0) u++;
    unsigned char *seen = calloc(n, 1);
    while (seen && !seen[u]) {
      seen[u] = 1;
      const Ttd__V1__Node *node = g->nodes[u];
      for (size_t k = 0; k < node->n_inputs; k++) {
        int v = name_map_find(names, node->inputs[k], -1);
        if (v >= first_node_value && indegree[v - first_node_value] > 0) {
          u = (size_t)(v - first_node_value);
          break;
        }
      }
    }
    free(seen);
    status = ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                             "node '%.128s' is part of a cycle: it depends, directly or not, on its own output",
                             g->nodes[u]->name);
  }
  free(indegree);
  free(users_start);
  free(users);
  return status;
oom:
  free(indegree);
  free(users_start);
  free(users);
  return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
}

/* The state of one compilation, passed through its phases. */
typedef struct compile_state {
  const Ttd__V1__Graph *g;
  ttd_program *p;
  name_map names;       /* value name -> value index */
  int *order;           /* nodes in topological order (indices into g->nodes) */
  size_t n_values;      /* inputs, parameters and nodes */
  int first_node_value; /* values of nodes follow the inputs' and parameters' */
} compile_state;

static ttd_status_t out_of_memory(void) {
  return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory compiling the graph");
}

static ttd_status_t compile_alloc(compile_state *c) {
  const Ttd__V1__Graph *g = c->g;
  ttd_program *p = c->p = calloc(1, sizeof(*p));
  if (!p) return out_of_memory();
  atomic_init(&p->refs, 1);
  if (name_map_init(&c->names, c->n_values) != 0) return out_of_memory();
  p->n_inputs = (int)g->n_inputs;
  p->n_params = (int)g->n_parameters;
  p->n_nodes = (int)g->n_nodes;
  p->n_outputs = (int)g->n_outputs;
  p->values = calloc(c->n_values ? c->n_values : 1, sizeof(*p->values));
  p->nodes = calloc(g->n_nodes ? g->n_nodes : 1, sizeof(*p->nodes));
  p->outputs = calloc(g->n_outputs, sizeof(int));
  c->order = malloc((g->n_nodes ? g->n_nodes : 1) * sizeof(int));
  if (!p->values || !p->nodes || !p->outputs || !c->order) return out_of_memory();
  return TTD_OK;
}

/* Names: inputs, parameters and nodes share one namespace; inputs' and parameters' specs
 * are read and checked. */
static ttd_status_t compile_names(compile_state *c) {
  const Ttd__V1__Graph *g = c->g;
  ttd_program *p = c->p;
  for (size_t i = 0; i < c->n_values; i++) {
    ttd_status_t status = TTD_OK;
    ttd_program_value *v = &p->values[i];
    if (i < g->n_inputs) {
      status = read_value_spec(g->inputs[i], "input", i, v);
      v->kind = TTD_VALUE_INPUT;
    } else if (i < g->n_inputs + g->n_parameters) {
      status = read_value_spec(g->parameters[i - g->n_inputs], "parameter", i - g->n_inputs, v);
      v->kind = TTD_VALUE_PARAM;
      if (!status && v->type.dtype == TTD_DTYPE_INT32) {
        status = invalid("parameter '%.128s' is int32%s; parameters must be float32 or bfloat16", v->name, "");
      }
    } else {
      const Ttd__V1__Node *node = g->nodes[i - g->n_inputs - g->n_parameters];
      v->kind = TTD_VALUE_NODE;
      if (!node->name || !node->name[0]) {
        status = ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                                 "node %zu (%.32s) has no name; name every node: its output is the value named after it",
                                 i - g->n_inputs - g->n_parameters, node->op);
      } else if (!(v->name = strdup(node->name))) {
        status = out_of_memory();
      }
    }
    p->n_values = (int)i + 1;
    if (status) return status;
    v->requires_grad = v->kind != TTD_VALUE_NODE && v->type.dtype != TTD_DTYPE_INT32;
    v->param_grad = v->kind == TTD_VALUE_PARAM && v->type.dtype != TTD_DTYPE_INT32;
    if (name_map_find(&c->names, v->name, (int)i) >= 0) {
      return invalid("the name '%.128s' is used twice%s; inputs, parameters and nodes share one namespace", v->name, "");
    }
  }
  return TTD_OK;
}

/* Every node names a known op, and inputs that exist. */
static ttd_status_t compile_check_nodes(compile_state *c) {
  const Ttd__V1__Graph *g = c->g;
  for (size_t i = 0; i < g->n_nodes; i++) {
    const Ttd__V1__Node *node = g->nodes[i];
    if (ttd_op_lookup(node->op ? node->op : "") < 0) {
      return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "node '%.128s': unknown op '%.64s'", node->name, node->op);
    }
    if (node->n_inputs > TTD_MAX_NODE_INPUTS) {
      return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "node '%.128s' (%s): %zu inputs; no op takes more than %d",
                             node->name, node->op, node->n_inputs, TTD_MAX_NODE_INPUTS);
    }
    for (size_t k = 0; k < node->n_inputs; k++) {
      if (name_map_find(&c->names, node->inputs[k], -1) < 0) {
        return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                               "node '%.128s' (%s): input '%.128s' names no graph input, parameter or node",
                               node->name, node->op, node->inputs[k]);
      }
    }
  }
  return TTD_OK;
}

/* Nodes in topological order (a cycle is refused); their values move into that order, so
 * that value index = position, and the name map is rebuilt to match. */
static ttd_status_t compile_sort(compile_state *c) {
  const Ttd__V1__Graph *g = c->g;
  ttd_program *p = c->p;
  TTD_RETURN_IF_ERROR(topo_sort(g, &c->names, c->first_node_value, c->order));
  ttd_program_value *sorted = calloc(g->n_nodes ? g->n_nodes : 1, sizeof(*sorted));
  if (!sorted) return out_of_memory();
  for (size_t i = 0; i < g->n_nodes; i++) sorted[i] = p->values[c->first_node_value + c->order[i]];
  memcpy(p->values + c->first_node_value, sorted, g->n_nodes * sizeof(*sorted));
  free(sorted);
  name_map_free(&c->names);
  if (name_map_init(&c->names, c->n_values) != 0) return out_of_memory();
  for (int i = 0; i < p->n_values; i++) name_map_find(&c->names, p->values[i].name, i);
  return TTD_OK;
}

/* Each node's output dtype and shape from its inputs' (the op catalogue's inference), and
 * whether a gradient flows to it. */
static ttd_status_t compile_infer(compile_state *c) {
  const Ttd__V1__Graph *g = c->g;
  ttd_program *p = c->p;
  p->costliest = -1;
  for (size_t i = 0; i < g->n_nodes; i++) {
    const Ttd__V1__Node *node = g->nodes[c->order[i]];
    ttd_program_node *pn = &p->nodes[i];
    pn->op = (ttd_op)ttd_op_lookup(node->op);
    pn->n_inputs = (int)node->n_inputs;
    pn->value = c->first_node_value + (int)i;
    const ttd_value_type *in_types[TTD_MAX_NODE_INPUTS];
    bool grad = false, param_grad = false;
    for (int k = 0; k < pn->n_inputs; k++) {
      pn->inputs[k] = name_map_find(&c->names, node->inputs[k], -1);
      const ttd_program_value *src = &p->values[pn->inputs[k]];
      in_types[k] = &src->type;
      grad = grad || src->requires_grad;
      param_grad = param_grad || src->param_grad;
    }
    ttd_program_value *out = &p->values[pn->value];
    TTD_RETURN_IF_ERROR(ttd_op_infer(pn->op, node, in_types, pn->n_inputs, &pn->attrs, &out->type));
    TTD_RETURN_IF_ERROR(check_output_size(node, &out->type));
    double cost = ttd_op_cost(pn->op, &pn->attrs, in_types, pn->n_inputs, &out->type);
    p->cost += cost;
    if (p->costliest < 0 || cost > p->costliest_cost) {
      p->costliest = (int)i;
      p->costliest_cost = cost;
    }
    out->requires_grad = grad && out->type.dtype != TTD_DTYPE_INT32;
    out->param_grad = param_grad && out->type.dtype != TTD_DTYPE_INT32;
  }
  return TTD_OK;
}

/* The outputs name values of the graph, each once. */
static ttd_status_t compile_outputs(compile_state *c) {
  const Ttd__V1__Graph *g = c->g;
  unsigned char *listed = calloc(c->n_values ? c->n_values : 1, 1); /* outputs seen, by value */
  if (!listed) return out_of_memory();
  ttd_status_t status = TTD_OK;
  for (size_t i = 0; i < g->n_outputs && !status; i++) {
    int v = name_map_find(&c->names, g->outputs[i], -1);
    if (v < 0) {
      status = ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "output '%.128s' names no value of the graph", g->outputs[i]);
    } else if (listed[v]++) {
      status = ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "output '%.128s' is listed twice", g->outputs[i]);
    }
    c->p->outputs[i] = v;
  }
  free(listed);
  return status;
}

/* Marks each linear node whose value only the next node, a relu, reads (relu_next), where
 * neither value is an output; and each relu whose value only the next node, a linear, reads,
 * as its x, the value no output (grad_next). */
static ttd_status_t compile_mark_fusions(compile_state *c) {
  ttd_program *p = c->p;
  enum { OUTPUT = 1 << 20 }; /* above any count of node inputs (TTD_MAX_GRAPH_NODES of 3) */
  _Static_assert(TTD_MAX_GRAPH_NODES * TTD_MAX_NODE_INPUTS < OUTPUT, "a count of readers stays below OUTPUT");
  int *readers = calloc((size_t)p->n_values + 1, sizeof(int)); /* node inputs reading each value, + OUTPUT */
  if (!readers) return out_of_memory();
  for (int i = 0; i < p->n_nodes; i++)
    for (int k = 0; k < p->nodes[i].n_inputs; k++) readers[p->nodes[i].inputs[k]]++;
  for (int o = 0; o < p->n_outputs; o++) readers[p->outputs[o]] += OUTPUT;
  for (int i = 0; i + 1 < p->n_nodes; i++) {
    const ttd_program_node *node = &p->nodes[i], *next = &p->nodes[i + 1];
    p->nodes[i].relu_next = node->op == TTD_OP_LINEAR && next->op == TTD_OP_RELU && next->n_inputs == 1 &&
                            next->inputs[0] == node->value && readers[node->value] == 1 && readers[next->value] < OUTPUT;
    p->nodes[i].grad_next = node->op == TTD_OP_RELU && next->op == TTD_OP_LINEAR && next->inputs[0] == node->value &&
                            readers[node->value] == 1;
  }
  free(readers);
  return TTD_OK;
}

ttd_status_t ttd_program_compile(const Ttd__V1__Graph *g, ttd_program **out_program) {
  *out_program = NULL;
  if (!g) return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "the graph is missing");
  if (g->n_nodes > TTD_MAX_GRAPH_NODES) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "graph has %zu nodes; at most %d are supported", g->n_nodes,
                           TTD_MAX_GRAPH_NODES);
  }
  if (g->n_outputs == 0) return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "graph declares no outputs");
  compile_state c = {.g = g, .n_values = g->n_inputs + g->n_parameters + g->n_nodes,
                     .first_node_value = (int)(g->n_inputs + g->n_parameters)};
  ttd_status_t status = compile_alloc(&c);
  if (!status) status = compile_names(&c);
  if (!status) status = compile_check_nodes(&c);
  if (!status) status = compile_sort(&c);
  if (!status) status = compile_infer(&c);
  if (!status) status = compile_outputs(&c);
  if (!status) status = compile_mark_fusions(&c);
  name_map_free(&c.names);
  free(c.order);
  if (status) {
    ttd_program_release(c.p);
    return status;
  }
  ttd_program *p = c.p;
  p->host_bytes = sizeof(*p) + (uint64_t)p->n_values * sizeof(*p->values) + (uint64_t)p->n_nodes * sizeof(*p->nodes) +
                  (uint64_t)p->n_outputs * sizeof(*p->outputs);
  for (int v = 0; v < p->n_values; v++) p->host_bytes += p->values[v].name ? strlen(p->values[v].name) + 1 : 0;
  *out_program = p;
  return TTD_OK;
}
