/* Whole-program gradient checks, in process on the simulated card: an MLP, LeNet-5, a
 * transformer block (attention + MLP + layer_norm) and a chain of the binary ops' scalar
 * forms are compiled, run forward and backward by the daemon's executor, and every
 * parameter's gradient is compared with central finite differences of the program's own
 * loss at sampled elements. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "dtype.h"
#include "device/program_run.h"
#include "graph_builder.h"
#include "suites.h"

typedef struct harness {
  ttd_backend *backend;
  ttd_program *program;
  ttd_tensor *inputs[MAXV], *params[MAXV];
} harness;

static unsigned rng_state = 12345;
static float uniform(float scale) {
  rng_state = rng_state * 1664525u + 1013904223u;
  return ((float)(rng_state >> 8) / 16777216.0f * 2.0f - 1.0f) * scale;
}

static ttd_tensor *make(ttd_backend *backend, const ttd_program_value *v, float scale, int label_classes) {
  ttd_tensor_spec spec = {.dtype = v->type.dtype, .ndim = v->type.shape.ndim, .device = 0, .location = TTD_MEM_DRAM};
  memcpy(spec.shape, v->type.shape.d, sizeof(int64_t) * (size_t)spec.ndim);
  ck_assert_ptr_null(ttd_tensor_spec_finish(&spec));
  ttd_tensor *t = NULL;
  ck_assert_ptr_null(ttd_tensor_create(backend, NULL, &spec, &t));
  float *data = malloc(spec.numel * 4 + 4);
  for (uint64_t i = 0; i < spec.numel; i++) {
    if (spec.dtype == TTD_DTYPE_INT32) ((int32_t *)data)[i] = (int32_t)(i % (uint64_t)label_classes);
    else data[i] = uniform(scale);
  }
  if (spec.dtype == TTD_DTYPE_BFLOAT16) {
    for (uint64_t i = 0; i < spec.numel; i++) ((uint16_t *)data)[i] = ttd_bf16_from_f32(data[i]); /* in place, forward */
  }
  backend->vtable->buffer_write(backend, t->buffer, 0, data, spec.nbytes);
  free(data);
  return t;
}

static void harness_setup(harness *h, graph_builder *b, float param_scale, int label_classes) {
  memset(h, 0, sizeof(*h));
  ttd_backend_options o = {.devices = 1, .dram_bytes = 1ull << 30, .l1_bytes = 1 << 20, .cores = 2};
  ck_assert_ptr_null(ttd_backend_create("sim", &o, &h->backend));
  ttd_status_t s = ttd_program_compile(&b->graph, &h->program);
  ck_assert_msg(s == NULL, "compile: %s", ttd_status_message(s));
  for (int i = 0; i < h->program->n_inputs; i++) h->inputs[i] = make(h->backend, &h->program->values[i], 1.0f, label_classes);
  for (int i = 0; i < h->program->n_params; i++) {
    h->params[i] = make(h->backend, &h->program->values[ttd_program_param_value(h->program, i)], param_scale, 1);
  }
}

static double loss_of(harness *h) {
  ttd_run *run = NULL;
  ttd_status_t s = ttd_run_forward(h->backend, NULL, h->program, h->inputs, h->program->n_inputs, h->params,
                                   h->program->n_params, &run);
  ck_assert_msg(s == NULL, "forward: %s", ttd_status_message(s));
  float loss;
  h->backend->vtable->buffer_read(h->backend, run->values[h->program->outputs[0]]->buffer, 0, &loss, 4);
  ttd_run_free(run);
  return loss;
}

static float read_at(ttd_backend *backend, ttd_tensor *t, uint64_t i) {
  float v;
  backend->vtable->buffer_read(backend, t->buffer, i * 4, &v, 4);
  return v;
}

static void write_at(ttd_backend *backend, ttd_tensor *t, uint64_t i, float v) {
  backend->vtable->buffer_write(backend, t->buffer, i * 4, &v, 4);
}

/* d loss / d loss: a float32 scalar 1. */
static ttd_tensor *unit_loss_grad(ttd_backend *backend) {
  ttd_tensor_spec one = {.dtype = TTD_DTYPE_FLOAT32, .ndim = 0};
  ttd_tensor_spec_finish(&one);
  ttd_tensor *dloss = NULL;
  ck_assert_ptr_null(ttd_tensor_create(backend, NULL, &one, &dloss));
  write_at(backend, dloss, 0, 1.0f);
  return dloss;
}

/* Backward once, then compares `samples` elements of every parameter's gradient with
 * central differences of the loss (float32 forward, step eps). */
static void check_gradients(harness *h, int samples, float eps, double rtol, double atol) {
  ttd_run *run = NULL;
  ck_assert_ptr_null(ttd_run_forward(h->backend, NULL, h->program, h->inputs, h->program->n_inputs, h->params,
                                     h->program->n_params, &run));
  ttd_tensor *dloss = unit_loss_grad(h->backend);
  ttd_tensor *out_grads[MAXV] = {dloss}, *param_grads[MAXV] = {0}; /* the loss is output 0; others get none */
  ttd_status_t s = ttd_run_backward(run, h->backend, out_grads, param_grads, NULL);
  ck_assert_msg(s == NULL, "backward: %s", ttd_status_message(s));
  ttd_run_free(run);
  for (int p = 0; p < h->program->n_params; p++) {
    const char *name = h->program->values[ttd_program_param_value(h->program, p)].name;
    ck_assert_msg(param_grads[p] != NULL, "parameter %s got no gradient", name);
    uint64_t n = h->params[p]->spec.numel;
    for (int k = 0; k < samples && (uint64_t)k < n; k++) {
      uint64_t i = (uint64_t)k * 7919u % n;
      float keep = read_at(h->backend, h->params[p], i);
      write_at(h->backend, h->params[p], i, keep + eps);
      double up = loss_of(h);
      write_at(h->backend, h->params[p], i, keep - eps);
      double down = loss_of(h);
      write_at(h->backend, h->params[p], i, keep);
      double fd = (up - down) / (2.0 * eps);
      double got = read_at(h->backend, param_grads[p], i);
      ck_assert_msg(fabs(fd - got) <= atol + rtol * fmax(fabs(fd), fabs(got)),
                    "%s[%llu]: backward %.6g, finite difference %.6g", name, (unsigned long long)i, got, fd);
    }
    ttd_tensor_release(param_grads[p]);
  }
  ttd_tensor_release(dloss);
}

static void harness_teardown(harness *h) {
  for (int i = 0; i < h->program->n_inputs; i++) ttd_tensor_release(h->inputs[i]);
  for (int i = 0; i < h->program->n_params; i++) ttd_tensor_release(h->params[i]);
  ttd_program_release(h->program);
  ttd_device_info info;
  h->backend->vtable->device_info(h->backend, 0, &info);
  ck_assert_uint_eq(info.memory[0].used_bytes, 0); /* every activation and gradient freed */
  ttd_backend_destroy(h->backend);
}

