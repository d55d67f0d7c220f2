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
#include "graph_builder.h"
#include "suites.h"
#include "ttd/v1/ttd.pb-c.h"
#include "ttd_harness.h"

static ttd_proc proc;
static char session[17], instance[40];

static void setup(void) {
  const char *args[] = {"--devices", "2", NULL};
  ttd_proc_start(&proc, args);
  raw_open_session(proc.target, session, instance);
}

static void teardown(void) {
  ck_assert_msg(ttd_proc_alive(&proc), "ttd died; see %s", proc.log_path);
  ck_assert_int_eq(ttd_proc_stop(&proc), 0);
}


/* The MLP of the examples: x[64,784] -> linear 512 -> relu -> linear 10. */
static void mlp(graph_builder *b) {
  gb_init(b);
  gb_value(b, 0, "x", TTD__V1__DTYPE__DTYPE_FLOAT32, 2, 64, 784, 0, 0);
  gb_value(b, 1, "w1", TTD__V1__DTYPE__DTYPE_FLOAT32, 2, 512, 784, 0, 0);
  gb_value(b, 1, "b1", TTD__V1__DTYPE__DTYPE_FLOAT32, 1, 512, 0, 0, 0);
  gb_value(b, 1, "w2", TTD__V1__DTYPE__DTYPE_FLOAT32, 2, 10, 512, 0, 0);
  gb_value(b, 1, "b2", TTD__V1__DTYPE__DTYPE_FLOAT32, 1, 10, 0, 0, 0);
  /* Deliberately out of order: the daemon sorts. */
  gb_node(b, "logits", "linear", "h", "w2", "b2");
  gb_node(b, "h", "relu", "z", NULL, NULL);
  gb_node(b, "z", "linear", "x", "w1", "b1");
  gb_output(b, "logits");
}


/* x [n, in] -> linear h -> act -> linear out = logits; loss = cross_entropy(logits, labels).
 * Inputs x and int32 labels; parameters w1, b1, w2, b2. No outputs yet. */
static void two_layer_graph(graph_builder *b, int64_t n, int64_t in, int64_t h, int64_t out, const char *act) {
  gb_init(b);
  gb_value(b, 0, "x", TTD__V1__DTYPE__DTYPE_FLOAT32, 2, n, in, 0, 0);
  gb_value(b, 0, "labels", TTD__V1__DTYPE__DTYPE_INT32, 1, n, 0, 0, 0);
  gb_value(b, 1, "w1", TTD__V1__DTYPE__DTYPE_FLOAT32, 2, h, in, 0, 0);
  gb_value(b, 1, "b1", TTD__V1__DTYPE__DTYPE_FLOAT32, 1, h, 0, 0, 0);
  gb_value(b, 1, "w2", TTD__V1__DTYPE__DTYPE_FLOAT32, 2, out, h, 0, 0);
  gb_value(b, 1, "b2", TTD__V1__DTYPE__DTYPE_FLOAT32, 1, out, 0, 0, 0);
  gb_node(b, "z", "linear", "x", "w1", "b1");
  gb_node(b, "h", act, "z", NULL, NULL);
  gb_node(b, "logits", "linear", "h", "w2", "b2");
  gb_node(b, "loss", "cross_entropy", "logits", "labels", NULL);
}

static Ttd__V1__CompileResponse *compile(graph_builder *b, int want_code, const char *needle) {
  return gb_compile(b, proc.target, session, want_code, needle);
}

/* A valid MLP compiles: parameters listed in order and the output shape inferred [64, 10];
 * compiling it again is served from the cache, under the same handle of the session. */
START_TEST(test_compile_mlp_and_cache) {
  graph_builder b;
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
  ck_assert_uint_eq(r2->program, r1->program);
  ttd__v1__compile_response__free_unpacked(r1, NULL);
  ttd__v1__compile_response__free_unpacked(r2, NULL);
}
END_TEST

/* A session holds at most TTD_SESSION_MAX_PROGRAMS distinct programs: one more is
 * RESOURCE_EXHAUSTED naming the bound, while one it holds still compiles (to its handle). */
