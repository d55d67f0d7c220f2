/* Graphs and modules through the client library and a real ttd: a model in a few lines with
 * shapes inferred at each line, torch's default initialisation, a module on "cpu" running in
 * process and the same module on the card giving the same outputs, and clear errors; dropout
 * following the module's mode and its count of training forwards, on the card and on "cpu". */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels.h"
#include "suites.h"
#include "training_fixture.h"
#include "ttd_harness.h"

static ttd_proc proc;
static tt_client *client;

static void setup(void) {
  ttd_proc_start(&proc, NULL);
  client = harness_connect(&proc, 1);
}

static void teardown(void) {
  tt_disconnect(client);
  ck_assert_int_eq(ttd_proc_stop(&proc), 0);
}

enum { N = TF_N, IN = TF_IN, H = TF_H, OUT = TF_OUT };

static tt_graph *mlp(void) { return tf_mlp(client); }

/* Shapes are inferred line by line; parameters are named and initialised as torch's
 * Linear does (|w| and |b| below 1/sqrt(fan_in), not all zero). */
START_TEST(test_graph_shapes_and_init) {
  tt_graph *g = tt_graph_create(client, 7);
  int64_t xs[2] = {N, IN};
  tt_value x = tt_graph_input(g, "x", TT_FLOAT32, xs, 2);
  tt_value y = tt_nn_linear(g, x, H, 1);
  int64_t shape[TT_MAX_DIMS];
  int ndim;
  ck_assert_int_eq(tt_graph_shape(g, y, shape, &ndim), 0);
  ck_assert_int_eq(ndim, 2);
  ck_assert_int_eq(shape[0], N);
  ck_assert_int_eq(shape[1], H);
  ck_assert_int_eq(tt_graph_output_count(g), 0);
  tt_graph_output(g, y);
  ck_assert_int_eq(tt_graph_output(g, x), 0);
  ck_assert_int_eq(tt_graph_output_count(g), 2);
  tt_module *m = tt_compile(client, g);
  tt_graph_free(g);
  ck_assert_ptr_nonnull(m);
  ck_assert_int_eq(tt_module_output_count(m), 2);
  ck_assert_int_eq(tt_module_param_count(m), 2);
  ck_assert_str_eq(tt_module_param_name(m, 0), "linear1.weight");
  ck_assert_str_eq(tt_module_param_name(m, 1), "linear1.bias");
  tt_tensor *w = tt_module_param(m, "linear1.weight");
  const float *wd = tt_tensor_data(w);
  double bound = 1.0 / sqrt(IN), sum_abs = 0;
  for (int i = 0; i < H * IN; i++) {
    ck_assert(fabs(wd[i]) <= bound);
    sum_abs += fabs(wd[i]);
  }
  ck_assert(sum_abs / (H * IN) > bound / 4); /* uniform on [-b, b] has mean |w| = b/2 */
  tt_tensor_free(w);
  ck_assert_ptr_null(tt_module_param(m, "nope"));
  ck_assert_int_eq(tt_errcode(client), TT_NOT_FOUND);
  tt_module_free(m);
}
END_TEST

/* A shape mistake fails at the line that makes it, with the op and shapes named; later
 * lines given the failed value fail too, and compiling is refused. */
START_TEST(test_graph_errors) {
  tt_graph *g = tt_graph_create(client, 1);
  int64_t as[2] = {4, 5}, bs[2] = {6, 7};
  tt_value a = tt_graph_input(g, "a", TT_FLOAT32, as, 2);
  tt_value b = tt_graph_input(g, "b", TT_FLOAT32, bs, 2);
  tt_value ab[2] = {a, b};
  tt_value bad = tt_graph_op(g, "matmul", ab, 2, NULL);
  ck_assert_int_lt(bad, 0);
  ck_assert_int_eq(tt_errcode(client), TT_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(tt_last_error(client), "inner dims differ: [4, 5] x [6, 7]"));
  ck_assert_int_lt(tt_relu(g, bad), 0);
  ck_assert_int_lt(tt_graph_op(g, "max_pool2d", &a, 1, "kernel=2"), 0);
  ck_assert_ptr_nonnull(strstr(tt_last_error(client), "[n, c, h, w]"));
  ck_assert_int_lt(tt_graph_op(g, "relu", &a, 1, "slope"), 0);
  ck_assert_ptr_nonnull(strstr(tt_last_error(client), "name=value"));
  ck_assert_int_lt(tt_graph_op(g, "softmax", &a, 1, "axis=0"), 0);
  ck_assert_int_lt(tt_graph_input(g, "a", TT_FLOAT32, as, 2), 0);
  ck_assert_ptr_nonnull(strstr(tt_last_error(client), "'a' is already used"));
  tt_value t = tt_graph_op(g, "transpose", &a, 1, "dim0=0;dim1=1");
  ck_assert_int_ge(t, 0);
  tt_value tb[2] = {t, t};
  ck_assert_int_ge(tt_graph_op(g, "matmul", tb, 2, "transpose_b=1"), 0);
  tt_graph *empty = tt_graph_create(client, 1);
  ck_assert_ptr_null(tt_compile(client, empty));
  ck_assert_ptr_nonnull(strstr(tt_last_error(client), "no outputs"));
  tt_graph_free(empty);
  tt_graph_free(g);
}
END_TEST

/* The module runs on "cpu" in process and, moved with tt_module_to("tt"), on the card:
 * same outputs; parameters occupy device memory and come back unchanged. */