#define F32 TTD__V1__DTYPE__DTYPE_FLOAT32
#define I32 TTD__V1__DTYPE__DTYPE_INT32

/* A new graph with the hidden layer the MLP tests share: input x [8, 20], labels y [8],
 * parameters w1 [16, 20] and b1 [16], and h = relu(linear(x, w1, b1)). */
static void mlp_hidden_layer(graph_builder *b) {
  gb_init(b);
  gb_value(b, 0, "x", F32, 2, 8, 20, 0, 0);
  gb_value(b, 0, "y", I32, 1, 8, 0, 0, 0);
  gb_value(b, 1, "w1", F32, 2, 16, 20, 0, 0);
  gb_value(b, 1, "b1", F32, 1, 16, 0, 0, 0);
  gb_node(b, "z", "linear", "x", "w1", "b1");
  gb_node(b, "h", "relu", "z", NULL, NULL);
}

/* MLP 20-16-5 with ReLU and cross-entropy: every parameter's gradient matches. */
START_TEST(test_mlp_gradients) {
  graph_builder b;
  mlp_hidden_layer(&b);
  gb_value(&b, 1, "w2", F32, 2, 5, 16, 0, 0);
  gb_value(&b, 1, "b2", F32, 1, 5, 0, 0, 0);
  gb_node(&b, "logits", "linear", "h", "w2", "b2");
  gb_node(&b, "loss", "cross_entropy", "logits", "y", NULL);
  b.outputs[b.graph.n_outputs++] = "loss";
  harness h;
  harness_setup(&h, &b, 0.5f, 5);
  check_gradients(&h, 12, 1e-2f, 3e-2, 2e-3);
  harness_teardown(&h);
}
END_TEST

/* A Backward that asks for no input gradients computes only what leads to a parameter: the
 * values reached from inputs alone (x, relu(x)) are marked so, and the parameters'
 * gradients are bit-identical to those of a Backward that also returns dx. */
START_TEST(test_backward_without_input_grads) {
  graph_builder b;
  gb_init(&b);
  gb_value(&b, 0, "x", F32, 2, 8, 20, 0, 0);
  gb_value(&b, 0, "y", I32, 1, 8, 0, 0, 0);
  gb_value(&b, 1, "w1", F32, 2, 5, 20, 0, 0);
  gb_value(&b, 1, "b1", F32, 1, 5, 0, 0, 0);
  gb_node(&b, "xr", "relu", "x", NULL, NULL);
  gb_node(&b, "logits", "linear", "xr", "w1", "b1");
  gb_node(&b, "loss", "cross_entropy", "logits", "y", NULL);
  b.outputs[b.graph.n_outputs++] = "loss";
  harness h;
  harness_setup(&h, &b, 0.5f, 5);
  const ttd_program *p = h.program;
  struct { const char *name; bool requires, param; } want[] = {
      {"x", true, false}, {"y", false, false}, {"w1", true, true}, {"b1", true, true},
      {"xr", true, false}, {"logits", true, true}, {"loss", true, true}};
  for (size_t w = 0; w < sizeof(want) / sizeof(want[0]); w++) {
    int v = 0;
    while (v < p->n_values && strcmp(p->values[v].name, want[w].name) != 0) v++;
    ck_assert_int_lt(v, p->n_values);
    ck_assert_msg(p->values[v].requires_grad == want[w].requires && p->values[v].param_grad == want[w].param,
                  "%s: requires_grad %d param_grad %d", want[w].name, p->values[v].requires_grad, p->values[v].param_grad);
  }
  ttd_tensor *dloss = unit_loss_grad(h.backend);
  float got[2][5 * 20 + 5];
  for (int with_inputs = 0; with_inputs < 2; with_inputs++) {
    ttd_run *run = NULL;
    ck_assert_ptr_null(ttd_run_forward(h.backend, NULL, h.program, h.inputs, p->n_inputs, h.params, p->n_params, &run));
    ttd_tensor *out_grads[1] = {dloss}, *param_grads[MAXV] = {0}, *input_grads[MAXV] = {0};
    ck_assert_ptr_null(ttd_run_backward(run, h.backend, out_grads, param_grads, with_inputs ? input_grads : NULL));
    ttd_run_free(run);
    h.backend->vtable->buffer_read(h.backend, param_grads[0]->buffer, 0, got[with_inputs], 5 * 20 * 4);
    h.backend->vtable->buffer_read(h.backend, param_grads[1]->buffer, 0, got[with_inputs] + 100, 5 * 4);
    for (int k = 0; k < 2; k++) ttd_tensor_release(param_grads[k]);
    /* The parameters' .grad accumulate: start the second run from zero. */
    for (int k = 0; k < 2; k++) {
      ttd_tensor_release(h.params[k]->grad);
      h.params[k]->grad = NULL;
    }
    if (with_inputs) {
      ck_assert_ptr_nonnull(input_grads[0]); /* dx, asked for */
      ck_assert_ptr_null(input_grads[1]);    /* the int32 labels have none */
      ttd_tensor_release(input_grads[0]);
    }
  }
  ck_assert_int_eq(memcmp(got[0], got[1], sizeof(got[0])), 0);
  ttd_tensor_release(dloss);
  harness_teardown(&h);
}
END_TEST

/* LeNet-5 (conv 5x5 pad 2, tanh, avg pool, conv 5x5, tanh, max pool, flatten, three linear
 * layers, cross-entropy) on 28x28 images: every parameter's gradient matches. */