START_TEST(test_programs_per_session_bounded) {
  uint64_t first = gb_compile_relu(proc.target, session, 1, 1, 0);
  for (int64_t n = 2; n <= 256; n++) gb_compile_relu(proc.target, session, 1, n, 0);
  graph_builder b;
  gb_init(&b);
  gb_value(&b, 0, "x", TTD__V1__DTYPE__DTYPE_FLOAT32, 1, 257, 0, 0, 0);
  gb_node(&b, "y", "relu", "x", NULL, NULL);
  gb_output(&b, "y");
  ck_assert_ptr_null(compile(&b, 8, "holds 256 programs, the most one session may"));
  ck_assert_uint_eq(gb_compile_relu(proc.target, session, 1, 1, 0), first);
}
END_TEST

/* A LeNet-style conv stack infers conv, pool and flatten shapes. */
START_TEST(test_compile_conv_shapes) {
  graph_builder b;
  gb_init(&b);
  gb_value(&b, 0, "img", TTD__V1__DTYPE__DTYPE_FLOAT32, 2, 1, 1, 0, 0); /* reshaped below to 4-D */
  b.specs[0].n_shape = 4;
  int64_t img[4] = {8, 1, 28, 28};
  b.specs[0].shape = img;
  gb_value(&b, 1, "k", TTD__V1__DTYPE__DTYPE_FLOAT32, 2, 1, 1, 0, 0);
  b.specs[1].n_shape = 4;
  int64_t k[4] = {6, 1, 5, 5};
  b.specs[1].shape = k;
  Ttd__V1__Node *c = gb_node(&b, "c", "conv2d", "img", "k", NULL);
  gb_int(&b, c, "padding", 2);
  Ttd__V1__Node *p = gb_node(&b, "p", "max_pool2d", "c", NULL, NULL);
  gb_int(&b, p, "kernel", 2);
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
  graph_builder b;
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
  gb_int(&b, &b.nodes[1], "slope", 2);
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
  gb_value(&b, 0, "logits", TTD__V1__DTYPE__DTYPE_FLOAT32, 2, 4, 10, 0, 0);
  gb_value(&b, 0, "labels", TTD__V1__DTYPE__DTYPE_FLOAT32, 1, 4, 0, 0, 0);
  gb_node(&b, "loss", "cross_entropy", "logits", "labels", NULL);
  gb_output(&b, "loss");
  compile(&b, 3, "labels must be int32");
  /* Garbage instead of a graph. */
  raw_result r;
  raw_call(proc.target, "/ttd.v1.Device/Compile", (raw_md){.session = session, .instance = instance}, "\x0a\x05\x0a\x03", 4, &r);
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
  raw_call(proc.target, "/ttd.v1.Device/Execute", (raw_md){.session = session, .instance = instance}, buf, len, &r);
  ck_assert_msg(r.code == want_code, "expected code %d, got %d: %s", want_code, r.code, r.details);
  if (needle) ck_assert_msg(strstr(r.details, needle) != NULL, "message '%s' lacks '%s'", r.details, needle);
  Ttd__V1__ExecuteResponse *resp = NULL;
  if (r.code == 0) resp = ttd__v1__execute_response__unpack(NULL, r.body_len, r.body);
  raw_result_free(&r);
  return resp;
}

/* Uploads host floats (or int32) with raw calls into this test's session. */
static uint64_t upload(const void *data, int dtype, int ndim, int64_t d0, int64_t d1, const char *device) {
  return raw_upload(proc.target, (raw_md){.session = session, .instance = instance}, data, dtype, ndim, d0, d1, device);
}

static void download(uint64_t handle, float *out, size_t n) {
  raw_download(proc.target, (raw_md){.session = session, .instance = instance}, handle, out, n);
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
  graph_builder b;
  two_layer_graph(&b, N, IN, H, OUT, "relu");
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
  raw_call(proc.target, "/ttd.v1.Device/CloseSession", (raw_md){.session = session, .instance = instance}, "", 0, &cr);
  ck_assert_int_eq(cr.code, 0);
  raw_result_free(&cr);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 0);
}
END_TEST

/* A linear with no input features (x [2, 0], w [4, 0]) gives its bias on every row: the rows
 * come from x's leading dims, not from its 0 elements over 0 features (it left y unwritten,
 * and an inline output returned old device memory). */
