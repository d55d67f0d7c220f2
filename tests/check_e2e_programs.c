/* Programs through a real ttd: a valid graph gets a program handle with inferred output
 * shapes, the same graph is served from the cache, every malformed graph is
 * INVALID_ARGUMENT naming the node and the reason; Execute runs it on device tensors and
 * matches a host reference, and bad operands get precise errors. */
#include <check.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "raw_rpc.h"
#include "suites.h"
#include "ttd/v1/ttd.pb-c.h"
#include "ttd_harness.h"

static ttd_proc proc;
static char session[17], instance[40];

static void setup(void) {
  ttd_proc_start(&proc, NULL);
  raw_open_session(proc.target, session, instance);
}

static void teardown(void) {
  ck_assert_msg(ttd_proc_alive(&proc), "ttd died; see %s", proc.log_path);
  ck_assert_int_eq(ttd_proc_stop(&proc), 0);
}

/* A small graph under construction: fixed-size storage, no allocation. */
typedef struct gb {
  Ttd__V1__Graph graph;
  Ttd__V1__ValueSpec specs[8], *inputs[8], *params[8];
  int64_t dims[8][4];
  Ttd__V1__Node nodes[8], *node_ptrs[8];
  char *node_inputs[8][3];
  Ttd__V1__Attr attrs[8], *attr_ptrs[8][1];
  Ttd__V1__IntList lists[8];
  int64_t list_values[8][4];
  char *outputs[4];
  int n_specs;
} gb;

static void gb_init(gb *b) {
  memset(b, 0, sizeof(*b));
  ttd__v1__graph__init(&b->graph);
  b->graph.inputs = b->inputs;
  b->graph.parameters = b->params;
  b->graph.nodes = b->node_ptrs;
  b->graph.outputs = b->outputs;
}

static void gb_value(gb *b, int param, const char *name, int dtype, int ndim, int64_t d0, int64_t d1) {
  Ttd__V1__ValueSpec *s = &b->specs[b->n_specs];
  ttd__v1__value_spec__init(s);
  s->name = (char *)name;
  s->dtype = dtype;
  s->n_shape = (size_t)ndim;
  b->dims[b->n_specs][0] = d0;
  b->dims[b->n_specs][1] = d1;
  s->shape = b->dims[b->n_specs++];
  if (param) b->params[b->graph.n_parameters++] = s;
  else b->inputs[b->graph.n_inputs++] = s;
}

static Ttd__V1__Node *gb_node(gb *b, const char *name, const char *op, const char *in0, const char *in1, const char *in2) {
  int i = (int)b->graph.n_nodes++;
  Ttd__V1__Node *n = &b->nodes[i];
  ttd__v1__node__init(n);
  n->name = (char *)name;
  n->op = (char *)op;
  const char *ins[3] = {in0, in1, in2};
  for (int k = 0; k < 3 && ins[k]; k++) b->node_inputs[i][n->n_inputs++] = (char *)ins[k];
  n->inputs = b->node_inputs[i];
  b->node_ptrs[i] = n;
  return n;
}

static void gb_attr_int(gb *b, Ttd__V1__Node *n, const char *name, int64_t v) {
  int i = (int)(n - b->nodes);
  ttd__v1__attr__init(&b->attrs[i]);
  b->attrs[i].name = (char *)name;
  b->attrs[i].value_case = TTD__V1__ATTR__VALUE_I;
  b->attrs[i].i = v;
  b->attr_ptrs[i][0] = &b->attrs[i];
  n->n_attrs = 1;
  n->attrs = b->attr_ptrs[i];
}

static void gb_output(gb *b, const char *name) { b->outputs[b->graph.n_outputs++] = (char *)name; }

/* The MLP of the examples: x[64,784] -> linear 512 -> relu -> linear 10. */
static void mlp(gb *b) {
  gb_init(b);
  gb_value(b, 0, "x", TTD__V1__DTYPE__DTYPE_FLOAT32, 2, 64, 784);
  gb_value(b, 1, "w1", TTD__V1__DTYPE__DTYPE_FLOAT32, 2, 512, 784);
  gb_value(b, 1, "b1", TTD__V1__DTYPE__DTYPE_FLOAT32, 1, 512, 0);
  gb_value(b, 1, "w2", TTD__V1__DTYPE__DTYPE_FLOAT32, 2, 10, 512);
  gb_value(b, 1, "b2", TTD__V1__DTYPE__DTYPE_FLOAT32, 1, 10, 0);
  /* Deliberately out of order: the daemon sorts. */
  gb_node(b, "logits", "linear", "h", "w2", "b2");
  gb_node(b, "h", "relu", "z", NULL, NULL);
  gb_node(b, "z", "linear", "x", "w1", "b1");
  gb_output(b, "logits");
}