START_TEST(test_module_cpu_and_device_agree) {
  tt_graph *g = mlp();
  tt_module *m = tt_compile(client, g);
  tt_graph_free(g);
  ck_assert_ptr_nonnull(m);
  tt_module_train(m, 0); /* eval: outputs hold no run, so the module may move while they live */
  ck_assert_str_eq(tt_module_device(m), "cpu");
  float xv[N * IN];
  for (int i = 0; i < N * IN; i++) xv[i] = sinf((float)i * 0.37f);
  int64_t xs[2] = {N, IN};
  tt_tensor *x = tt_tensor_from_host(client, xv, TT_FLOAT32, xs, 2);
  tt_tensor *y_cpu = NULL;
  ck_assert_int_eq(tt_forward(m, &x, 1, &y_cpu), TT_OK);
  ck_assert_int_eq(tt_tensor_shape(y_cpu)[1], OUT);
  /* Reference from the module's own parameters. */
  tt_tensor *w1 = tt_module_param(m, "linear1.weight"), *b1 = tt_module_param(m, "linear1.bias");
  tt_tensor *w2 = tt_module_param(m, "linear2.weight"), *b2 = tt_module_param(m, "linear2.bias");
  const float *W1 = tt_tensor_data(w1), *B1 = tt_tensor_data(b1), *W2 = tt_tensor_data(w2), *B2 = tt_tensor_data(b2);
  const float *Y = tt_tensor_data(y_cpu);
  for (int i = 0; i < N; i++) {
    double h[H];
    for (int j = 0; j < H; j++) {
      double z = B1[j];
      for (int k = 0; k < IN; k++) z += (double)xv[i * IN + k] * W1[j * IN + k];
      h[j] = z > 0 ? z : 0;
    }
    for (int o = 0; o < OUT; o++) {
      double z = B2[o];
      for (int j = 0; j < H; j++) z += h[j] * W2[o * H + j];
      ck_assert_msg(fabs(z - Y[i * OUT + o]) < 1e-5, "cpu output %d,%d: %g vs %g", i, o, Y[i * OUT + o], z);
    }
  }
  uint64_t param_bytes = (uint64_t)(H * IN + H + OUT * H + OUT) * 4;
  ck_assert_int_eq(tt_module_to(m, "tt"), TT_OK);
  ck_assert_str_eq(tt_module_device(m), "tt:0");
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), param_bytes);
  tt_tensor *y_dev = NULL;
  ck_assert_int_eq(tt_forward(m, &x, 1, &y_dev), TT_INVALID_ARGUMENT); /* x is still on the cpu */
  ck_assert_ptr_nonnull(strstr(tt_last_error(client), "input 0 ('x') is on cpu but the module is on tt:0"));
  tt_tensor *xd = tt_to(x, "tt");
  ck_assert_int_eq(tt_forward(m, &xd, 1, &y_dev), TT_OK);
  ck_assert_str_eq(tt_tensor_device(y_dev), "tt:0");
  tt_tensor *y_back = tt_to(y_dev, "cpu");
  for (int i = 0; i < N * OUT; i++) ck_assert_float_eq_tol(((float *)tt_tensor_data(y_back))[i], Y[i], 1e-5);
  ck_assert_int_eq(tt_module_to(m, "cpu"), TT_OK);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), (uint64_t)(N * IN + N * OUT) * 4); /* xd, y_dev */
  tt_tensor *w1_back = tt_module_param(m, "linear1.weight");
  ck_assert_int_eq(memcmp(tt_tensor_data(w1_back), W1, sizeof(float) * H * IN), 0);
  ck_assert_int_eq(tt_module_to(m, "tt:0/l1"), TT_INVALID_ARGUMENT);
  tt_tensor *list[] = {w1_back, y_back, y_dev, xd, w1, b1, w2, b2, y_cpu, x};
  for (size_t i = 0; i < sizeof(list) / sizeof(list[0]); i++) tt_tensor_free(list[i]);
  tt_module_free(m);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 0);
}
END_TEST

/* The .to() training flow: module on the card, loss on the CPU, tt_backward reaching the
 * device module through the downloaded output, SGD on the device. On a fixed batch the loss
 * falls; .grad is readable; misuse gets clear errors. */