START_TEST(test_linear_without_features) {
  graph_builder b;
  gb_init(&b);
  gb_value(&b, 0, "x", TTD__V1__DTYPE__DTYPE_FLOAT32, 2, 2, 0, 0, 0);
  gb_value(&b, 1, "w", TTD__V1__DTYPE__DTYPE_FLOAT32, 2, 4, 0, 0, 0);
  gb_value(&b, 1, "b", TTD__V1__DTYPE__DTYPE_FLOAT32, 1, 4, 0, 0, 0);
  gb_node(&b, "y", "linear", "x", "w", "b");
  gb_output(&b, "y");
  Ttd__V1__CompileResponse *c = compile(&b, 0, NULL);
  float bias[4] = {1.5f, -2.0f, 3.0f, 0.25f}, y[8];
  uint64_t x = upload(bias, TTD__V1__DTYPE__DTYPE_FLOAT32, 2, 2, 0, NULL);
  uint64_t params[2] = {upload(bias, TTD__V1__DTYPE__DTYPE_FLOAT32, 2, 4, 0, NULL),
                        upload(bias, TTD__V1__DTYPE__DTYPE_FLOAT32, 1, 4, 1, NULL)};
  Ttd__V1__ExecuteResponse *r = execute(c->program, &x, 1, params, 2, 0, NULL);
  download(r->outputs[0]->handle, y, 8);
  for (int i = 0; i < 8; i++) ck_assert_float_eq(y[i], bias[i % 4]);
  ttd__v1__execute_response__free_unpacked(r, NULL);
  ttd__v1__compile_response__free_unpacked(c, NULL);
}
END_TEST

static int want_input_grads;

static Ttd__V1__BackwardResponse *backward(uint64_t run, const uint64_t *grads, size_t n, int keep, int want_code,
                                           const char *needle) {
  Ttd__V1__BackwardRequest req = TTD__V1__BACKWARD_REQUEST__INIT;
  req.input_grads = want_input_grads;
  req.run = run;
  req.output_grads = (uint64_t *)grads;
  req.n_output_grads = n;
  req.keep_run = keep;
  unsigned char buf[256];
  size_t len = ttd__v1__backward_request__pack(&req, buf);
  raw_result r;
  raw_call(proc.target, "/ttd.v1.Device/Backward", (raw_md){.session = session, .instance = instance}, buf, len, &r);
  ck_assert_msg(r.code == want_code, "expected code %d, got %d: %s", want_code, r.code, r.details);
  if (needle) ck_assert_msg(strstr(r.details, needle) != NULL, "message '%s' lacks '%s'", r.details, needle);
  Ttd__V1__BackwardResponse *resp = r.code == 0 ? ttd__v1__backward_response__unpack(NULL, r.body_len, r.body) : NULL;
  raw_result_free(&r);
  return resp;
}

enum { TN = 6, TIN = 4, TH = 5, TOUT = 3 };

typedef struct mlp_params {
  double w1[TH * TIN], b1[TH], w2[TOUT * TH], b2[TOUT];
} mlp_params;

/* The tanh MLP's mean cross-entropy in double precision: the host reference. */
static double mlp_loss(const mlp_params *p, const float *x, const int32_t *labels) {
  double loss = 0;
  for (int i = 0; i < TN; i++) {
    double h[TH], l[TOUT], mx = -1e300, se = 0;
    for (int j = 0; j < TH; j++) {
      double z = p->b1[j];
      for (int k = 0; k < TIN; k++) z += x[i * TIN + k] * p->w1[j * TIN + k];
      h[j] = tanh(z);
    }
    for (int o = 0; o < TOUT; o++) {
      l[o] = p->b2[o];
      for (int j = 0; j < TH; j++) l[o] += h[j] * p->w2[o * TH + j];
      mx = fmax(mx, l[o]);
    }
    for (int o = 0; o < TOUT; o++) se += exp(l[o] - mx);
    loss += -(l[labels[i]] - mx - log(se)) / TN;
  }
  return loss;
}

typedef struct trained {
  Ttd__V1__CompileResponse *program;
  uint64_t in[2], params[4];
  float x[TN * TIN], w[4][TH * TIN];
  int32_t labels[TN];
  int sizes[4];
} trained;