static Ttd__V1__CompileResponse *compile(gb *b, int want_code, const char *needle) {
  Ttd__V1__CompileRequest req = TTD__V1__COMPILE_REQUEST__INIT;
  req.graph = &b->graph;
  size_t len = ttd__v1__compile_request__get_packed_size(&req);
  unsigned char *buf = malloc(len);
  ttd__v1__compile_request__pack(&req, buf);
  raw_result r;
  raw_call(proc.target, "/ttd.v1.Device/Compile", (raw_md){session, instance}, buf, len, &r);
  free(buf);
  ck_assert_msg(r.code == want_code, "expected code %d, got %d: %s", want_code, r.code, r.details);
  if (needle) ck_assert_msg(strstr(r.details, needle) != NULL, "message '%s' lacks '%s'", r.details, needle);
  Ttd__V1__CompileResponse *resp = NULL;
  if (r.code == 0) resp = ttd__v1__compile_response__unpack(NULL, r.body_len, r.body);
  raw_result_free(&r);
  return resp;
}

/* A valid MLP compiles: parameters listed in order and the output shape inferred [64, 10];
 * compiling it again is served from the cache with a new handle. */
START_TEST(test_compile_mlp_and_cache) {
  gb b;
  mlp(&b);
  Ttd__V1__CompileResponse *r1 = compile(&b, 0, NULL);
  ck_assert_ptr_nonnull(r1);
  ck_assert_uint_ne(r1->program, 0);
  ck_assert_int_eq(r1->cached, 0);
  ck_assert_uint_eq(r1->n_parameters, 4);
  ck_assert_str_eq(r1->parameters[2]->name, "w2");
  ck_assert_uint_eq(r1->n_outputs, 1);
  ck_assert_str_eq(r1->outputs[0]->name, "logits");
  ck_assert_uint_eq(r1->outputs[0]->n_shape, 2);
  ck_assert_int_eq(r1->outputs[0]->shape[0], 64);
  ck_assert_int_eq(r1->outputs[0]->shape[1], 10);
  Ttd__V1__CompileResponse *r2 = compile(&b, 0, NULL);
  ck_assert_int_eq(r2->cached, 1);
  ck_assert_uint_ne(r2->program, r1->program);
  ttd__v1__compile_response__free_unpacked(r1, NULL);
  ttd__v1__compile_response__free_unpacked(r2, NULL);
}
END_TEST

/* A LeNet-style conv stack infers conv, pool and flatten shapes. */
START_TEST(test_compile_conv_shapes) {
  gb b;
  gb_init(&b);
  gb_value(&b, 0, "img", TTD__V1__DTYPE__DTYPE_FLOAT32, 2, 1, 1); /* reshaped below to 4-D */
  b.specs[0].n_shape = 4;
  int64_t img[4] = {8, 1, 28, 28};
  b.specs[0].shape = img;
  gb_value(&b, 1, "k", TTD__V1__DTYPE__DTYPE_FLOAT32, 2, 1, 1);
  b.specs[1].n_shape = 4;
  int64_t k[4] = {6, 1, 5, 5};
  b.specs[1].shape = k;
  Ttd__V1__Node *c = gb_node(&b, "c", "conv2d", "img", "k", NULL);
  gb_attr_int(&b, c, "padding", 2);
  Ttd__V1__Node *p = gb_node(&b, "p", "max_pool2d", "c", NULL, NULL);
  gb_attr_int(&b, p, "kernel", 2);
  gb_node(&b, "f", "flatten", "p", NULL, NULL);
  gb_output(&b, "f");
  Ttd__V1__CompileResponse *r = compile(&b, 0, NULL);
  ck_assert_int_eq(r->outputs[0]->shape[0], 8);
  ck_assert_int_eq(r->outputs[0]->shape[1], 6 * 14 * 14);
  ttd__v1__compile_response__free_unpacked(r, NULL);
}
END_TEST

