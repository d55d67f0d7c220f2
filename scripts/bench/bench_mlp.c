/* The mlp training step, as train_run in client/examples/train_common.h does it. */
#include "bench_mlp.h"

#include <stdlib.h>

#include "bench_common.h"

#define BATCHES 4

struct bench_mlp {
  tt_client *client;
  int owns_client;
  tt_module *module;
  tt_optimizer *opt;
  int batch, next;
  float *x[BATCHES];
  int32_t *y[BATCHES];
  bench_mlp_hook hook;
  void *hook_arg;
};

/* Tells the hook, if any, that stage is about to run (done 0) or ran (done 1); always 1, to
 * sit in the step's chain of calls. */
static int at(bench_mlp *m, bench_mlp_stage stage, int done) {
  if (m->hook) m->hook(m->hook_arg, stage, done);
  return 1;
}

static void die(bench_mlp *m, const char *what) { bench_die(what, tt_last_error(m->client)); }

bench_mlp *bench_mlp_create(const char *target, const tt_connect_options *options, int batch) {
  tt_client *client = NULL;
  if (tt_connect(target, options, &client) != TT_OK) bench_die("tt_connect", tt_last_error(client));
  bench_mlp *m = bench_mlp_create_on(client, batch);
  if (!m) bench_die("putting the MLP on the card", tt_last_error(client));
  m->owns_client = 1;
  return m;
}

/* A parameter of the given shape holding values uniform in [-bound, bound), rounded to
 * bfloat16 whatever dtype holds them (so both dtypes start from the same model). */
static tt_value param_of(tt_graph *g, tt_client *client, const char *name, const int64_t *shape, int ndim, double bound,
                         tt_dtype dtype, unsigned long long *rng) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  tt_tensor *f32 = tt_tensor_from_host(client, NULL, TT_FLOAT32, shape, ndim);
  if (!f32) bench_die("param_of", tt_last_error(client));
  float *v = tt_tensor_data(f32);
  bench_fill_random(v, (size_t)n, rng);
  for (int64_t i = 0; i < n; i++) v[i] = (2 * v[i] - 1) * (float)bound; /* [0, 1) to [-bound, bound) */
  tt_tensor *bf = tt_to_dtype(f32, "cpu", TT_BFLOAT16);
  tt_tensor *back = bf ? tt_to_dtype(bf, "cpu", TT_FLOAT32) : NULL;
  if (!back) bench_die("param_of", tt_last_error(client));
  tt_value p = tt_graph_param_from(g, name, dtype == TT_BFLOAT16 ? bf : back);
  tt_tensor_free(f32), tt_tensor_free(bf), tt_tensor_free(back);
  return p;
}

/* A model with its batches and no module yet. */
static bench_mlp *with_batches(tt_client *client, int batch) {
  bench_mlp *m = calloc(1, sizeof(*m));
  if (!m) bench_die("bench_mlp_create", "out of memory");
  m->client = client;
  m->batch = batch;
  unsigned long long rng = 1234;
  for (int i = 0; i < BATCHES; i++) {
    m->x[i] = malloc(sizeof(float) * (size_t)batch * 784);
    m->y[i] = malloc(sizeof(int32_t) * (size_t)batch);
    if (!m->x[i] || !m->y[i]) bench_die("bench_mlp_create", "out of memory");
    bench_fill_random(m->x[i], (size_t)batch * 784, &rng);
    for (int k = 0; k < batch; k++) {
      rng = rng * 6364136223846793005ull + 1442695040888963407ull;
      m->y[i][k] = (int32_t)((rng >> 33) % 10);
    }
  }
  return m;
}

/* m with the module of graph g (freed here) on "tt" and its SGD; NULL (m freed) on error. */
static bench_mlp *on_card(bench_mlp *m, tt_graph *g) {
  m->module = tt_compile(m->client, g);
  tt_graph_free(g);
  if (m->module && tt_module_to(m->module, "tt") == TT_OK) m->opt = tt_sgd(m->module, 0.1f, 0.0f, 0.0f, 0);
  if (!m->opt) {
    bench_mlp_destroy(m);
    return NULL;
  }
  return m;
}