static void tanh_mlp(trained *t) {
  static const int sizes[4] = {TH * TIN, TH, TOUT * TH, TOUT};
  memcpy(t->sizes, sizes, sizeof(sizes));
  fill(t->x, TN * TIN, 11);
  for (int i = 0; i < 4; i++) fill(t->w[i], sizes[i], 20 + (unsigned)i);
  for (int i = 0; i < TN; i++) t->labels[i] = i % TOUT;
  graph_builder b;
  two_layer_graph(&b, TN, TIN, TH, TOUT, "tanh");
  gb_output(&b, "loss");
  t->program = compile(&b, 0, NULL);
  t->in[0] = upload(t->x, 1, 2, TN, TIN, "tt:0");
  t->in[1] = upload(t->labels, 3, 1, TN, 0, "tt:0");
  t->params[0] = upload(t->w[0], 1, 2, TH, TIN, "tt:0");
  t->params[1] = upload(t->w[1], 1, 1, TH, 0, "tt:0");
  t->params[2] = upload(t->w[2], 1, 2, TOUT, TH, "tt:0");
  t->params[3] = upload(t->w[3], 1, 1, TOUT, 0, "tt:0");
}

static void to_double(const trained *t, mlp_params *p) {
  double *dst[4] = {p->w1, p->b1, p->w2, p->b2};
  for (int i = 0; i < 4; i++)
    for (int k = 0; k < t->sizes[i]; k++) dst[i][k] = t->w[i][k];
}

static uint64_t run_kept(const trained *t) {
  Ttd__V1__ExecuteRequest req = TTD__V1__EXECUTE_REQUEST__INIT;
  req.program = t->program->program;
  req.inputs = (uint64_t *)t->in;
  req.n_inputs = 2;
  req.parameters = (uint64_t *)t->params;
  req.n_parameters = 4;
  req.keep_for_backward = 1;
  unsigned char buf[256];
  size_t len = ttd__v1__execute_request__pack(&req, buf);
  raw_result r;
  raw_call(proc.target, "/ttd.v1.Device/Execute", (raw_md){.session = session, .instance = instance}, buf, len, &r);
  ck_assert_msg(r.code == 0, "execute: %s", r.details);
  Ttd__V1__ExecuteResponse *resp = ttd__v1__execute_response__unpack(NULL, r.body_len, r.body);
  uint64_t run = resp->run;
  ck_assert_uint_ne(run, 0);
  ttd__v1__execute_response__free_unpacked(resp, NULL);
  raw_result_free(&r);
  return run;
}

/* Backward of a whole MLP program (linear, tanh, linear, cross-entropy) matches central
 * finite differences of a double-precision host reference for every parameter element;
 * a second backward accumulates into .grad (twice the gradient) under the same handles. */
START_TEST(test_backward_matches_finite_differences) {
  trained t;
  tanh_mlp(&t);
  float one = 1.0f;
  uint64_t dloss = upload(&one, 1, 0, 1, 0, "tt:0");
  Ttd__V1__BackwardResponse *g = backward(run_kept(&t), &dloss, 1, 0, 0, NULL);
  ck_assert_uint_eq(g->n_parameter_grads, 4);
  mlp_params p;
  to_double(&t, &p);
  double *views[4] = {p.w1, p.b1, p.w2, p.b2};
  uint64_t grad_handles[4];
  for (int i = 0; i < 4; i++) {
    float got[TH * TIN];
    grad_handles[i] = g->parameter_grads[i]->handle;
    ck_assert_uint_ne(grad_handles[i], 0);
    download(grad_handles[i], got, (size_t)t.sizes[i]);
    for (int k = 0; k < t.sizes[i]; k++) {
      double keep = views[i][k], h = 1e-6;
      views[i][k] = keep + h;
      double up = mlp_loss(&p, t.x, t.labels);
      views[i][k] = keep - h;
      double down = mlp_loss(&p, t.x, t.labels);
      views[i][k] = keep;
      double fd = (up - down) / (2 * h);
      ck_assert_msg(fabs(fd - got[k]) <= 1e-4 + 1e-3 * fabs(fd), "param %d element %d: backward %g, finite difference %g",
                    i, k, got[k], fd);
    }
  }
  ttd__v1__backward_response__free_unpacked(g, NULL);
  /* Accumulation, as torch's .grad: a second run and backward doubles it, same handles. */
  float first[TOUT];
  download(grad_handles[3], first, TOUT);
  Ttd__V1__BackwardResponse *g2 = backward(run_kept(&t), &dloss, 1, 0, 0, NULL);
  ck_assert_uint_eq(g2->parameter_grads[3]->handle, grad_handles[3]);
  float second[TOUT];
  download(grad_handles[3], second, TOUT);
  for (int k = 0; k < TOUT; k++) ck_assert_float_eq_tol(second[k], 2 * first[k], 1e-6);
  ttd__v1__backward_response__free_unpacked(g2, NULL);
  ttd__v1__compile_response__free_unpacked(t.program, NULL);
}
END_TEST