START_TEST(test_train_on_device_with_cpu_loss) {
  tt_graph *g = mlp();
  tt_module *m = tt_compile(client, g);
  tt_graph_free(g);
  ck_assert_int_eq(tt_module_to(m, "tt"), TT_OK);
  float xv[N * IN];
  int32_t yv[N];
  for (int i = 0; i < N * IN; i++) xv[i] = cosf((float)i * 0.91f);
  for (int i = 0; i < N; i++) yv[i] = i % OUT;
  int64_t xs[2] = {N, IN}, ys[1] = {N};
  tt_tensor *x = tt_tensor_from_host(client, xv, TT_FLOAT32, xs, 2), *labels = tt_tensor_from_host(client, yv, TT_INT32, ys, 1);
  tt_tensor *xd = tt_to(x, "tt");
  tt_optimizer *opt = tt_sgd(m, 0.5f, 0.9f, 0.0f, 0);
  ck_assert_ptr_null(tt_param_grad(m, "linear1.weight"));
  ck_assert_int_eq(tt_errcode(client), TT_FAILED_PRECONDITION);
  float first = 0, last = 0;
  for (int step = 0; step < 40; step++) {
    tt_tensor *y = NULL;
    ck_assert_int_eq(tt_forward(m, &xd, 1, &y), TT_OK);
    tt_tensor *y_cpu = tt_to(y, "cpu");
    tt_tensor *loss = tt_cross_entropy(y_cpu, labels);
    ck_assert_ptr_nonnull(loss);
    if (step == 0) first = tt_tensor_item(loss);
    last = tt_tensor_item(loss);
    ck_assert_int_eq(tt_zero_grad(opt), TT_OK);
    ck_assert_msg(tt_backward(loss) == TT_OK, "%s", tt_last_error(client));
    if (step == 0) {
      /* .grad is on the device; a second backward through the same run is refused. */
      tt_tensor *gw = tt_param_grad(m, "linear2.bias");
      ck_assert_ptr_nonnull(gw);
      ck_assert_str_eq(tt_tensor_device(gw), "tt:0");
      tt_tensor *gh = tt_to(gw, "cpu");
      float sum = 0;
      for (int k = 0; k < OUT; k++) sum += ((float *)tt_tensor_data(gh))[k];
      ck_assert_float_eq_tol(sum, 0.0f, 1e-5); /* cross-entropy bias gradients sum to zero */
      tt_tensor_free(gh);
      tt_tensor_free(gw);
      ck_assert_int_eq(tt_backward(loss), TT_FAILED_PRECONDITION);
      ck_assert_ptr_nonnull(strstr(tt_last_error(client), "already backpropagated"));
    }
    ck_assert_int_eq(tt_step(opt), TT_OK);
    tt_tensor_free(loss);
    tt_tensor_free(y_cpu);
    tt_tensor_free(y);
  }
  ck_assert_msg(last < first * 0.2f, "loss went from %g to %g", first, last);
  /* Moving a module while a forward's run is pending is refused; after backward it moves. */
  tt_tensor *y = NULL;
  ck_assert_int_eq(tt_forward(m, &xd, 1, &y), TT_OK);
  ck_assert_int_eq(tt_module_to(m, "cpu"), TT_FAILED_PRECONDITION);
  ck_assert_ptr_nonnull(strstr(tt_last_error(client), "1 forward run(s) pending"));
  tt_tensor *y_cpu = tt_to(y, "cpu");
  tt_tensor *loss = tt_cross_entropy(y_cpu, labels);
  ck_assert_int_eq(tt_backward(loss), TT_OK);
  ck_assert_int_eq(tt_module_to(m, "cpu"), TT_OK);
  ck_assert_int_eq(tt_module_to(m, "tt"), TT_OK);
  tt_tensor_free(loss);
  tt_tensor_free(y_cpu);
  tt_tensor_free(y);
  /* A host loss of mismatched shapes, and a loss of untracked tensors. */
  float t5[5] = {0};
  int64_t s5[1] = {5};
  tt_tensor *five = tt_tensor_from_host(client, t5, TT_FLOAT32, s5, 1);
  ck_assert_ptr_null(tt_mse_loss(x, five));
  ck_assert_ptr_nonnull(strstr(tt_last_error(client), "[8, 12] and [5]"));
  tt_tensor *plain = tt_mse_loss(five, five);
  ck_assert_int_eq(tt_backward(plain), TT_OK); /* nothing upstream: a no-op */
  ck_assert_int_eq(tt_backward(five), TT_INVALID_ARGUMENT);
  tt_tensor_free(plain);
  tt_tensor_free(five);
  tt_optimizer_free(opt);
  tt_tensor_free(xd);
  tt_tensor_free(x);
  tt_tensor_free(labels);
  tt_module_free(m);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 0);
}
END_TEST

/* A module saved as safetensors from the card and loaded into a fresh module (on the cpu)
 * gives the same outputs; a checkpoint of another model is refused naming the parameter. */
START_TEST(test_checkpoint_round_trip) {
  char path[128];
  snprintf(path, sizeof(path), "%s/model.safetensors", proc.dir);
  tt_graph *g = mlp();
  tt_module *a = tt_compile(client, g);
  tt_graph_free(g);
  ck_assert_int_eq(tt_module_to(a, "tt"), TT_OK);
  ck_assert_int_eq(tt_module_save(a, path), TT_OK);
  tt_graph *g2 = tt_graph_create(client, 999); /* other initial values */
  int64_t xs[2] = {N, IN};
  tt_value x = tt_graph_input(g2, "x", TT_FLOAT32, xs, 2);
  tt_graph_output(g2, tt_nn_linear(g2, tt_relu(g2, tt_nn_linear(g2, x, H, 1)), OUT, 1));
  tt_module *b = tt_compile(client, g2);
  tt_graph_free(g2);
  ck_assert_int_eq(tt_module_load(b, path), TT_OK);
  tt_tensor *wa = tt_module_param(a, "linear2.weight"), *wb = tt_module_param(b, "linear2.weight");
  tt_tensor *wa_host = tt_to(wa, "cpu");
  ck_assert_int_eq(memcmp(tt_tensor_data(wa_host), tt_tensor_data(wb), sizeof(float) * OUT * H), 0);
  tt_graph *g3 = tt_graph_create(client, 1);
  tt_value x3 = tt_graph_input(g3, "x", TT_FLOAT32, xs, 2);
  tt_graph_output(g3, tt_nn_linear(g3, x3, 4, 1));
  tt_module *c3 = tt_compile(client, g3);
  tt_graph_free(g3);
  ck_assert_int_eq(tt_module_load(c3, path), TT_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(tt_last_error(client), "'linear1.weight' has another dtype or shape"));
  tt_tensor_free(wa_host);
  tt_tensor_free(wa);
  tt_tensor_free(wb);
  tt_module_free(c3);
  tt_module_free(b);
  tt_module_free(a);
}
END_TEST

/* k SGD steps of one model three ways: on the card with the device optimizer, all on "cpu"
 * in process, and on the card with the CPU optimizer: the same parameters. */
