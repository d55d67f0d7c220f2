/* Building a model graph value by value, with each op's shape inferred on the spot by the
 * daemon's own inference code (daemon/runtime/graph/ops.c), so the client and the daemon agree. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/ops.h"
#include "module/module.h"

/* Layers whose parameters are named "<kind><n>.<part>", counted per kind. */
typedef enum layer_kind { LAYER_LINEAR, LAYER_CONV, LAYER_NORM } layer_kind;

static int fail(tt_graph *g, tt_status code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(tt_graph *g, tt_status code, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  tt_client_fail(g->client, code, "%s", msg);
  return -1;
}

tt_graph *tt_graph_create(tt_client *client, uint64_t seed) {
  tt_graph *g = calloc(1, sizeof(*g));
  if (!g) {
    if (client) tt_client_fail(client, TT_RESOURCE_EXHAUSTED, "out of host memory");
    return NULL;
  }
  g->client = client;
  g->rng = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
  return g;
}

static void free_node(Ttd__V1__Node *n) {
  if (!n) return;
  free(n->name);
  free(n->op);
  for (size_t i = 0; i < n->n_inputs; i++) free(n->inputs[i]);
  free(n->inputs);
  for (size_t i = 0; i < n->n_attrs; i++) {
    free(n->attrs[i]->name);
    if (n->attrs[i]->value_case == TTD__V1__ATTR__VALUE_INTS && n->attrs[i]->ints) {
      free(n->attrs[i]->ints->values);
      free(n->attrs[i]->ints);
    }
    free(n->attrs[i]);
  }
  free(n->attrs);
  free(n);
}

void tt_graph_free(tt_graph *g) {
  if (!g) return;
  for (int i = 0; i < g->n_values; i++) {
    free(g->values[i].name);
    tt_tensor_free(g->values[i].init);
  }
  for (int i = 0; i < g->n_nodes; i++) free_node(g->nodes[i]);
  free(g->values);
  free(g->nodes);
  free(g->outputs);
  free(g);
}

static int grow(void **array, int *cap, int need, size_t elem) {
  if (need <= *cap) return 0;
  int cap2 = *cap ? *cap * 2 : 16;
  while (cap2 < need) cap2 *= 2;
  void *p = realloc(*array, (size_t)cap2 * elem);
  if (!p) return -1;
  *array = p;
  *cap = cap2;
  return 0;
}

static int find_name(const tt_graph *g, const char *name) {
  for (int i = 0; i < g->n_values; i++) {
    if (strcmp(g->values[i].name, name) == 0) return i;
  }
  return -1;
}

/* Adds a named value; returns its index or -1 (error recorded). */
static int add_value(tt_graph *g, const char *name, tt_graph_value_kind kind, tt_dtype dtype, const int64_t *shape, int ndim) {
  if (!name || !name[0]) return fail(g, TT_INVALID_ARGUMENT, "a graph value needs a non-empty name");
  if (find_name(g, name) >= 0) return fail(g, TT_INVALID_ARGUMENT, "the name '%s' is already used in this graph", name);
  if (ndim < 0 || ndim > TT_MAX_DIMS || (ndim && !shape)) {
    return fail(g, TT_INVALID_ARGUMENT, "'%s': ndim %d; use 0..%d with a shape", name, ndim, TT_MAX_DIMS);
  }
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0) return fail(g, TT_INVALID_ARGUMENT, "'%s': dim %d is %lld; dims must be >= 0", name, i, (long long)shape[i]);
  }
  if (grow((void **)&g->values, &g->cap_values, g->n_values + 1, sizeof(*g->values)) != 0) {
    return fail(g, TT_RESOURCE_EXHAUSTED, "out of host memory");
  }
  tt_graph_value *v = &g->values[g->n_values];
  memset(v, 0, sizeof(*v));
  v->name = strdup(name);
  if (!v->name) return fail(g, TT_RESOURCE_EXHAUSTED, "out of host memory");
  v->kind = kind;
  v->dtype = dtype;
  v->ndim = ndim;
  if (ndim) memcpy(v->shape, shape, sizeof(int64_t) * (size_t)ndim);
  return g->n_values++;
}