/* SGD (momentum, Nesterov, weight decay) and Adam/AdamW steps update parameters in place on
 * the device exactly as torch's update rules computed on the host. */
START_TEST(test_optimizer_steps_match_host_reference) {
  trained t;
  tanh_mlp(&t);
  float one = 1.0f;
  uint64_t dloss = upload(&one, 1, 0, 1, 0, "tt:0");
  Ttd__V1__BackwardResponse *g = backward(run_kept(&t), &dloss, 1, 0, 0, NULL);
  float grad[TOUT];
  download(g->parameter_grads[3]->handle, grad, TOUT);
  ttd__v1__backward_response__free_unpacked(g, NULL);
  /* Three SGD steps with the same .grad: momentum 0.9, nesterov, weight decay 0.01. */
  double param[TOUT], buf[TOUT];
  for (int k = 0; k < TOUT; k++) param[k] = t.w[3][k];
  for (int step = 1; step <= 3; step++) {
    Ttd__V1__SgdOptions sgd = TTD__V1__SGD_OPTIONS__INIT;
    sgd.lr = 0.1f;
    sgd.momentum = 0.9f;
    sgd.weight_decay = 0.01f;
    sgd.nesterov = 1;
    Ttd__V1__OptimizerStepRequest req = TTD__V1__OPTIMIZER_STEP_REQUEST__INIT;
    req.parameters = &t.params[3];
    req.n_parameters = 1;
    req.optimizer_case = TTD__V1__OPTIMIZER_STEP_REQUEST__OPTIMIZER_SGD;
    req.sgd = &sgd;
    raw_expect(proc.target, "/ttd.v1.Device/OptimizerStep", &req.base, (raw_md){.session = session, .instance = instance}, 0, NULL);
    for (int k = 0; k < TOUT; k++) {
      double d = grad[k] + 0.01 * param[k];
      buf[k] = step == 1 ? d : 0.9 * buf[k] + d;
      param[k] -= 0.1 * (d + 0.9 * buf[k]);
    }
  }
  float got[TOUT];
  download(t.params[3], got, TOUT);
  for (int k = 0; k < TOUT; k++) ck_assert_msg(fabs(got[k] - param[k]) < 1e-5, "sgd %d: %g vs %g", k, got[k], param[k]);
  /* Two AdamW steps on w1 (its own fresh state). */
  float g1[TH * TIN];
  Ttd__V1__BackwardResponse *gw = backward(run_kept(&t), &dloss, 1, 0, 0, NULL);
  download(gw->parameter_grads[0]->handle, g1, TH * TIN);
  uint64_t b2_grad = gw->parameter_grads[3]->handle;
  ttd__v1__backward_response__free_unpacked(gw, NULL);
  double w[TH * TIN], m[TH * TIN] = {0}, v[TH * TIN] = {0};
  for (int k = 0; k < TH * TIN; k++) w[k] = t.w[0][k];
  for (int step = 1; step <= 2; step++) {
    Ttd__V1__AdamOptions adam = TTD__V1__ADAM_OPTIONS__INIT;
    adam.lr = 0.01f;
    adam.weight_decay = 0.1f;
    adam.decoupled = 1;
    Ttd__V1__OptimizerStepRequest req = TTD__V1__OPTIMIZER_STEP_REQUEST__INIT;
    req.parameters = &t.params[0];
    req.n_parameters = 1;
    req.optimizer_case = TTD__V1__OPTIMIZER_STEP_REQUEST__OPTIMIZER_ADAM;
    req.adam = &adam;
    raw_expect(proc.target, "/ttd.v1.Device/OptimizerStep", &req.base, (raw_md){.session = session, .instance = instance}, 0, NULL);
    for (int k = 0; k < TH * TIN; k++) {
      w[k] *= 1 - 0.01 * 0.1;
      m[k] = 0.9 * m[k] + 0.1 * g1[k];
      v[k] = 0.999 * v[k] + 0.001 * (double)g1[k] * g1[k];
      double mh = m[k] / (1 - pow(0.9, step)), vh = v[k] / (1 - pow(0.999, step));
      w[k] -= 0.01 * mh / (sqrt(vh) + 1e-8);
    }
  }
  float gotw[TH * TIN];
  download(t.params[0], gotw, TH * TIN);
  for (int k = 0; k < TH * TIN; k++) ck_assert_msg(fabs(gotw[k] - w[k]) < 1e-5, "adamw %d: %g vs %g", k, gotw[k], w[k]);
  /* ZeroGrad clears .grad (non-zero before it). */
  float before[TOUT];
  download(b2_grad, before, TOUT);
  ck_assert(before[0] != 0.0f || before[1] != 0.0f);
  Ttd__V1__ZeroGradRequest zr = TTD__V1__ZERO_GRAD_REQUEST__INIT;
  zr.parameters = t.params;
  zr.n_parameters = 4;
  raw_expect(proc.target, "/ttd.v1.Device/ZeroGrad", &zr.base, (raw_md){.session = session, .instance = instance}, 0, NULL);
  float after[TOUT];
  download(b2_grad, after, TOUT);
  for (int k = 0; k < TOUT; k++) ck_assert_float_eq(after[k], 0.0f);
  Ttd__V1__OptimizerStepRequest bad = TTD__V1__OPTIMIZER_STEP_REQUEST__INIT;
  raw_expect(proc.target, "/ttd.v1.Device/OptimizerStep", &bad.base, (raw_md){.session = session, .instance = instance}, 3, "set sgd or adam");
  ttd__v1__compile_response__free_unpacked(t.program, NULL);
}
END_TEST