/* Every malformed graph is INVALID_ARGUMENT naming the node and the reason. */
START_TEST(test_bad_graphs) {
  gb b;
  mlp(&b);
  b.nodes[1].inputs[0] = "logits"; /* h reads logits, which reads h: a cycle */
  compile(&b, 3, "part of a cycle");
  mlp(&b);
  b.nodes[1].inputs[0] = "h"; /* a node reading itself */
  compile(&b, 3, "node 'h' is part of a cycle");
  mlp(&b);
  b.nodes[1].inputs[0] = "nowhere";
  compile(&b, 3, "input 'nowhere' names no graph input, parameter or node");
  mlp(&b);
  b.nodes[1].op = "frobnicate";
  compile(&b, 3, "node 'h': unknown op 'frobnicate'");
  mlp(&b);
  b.specs[1].shape[1] = 783; /* w1 no longer fits x */
  compile(&b, 3, "node 'z' (linear): x [64, 784] and weight [512, 783] do not fit");
  mlp(&b);
  b.nodes[1].n_inputs = 2;
  b.node_inputs[1][1] = "x";
  compile(&b, 3, "node 'h' (relu): takes 1 inputs, got 2");
  mlp(&b);
  gb_attr_int(&b, &b.nodes[1], "slope", 2);
  compile(&b, 3, "unknown attribute 'slope'");
  mlp(&b);
  b.nodes[2].name = "x";
  compile(&b, 3, "the name 'x' is used twice");
  mlp(&b);
  b.outputs[0] = "missing";
  compile(&b, 3, "output 'missing' names no value");
  mlp(&b);
  b.graph.n_outputs = 0;
  compile(&b, 3, "no outputs");
  mlp(&b);
  b.specs[0].dtype = TTD__V1__DTYPE__DTYPE_INT32; /* an int32 x into linear */
  compile(&b, 3, "node 'z' (linear): input 0 must be floating point, got int32");
  mlp(&b);
  b.specs[0].shape[0] = -4;
  compile(&b, 3, "input 'x'");
  gb_init(&b);
  gb_value(&b, 0, "logits", TTD__V1__DTYPE__DTYPE_FLOAT32, 2, 4, 10);
  gb_value(&b, 0, "labels", TTD__V1__DTYPE__DTYPE_FLOAT32, 1, 4, 0);
  gb_node(&b, "loss", "cross_entropy", "logits", "labels", NULL);
  gb_output(&b, "loss");
  compile(&b, 3, "labels must be int32");
  /* Garbage instead of a graph. */
  raw_result r;
  raw_call(proc.target, "/ttd.v1.Device/Compile", (raw_md){session, instance}, "\x0a\x05\x0a\x03", 4, &r);
  ck_assert_int_eq(r.code, 3);
  raw_result_free(&r);
}
END_TEST

/* Runs program with operand handles; returns the response or NULL, asserting the code. */
static Ttd__V1__ExecuteResponse *execute(uint64_t program, const uint64_t *in, size_t n_in, const uint64_t *params,
                                         size_t n_params, int want_code, const char *needle) {
  Ttd__V1__ExecuteRequest req = TTD__V1__EXECUTE_REQUEST__INIT;
  req.program = program;
  req.inputs = (uint64_t *)in;
  req.n_inputs = n_in;
  req.parameters = (uint64_t *)params;
  req.n_parameters = n_params;
  unsigned char buf[512];
  size_t len = ttd__v1__execute_request__pack(&req, buf);
  raw_result r;
  raw_call(proc.target, "/ttd.v1.Device/Execute", (raw_md){session, instance}, buf, len, &r);
  ck_assert_msg(r.code == want_code, "expected code %d, got %d: %s", want_code, r.code, r.details);
  if (needle) ck_assert_msg(strstr(r.details, needle) != NULL, "message '%s' lacks '%s'", r.details, needle);
  Ttd__V1__ExecuteResponse *resp = NULL;
  if (r.code == 0) resp = ttd__v1__execute_response__unpack(NULL, r.body_len, r.body);
  raw_result_free(&r);
  return resp;
}

