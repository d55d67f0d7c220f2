#include "graph_builder.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "raw_rpc.h"

void gb_init(graph_builder *b) {
  memset(b, 0, sizeof(*b));
  ttd__v1__graph__init(&b->graph);
  b->graph.inputs = b->inputs;
  b->graph.parameters = b->params;
  b->graph.nodes = b->node_ptrs;
  b->graph.outputs = b->outputs;
}

void gb_value(graph_builder *b, int param, const char *name, int dtype, int ndim, int64_t d0, int64_t d1,
                     int64_t d2, int64_t d3) {
  Ttd__V1__ValueSpec *s = &b->specs[b->n_specs];
  ttd__v1__value_spec__init(s);
  s->name = (char *)name;
  s->dtype = dtype;
  s->n_shape = (size_t)ndim;
  int64_t *d = b->dims[b->n_specs++];
  d[0] = d0, d[1] = d1, d[2] = d2, d[3] = d3;
  s->shape = d;
  if (param) b->params[b->graph.n_parameters++] = s;
  else b->inputs[b->graph.n_inputs++] = s;
}

Ttd__V1__Node *gb_node(graph_builder *b, const char *name, const char *op, const char *in0, const char *in1,
                              const char *in2) {
  int i = (int)b->graph.n_nodes++;
  Ttd__V1__Node *n = &b->nodes[i];
  ttd__v1__node__init(n);
  n->name = (char *)name;
  n->op = (char *)op;
  const char *ins[3] = {in0, in1, in2};
  for (int k = 0; k < 3 && ins[k]; k++) b->node_inputs[i][n->n_inputs++] = (char *)ins[k];
  n->inputs = b->node_inputs[i];
  n->attrs = b->attr_ptrs[i];
  b->node_ptrs[i] = n;
  return n;
}

static Ttd__V1__Attr *gb_attr(graph_builder *b, Ttd__V1__Node *n, const char *name) {
  int i = (int)(n - b->nodes);
  Ttd__V1__Attr *a = &b->attrs[i][n->n_attrs];
  ttd__v1__attr__init(a);
  a->name = (char *)name;
  b->attr_ptrs[i][n->n_attrs++] = a;
  return a;
}

void gb_int(graph_builder *b, Ttd__V1__Node *n, const char *name, int64_t v) {
  Ttd__V1__Attr *a = gb_attr(b, n, name);
  a->value_case = TTD__V1__ATTR__VALUE_I;
  a->i = v;
}

void gb_float(graph_builder *b, Ttd__V1__Node *n, const char *name, float v) {
  Ttd__V1__Attr *a = gb_attr(b, n, name);
  a->value_case = TTD__V1__ATTR__VALUE_F;
  a->f = v;
}


void gb_output(graph_builder *b, const char *name) { b->outputs[b->graph.n_outputs++] = (char *)name; }

Ttd__V1__CompileResponse *gb_compile(graph_builder *b, const char *target, const char *session, int want_code,
                                     const char *needle) {
  Ttd__V1__CompileRequest req = TTD__V1__COMPILE_REQUEST__INIT;
  req.graph = &b->graph;
  size_t len = ttd__v1__compile_request__get_packed_size(&req);
  unsigned char *buf = malloc(len);
  ttd__v1__compile_request__pack(&req, buf);
  raw_result r;
  raw_call(target, "/ttd.v1.Device/Compile", (raw_md){.session = session}, buf, len, &r);
  free(buf);
  ck_assert_msg(r.code == want_code, "expected code %d, got %d: %s", want_code, r.code, r.details);
  if (needle) ck_assert_msg(strstr(r.details, needle) != NULL, "message '%s' lacks '%s'", r.details, needle);
  Ttd__V1__CompileResponse *resp = NULL;
  if (r.code == 0) resp = ttd__v1__compile_response__unpack(NULL, r.body_len, r.body);
  raw_result_free(&r);
  return resp;
}

uint64_t gb_compile_relu(const char *target, const char *session, int ndim, int64_t d0, int64_t d1) {
  graph_builder b;
  gb_init(&b);
  gb_value(&b, 0, "x", TTD__V1__DTYPE__DTYPE_FLOAT32, ndim, d0, d1, 0, 0);
  gb_node(&b, "r", "relu", "x", NULL, NULL);
  gb_output(&b, "r");
  Ttd__V1__CompileResponse *c = gb_compile(&b, target, session, 0, NULL);
  uint64_t program = c->program;
  ttd__v1__compile_response__free_unpacked(c, NULL);
  return program;
}