static tt_module *trained_three_ways(int way) {
  tt_graph *g = mlp(); /* same seed, same initial parameters */
  tt_module *m = tt_compile(client, g);
  tt_graph_free(g);
  if (way != 1) ck_assert_int_eq(tt_module_to(m, "tt"), TT_OK);
  tt_optimizer *opt = tt_sgd(m, 0.2f, 0.9f, 0.01f, 0);
  if (way == 2) tt_optimizer_on_cpu(opt, 1);
  float xv[N * IN];
  int32_t yv[N];
  for (int i = 0; i < N * IN; i++) xv[i] = sinf((float)i * 1.3f);
  for (int i = 0; i < N; i++) yv[i] = (i * 7) % OUT;
  int64_t xs[2] = {N, IN}, ys[1] = {N};
  tt_tensor *x = tt_tensor_from_host(client, xv, TT_FLOAT32, xs, 2), *labels = tt_tensor_from_host(client, yv, TT_INT32, ys, 1);
  tt_tensor *xin = tt_to(x, tt_module_device(m));
  for (int step = 0; step < 5; step++) {
    tt_tensor *y = NULL;
    ck_assert_int_eq(tt_forward(m, &xin, 1, &y), TT_OK);
    tt_tensor *y_cpu = tt_to(y, "cpu");
    tt_tensor *loss = tt_cross_entropy(y_cpu, labels);
    ck_assert_int_eq(tt_zero_grad(opt), TT_OK);
    ck_assert_msg(tt_backward(loss) == TT_OK, "way %d: %s", way, tt_last_error(client));
    ck_assert_msg(tt_step(opt) == TT_OK, "way %d: %s", way, tt_last_error(client));
    tt_tensor_free(loss);
    tt_tensor_free(y_cpu);
    tt_tensor_free(y);
  }
  tt_tensor_free(xin);
  tt_tensor_free(x);
  tt_tensor_free(labels);
  tt_optimizer_free(opt);
  ck_assert_int_eq(tt_module_to(m, "cpu"), TT_OK);
  return m;
}

START_TEST(test_three_ways_same_parameters) {
  tt_module *ways[3];
  for (int w = 0; w < 3; w++) ways[w] = trained_three_ways(w);
  tt_graph *g = mlp();
  tt_module *fresh = tt_compile(client, g);
  tt_graph_free(g);
  for (int p = 0; p < tt_module_param_count(fresh); p++) {
    const char *name = tt_module_param_name(fresh, p);
    tt_tensor *t0 = tt_module_param(fresh, name), *t[3];
    for (int w = 0; w < 3; w++) t[w] = tt_module_param(ways[w], name);
    const float *a = tt_tensor_data(t[0]);
    double moved = 0;
    for (uint64_t k = 0; k < tt_tensor_numel(t[0]); k++) {
      moved += fabs(a[k] - ((float *)tt_tensor_data(t0))[k]);
      for (int w = 1; w < 3; w++) {
        float b = ((float *)tt_tensor_data(t[w]))[k];
        ck_assert_msg(fabsf(a[k] - b) <= 1e-5f + 1e-4f * fabsf(a[k]), "%s[%llu]: way 0 %g, way %d %g", name,
                      (unsigned long long)k, a[k], w, b);
      }
    }
    ck_assert_msg(moved > 0, "%s did not change: the steps did nothing", name);
    for (int w = 0; w < 3; w++) tt_tensor_free(t[w]);
    tt_tensor_free(t0);
  }
  for (int w = 0; w < 3; w++) tt_module_free(ways[w]);
  tt_module_free(fresh);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 0);
}
END_TEST

static void grad_of(tt_module *m, const char *name, float *out, size_t n) { tf_grad_of(client, m, name, out, n); }

typedef tt_tensor *(*loss_fn)(tt_module *a, tt_module *b, tt_tensor *x, tt_tensor *target, tt_tensor *labels);

/* Runs a fresh forward of the modules the loss uses, backward, and returns linear2.bias's
 * gradient of each (module a first). .grad is zeroed before. */
static void grads_for(loss_fn f, tt_module *a, tt_module *b, tt_tensor *x, tt_tensor *t, tt_tensor *l, float *ga, float *gb) {
  tt_optimizer *oa = tt_sgd(a, 0.1f, 0, 0, 0), *ob = tt_sgd(b, 0.1f, 0, 0, 0);
  tt_zero_grad(oa);
  tt_zero_grad(ob);
  tt_tensor *loss = f(a, b, x, t, l);
  ck_assert_msg(loss != NULL, "%s", tt_last_error(client));
  ck_assert_msg(tt_backward(loss) == TT_OK, "%s", tt_last_error(client));
  tt_tensor_free(loss);
  if (ga) grad_of(a, "linear2.bias", ga, OUT);
  if (gb) grad_of(b, "linear2.bias", gb, OUT);
  tt_optimizer_free(oa);
  tt_optimizer_free(ob);
}

static tt_tensor *out_cpu(tt_module *m, tt_tensor *x) {
  tt_tensor *y = NULL;
  ck_assert_int_eq(tt_forward(m, &x, 1, &y), TT_OK);
  tt_tensor *h = tt_to(y, "cpu");
  tt_tensor_free(y);
  return h;
}