/* Uploads host floats (or int32) with raw calls into this test's session. */
static uint64_t upload(const void *data, int dtype, int ndim, int64_t d0, int64_t d1, const char *device) {
  Ttd__V1__TensorSpec spec = TTD__V1__TENSOR_SPEC__INIT;
  int64_t shape[2] = {d0, d1};
  spec.dtype = dtype;
  spec.n_shape = (size_t)ndim;
  spec.shape = shape;
  spec.device = (char *)device;
  Ttd__V1__UploadHeader header = TTD__V1__UPLOAD_HEADER__INIT;
  header.target_case = TTD__V1__UPLOAD_HEADER__TARGET_SPEC;
  header.spec = &spec;
  Ttd__V1__UploadRequest req = TTD__V1__UPLOAD_REQUEST__INIT;
  req.header = &header;
  req.data.data = (uint8_t *)data;
  req.data.len = (size_t)(d0 * (ndim > 1 ? d1 : 1)) * 4;
  size_t len = ttd__v1__upload_request__get_packed_size(&req);
  unsigned char *msg = malloc(len);
  ttd__v1__upload_request__pack(&req, msg);
  const void *msgs[1] = {msg};
  raw_result r;
  raw_stream(proc.target, "/ttd.v1.Device/Upload", (raw_md){session, instance}, msgs, &len, 1, 0, &r);
  free(msg);
  ck_assert_msg(r.code == 0, "upload: %s", r.details);
  Ttd__V1__UploadResponse *resp = ttd__v1__upload_response__unpack(NULL, r.body_len, r.body);
  uint64_t h = resp->tensor->handle;
  ttd__v1__upload_response__free_unpacked(resp, NULL);
  raw_result_free(&r);
  return h;
}

static void download(uint64_t handle, float *out, size_t n) {
  Ttd__V1__DownloadRequest req = TTD__V1__DOWNLOAD_REQUEST__INIT;
  req.handle = handle;
  unsigned char buf[64];
  size_t len = ttd__v1__download_request__pack(&req, buf);
  raw_result r;
  raw_call(proc.target, "/ttd.v1.Device/Download", (raw_md){session, instance}, buf, len, &r);
  ck_assert_msg(r.code == 0, "download: %s", r.details);
  Ttd__V1__DownloadResponse *resp = ttd__v1__download_response__unpack(NULL, r.body_len, r.body);
  ck_assert_uint_eq(resp->data.len, n * 4);
  memcpy(out, resp->data.data, n * 4);
  ttd__v1__download_response__free_unpacked(resp, NULL);
  raw_result_free(&r);
}

static void fill(float *v, int n, unsigned seed) {
  for (int i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    v[i] = (float)((seed >> 8) % 2001) / 1000.0f - 1.0f;
  }
}

/* A small MLP (linear, relu, linear) and its cross-entropy loss run on the device and
 * match a direct host computation; outputs are new tensors of the session. */