START_TEST(test_lenet_gradients) {
  graph_builder b;
  gb_init(&b);
  gb_value(&b, 0, "img", F32, 4, 2, 1, 28, 28);
  gb_value(&b, 0, "y", I32, 1, 2, 0, 0, 0);
  gb_value(&b, 1, "c1w", F32, 4, 6, 1, 5, 5);
  gb_value(&b, 1, "c1b", F32, 1, 6, 0, 0, 0);
  gb_value(&b, 1, "c2w", F32, 4, 16, 6, 5, 5);
  gb_value(&b, 1, "c2b", F32, 1, 16, 0, 0, 0);
  gb_value(&b, 1, "f1w", F32, 2, 120, 400, 0, 0);
  gb_value(&b, 1, "f1b", F32, 1, 120, 0, 0, 0);
  gb_value(&b, 1, "f2w", F32, 2, 84, 120, 0, 0);
  gb_value(&b, 1, "f2b", F32, 1, 84, 0, 0, 0);
  gb_value(&b, 1, "f3w", F32, 2, 10, 84, 0, 0);
  gb_value(&b, 1, "f3b", F32, 1, 10, 0, 0, 0);
  Ttd__V1__Node *c1 = gb_node(&b, "c1", "conv2d", "img", "c1w", "c1b");
  gb_int(&b, c1, "padding", 2);
  gb_node(&b, "a1", "tanh", "c1", NULL, NULL);
  gb_int(&b, gb_node(&b, "p1", "avg_pool2d", "a1", NULL, NULL), "kernel", 2);
  gb_node(&b, "c2", "conv2d", "p1", "c2w", "c2b");
  gb_node(&b, "a2", "tanh", "c2", NULL, NULL);
  gb_int(&b, gb_node(&b, "p2", "max_pool2d", "a2", NULL, NULL), "kernel", 2);
  gb_node(&b, "flat", "flatten", "p2", NULL, NULL);
  gb_node(&b, "f1", "linear", "flat", "f1w", "f1b");
  gb_node(&b, "r1", "tanh", "f1", NULL, NULL);
  gb_node(&b, "f2", "linear", "r1", "f2w", "f2b");
  gb_node(&b, "r2", "tanh", "f2", NULL, NULL);
  gb_node(&b, "logits", "linear", "r2", "f3w", "f3b");
  gb_node(&b, "loss", "cross_entropy", "logits", "y", NULL);
  b.outputs[b.graph.n_outputs++] = "loss";
  harness h;
  harness_setup(&h, &b, 0.2f, 10);
  check_gradients(&h, 6, 1e-3f, 5e-2, 2e-3); /* a small step: max-pool winners must not switch */
  harness_teardown(&h);
}
END_TEST

/* A pre-norm transformer block: layer_norm, single-head attention (q k^T scaled, softmax,
 * times v, projection), residual, layer_norm, GELU MLP, residual, MSE to a target. */
START_TEST(test_transformer_block_gradients) {
  enum { B = 2, T = 5, D = 8, FF = 16 };
  graph_builder b;
  gb_init(&b);
  gb_value(&b, 0, "x", F32, 3, B, T, D, 0);
  gb_value(&b, 0, "target", F32, 3, B, T, D, 0);
  gb_value(&b, 0, "scale", F32, 1, 1, 0, 0, 0);
  gb_value(&b, 1, "g1", F32, 1, D, 0, 0, 0);
  gb_value(&b, 1, "be1", F32, 1, D, 0, 0, 0);
  gb_value(&b, 1, "wq", F32, 2, D, D, 0, 0);
  gb_value(&b, 1, "wk", F32, 2, D, D, 0, 0);
  gb_value(&b, 1, "wv", F32, 2, D, D, 0, 0);
  gb_value(&b, 1, "wo", F32, 2, D, D, 0, 0);
  gb_value(&b, 1, "bo", F32, 1, D, 0, 0, 0);
  gb_value(&b, 1, "g2", F32, 1, D, 0, 0, 0);
  gb_value(&b, 1, "be2", F32, 1, D, 0, 0, 0);
  gb_value(&b, 1, "w1", F32, 2, FF, D, 0, 0);
  gb_value(&b, 1, "c1", F32, 1, FF, 0, 0, 0);
  gb_value(&b, 1, "w2", F32, 2, D, FF, 0, 0);
  gb_value(&b, 1, "c2", F32, 1, D, 0, 0, 0);
  gb_node(&b, "ln1", "layer_norm", "x", "g1", "be1");
  gb_node(&b, "q", "linear", "ln1", "wq", NULL);
  gb_node(&b, "k", "linear", "ln1", "wk", NULL);
  gb_node(&b, "v", "linear", "ln1", "wv", NULL);
  gb_int(&b, gb_node(&b, "scores", "matmul", "q", "k", NULL), "transpose_b", 1);
  gb_node(&b, "scaled", "mul", "scores", "scale", NULL);
  gb_node(&b, "attn", "softmax", "scaled", NULL, NULL);
  gb_node(&b, "ctx", "matmul", "attn", "v", NULL);
  gb_node(&b, "o", "linear", "ctx", "wo", "bo");
  gb_node(&b, "r1", "add", "x", "o", NULL);
  gb_node(&b, "ln2", "layer_norm", "r1", "g2", "be2");
  gb_node(&b, "m1", "linear", "ln2", "w1", "c1");
  gb_node(&b, "act", "gelu", "m1", NULL, NULL);
  gb_node(&b, "m2", "linear", "act", "w2", "c2");
  gb_node(&b, "y", "add", "r1", "m2", NULL);
  gb_node(&b, "loss", "mse_loss", "y", "target", NULL);
  b.outputs[b.graph.n_outputs++] = "loss";
  harness h;
  harness_setup(&h, &b, 0.5f, 1);
  check_gradients(&h, 10, 1e-2f, 5e-2, 2e-3);
  harness_teardown(&h);
}
END_TEST

/* The four binary ops with a number in place of their second input (the attribute scalar;
 * reverse=1 puts it first, as 2 - b and 4 / d below): forward values match a double
 * reference, the weight's gradient through all of them matches finite differences. */
START_TEST(test_scalar_operands) {
  enum { N = 4, D = 6 };
  graph_builder b;
  gb_init(&b);
  gb_value(&b, 0, "x", F32, 2, N, D, 0, 0);
  gb_value(&b, 0, "target", F32, 2, N, D, 0, 0);
  gb_value(&b, 1, "w", F32, 2, D, D, 0, 0);
  gb_node(&b, "h", "linear", "x", "w", NULL);
  gb_float(&b, gb_node(&b, "a", "mul", "h", NULL, NULL), "scalar", 0.5f);
  gb_int(&b, gb_node(&b, "b", "div", "a", NULL, NULL), "scalar", 3); /* an integer number too */
  Ttd__V1__Node *c = gb_node(&b, "c", "sub", "b", NULL, NULL);
  gb_float(&b, c, "scalar", 2.0f);
  gb_int(&b, c, "reverse", 1);
  gb_float(&b, gb_node(&b, "d", "add", "c", NULL, NULL), "scalar", 1.5f);
  Ttd__V1__Node *e = gb_node(&b, "e", "div", "d", NULL, NULL);
  gb_float(&b, e, "scalar", 4.0f);
  gb_int(&b, e, "reverse", 1);
  gb_float(&b, gb_node(&b, "f", "sub", "e", NULL, NULL), "scalar", 0.25f);
  Ttd__V1__Node *g = gb_node(&b, "g", "mul", "f", NULL, NULL);
  gb_float(&b, g, "scalar", -2.0f);
  gb_int(&b, g, "reverse", 1);
  gb_node(&b, "loss", "mse_loss", "g", "target", NULL);
  gb_output(&b, "loss");
  gb_output(&b, "g");
  harness h;
  harness_setup(&h, &b, 0.5f, 1);
  float x[N * D], w[D * D], got[N * D];
  h.backend->vtable->buffer_read(h.backend, h.inputs[0]->buffer, 0, x, sizeof(x));
  h.backend->vtable->buffer_read(h.backend, h.params[0]->buffer, 0, w, sizeof(w));
  ttd_run *run = NULL;
  ck_assert_ptr_null(ttd_run_forward(h.backend, NULL, h.program, h.inputs, 2, h.params, 1, &run));
  h.backend->vtable->buffer_read(h.backend, run->values[h.program->outputs[1]]->buffer, 0, got, sizeof(got));
  ttd_run_free(run);
  for (int i = 0; i < N; i++) {
    for (int j = 0; j < D; j++) {
      double hv = 0;
      for (int k = 0; k < D; k++) hv += (double)x[i * D + k] * w[j * D + k];
      double want = -2.0 * (4.0 / ((2.0 - hv * 0.5 / 3.0) + 1.5) - 0.25);
      ck_assert_msg(fabs(got[i * D + j] - want) <= 1e-5 * fabs(want) + 1e-6, "g[%d][%d] = %.7g, want %.7g", i, j,
                    (double)got[i * D + j], want);
    }
  }
  check_gradients(&h, 12, 1e-2f, 3e-2, 2e-3);
  harness_teardown(&h);
}
END_TEST