static tt_tensor *mse_a(tt_module *a, tt_module *b, tt_tensor *x, tt_tensor *t, tt_tensor *l) {
  (void)b, (void)l;
  tt_tensor *y = out_cpu(a, x), *loss = tt_mse_loss(y, t);
  tt_tensor_free(y);
  return loss;
}
static tt_tensor *l1_a(tt_module *a, tt_module *b, tt_tensor *x, tt_tensor *t, tt_tensor *l) {
  (void)b, (void)l;
  tt_tensor *y = out_cpu(a, x), *loss = tt_l1_loss(y, t);
  tt_tensor_free(y);
  return loss;
}
static tt_tensor *both_of_a(tt_module *a, tt_module *b, tt_tensor *x, tt_tensor *t, tt_tensor *l) {
  (void)b, (void)l;
  tt_tensor *y = out_cpu(a, x); /* one device output, used twice */
  tt_tensor *m1 = tt_mse_loss(y, t), *m2 = tt_l1_loss(y, t), *loss = tt_add(m1, m2);
  tt_tensor_free(m1);
  tt_tensor_free(m2);
  tt_tensor_free(y);
  return loss;
}
static tt_tensor *ce_b(tt_module *a, tt_module *b, tt_tensor *x, tt_tensor *t, tt_tensor *l) {
  (void)a, (void)t;
  tt_tensor *y = out_cpu(b, x), *loss = tt_cross_entropy(y, l);
  tt_tensor_free(y);
  return loss;
}
static tt_tensor *two_modules(tt_module *a, tt_module *b, tt_tensor *x, tt_tensor *t, tt_tensor *l) {
  tt_tensor *la = mse_a(a, b, x, t, l), *lb = ce_b(a, b, x, t, l);
  tt_tensor *half = tt_tensor_from_host(client, (float[]){0.5f}, TT_FLOAT32, NULL, 0);
  tt_tensor *scaled = tt_mul(lb, half), *sum = tt_add(la, scaled), *loss = tt_mean(sum);
  tt_tensor *done[] = {la, lb, half, scaled, sum};
  for (size_t i = 0; i < 5; i++) tt_tensor_free(done[i]);
  return loss;
}

/* A device output used twice accumulates on the host before one Backward (its gradient is
 * the sum of each use's), and a loss over outputs of two modules reaches both (host add,
 * mul and mean on the tape). */
START_TEST(test_output_used_twice_and_two_modules) {
  tt_graph *ga_graph = mlp(), *gb_graph = tt_graph_create(client, 77);
  int64_t xs[2] = {N, IN};
  tt_value xv = tt_graph_input(gb_graph, "x", TT_FLOAT32, xs, 2);
  tt_graph_output(gb_graph, tt_nn_linear(gb_graph, tt_relu(gb_graph, tt_nn_linear(gb_graph, xv, H, 1)), OUT, 1));
  tt_module *a = tt_compile(client, ga_graph), *b = tt_compile(client, gb_graph);
  tt_graph_free(ga_graph);
  tt_graph_free(gb_graph);
  ck_assert_int_eq(tt_module_to(a, "tt"), TT_OK);
  ck_assert_int_eq(tt_module_to(b, "tt"), TT_OK);
  float xh[N * IN], th[N * OUT];
  int32_t lh[N];
  for (int i = 0; i < N * IN; i++) xh[i] = cosf((float)i);
  for (int i = 0; i < N * OUT; i++) th[i] = sinf((float)i * 3.0f);
  for (int i = 0; i < N; i++) lh[i] = i % OUT;
  int64_t ts[2] = {N, OUT}, ls[1] = {N};
  tt_tensor *x = tt_tensor_from_host(client, xh, TT_FLOAT32, xs, 2), *xd = tt_to(x, "tt");
  tt_tensor *t = tt_tensor_from_host(client, th, TT_FLOAT32, ts, 2), *l = tt_tensor_from_host(client, lh, TT_INT32, ls, 1);
  float g_mse[OUT], g_l1[OUT], g_both[OUT], ga[OUT], gb[OUT], g_ce[OUT];
  grads_for(mse_a, a, b, xd, t, l, g_mse, NULL);
  grads_for(l1_a, a, b, xd, t, l, g_l1, NULL);
  grads_for(both_of_a, a, b, xd, t, l, g_both, NULL);
  ck_assert(fabsf(g_mse[0]) + fabsf(g_l1[0]) > 1e-4f); /* real gradients, not zeros */
  for (int k = 0; k < OUT; k++) ck_assert_float_eq_tol(g_both[k], g_mse[k] + g_l1[k], 1e-5);
  grads_for(ce_b, a, b, xd, t, l, NULL, g_ce);
  grads_for(two_modules, a, b, xd, t, l, ga, gb);
  for (int k = 0; k < OUT; k++) {
    ck_assert_float_eq_tol(ga[k], g_mse[k] / 1.0f, 1e-5); /* mean of a scalar is itself */
    ck_assert_float_eq_tol(gb[k], 0.5f * g_ce[k], 1e-5);
  }
  tt_tensor *free_list[] = {x, xd, t, l};
  for (size_t i = 0; i < 4; i++) tt_tensor_free(free_list[i]);
  tt_module_free(a);
  tt_module_free(b);
}
END_TEST

/* One step of zero_grad-between-forward-and-backward training on m: forward, the loss of
 * output 0 (and of output 1 too when both), zero_grad when zero, backward. */
static void zb_step(tt_module *m, tt_optimizer *o, tt_tensor *x, tt_tensor *ta, tt_tensor *tb, int both, int zero) {
  tt_tensor *ys[2] = {NULL, NULL};
  ck_assert_msg(tt_forward(m, &x, 1, ys) == TT_OK, "%s", tt_last_error(client));
  tt_tensor *ya = tt_to(ys[0], "cpu"), *yb = tt_to(ys[1], "cpu");
  tt_tensor *la = tt_mse_loss(ya, ta), *lb = tt_mse_loss(yb, tb), *loss = both ? tt_add(la, lb) : NULL;
  if (zero) ck_assert_int_eq(tt_zero_grad(o), TT_OK);
  ck_assert_msg(tt_backward(both ? loss : la) == TT_OK, "%s", tt_last_error(client));
  tt_tensor *done[] = {ys[0], ys[1], ya, yb, la, lb, loss};
  for (size_t i = 0; i < 7; i++) tt_tensor_free(done[i]);
}