bench_mlp *bench_mlp_create_dtype(tt_client *client, int batch, tt_dtype dtype) {
  bench_mlp *m = with_batches(client, batch);
  unsigned long long rng = 99; /* bounds 1/sqrt(fan_in), torch's default for Linear */
  int64_t xs[2] = {batch, 784}, w1s[2] = {512, 784}, b1s[1] = {512}, w2s[2] = {10, 512}, b2s[1] = {10};
  tt_graph *g = tt_graph_create(client, 1);
  tt_value x = tt_graph_input(g, "x", TT_FLOAT32, xs, 2);
  tt_value l1[3] = {x, param_of(g, client, "w1", w1s, 2, 1 / 28.0, dtype, &rng),
                    param_of(g, client, "b1", b1s, 1, 1 / 28.0, dtype, &rng)};
  tt_value l2[3] = {tt_relu(g, tt_graph_op(g, "linear", l1, 3, NULL)),
                    param_of(g, client, "w2", w2s, 2, 1 / 22.6, dtype, &rng),
                    param_of(g, client, "b2", b2s, 1, 1 / 22.6, dtype, &rng)};
  tt_graph_output(g, tt_graph_op(g, "linear", l2, 3, NULL));
  return on_card(m, g);
}

bench_mlp *bench_mlp_create_on(tt_client *client, int batch) {
  bench_mlp *m = with_batches(client, batch);
  int64_t xs[2] = {batch, 784};
  tt_graph *g = tt_graph_create(client, 1);
  tt_value x = tt_graph_input(g, "x", TT_FLOAT32, xs, 2);
  tt_graph_output(g, tt_nn_linear(g, tt_relu(g, tt_nn_linear(g, x, 512, 1)), 10, 1));
  return on_card(m, g);
}

void bench_mlp_step(bench_mlp *m) {
  if (bench_mlp_try_step(m, NULL) != TT_OK) die(m, "training step");
}

tt_status bench_mlp_try_step(bench_mlp *m, float *out_loss) {
  int i = m->next;
  m->next = (m->next + 1) % BATCHES;
  int64_t xs[2] = {m->batch, 784}, ys[1] = {m->batch};
  tt_tensor *xh = tt_tensor_from_host(m->client, m->x[i], TT_FLOAT32, xs, 2);
  tt_tensor *xd = NULL, *out = NULL, *out_cpu = NULL, *loss = NULL, *labels = NULL;
  int ok = xh && at(m, BENCH_MLP_UPLOAD, 0) && (xd = tt_to(xh, tt_module_device(m->module))) &&
           at(m, BENCH_MLP_UPLOAD, 1) && at(m, BENCH_MLP_FORWARD, 0) && tt_forward(m->module, &xd, 1, &out) == TT_OK &&
           at(m, BENCH_MLP_FORWARD, 1) && at(m, BENCH_MLP_DOWNLOAD, 0) && (out_cpu = tt_to(out, "cpu")) &&
           at(m, BENCH_MLP_DOWNLOAD, 1) && (labels = tt_tensor_from_host(m->client, m->y[i], TT_INT32, ys, 1)) &&
           (loss = tt_cross_entropy(out_cpu, labels)) && tt_zero_grad(m->opt) == TT_OK && at(m, BENCH_MLP_BACKWARD, 0) &&
           tt_backward(loss) == TT_OK && at(m, BENCH_MLP_BACKWARD, 1) && at(m, BENCH_MLP_STEP, 0) &&
           tt_step(m->opt) == TT_OK && at(m, BENCH_MLP_STEP, 1);
  if (ok && out_loss) *out_loss = tt_tensor_item(loss);
  tt_tensor *done[] = {labels, loss, out_cpu, out, xd, xh};
  for (size_t k = 0; k < sizeof(done) / sizeof(done[0]); k++) tt_tensor_free(done[k]);
  return ok ? TT_OK : tt_errcode(m->client);
}

void bench_mlp_set_hook(bench_mlp *m, bench_mlp_hook hook, void *arg) {
  m->hook = hook;
  m->hook_arg = arg;
}

tt_module *bench_mlp_module(bench_mlp *m) { return m->module; }

void bench_mlp_destroy(bench_mlp *m) {
  if (!m) return;
  tt_optimizer_free(m->opt);
  tt_module_free(m->module);
  if (m->owns_client) tt_disconnect(m->client);
  for (int i = 0; i < BATCHES; i++) free(m->x[i]), free(m->y[i]);
  free(m);
}