/* The scalar form's misuse fails to compile, naming the node: one input without scalar, two
 * inputs with it, a reverse other than 0 or 1. */
START_TEST(test_scalar_operand_errors) {
  static const struct {
    int inputs, scalar;
    int64_t reverse; /* -1: absent */
    const char *why;
  } cases[] = {
      {1, 0, -1, "node 'y' (mul): takes two inputs, or one input and the attribute 'scalar'"},
      {1, 0, 1, "takes two inputs, or one input and the attribute 'scalar'"},
      {2, 1, -1, "attributes 'scalar' and 'reverse' go with one input"},
      {2, 0, 0, "attributes 'scalar' and 'reverse' go with one input"},
      {1, 1, 2, "attribute 'reverse' must be 0 or 1, got 2"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    graph_builder b;
    gb_init(&b);
    gb_value(&b, 0, "x", F32, 1, 3, 0, 0, 0);
    Ttd__V1__Node *y = gb_node(&b, "y", "mul", "x", cases[i].inputs == 2 ? "x" : NULL, NULL);
    if (cases[i].scalar) gb_float(&b, y, "scalar", 2.0f);
    if (cases[i].reverse >= 0) gb_int(&b, y, "reverse", cases[i].reverse);
    gb_output(&b, "y");
    ttd_program *p = NULL;
    ttd_status_t s = ttd_program_compile(&b.graph, &p);
    ck_assert_msg(s != NULL, "case %zu compiled", i);
    ck_assert_msg(strstr(ttd_status_message(s), cases[i].why) != NULL, "case %zu: '%s' lacks '%s'", i,
                  ttd_status_message(s), cases[i].why);
    ttd_status_free(s);
    ck_assert_ptr_null(p);
  }
}
END_TEST

/* A bfloat16 operand that another op reads too (w, also in a mul), or that is an output of
 * the program itself (z), gets a float32 copy for the run (the mul reads it, the output is
 * float32); the linear and the matmul read the operands themselves all the same, so their
 * products stay bfloat16 ones: x (float32) rounded to bfloat16. */
START_TEST(test_bfloat16_widened_where_not_every_reader_takes_it) {
  graph_builder b;
  gb_init(&b);
  gb_value(&b, 0, "x", F32, 2, 4, 6, 0, 0);
  gb_value(&b, 0, "z", TTD__V1__DTYPE__DTYPE_BFLOAT16, 2, 6, 3, 0, 0);
  gb_value(&b, 1, "w", TTD__V1__DTYPE__DTYPE_BFLOAT16, 2, 3, 6, 0, 0);
  gb_node(&b, "y", "linear", "x", "w", NULL);
  gb_node(&b, "w2", "mul", "w", "w", NULL);
  gb_node(&b, "q", "matmul", "x", "z", NULL);
  gb_output(&b, "y");
  gb_output(&b, "w2");
  gb_output(&b, "z");
  gb_output(&b, "q");
  harness h;
  harness_setup(&h, &b, 0.5f, 1);
  ttd_run *run = NULL;
  ck_assert_ptr_null(ttd_run_forward(h.backend, NULL, h.program, h.inputs, 2, h.params, 1, &run));
  for (int v = 1; v < 3; v++) { /* z, w: float32 copies */
    ck_assert_ptr_ne(run->values[v], run->operands[v]);
    ck_assert_int_eq(run->values[v]->spec.dtype, TTD_DTYPE_FLOAT32);
  }
  ck_assert_int_eq(run->values[h.program->outputs[2]]->spec.dtype, TTD_DTYPE_FLOAT32);
  /* y[0][0] = sum_p bf16(x[0][p]) w[0][p] and q[0][0] = sum_p bf16(x[0][p]) z[p][0]: the
   * products of x rounded, not of x */
  float y = read_at(h.backend, run->values[h.program->outputs[0]], 0);
  float q = read_at(h.backend, run->values[h.program->outputs[3]], 0);
  double want_y = 0, want_q = 0, unrounded = 0;
  for (int p = 0; p < 6; p++) {
    float x = read_at(h.backend, run->values[0], (uint64_t)p), xr = ttd_f32_from_bf16(ttd_bf16_from_f32(x));
    float w = read_at(h.backend, run->values[2], (uint64_t)p), z = read_at(h.backend, run->values[1], (uint64_t)(3 * p));
    want_y += (double)xr * w;
    want_q += (double)xr * z;
    unrounded += (double)x * w;
  }
  ck_assert_double_eq_tol(y, want_y, 1e-6);
  ck_assert_double_eq_tol(q, want_q, 1e-6);
  ck_assert(fabs(unrounded - want_y) > 1e-5); /* the test tells the two apart */
  ttd_run_free(run);
  harness_teardown(&h);
}
END_TEST

/* bfloat16 storage: a program whose input and parameters are bfloat16 reads x and w as they
 * are (the linear's products are bfloat16 ones) and widens the bias (read by the linear's
 * float32 epilogue). Its loss is the float32 program's on the rounded values (every product
 * of two bfloat16 is exact); its gradients are float32, those of bfloat16 products (dy
 * rounded), so within bfloat16's rounding of the float32 program's, and not all equal. */
START_TEST(test_bfloat16_storage_matches_float32) {
  graph_builder b16, b32;
  for (int pass = 0; pass < 2; pass++) {
    graph_builder *b = pass ? &b32 : &b16;
    int dt = pass ? F32 : TTD__V1__DTYPE__DTYPE_BFLOAT16;
    gb_init(b);
    gb_value(b, 0, "x", dt, 2, 4, 6, 0, 0);
    gb_value(b, 0, "t", F32, 2, 4, 3, 0, 0);
    gb_value(b, 1, "w", dt, 2, 3, 6, 0, 0);
    gb_value(b, 1, "c", dt, 1, 3, 0, 0, 0);
    gb_node(b, "y", "linear", "x", "w", "c");
    gb_node(b, "a", "tanh", "y", NULL, NULL);
    gb_node(b, "loss", "mse_loss", "a", "t", NULL);
    b->outputs[b->graph.n_outputs++] = "loss";
  }
  harness h16, h32;
  harness_setup(&h16, &b16, 0.5f, 1);
  harness_setup(&h32, &b32, 0.5f, 1);
  /* Same values: the float32 program gets the bfloat16 values widened. */
  ttd_tensor *pairs[3][2] = {{h16.inputs[0], h32.inputs[0]}, {h16.params[0], h32.params[0]}, {h16.params[1], h32.params[1]}};
  for (int k = 0; k < 3; k++) {
    uint64_t n = pairs[k][0]->spec.numel;
    ck_assert_int_eq(pairs[k][0]->spec.dtype, TTD_DTYPE_BFLOAT16);
    ck_assert_ptr_null(h16.backend->vtable->buffer_convert(h16.backend, pairs[k][0]->buffer, TTD_DTYPE_BFLOAT16,
                                                           pairs[k][1]->buffer, TTD_DTYPE_FLOAT32, n));
  }
  ttd_backend *b2 = h32.backend; /* both harnesses have their own card: copy the target over */
  float target[12];
  b2->vtable->buffer_read(b2, h32.inputs[1]->buffer, 0, target, sizeof(target));
  h16.backend->vtable->buffer_write(h16.backend, h16.inputs[1]->buffer, 0, target, sizeof(target));
  double l16 = loss_of(&h16), l32 = loss_of(&h32);
  ck_assert(isfinite(l16));
  ck_assert_double_eq(l16, l32);
  /* Gradients: float32 for the bfloat16 parameters, equal to the float32 program's. */
  ttd_tensor *g16[MAXV] = {0}, *g32[MAXV] = {0};
  harness *hs[2] = {&h16, &h32};
  ttd_tensor **gs[2] = {g16, g32};
  for (int k = 0; k < 2; k++) {
    ttd_run *run = NULL;
    ck_assert_ptr_null(ttd_run_forward(hs[k]->backend, NULL, hs[k]->program, hs[k]->inputs, 2, hs[k]->params, 2, &run));
    if (k == 0) { /* values: x, t, w, c */
      ck_assert_ptr_eq(run->values[0], hs[k]->inputs[0]);
      ck_assert_ptr_eq(run->values[2], hs[k]->params[0]);
      ck_assert_int_eq(run->values[3]->spec.dtype, TTD_DTYPE_FLOAT32);
      ck_assert_int_eq(hs[k]->params[1]->spec.dtype, TTD_DTYPE_BFLOAT16);
    }
    ttd_tensor_spec one = {.dtype = TTD_DTYPE_FLOAT32, .ndim = 0};
    ttd_tensor_spec_finish(&one);
    ttd_tensor *dloss = NULL;
    ck_assert_ptr_null(ttd_tensor_create(hs[k]->backend, NULL, &one, &dloss));
    write_at(hs[k]->backend, dloss, 0, 1.0f);
    ck_assert_ptr_null(ttd_run_backward(run, hs[k]->backend, &dloss, gs[k], NULL));
    ttd_run_free(run);
    ttd_tensor_release(dloss);
  }
  int differ = 0;
  for (int p = 0; p < 2; p++) {
    ck_assert_int_eq(g16[p]->spec.dtype, TTD_DTYPE_FLOAT32);
    float largest = 0.0f;
    for (uint64_t i = 0; i < g32[p]->spec.numel; i++) largest = fmaxf(largest, fabsf(read_at(h32.backend, g32[p], i)));
    for (uint64_t i = 0; i < g16[p]->spec.numel; i++) {
      float got = read_at(h16.backend, g16[p], i), want = read_at(h32.backend, g32[p], i);
      ck_assert_msg(fabsf(got - want) <= largest / 128.0f, "grad %d[%llu]: %g against float32's %g", p,
                    (unsigned long long)i, (double)got, (double)want);
      differ += got != want;
    }
    ttd_tensor_release(g16[p]);
    ttd_tensor_release(g32[p]);
  }
  ck_assert_int_gt(differ, 0); /* dW's products read dy rounded */
  harness_teardown(&h16);
  harness_teardown(&h32);
}
END_TEST


/* ---- .grad summed in place ---- */

static const ttd_backend_vtable *sim_vtable; /* the wrapped backend's own */
static uint64_t alloc_bytes_seen[8];          /* sizes to count, then their counts */
static int alloc_count[8], alloc_kinds;
static ttd_cancel *stop_flag; /* set after stop_after backwards of matmul or linear nodes */
static int stop_after;

static ttd_status_t counting_alloc(ttd_backend *backend, int device, ttd_memloc loc, uint64_t bytes,
                                   ttd_backend_buffer **out) {
  for (int i = 0; i < alloc_kinds; i++) alloc_count[i] += alloc_bytes_seen[i] == bytes;
  return sim_vtable->buffer_alloc(backend, device, loc, bytes, out);
}

static ttd_status_t stopping_backward(ttd_backend *backend, int device, const ttd_node_call *call) {
  ttd_status_t s = sim_vtable->run_node_backward(backend, device, call);
  bool summing = call->node->op == TTD_OP_MATMUL || call->node->op == TTD_OP_LINEAR;
  if (stop_flag && summing && --stop_after == 0) atomic_store(&stop_flag->code, GRPC_STATUS_DEADLINE_EXCEEDED);
  return s;
}

/* The MLP's 20-16-5 graph, with `extra` more outputs among "z" and "h", or with z read by a
 * node "z2" too. */
static void mlp_graph(graph_builder *b, const char *extra_output, bool z_read_twice) {
  mlp_hidden_layer(b);
  gb_value(b, 1, "w2", F32, 2, 5, 16, 0, 0);
  gb_value(b, 1, "b2", F32, 1, 5, 0, 0, 0);
  gb_node(b, "logits", "linear", "h", "w2", "b2");
  gb_node(b, "loss", "cross_entropy", "logits", "y", NULL);
  if (z_read_twice) gb_node(b, "z2", "add", "z", "z", NULL);
  b->outputs[b->graph.n_outputs++] = "loss";
  if (extra_output) b->outputs[b->graph.n_outputs++] = (char *)extra_output;
  if (z_read_twice) b->outputs[b->graph.n_outputs++] = "z2";
}

static bool relu_next_of(const ttd_program *p, int node) { return p->nodes[node].relu_next; }

/* The node that makes the value named name. */
static const ttd_program_node *node_named(const ttd_program *p, const char *name) {
  for (int i = 0; i < p->n_nodes; i++)
    if (strcmp(p->values[p->nodes[i].value].name, name) == 0) return &p->nodes[i];
  ck_abort_msg("no node makes %s", name);
  return NULL;
}

/* Forward (loss), then backward with dx: the loss and every gradient, as bytes, into out
 * (loss, w1, b1, w2, b2, dx); the 8 x 16 buffers the forward allocated (z, and h unless
 * fused) into allocs[0], those the backward allocated (h's gradient, and z's unless fused)
 * into allocs[1]. */
static void mlp_run_bytes(harness *h, float *out, int allocs[2]) {
  alloc_kinds = 1;
  alloc_bytes_seen[0] = 8 * 16 * 4;
  alloc_count[0] = 0;
  ttd_run *run = NULL;
  ck_assert_ptr_null(ttd_run_forward(h->backend, NULL, h->program, h->inputs, h->program->n_inputs, h->params,
                                     h->program->n_params, &run));
  allocs[0] = alloc_count[0];
  alloc_count[0] = 0;
  h->backend->vtable->buffer_read(h->backend, run->values[h->program->outputs[0]]->buffer, 0, out, 4);
  ttd_tensor *dloss = unit_loss_grad(h->backend), *out_grads[1] = {dloss}, *param_grads[MAXV] = {0},
             *input_grads[MAXV] = {0};
  ck_assert_ptr_null(ttd_run_backward(run, h->backend, out_grads, param_grads, input_grads));
  allocs[1] = alloc_count[0];
  ttd_run_free(run);
  float *at = out + 1;
  for (int p = 0; p < 4; p++) {
    h->backend->vtable->buffer_read(h->backend, param_grads[p]->buffer, 0, at, param_grads[p]->spec.nbytes);
    at += param_grads[p]->spec.numel;
    ttd_tensor_release(param_grads[p]);
    ttd_tensor_release(h->params[p]->grad); /* the next run starts without .grad */
    h->params[p]->grad = NULL;
  }
  h->backend->vtable->buffer_read(h->backend, input_grads[0]->buffer, 0, at, input_grads[0]->spec.nbytes);
  ttd_tensor_release(input_grads[0]);
  ttd_tensor_release(dloss);
}

/* A linear whose value only the next node, a relu, reads is marked relu_next, and the sim
 * backend then relus in the linear's epilogue: the relu's buffer is not made. A relu whose
 * value only the next node, a linear, reads as its x is marked grad_next, and that linear's
 * backward then writes the relu's input's gradient: the relu's gradient buffer is not made.
 * The loss, every parameter's gradient and dx have the bits of the unfused run (a backend
 * without fuses_relu or masks_relu_grad), with either fusion alone or both. Not marked: the
 * second linear (a cross-entropy follows), nor the first when its value or the relu's is an
 * output, or another node reads its value; nor the relu when its value is an output. */
START_TEST(test_linear_relu_fused) {
  graph_builder b;
  mlp_graph(&b, NULL, false);
  harness h;
  harness_setup(&h, &b, 0.5f, 5);
  const ttd_program *p = h.program;
  ck_assert(relu_next_of(p, 0));  /* z = linear, h = relu(z) */
  ck_assert(!relu_next_of(p, 1)); /* the relu */
  ck_assert(!relu_next_of(p, 2)); /* logits: a cross-entropy follows */
  ck_assert(!p->nodes[0].grad_next && p->nodes[1].grad_next && !p->nodes[2].grad_next); /* logits = linear(h) */
  const char *outputs[] = {"z", "h"};
  for (int o = 0; o < 3; o++) {
    graph_builder other;
    mlp_graph(&other, o < 2 ? outputs[o] : NULL, o == 2);
    ttd_program *q = NULL;
    ttd_status_t s = ttd_program_compile(&other.graph, &q);
    ck_assert_msg(s == NULL, "compile: %s", ttd_status_message(s));
    ck_assert_msg(!node_named(q, "z")->relu_next, "variant %d fused", o);
    if (o < 2) ck_assert_msg(node_named(q, "h")->grad_next == (o == 0), "variant %d: grad_next", o);
    ttd_program_release(q);
  }
  enum { N = 1 + 16 * 20 + 16 + 5 * 16 + 5 + 8 * 20 };
  static float got[4][N];
  ttd_backend_vtable wrapped = *h.backend->vtable;
  sim_vtable = h.backend->vtable;
  wrapped.buffer_alloc = counting_alloc;
  h.backend->vtable = &wrapped;
  for (int way = 0; way < 4; way++) { /* bit 0: fuses_relu, bit 1: masks_relu_grad */
    wrapped.fuses_relu = way & 1 ? sim_vtable->fuses_relu : NULL;
    wrapped.masks_relu_grad = way & 2 ? sim_vtable->masks_relu_grad : NULL;
    int allocs[2];
    mlp_run_bytes(&h, got[way], allocs);
    ck_assert_msg(allocs[0] == (way & 1 ? 1 : 2), "way %d: %d hidden buffers in the forward", way, allocs[0]);
    ck_assert_msg(allocs[1] == (way & 2 ? 1 : 2), "way %d: %d hidden gradients in the backward", way, allocs[1]);
    ck_assert_msg(memcmp(got[way], got[0], sizeof(got[0])) == 0, "way %d differs from the unfused run", way);
  }
  h.backend->vtable = sim_vtable;
  alloc_kinds = 0;
  int zero_dx = 0, zero_w1 = 0;
  for (int i = N - 8 * 20; i < N; i++) zero_dx += got[3][i] == 0.0f;
  for (int i = 1; i < 1 + 16 * 20; i++) zero_w1 += got[3][i] == 0.0f;
  ck_assert_int_lt(zero_dx, 8 * 20); /* dx went through the relu's mask and is not all zero */
  ck_assert_int_lt(zero_w1, 16 * 20);
  harness_teardown(&h);
}
END_TEST

/* A batched matmul with no rows (x [2, 0, 3] @ w [2, 3, 4]) writes its weight's gradient all
 * zeros: on the first Backward (its buffer made from freed memory that held other values)
 * and into a .grad whose zeros a ZeroGrad left to the Backward (which still held the last
 * gradient). */
START_TEST(test_empty_batched_matmul_writes_zero_grads) {
  graph_builder b;
  gb_init(&b);
  gb_value(&b, 0, "x", F32, 3, 2, 0, 3, 0);
  gb_value(&b, 1, "w", F32, 3, 2, 3, 4, 0);
  gb_node(&b, "y", "matmul", "x", "w", NULL);
  b.outputs[b.graph.n_outputs++] = "y";
  harness h;
  harness_setup(&h, &b, 0.5f, 1);
  ttd_tensor *w = h.params[0];
  for (int round = 0; round < 2; round++) {
    if (round == 0) { /* freed memory of the gradient's size, holding 7s, for the cache to hand out */
      ttd_tensor *junk = NULL;
      ck_assert_ptr_null(ttd_tensor_create(h.backend, NULL, &w->spec, &junk));
      for (uint64_t i = 0; i < w->spec.numel; i++) write_at(h.backend, junk, i, 7.0f);
      ttd_tensor_release(junk);
    } else { /* the last gradient, its zeros left to this Backward */
      for (uint64_t i = 0; i < w->spec.numel; i++) write_at(h.backend, w->grad, i, 1.0f);
      atomic_store(&w->grad->grad_state, TTD_GRAD_PENDING_ZEROS);
    }
    ttd_run *run = NULL;
    ck_assert_ptr_null(ttd_run_forward(h.backend, NULL, h.program, h.inputs, 1, h.params, 1, &run));
    const ttd_program_value *y = &h.program->values[h.program->outputs[0]];
    ttd_tensor_spec spec = {.dtype = TTD_DTYPE_FLOAT32, .ndim = 3, .device = 0, .location = TTD_MEM_DRAM};
    memcpy(spec.shape, y->type.shape.d, sizeof(int64_t) * 3);
    ck_assert_ptr_null(ttd_tensor_spec_finish(&spec));
    ttd_tensor *dy = NULL, *param_grads[1] = {0};
    ck_assert_ptr_null(ttd_tensor_create(h.backend, NULL, &spec, &dy));
    ttd_status_t st = ttd_run_backward(run, h.backend, &dy, param_grads, NULL);
    ck_assert_msg(st == NULL, "%s", ttd_status_message(st));
    ck_assert_ptr_eq(param_grads[0], w->grad);
    for (uint64_t i = 0; i < w->spec.numel; i++) {
      ck_assert_msg(read_at(h.backend, w->grad, i) == 0.0f, "round %d: w.grad[%llu] is %g", round,
                    (unsigned long long)i, read_at(h.backend, w->grad, i));
    }
    ttd_tensor_release(param_grads[0]);
    ttd_tensor_release(dy);
    ttd_run_free(run);
  }
  harness_teardown(&h);
}
END_TEST

/* ZeroGrad on a parameter's .grad. */
static void zero_grad(harness *h, ttd_tensor *param) {
  ck_assert_ptr_null(ttd_tensor_zero_grad(h->backend, param->grad));
  ck_assert_int_eq(atomic_load(&param->grad->grad_state), TTD_GRAD_ZEROS);
}

static ttd_status_t backward_once(harness *h, ttd_cancel *cancel) {
  ttd_run *run = NULL;
  ck_assert_ptr_null(ttd_run_forward(h->backend, NULL, h->program, h->inputs, h->program->n_inputs, h->params,
                                     h->program->n_params, &run));
  ttd_tensor *dloss = unit_loss_grad(h->backend), *out_grads[1] = {dloss}, *param_grads[MAXV] = {0};
  run->mode.cancel = cancel;
  for (int i = 0; i < alloc_kinds; i++) alloc_count[i] = 0;
  ttd_status_t s = ttd_run_backward(run, h->backend, out_grads, param_grads, NULL);
  for (int p = 0; p < h->program->n_params; p++) {
    if (!s) ck_assert_ptr_eq(param_grads[p], h->params[p]->grad); /* every parameter got its .grad back */
    ttd_tensor_release(param_grads[p]);
  }
  ttd_run_free(run);
  ttd_tensor_release(dloss);
  return s;
}

/* After ZeroGrad, a Backward writes the .grad of linear and matmul parameters in place: no
 * gradient buffer of theirs is allocated, and every .grad equals, value for value, the one
 * summed at the end (the first Backward, when there is no .grad yet), wc's too, which two
 * nodes write (the first writes, the second adds). Without ZeroGrad the gradients are
 * summed at the end onto the old ones (2x). A tensor bound to two parameters is summed in
 * place once and at the end once (their sum). A Backward stopped after five of its nodes
 * had written .grads in place (wc's, wb's, w2's; not w1's) leaves every .grad at zero,
 * known to be zero, and nothing allocated; an Upload begun into a zeroed .grad makes it
 * unknown again, and a ZeroGrad meanwhile cannot say otherwise. */
START_TEST(test_grad_summed_in_place) {
  graph_builder b;
  mlp_hidden_layer(&b);
  gb_value(&b, 1, "w2", F32, 2, 16, 5, 0, 0);
  gb_value(&b, 1, "wa", F32, 2, 5, 5, 0, 0);
  gb_value(&b, 1, "wb", F32, 2, 5, 5, 0, 0);
  gb_value(&b, 1, "wc", F32, 2, 5, 5, 0, 0);
  gb_node(&b, "l", "matmul", "h", "w2", NULL);
  gb_node(&b, "m1", "matmul", "l", "wa", NULL);
  gb_node(&b, "m2", "matmul", "l", "wb", NULL);
  gb_node(&b, "s", "add", "m1", "m2", NULL);
  gb_node(&b, "s2", "matmul", "s", "wc", NULL);
  gb_node(&b, "s3", "matmul", "s2", "wc", NULL);
  gb_node(&b, "loss", "cross_entropy", "s3", "y", NULL);
  b.outputs[b.graph.n_outputs++] = "loss";
  harness h;
  harness_setup(&h, &b, 0.5f, 5);
  ttd_tensor_release(h.params[4]); /* wb is wa's tensor */
  h.params[4] = ttd_tensor_retain(h.params[3]);
  ttd_backend_vtable wrapped = *h.backend->vtable;
  sim_vtable = h.backend->vtable;
  wrapped.buffer_alloc = counting_alloc;
  wrapped.run_node_backward = stopping_backward;
  h.backend->vtable = &wrapped;
  alloc_kinds = 3;
  alloc_bytes_seen[0] = 16 * 20 * 4; /* w1's gradient (no other value has its size) */
  alloc_bytes_seen[1] = 16 * 5 * 4;  /* w2's */
  alloc_bytes_seen[2] = 5 * 5 * 4;   /* wa's, wb's and wc's (twice) */

  ck_assert_ptr_null(backward_once(&h, NULL)); /* no .grad yet: made at the end */
  ck_assert_int_eq(alloc_count[0], 1);
  ck_assert_int_eq(alloc_count[1], 1);
  ck_assert_int_eq(alloc_count[2], 4);
  enum { NP = 6 }; /* w1 b1 w2 wa wb(=wa) wc */
  float *first[NP];
  for (int p = 0; p < NP; p++) {
    ttd_tensor *g = h.params[p]->grad;
    ck_assert_int_eq(atomic_load(&g->grad_state), TTD_GRAD_UNKNOWN);
    first[p] = malloc(g->spec.nbytes);
    h.backend->vtable->buffer_read(h.backend, g->buffer, 0, first[p], g->spec.nbytes);
  }
  for (int p = 0; p < NP; p++) zero_grad(&h, h.params[p]);
  ttd_device_info info;
  h.backend->vtable->device_info(h.backend, 0, &info);
  uint64_t used = info.memory[0].used_bytes;

  ck_assert_ptr_null(backward_once(&h, NULL)); /* in place */
  ck_assert_int_eq(alloc_count[0], 0);
  ck_assert_int_eq(alloc_count[1], 0);
  ck_assert_int_eq(alloc_count[2], 1); /* wb and wc in place, wa (wb's tensor) at the end */
  for (int p = 0; p < NP; p++) {
    ttd_tensor *g = h.params[p]->grad;
    ck_assert_int_eq(atomic_load(&g->grad_state), TTD_GRAD_UNKNOWN);
    for (uint64_t i = 0; i < g->spec.numel; i++) {
      float want = first[p][i], got = read_at(h.backend, g, i);
      if (p == 3 || p == 4) ck_assert_msg(fabsf(got - want) <= 1e-6f * (1.0f + fabsf(want)), "wa[%llu] %g vs %g", (unsigned long long)i, got, want);
      else ck_assert_msg(got == want, "parameter %d [%llu]: in place %g, at the end %g", p, (unsigned long long)i, got, want);
    }
  }

  ck_assert_ptr_null(backward_once(&h, NULL)); /* no ZeroGrad: summed onto the old .grad */
  ck_assert_int_eq(alloc_count[0], 1);
  for (int p = 0; p < 3; p++) {
    for (uint64_t i = 0; i < h.params[p]->spec.numel; i++) ck_assert_float_eq(read_at(h.backend, h.params[p]->grad, i), 2 * first[p][i]);
  }

  for (int p = 0; p < NP; p++) zero_grad(&h, h.params[p]);
  ttd_cancel cancel = {0};
  stop_flag = &cancel;
  stop_after = 5; /* s3, s2 (wc in place), m2 (wb in place), m1 (wa at the end), l (w2 in place) */
  ttd_status_t s = backward_once(&h, &cancel);
  stop_flag = NULL;
  ck_assert_int_eq(stop_after, 0);
  ck_assert_ptr_nonnull(s);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_DEADLINE_EXCEEDED);
  ck_assert_msg(strstr(ttd_status_message(s), "stopped in the backward"), "%s", ttd_status_message(s));
  ttd_status_free(s);
  for (int p = 0; p < NP; p++) {
    ttd_tensor *g = h.params[p]->grad;
    ck_assert_int_eq(atomic_load(&g->grad_state), TTD_GRAD_ZEROS);
    for (uint64_t i = 0; i < g->spec.numel; i++) ck_assert_float_eq(read_at(h.backend, g, i), 0.0f);
  }
  ttd_tensor *w1g = h.params[0]->grad;
  ck_assert(ttd_tensor_write_begin(w1g)); /* an Upload into it */
  ck_assert_int_eq(atomic_load(&w1g->grad_state), TTD_GRAD_UNKNOWN);
  ck_assert_ptr_null(ttd_tensor_zero_grad(h.backend, w1g));
  ck_assert_int_eq(atomic_load(&w1g->grad_state), TTD_GRAD_UNKNOWN);
  ttd_tensor_write_end(w1g);
  h.backend->vtable->device_info(h.backend, 0, &info);
  ck_assert_uint_eq(info.memory[0].used_bytes, used);
  for (int p = 0; p < NP; p++) free(first[p]);
  h.backend->vtable = sim_vtable;
  for (int p = 0; p < NP; p++) { /* .grad goes with its parameter: dropped here for the teardown's count */
    ttd_tensor_release(h.params[p]->grad);
    h.params[p]->grad = NULL;
  }
  harness_teardown(&h);
}
END_TEST