/* zero_grad() between the forward and backward() (a Backward's queued work): the card leaves
 * the zeros to the Backward, which writes each .grad it reaches whole; the gradients are
 * those of the module on "cpu" bit for bit: w's (two matmuls, summed in place), s's (a mul,
 * summed at the end over the stale bytes' zeros), and zeros for the linear the loss no
 * longer reaches, all three after a step that gave every .grad other values. */
START_TEST(test_zero_grad_before_backward) {
  enum { ZH = 6 };
  float got[2][IN * ZH + ZH + OUT * IN + OUT];
  for (int where = 0; where < 2; where++) {
    tt_graph *g = tt_graph_create(client, 9);
    int64_t xs[2] = {N, IN}, ws[2] = {IN, ZH}, ss[1] = {ZH};
    tt_value x = tt_graph_input(g, "x", TT_FLOAT32, xs, 2);
    tt_value w = tt_graph_param(g, "w", ws, 2, TT_INIT_UNIFORM, 0.5);
    tt_value sc = tt_graph_param(g, "s", ss, 1, TT_INIT_UNIFORM, 1.0);
    tt_value h = tt_graph_op(g, "add", (tt_value[]){tt_graph_op(g, "matmul", (tt_value[]){x, w}, 2, NULL),
                                                    tt_graph_op(g, "matmul", (tt_value[]){tt_relu(g, x), w}, 2, NULL)},
                             2, NULL);
    tt_value ya = tt_graph_op(g, "mul", (tt_value[]){h, sc}, 2, NULL);
    tt_value yb = tt_nn_linear(g, x, OUT, 1);
    ck_assert_int_ge(ya, 0);
    ck_assert_int_eq(tt_graph_output(g, ya), 0);
    ck_assert_int_eq(tt_graph_output(g, yb), 0);
    tt_module *m = tt_compile(client, g);
    tt_graph_free(g);
    ck_assert_msg(m != NULL, "%s", tt_last_error(client));
    ck_assert_int_eq(tt_module_to(m, where ? "tt" : "cpu"), TT_OK);
    tt_optimizer *o = tt_sgd(m, 0.1f, 0, 0, 0);
    float xh[N * IN], tah[N * ZH], tbh[N * OUT];
    for (int i = 0; i < N * IN; i++) xh[i] = cosf((float)i) - 0.2f;
    for (int i = 0; i < N * ZH; i++) tah[i] = sinf((float)i);
    for (int i = 0; i < N * OUT; i++) tbh[i] = cosf((float)i * 2.0f);
    int64_t tas[2] = {N, ZH}, tbs[2] = {N, OUT};
    tt_tensor *xt = tt_tensor_from_host(client, xh, TT_FLOAT32, xs, 2), *xd = tt_to(xt, where ? "tt" : "cpu");
    tt_tensor *ta = tt_tensor_from_host(client, tah, TT_FLOAT32, tas, 2);
    tt_tensor *tb = tt_tensor_from_host(client, tbh, TT_FLOAT32, tbs, 2);
    zb_step(m, o, xd, ta, tb, 1, 0); /* every .grad made, and given values */
    zb_step(m, o, xd, ta, tb, 0, 1); /* zero_grad, then a loss of output 0 alone */
    ck_assert_int_eq(tt_module_to(m, where ? "tt:0" : "cpu"), TT_OK); /* where it is: nothing moves, .grad stays */
    float *out = got[where]; /* tt_param_grad sends the queued Backward first */
    grad_of(m, "w", out, IN * ZH);
    grad_of(m, "s", out + IN * ZH, ZH);
    grad_of(m, "linear1.weight", out + IN * ZH + ZH, OUT * IN);
    grad_of(m, "linear1.bias", out + IN * ZH + ZH + OUT * IN, OUT);
    tt_tensor *done[] = {xt, xd, ta, tb};
    for (size_t i = 0; i < 4; i++) tt_tensor_free(done[i]);
    tt_optimizer_free(o);
    tt_module_free(m);
  }
  float wsum = 0, ssum = 0;
  for (int i = 0; i < IN * ZH; i++) wsum += fabsf(got[1][i]);
  for (int i = 0; i < ZH; i++) ssum += fabsf(got[1][IN * ZH + i]);
  ck_assert(wsum > 1e-3f && ssum > 1e-3f); /* real gradients */
  for (int i = IN * ZH + ZH; i < IN * ZH + ZH + OUT * IN + OUT; i++) ck_assert_float_eq(got[1][i], 0.0f);
  ck_assert_mem_eq(got[0], got[1], sizeof(got[0]));
}
END_TEST

/* Tensors of a disconnected client: host data stays readable, device calls fail with
 * FAILED_PRECONDITION saying the client was disconnected, the daemon freed the memory, and
 * freeing the tensors afterwards is safe. */
START_TEST(test_tensor_of_closed_client) {
  tt_client *c = harness_connect(&proc, 0);
  float v[4] = {1, 2, 3, 4};
  int64_t s4[1] = {4};
  tt_tensor *h = tt_tensor_from_host(c, v, TT_FLOAT32, s4, 1), *d = tt_to(h, "tt");
  ck_assert_ptr_nonnull(d);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 16);
  tt_disconnect(c);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 0);
  ck_assert_ptr_null(tt_to(d, "cpu"));
  ck_assert_int_eq(tt_errcode(tt_tensor_client(d)), TT_FAILED_PRECONDITION);
  ck_assert_ptr_nonnull(strstr(tt_last_error(tt_tensor_client(d)), "disconnected"));
  ck_assert_ptr_null(tt_to(h, "tt"));
  ck_assert_float_eq(((float *)tt_tensor_data(h))[3], 4.0f);
  tt_tensor_free(d);
  tt_tensor_free(h); /* the last reference: the client's memory goes now */
}
END_TEST