/* Run lifecycle: backward through a released run is NOT_FOUND; a wrong number or shape of
 * output gradients is INVALID_ARGUMENT; a run never backpropagated frees its activations on
 * ReleaseRun and on session close: memory returns to exactly what the tensors hold. */
START_TEST(test_run_lifecycle_and_memory) {
  trained t;
  tanh_mlp(&t);
  uint64_t held = harness_used_bytes(&proc, 0, 0);
  float one = 1.0f, two[2] = {1, 1};
  uint64_t dloss = upload(&one, 1, 0, 1, 0, "tt:0"), wrong = upload(two, 1, 1, 2, 0, "tt:0");
  held += 4 + 8;
  uint64_t run = run_kept(&t);
  ck_assert_uint_gt(harness_used_bytes(&proc, 0, 0), held + 4); /* activations are kept */
  backward(run, NULL, 0, 1, 3, "has 1 outputs, got 0 output gradients");
  backward(run, &wrong, 1, 1, 3, "gradient of output 'loss' must be float32 [], got float32 [2]");
  Ttd__V1__BackwardResponse *g = backward(run, &dloss, 1, 0, 0, NULL);
  ttd__v1__backward_response__free_unpacked(g, NULL);
  backward(run, &dloss, 1, 0, 5, "already backpropagated or released");
  /* Now .grad tensors exist for the 4 parameters: the rest of the run is gone. Each run's
   * loss output stays as a tensor of the session (4 bytes). */
  uint64_t grads = (uint64_t)(TH * TIN + TH + TOUT * TH + TOUT) * 4;
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), held + grads + 1 * 4);
  uint64_t never = run_kept(&t);
  Ttd__V1__ReleaseRunRequest rr = TTD__V1__RELEASE_RUN_REQUEST__INIT;
  rr.run = never;
  raw_expect(proc.target, "/ttd.v1.Device/ReleaseRun", &rr.base, (raw_md){.session = session, .instance = instance}, 0, NULL);
  raw_expect(proc.target, "/ttd.v1.Device/ReleaseRun", &rr.base, (raw_md){.session = session, .instance = instance}, 5, NULL);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), held + grads + 2 * 4);
  run_kept(&t); /* left pending: the session's end must free it */
  raw_result cr;
  raw_call(proc.target, "/ttd.v1.Device/CloseSession", (raw_md){.session = session, .instance = instance}, "", 0, &cr);
  ck_assert_int_eq(cr.code, 0);
  raw_result_free(&cr);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 0);
  ttd__v1__compile_response__free_unpacked(t.program, NULL);
}
END_TEST