tt_value tt_graph_input(tt_graph *g, const char *name, tt_dtype dtype, const int64_t *shape, int ndim) {
  if (!g) return -1;
  if (tt_dtype_size(dtype) == 0) return fail(g, TT_INVALID_ARGUMENT, "input '%s': dtype %d is not supported", name, (int)dtype);
  return add_value(g, name, TT_GRAPH_INPUT, dtype, shape, ndim);
}

static double uniform01(tt_graph *g) {
  uint64_t z = (g->rng += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

/* fan_in and fan_out as torch computes them: dim 1 and dim 0 times the receptive field. */
static void fans(const int64_t *shape, int ndim, double *fan_in, double *fan_out) {
  double field = 1;
  for (int i = 2; i < ndim; i++) field *= (double)shape[i];
  *fan_in = ndim >= 2 ? (double)shape[1] * field : (ndim == 1 ? (double)shape[0] : 1);
  *fan_out = ndim >= 2 ? (double)shape[0] * field : (ndim == 1 ? (double)shape[0] : 1);
}

static int init_param(tt_graph *g, int index, tt_init init, double a, double fan_in_override) {
  tt_graph_value *v = &g->values[index];
  tt_tensor *t = tt_tensor_from_host(g->client, NULL, TT_FLOAT32, v->shape, v->ndim);
  if (!t) return -1;
  float *data = tt_tensor_data(t);
  uint64_t n = tt_tensor_numel(t);
  double fan_in, fan_out;
  fans(v->shape, v->ndim, &fan_in, &fan_out);
  if (fan_in_override > 0) fan_in = fan_in_override;
  double bound = 0;
  switch (init) {
    case TT_INIT_ZEROS: break;
    case TT_INIT_ONES: for (uint64_t i = 0; i < n; i++) data[i] = 1.0f; break;
    case TT_INIT_NORMAL:
      for (uint64_t i = 0; i < n; i++) {
        double u1 = uniform01(g), u2 = uniform01(g);
        data[i] = (float)(a * sqrt(-2.0 * log(u1 > 0 ? u1 : 1e-300)) * cos(2 * M_PI * u2));
      }
      break;
    case TT_INIT_UNIFORM: bound = a; break;
    case TT_INIT_KAIMING_UNIFORM: bound = sqrt(6.0 / ((1.0 + a * a) * fan_in)); break;
    case TT_INIT_XAVIER_UNIFORM: bound = (a > 0 ? a : 1.0) * sqrt(6.0 / (fan_in + fan_out)); break;
    default:
      tt_tensor_free(t);
      return fail(g, TT_INVALID_ARGUMENT, "parameter '%s': unknown initialiser %d", v->name, (int)init);
  }
  if (init == TT_INIT_UNIFORM || init == TT_INIT_KAIMING_UNIFORM || init == TT_INIT_XAVIER_UNIFORM) {
    for (uint64_t i = 0; i < n; i++) data[i] = (float)((uniform01(g) * 2.0 - 1.0) * bound);
  }
  v->init = t;
  return index;
}

tt_value tt_graph_param(tt_graph *g, const char *name, const int64_t *shape, int ndim, tt_init init, double a) {
  if (!g) return -1;
  int index = add_value(g, name, TT_GRAPH_PARAM, TT_FLOAT32, shape, ndim);
  return index < 0 ? -1 : init_param(g, index, init, a, 0);
}

tt_value tt_graph_param_from(tt_graph *g, const char *name, const tt_tensor *data) {
  if (!g) return -1;
  if (!data || !tt_tensor_is_host(data) || (tt_tensor_dtype(data) != TT_FLOAT32 && tt_tensor_dtype(data) != TT_BFLOAT16)) {
    return fail(g, TT_INVALID_ARGUMENT, "parameter '%s' needs a float32 or bfloat16 host tensor", name ? name : "");
  }
  int index = add_value(g, name, TT_GRAPH_PARAM, tt_tensor_dtype(data), tt_tensor_shape(data), tt_tensor_ndim(data));
  if (index < 0) return -1;
  g->values[index].init = tt_tensor_from_host(g->client, tt_tensor_data((tt_tensor *)data), tt_tensor_dtype(data),
                                              tt_tensor_shape(data), tt_tensor_ndim(data));
  return g->values[index].init ? index : -1;
}

/* Parses "k=v;k=[a,b];k=0.5" into node attributes. */
static int parse_attrs(tt_graph *g, Ttd__V1__Node *node, const char *attrs) {
  if (!attrs || !*attrs) return 0;
  char *copy = strdup(attrs);
  if (!copy) return fail(g, TT_RESOURCE_EXHAUSTED, "out of host memory");
  int rc = 0;
  char *save = NULL;
  for (char *item = strtok_r(copy, ";", &save); item && rc == 0; item = strtok_r(NULL, ";", &save)) {
    char *eq = strchr(item, '=');
    if (!eq || eq == item) {
      rc = fail(g, TT_INVALID_ARGUMENT, "%s: attribute '%s' must read name=value", node->op, item);
      break;
    }
    *eq = '\0';
    const char *value = eq + 1;
    Ttd__V1__Attr *a = calloc(1, sizeof(*a));
    Ttd__V1__Attr **list = realloc(node->attrs, sizeof(*list) * (node->n_attrs + 1));
    if (!a || !list) {
      free(a);
      if (list) node->attrs = list;
      rc = fail(g, TT_RESOURCE_EXHAUSTED, "out of host memory");
      break;
    }
    node->attrs = list;
    ttd__v1__attr__init(a);
    a->name = strdup(item);
    node->attrs[node->n_attrs++] = a;
    char *end = NULL;
    if (value[0] == '[') {
      a->value_case = TTD__V1__ATTR__VALUE_INTS;
      a->ints = calloc(1, sizeof(*a->ints));
      if (!a->ints) { rc = fail(g, TT_RESOURCE_EXHAUSTED, "out of host memory"); break; }
      ttd__v1__int_list__init(a->ints);
      a->ints->values = calloc(TT_MAX_DIMS, sizeof(int64_t));
      const char *p = value + 1;
      while (a->ints->values && *p && *p != ']' && a->ints->n_values < TT_MAX_DIMS) {
        a->ints->values[a->ints->n_values++] = strtoll(p, &end, 10);
        if (end == p) break;
        p = *end == ',' ? end + 1 : end;
      }
      if (*p != ']') rc = fail(g, TT_INVALID_ARGUMENT, "%s: attribute '%s' list must read [a,b,...] (at most 8)", node->op, item);
    } else if (strpbrk(value, ".eE")) {
      a->value_case = TTD__V1__ATTR__VALUE_F;
      a->f = strtof(value, &end);
      if (end == value || *end) rc = fail(g, TT_INVALID_ARGUMENT, "%s: attribute '%s' is not a number: '%s'", node->op, item, value);
    } else {
      a->value_case = TTD__V1__ATTR__VALUE_I;
      a->i = strtoll(value, &end, 10);
      if (end == value || *end) rc = fail(g, TT_INVALID_ARGUMENT, "%s: attribute '%s' is not a number: '%s'", node->op, item, value);
    }
  }
  free(copy);
  return rc;
}

static void type_of(const tt_graph_value *v, ttd_value_type *out) {
  out->dtype = (ttd_dtype)v->dtype;
  out->shape.ndim = v->ndim;
  memcpy(out->shape.d, v->shape, sizeof(int64_t) * (size_t)v->ndim);
}

tt_value tt_graph_op(tt_graph *g, const char *op, const tt_value *inputs, int n_inputs, const char *attrs) {
  if (!g) return -1;
  for (int i = 0; i < n_inputs; i++) {
    if (inputs[i] < 0 || inputs[i] >= g->n_values) return -1; /* an earlier error: already reported */
  }
  int op_index = ttd_op_lookup(op ? op : "");
  if (op_index < 0) return fail(g, TT_INVALID_ARGUMENT, "unknown op '%s'", op ? op : "(null)");
  if (n_inputs < 0 || n_inputs > 3) return fail(g, TT_INVALID_ARGUMENT, "%s: %d inputs; ops take 1 to 3", op, n_inputs);
  char name[64];
  int count = 0;
  do snprintf(name, sizeof(name), "%s%d", op, ++count); while (find_name(g, name) >= 0);
  Ttd__V1__Node *node = calloc(1, sizeof(*node));
  if (!node) return fail(g, TT_RESOURCE_EXHAUSTED, "out of host memory");
  ttd__v1__node__init(node);
  node->name = strdup(name);
  node->op = strdup(op);
  node->inputs = calloc(3, sizeof(char *));
  for (int i = 0; node->inputs && i < n_inputs; i++) node->inputs[node->n_inputs++] = strdup(g->values[inputs[i]].name);
  if (!node->name || !node->op || !node->inputs) {
    free_node(node);
    return fail(g, TT_RESOURCE_EXHAUSTED, "out of host memory");
  }
  if (parse_attrs(g, node, attrs) != 0) {
    free_node(node);
    return -1;
  }
  ttd_value_type types[3], out;
  const ttd_value_type *ptrs[3];
  for (int i = 0; i < n_inputs; i++) {
    type_of(&g->values[inputs[i]], &types[i]);
    ptrs[i] = &types[i];
  }
  ttd_op_attrs parsed;
  ttd_status_t s = ttd_op_infer((ttd_op)op_index, node, ptrs, n_inputs, &parsed, &out);
  if (s) {
    tt_client_fail_status(g->client, s);
    free_node(node);
    return -1;
  }
  if (grow((void **)&g->nodes, &g->cap_nodes, g->n_nodes + 1, sizeof(*g->nodes)) != 0) {
    free_node(node);
    return fail(g, TT_RESOURCE_EXHAUSTED, "out of host memory");
  }
  int index = add_value(g, name, TT_GRAPH_NODE, (tt_dtype)out.dtype, out.shape.d, out.shape.ndim);
  if (index < 0) {
    free_node(node);
    return -1;
  }
  g->nodes[g->n_nodes++] = node;
  return index;
}

int tt_graph_output(tt_graph *g, tt_value value) {
  if (!g || value < 0 || value >= g->n_values) return -1;
  if (grow((void **)&g->outputs, &g->cap_outputs, g->n_outputs + 1, sizeof(int)) != 0) {
    return fail(g, TT_RESOURCE_EXHAUSTED, "out of host memory");
  }
  g->outputs[g->n_outputs++] = value;
  return 0;
}

int tt_graph_output_count(const tt_graph *g) { return g ? g->n_outputs : -1; }

int tt_graph_shape(const tt_graph *g, tt_value value, int64_t *out_shape, int *out_ndim) {
  if (!g || value < 0 || value >= g->n_values) return -1;
  *out_ndim = g->values[value].ndim;
  memcpy(out_shape, g->values[value].shape, sizeof(int64_t) * (size_t)g->values[value].ndim);
  return 0;
}

/* "<kind><n>.<part>" for layer parameters. */
static void layer_name(tt_graph *g, layer_kind kind, const char *prefix, const char *part, char *buf, size_t len, int advance) {
  if (advance) g->layer_count[kind]++;
  snprintf(buf, len, "%s%d.%s", prefix, g->layer_count[kind], part);
}

tt_value tt_nn_linear(tt_graph *g, tt_value x, int64_t out_features, int bias) {
  if (!g || x < 0 || x >= g->n_values) return -1;
  const tt_graph_value *xv = &g->values[x];
  if (xv->ndim < 1) return fail(g, TT_INVALID_ARGUMENT, "linear needs an input with at least 1 dim");
  int64_t in = xv->shape[xv->ndim - 1];
  char wname[64], bname[64];
  layer_name(g, LAYER_LINEAR, "linear", "weight", wname, sizeof(wname), 1);
  layer_name(g, LAYER_LINEAR, "linear", "bias", bname, sizeof(bname), 0);
  int64_t wshape[2] = {out_features, in};
  tt_value w = tt_graph_param(g, wname, wshape, 2, TT_INIT_KAIMING_UNIFORM, sqrt(5.0));
  tt_value ins[3] = {x, w, -1};
  if (bias) {
    int idx = add_value(g, bname, TT_GRAPH_PARAM, TT_FLOAT32, &out_features, 1);
    ins[2] = idx < 0 ? -1 : init_param(g, idx, TT_INIT_UNIFORM, 1.0 / sqrt((double)(in ? in : 1)), 0);
  }
  return tt_graph_op(g, "linear", ins, bias ? 3 : 2, NULL);
}

tt_value tt_nn_conv2d(tt_graph *g, tt_value x, int64_t out_channels, int64_t kernel, int64_t stride, int64_t padding,
                      int bias) {
  if (!g || x < 0 || x >= g->n_values) return -1;
  const tt_graph_value *xv = &g->values[x];
  if (xv->ndim != 4) return fail(g, TT_INVALID_ARGUMENT, "conv2d needs an [n, c, h, w] input, got %d dims", xv->ndim);
  int64_t c_in = xv->shape[1];
  char wname[64], bname[64], attrs[64];
  layer_name(g, LAYER_CONV, "conv", "weight", wname, sizeof(wname), 1);
  layer_name(g, LAYER_CONV, "conv", "bias", bname, sizeof(bname), 0);
  int64_t wshape[4] = {out_channels, c_in, kernel, kernel};
  tt_value w = tt_graph_param(g, wname, wshape, 4, TT_INIT_KAIMING_UNIFORM, sqrt(5.0));
  tt_value ins[3] = {x, w, -1};
  if (bias) {
    int idx = add_value(g, bname, TT_GRAPH_PARAM, TT_FLOAT32, &out_channels, 1);
    ins[2] = idx < 0 ? -1 : init_param(g, idx, TT_INIT_UNIFORM, 1.0 / sqrt((double)(c_in * kernel * kernel)), 0);
  }
  snprintf(attrs, sizeof(attrs), "stride=%lld;padding=%lld", (long long)stride, (long long)padding);
  return tt_graph_op(g, "conv2d", ins, bias ? 3 : 2, attrs);
}

tt_value tt_nn_layer_norm(tt_graph *g, tt_value x, double eps) {
  if (!g || x < 0 || x >= g->n_values) return -1;
  const tt_graph_value *xv = &g->values[x];
  if (xv->ndim < 1) return fail(g, TT_INVALID_ARGUMENT, "layer_norm needs an input with at least 1 dim");
  int64_t d = xv->shape[xv->ndim - 1];
  char wname[64], bname[64], attrs[48];
  layer_name(g, LAYER_NORM, "norm", "weight", wname, sizeof(wname), 1);
  layer_name(g, LAYER_NORM, "norm", "bias", bname, sizeof(bname), 0);
  tt_value ins[3] = {x, tt_graph_param(g, wname, &d, 1, TT_INIT_ONES, 0), tt_graph_param(g, bname, &d, 1, TT_INIT_ZEROS, 0)};
  snprintf(attrs, sizeof(attrs), "eps=%.9e", eps);
  return tt_graph_op(g, "layer_norm", ins, 3, attrs);
}

tt_value tt_relu(tt_graph *g, tt_value x) { return tt_graph_op(g, "relu", &x, 1, NULL); }