START_TEST(test_execute_mlp_matches_reference) {
  enum { N = 4, IN = 5, H = 3, OUT = 2 };
  float x[N * IN], w1[H * IN], b1[H], w2[OUT * H], b2[OUT];
  int32_t labels[N] = {0, 1, 1, 0};
  fill(x, N * IN, 1);
  fill(w1, H * IN, 2);
  fill(b1, H, 3);
  fill(w2, OUT * H, 4);
  fill(b2, OUT, 5);
  gb b;
  gb_init(&b);
  gb_value(&b, 0, "x", TTD__V1__DTYPE__DTYPE_FLOAT32, 2, N, IN);
  gb_value(&b, 0, "labels", TTD__V1__DTYPE__DTYPE_INT32, 1, N, 0);
  gb_value(&b, 1, "w1", TTD__V1__DTYPE__DTYPE_FLOAT32, 2, H, IN);
  gb_value(&b, 1, "b1", TTD__V1__DTYPE__DTYPE_FLOAT32, 1, H, 0);
  gb_value(&b, 1, "w2", TTD__V1__DTYPE__DTYPE_FLOAT32, 2, OUT, H);
  gb_value(&b, 1, "b2", TTD__V1__DTYPE__DTYPE_FLOAT32, 1, OUT, 0);
  gb_node(&b, "z", "linear", "x", "w1", "b1");
  gb_node(&b, "h", "relu", "z", NULL, NULL);
  gb_node(&b, "logits", "linear", "h", "w2", "b2");
  gb_node(&b, "loss", "cross_entropy", "logits", "labels", NULL);
  gb_output(&b, "logits");
  gb_output(&b, "loss");
  Ttd__V1__CompileResponse *c = compile(&b, 0, NULL);
  uint64_t in[2] = {upload(x, 1, 2, N, IN, "tt:0"), upload(labels, 3, 1, N, 0, "tt:0")};
  uint64_t params[4] = {upload(w1, 1, 2, H, IN, "tt:0"), upload(b1, 1, 1, H, 0, "tt:0"), upload(w2, 1, 2, OUT, H, "tt:0"),
                        upload(b2, 1, 1, OUT, 0, "tt:0")};
  Ttd__V1__ExecuteResponse *r = execute(c->program, in, 2, params, 4, 0, NULL);
  ck_assert_uint_eq(r->n_outputs, 2);
  ck_assert_int_eq(r->outputs[0]->spec->shape[1], OUT);
  ck_assert_uint_eq(r->outputs[1]->spec->n_shape, 0);
  float logits[N * OUT], loss;
  download(r->outputs[0]->handle, logits, N * OUT);
  download(r->outputs[1]->handle, &loss, 1);
  double want_loss = 0;
  for (int i = 0; i < N; i++) {
    double h[H], l[OUT], mx = -1e30, se = 0;
    for (int j = 0; j < H; j++) {
      double z = b1[j];
      for (int k = 0; k < IN; k++) z += (double)x[i * IN + k] * w1[j * IN + k];
      h[j] = z > 0 ? z : 0;
    }
    for (int o = 0; o < OUT; o++) {
      l[o] = b2[o];
      for (int j = 0; j < H; j++) l[o] += h[j] * w2[o * H + j];
      ck_assert_msg(fabs(l[o] - logits[i * OUT + o]) < 1e-5, "logit %d,%d: %g vs %g", i, o, l[o], logits[i * OUT + o]);
      mx = fmax(mx, l[o]);
    }
    for (int o = 0; o < OUT; o++) se += exp(l[o] - mx);
    want_loss += -(l[labels[i]] - mx - log(se)) / N;
  }
  ck_assert_msg(fabs(want_loss - loss) < 1e-5, "loss %g vs %g", loss, want_loss);
  ttd__v1__execute_response__free_unpacked(r, NULL);

  /* Bad operands: counts, shape, dtype, unknown handles, bad labels. */
  execute(c->program, in, 1, params, 4, 3, "takes 2 inputs and 4 parameters, got 1 and 4");
  uint64_t swapped[2] = {in[1], in[0]};
  execute(c->program, swapped, 2, params, 4, 3, "input 'x' must be float32 [4, 5], got int32 [4]");
  uint64_t wrong_params[4] = {params[2], params[1], params[0], params[3]};
  execute(c->program, in, 2, wrong_params, 4, 3, "parameter 'w1' must be float32 [3, 5], got float32 [2, 3]");
  uint64_t forged[2] = {in[0], 0x1234};
  execute(c->program, forged, 2, params, 4, 5, "not found in this session");
  execute(0x4242, in, 2, params, 4, 5, "program 0x0000000000004242 not found");
  int32_t bad_labels[N] = {0, 1, 7, 0};
  uint64_t bad_in[2] = {in[0], upload(bad_labels, 3, 1, N, 0, "tt:0")};
  execute(c->program, bad_in, 2, params, 4, 3, "label at position 2 is 7; it must lie in [0, 2)");
  ttd__v1__compile_response__free_unpacked(c, NULL);
  /* Closing the session returns every byte: inputs, parameters, outputs, nothing else left. */
  raw_result cr;
  raw_call(proc.target, "/ttd.v1.Device/CloseSession", (raw_md){session, instance}, "", 0, &cr);
  ck_assert_int_eq(cr.code, 0);
  raw_result_free(&cr);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 0);
}
END_TEST

Suite *e2e_programs_suite(void) {
  Suite *s = suite_create("e2e_programs");
  TCase *tc = tcase_create("compile");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_compile_mlp_and_cache);
  tcase_add_test(tc, test_compile_conv_shapes);
  tcase_add_test(tc, test_bad_graphs);
  tcase_add_test(tc, test_execute_mlp_matches_reference);
  suite_add_tcase(s, tc);
  return s;
}