/* Two training processes (build/bin/mlp, one epoch each) against one ttd at once: both
 * finish and reach the accuracy one run alone reaches (0.83 here; band >= 0.80). */
START_TEST(test_two_training_processes) {
  if (getenv("TTD_SKIP_HUGE")) return; /* two whole epochs: the plain build's run covers it */
  const char *bin = getenv("TTD_BIN") ? getenv("TTD_BIN") : "build/bin/ttd";
  char mlp_bin[512];
  snprintf(mlp_bin, sizeof(mlp_bin), "%.*smlp", (int)(strrchr(bin, '/') ? strrchr(bin, '/') - bin + 1 : 0), bin);
  pid_t pids[2];
  char logs[2][160];
  for (int i = 0; i < 2; i++) {
    snprintf(logs[i], sizeof(logs[i]), "%s/mlp%d.log", proc.dir, i);
    pids[i] = fork();
    ck_assert_int_ge(pids[i], 0);
    if (pids[i] == 0) {
      if (!freopen(logs[i], "w", stdout) || !freopen(logs[i], "a", stderr)) _exit(126);
      execl(mlp_bin, "mlp", "--epochs", "1", "--target", proc.target, (char *)NULL);
      _exit(127);
    }
  }
  for (int i = 0; i < 2; i++) {
    int status;
    ck_assert_int_eq(waitpid(pids[i], &status, 0), pids[i]);
    char text[8192] = "";
    FILE *f = fopen(logs[i], "r");
    size_t n = f ? fread(text, 1, sizeof(text) - 1, f) : 0;
    text[n] = '\0';
    if (f) fclose(f);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "mlp %d failed: %s", i, text);
    const char *at = strstr(text, "test accuracy: ");
    ck_assert_msg(at != NULL, "mlp %d printed no accuracy: %s", i, text);
    double acc = atof(at + strlen("test accuracy: "));
    ck_assert_msg(acc >= 0.80, "mlp %d reached %.4f", i, acc);
  }
}
END_TEST

/* ---- dropout through modules ---- */

enum { DR = 16, DC = 64, DN = DR * DC, DR_SMALL = 8 };
#define DROP_SEED 4242u
#define DROP_P 0.5f /* dropout's default p */

static const char *const drop_devices[] = {"cpu", "tt"};
static float drop_x[DN];

/* y = dropout(x * w) of x [rows, DC] with w a [DC] parameter of ones: y is dropout(x) itself
 * (x * 1 is x), and the gradient of w under sum(y) is the column sums of y. */
static tt_module *dropout_module(const char *device) {
  for (int i = 0; i < DN; i++) drop_x[i] = (float)(i % 89) * 0.25f - 10.125f; /* never 0 */
  tt_graph *g = tt_graph_create(client, 3);
  tt_value x = tt_graph_input(g, "x", TT_FLOAT32, (int64_t[]){DR, DC}, 2);
  tt_value xw[2] = {x, tt_graph_param(g, "w", (int64_t[]){DC}, 1, TT_INIT_ONES, 0)};
  tt_value y = tt_graph_op(g, "dropout", (tt_value[]){tt_graph_op(g, "mul", xw, 2, NULL)}, 1, "seed=4242");
  ck_assert_int_eq(tt_graph_output(g, y), 0);
  tt_module *m = tt_compile(client, g);
  tt_graph_free(g);
  ck_assert_msg(m != NULL, "%s", tt_last_error(client));
  ck_assert_int_eq(tt_module_to(m, device), TT_OK);
  return m;
}

/* The forward of m on the first rows of drop_x, on the host (holding the run in training). */
static tt_tensor *drop_forward(tt_module *m, int rows) {
  tt_tensor *h = tt_tensor_from_host(client, drop_x, TT_FLOAT32, (int64_t[]){rows, DC}, 2);
  tt_tensor *x = tt_to(h, tt_module_device(m)), *y = NULL;
  ck_assert_msg(tt_forward(m, &x, 1, &y) == TT_OK, "%s", tt_last_error(client));
  tt_tensor *out = tt_to(y, "cpu");
  ck_assert_ptr_nonnull(out);
  tt_tensor_free(y);
  tt_tensor_free(x);
  tt_tensor_free(h);
  return out;
}

/* y is dropout's output for the first rows of drop_x at dropout step, bit for bit. */
static void assert_mask_of_step(tt_tensor *y, int rows, uint64_t step, const char *what) {
  float want[DN];
  ttd_k_dropout(NULL, drop_x, (int64_t)rows * DC, DROP_P, DROP_SEED, step, want);
  ck_assert_msg(memcmp(tt_tensor_data(y), want, sizeof(float) * (size_t)rows * DC) == 0, "%s: not step %d's mask", what,
                (int)step);
}

/* In eval a module with dropout returns its input exactly (at any batch) and leaves the count
 * of training forwards alone; training forwards then draw the masks of steps 0 and 1, which
 * differ. */
START_TEST(test_dropout_eval_and_training_masks) {
  tt_module *m = dropout_module(drop_devices[_i]);
  tt_module_train(m, 0);
  for (int k = 0; k < 2; k++) {
    tt_tensor *y = drop_forward(m, k ? DR_SMALL : DR);
    ck_assert_int_eq(memcmp(tt_tensor_data(y), drop_x, sizeof(float) * (k ? DR_SMALL : DR) * DC), 0);
    tt_tensor_free(y);
  }
  tt_module_train(m, 1);
  tt_tensor *y0 = drop_forward(m, DR), *y1 = drop_forward(m, DR);
  assert_mask_of_step(y0, DR, 0, "first training forward");
  assert_mask_of_step(y1, DR, 1, "second training forward");
  const float *a = tt_tensor_data(y0), *b = tt_tensor_data(y1);
  int differ = 0;
  for (int i = 0; i < DN; i++) differ += (a[i] == 0.0f) != (b[i] == 0.0f);
  ck_assert_msg(differ > DN / 4, "the two masks differ at %d of %d", differ, DN); /* about half */
  tt_tensor_free(y0);
  tt_tensor_free(y1);
  tt_module_free(m);
}
END_TEST