/* Compile's cost estimate: a matmul is 2 x its output x its inner dimension, a conv2d 2 x its
 * output x its receptive field, a pool its output x its window (at least what it reads), an
 * elementwise op its elements; the sum and the costliest node are kept. */
START_TEST(test_cost_estimate) {
  graph_builder b;
  gb_init(&b);
  gb_value(&b, 0, "a", TTD__V1__DTYPE__DTYPE_FLOAT32, 2, 8, 16, 0, 0);
  gb_value(&b, 0, "b", TTD__V1__DTYPE__DTYPE_FLOAT32, 2, 16, 32, 0, 0);
  gb_value(&b, 0, "x", TTD__V1__DTYPE__DTYPE_FLOAT32, 4, 1, 2, 8, 8);
  gb_value(&b, 1, "k", TTD__V1__DTYPE__DTYPE_FLOAT32, 4, 3, 2, 3, 3);
  gb_node(&b, "m", "matmul", "a", "b", NULL);            /* 8*32 outputs x 2*16 = 8192 */
  gb_node(&b, "r", "relu", "m", NULL, NULL);             /* 256 */
  gb_node(&b, "c", "conv2d", "x", "k", NULL);            /* [1,3,6,6] = 108 x 2*2*3*3 = 3888 */
  Ttd__V1__Node *p = gb_node(&b, "p", "avg_pool2d", "c", NULL, NULL); /* [1,3,3,3] x 4 = 108 */
  gb_int(&b, p, "kernel", 2);
  gb_int(&b, p, "stride", 2);
  gb_output(&b, "r");
  gb_output(&b, "p");
  ttd_program *prog = NULL;
  ttd_status_t s = ttd_program_compile(&b.graph, &prog);
  ck_assert_msg(s == NULL, "compile: %s", ttd_status_message(s));
  ck_assert_double_eq(prog->cost, 8192.0 + 256.0 + 3888.0 + 108.0);
  ck_assert_double_eq(prog->costliest_cost, 8192.0);
  ck_assert_str_eq(prog->values[prog->nodes[prog->costliest].value].name, "m");
  ttd_program_release(prog);
}
END_TEST

Suite *program_grad_suite(void) {
  Suite *s = suite_create("program_grad");
  TCase *tc = tcase_create("whole_program");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_mlp_gradients);
  tcase_add_test(tc, test_backward_without_input_grads);
  tcase_add_test(tc, test_lenet_gradients);
  tcase_add_test(tc, test_transformer_block_gradients);
  tcase_add_test(tc, test_scalar_operands);
  tcase_add_test(tc, test_scalar_operand_errors);
  tcase_add_test(tc, test_bfloat16_storage_matches_float32);
  tcase_add_test(tc, test_bfloat16_widened_where_not_every_reader_takes_it);
  tcase_add_test(tc, test_grad_summed_in_place);
  tcase_add_test(tc, test_linear_relu_fused);
  tcase_add_test(tc, test_cost_estimate);
  tcase_add_test(tc, test_empty_batched_matmul_writes_zero_grads);
  suite_add_tcase(s, tc);
  return s;
}