/* Backward can return the gradients of float inputs (dx matches finite differences of the
 * host reference; int32 labels get none); operands on another device, another session's
 * program and a freed input are refused precisely. */
START_TEST(test_input_grads_and_foreign_operands) {
  trained t;
  tanh_mlp(&t);
  float one = 1.0f;
  uint64_t dloss = upload(&one, 1, 0, 1, 0, "tt:0");
  want_input_grads = 1;
  Ttd__V1__BackwardResponse *g = backward(run_kept(&t), &dloss, 1, 0, 0, NULL);
  want_input_grads = 0;
  ck_assert_uint_eq(g->n_input_grads, 2);
  ck_assert_uint_ne(g->input_grads[0]->handle, 0);
  ck_assert_uint_eq(g->input_grads[1]->handle, 0);
  float dx[TN * TIN];
  download(g->input_grads[0]->handle, dx, TN * TIN);
  mlp_params p;
  to_double(&t, &p);
  for (int k = 0; k < TN * TIN; k += 3) {
    float keep = t.x[k];
    t.x[k] = keep + 1e-3f;
    double up = mlp_loss(&p, t.x, t.labels), hi = t.x[k];
    t.x[k] = keep - 1e-3f;
    double down = mlp_loss(&p, t.x, t.labels), lo = t.x[k];
    t.x[k] = keep;
    double fd = (up - down) / (hi - lo);
    ck_assert_msg(fabs(fd - dx[k]) <= 1e-4 + 1e-3 * fabs(fd), "dx[%d]: %g vs %g", k, dx[k], fd);
  }
  ttd__v1__backward_response__free_unpacked(g, NULL);
  /* An input on tt:1 while the parameters are on tt:0. */
  uint64_t on_one[2] = {upload(t.x, 1, 2, TN, TIN, "tt:1"), t.in[1]};
  execute(t.program->program, on_one, 2, t.params, 4, 3, "input 'x' is on tt:1 but the program runs on tt:0");
  /* A freed input. */
  uint64_t freed = upload(t.x, 1, 2, TN, TIN, "tt:0");
  Ttd__V1__FreeRequest fr = TTD__V1__FREE_REQUEST__INIT;
  fr.handles = &freed;
  fr.n_handles = 1;
  raw_expect(proc.target, "/ttd.v1.Device/Free", &fr.base, (raw_md){.session = session, .instance = instance}, 0, NULL);
  uint64_t with_freed[2] = {freed, t.in[1]};
  execute(t.program->program, with_freed, 2, t.params, 4, 5, "not found in this session");
  /* Another session's program handle. */
  char mine[17];
  memcpy(mine, session, sizeof(mine));
  raw_open_session(proc.target, session, instance);
  execute(t.program->program, t.in, 2, t.params, 4, 5, "not found in this session");
  memcpy(session, mine, sizeof(mine));
  ttd__v1__compile_response__free_unpacked(t.program, NULL);
}
END_TEST

Suite *e2e_programs_suite(void) {
  Suite *s = suite_create("e2e_programs");
  TCase *tc = tcase_create("compile");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_compile_mlp_and_cache);
  tcase_add_test(tc, test_compile_conv_shapes);
  tcase_add_test(tc, test_programs_per_session_bounded);
  tcase_add_test(tc, test_bad_graphs);
  tcase_add_test(tc, test_execute_mlp_matches_reference);
  tcase_add_test(tc, test_backward_matches_finite_differences);
  tcase_add_test(tc, test_optimizer_steps_match_host_reference);
  tcase_add_test(tc, test_run_lifecycle_and_memory);
  tcase_add_test(tc, test_input_grads_and_foreign_operands);
  tcase_add_test(tc, test_linear_without_features);
  suite_add_tcase(s, tc);
  return s;
}