/* The same sequence of forwards (training and eval, two batch sizes) gives the same outputs,
 * bit for bit, on the card and on "cpu". */
START_TEST(test_dropout_card_equals_cpu) {
  tt_module *cpu = dropout_module("cpu"), *card = dropout_module("tt");
  static const struct { int training, rows; } seq[] = {{1, DR}, {1, DR}, {0, DR}, {1, DR_SMALL}, {0, DR_SMALL}, {1, DR}};
  for (size_t k = 0; k < sizeof(seq) / sizeof(seq[0]); k++) {
    tt_module_train(cpu, seq[k].training);
    tt_module_train(card, seq[k].training);
    tt_tensor *a = drop_forward(cpu, seq[k].rows), *b = drop_forward(card, seq[k].rows);
    ck_assert_msg(memcmp(tt_tensor_data(a), tt_tensor_data(b), tt_tensor_nbytes(a)) == 0, "forward %d differs", (int)k);
    tt_tensor_free(a);
    tt_tensor_free(b);
  }
  tt_module_free(cpu);
  tt_module_free(card);
}
END_TEST

/* The gradient of w from sum(y): the column sums of y, within float rounding. */
static void assert_grad_follows(tt_module *m, tt_tensor *y, const char *what) {
  float want[DC] = {0};
  const float *v = tt_tensor_data(y);
  for (int i = 0; i < DN; i++) want[i % DC] += v[i];
  tt_tensor *g = tt_param_grad(m, "w");
  ck_assert_msg(g != NULL, "%s", tt_last_error(client));
  tt_tensor *h = tt_to(g, "cpu");
  const float *got = tt_tensor_data(h);
  for (int c = 0; c < DC; c++) {
    ck_assert_msg(fabsf(got[c] - want[c]) <= 1e-4f * (1.0f + fabsf(want[c])), "%s: grad w[%d] %g, want %g", what, c,
                  (double)got[c], (double)want[c]);
  }
  tt_tensor_free(h);
  tt_tensor_free(g);
}

/* Backward of sum(y) with .grad zeroed first. */
static void drop_backward(tt_optimizer *opt, tt_tensor *y) {
  tt_tensor *loss = tt_sum(y);
  ck_assert_int_eq(tt_zero_grad(opt), TT_OK);
  ck_assert_msg(tt_backward(loss) == TT_OK, "%s", tt_last_error(client));
  tt_tensor_free(loss);
}

/* Each backward uses its own forward's mask: two forwards backpropagated in reverse order,
 * and a backward left for the next forward's Execute (on the card, carried by it). */
START_TEST(test_dropout_backward_uses_its_mask) {
  tt_module *m = dropout_module(drop_devices[_i]);
  tt_optimizer *opt = tt_sgd(m, 0.1f, 0, 0, 0);
  tt_tensor *y1 = drop_forward(m, DR), *y2 = drop_forward(m, DR);
  drop_backward(opt, y2);
  assert_grad_follows(m, y2, "second forward, backpropagated first");
  drop_backward(opt, y1);
  assert_grad_follows(m, y1, "first forward, backpropagated second");
  tt_tensor *y3 = drop_forward(m, DR);
  drop_backward(opt, y3);
  tt_tensor *y4 = drop_forward(m, DR); /* on the card, its Execute carries y3's Backward */
  assert_grad_follows(m, y3, "a backward carried by the next forward");
  assert_mask_of_step(y4, DR, 3, "the forward that carried it");
  tt_tensor *done[] = {y1, y2, y3, y4};
  for (int i = 0; i < 4; i++) tt_tensor_free(done[i]);
  tt_optimizer_free(opt);
  tt_module_free(m);
}
END_TEST

Suite *e2e_modules_suite(void) {
  Suite *s = suite_create("e2e_modules");
  TCase *tc = tcase_create("modules");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_graph_shapes_and_init);
  tcase_add_test(tc, test_graph_errors);
  tcase_add_test(tc, test_module_cpu_and_device_agree);
  tcase_add_test(tc, test_train_on_device_with_cpu_loss);
  tcase_add_test(tc, test_checkpoint_round_trip);
  tcase_add_test(tc, test_three_ways_same_parameters);
  tcase_add_test(tc, test_output_used_twice_and_two_modules);
  tcase_add_test(tc, test_zero_grad_before_backward);
  tcase_add_test(tc, test_tensor_of_closed_client);
  suite_add_tcase(s, tc);
  TCase *dropout = tcase_create("dropout");
  tcase_add_checked_fixture(dropout, setup, teardown);
  tcase_set_timeout(dropout, 60);
  tcase_add_loop_test(dropout, test_dropout_eval_and_training_masks, 0, 2);
  tcase_add_test(dropout, test_dropout_card_equals_cpu);
  tcase_add_loop_test(dropout, test_dropout_backward_uses_its_mask, 0, 2);
  suite_add_tcase(s, dropout);
  TCase *two = tcase_create("two_processes");
  tcase_add_checked_fixture(two, setup, teardown);
  tcase_set_timeout(two, 300);
  tcase_set_tags(two, "long_training"); /* two whole epochs: hours under valgrind, which skips the tag */
  tcase_add_test(two, test_two_training_processes);
  suite_add_tcase(s, two);
  return s;
}
