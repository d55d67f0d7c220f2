/* Optimizers as PyTorch users know them, through the client library and a real ttd: bad
 * arguments refused when an optimizer is made (torch.optim's checks, and finite values), Adam's
 * betas and eps and SGD's dampening reaching the update, the learning rate changed between
 * steps, and the optimizer state saved and loaded so that a resumed run continues bit for bit,
 * on the card and on the CPU path; the OptimizerState RPC's bad inputs. Expected values come
 * from torch 1.13 (torch.optim.SGD, Adam, AdamW on the same model and data, printed with 9
 * significant digits). */
#define _GNU_SOURCE /* memmem */
#include <check.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "raw_rpc.h"
#include "suites.h"
#include "ttd/v1/ttd.pb-c.h"
#include "ttd_harness.h"

static ttd_proc proc;
static tt_client *client;

static void setup(void) {
  const char *args[] = {"--devices", "2", NULL};
  ttd_proc_start(&proc, args);
  client = harness_connect(&proc, 1);
}

static void teardown(void) {
  tt_disconnect(client);
  ck_assert_int_eq(ttd_proc_stop(&proc), 0);
}

static void path_in(char *path, size_t size, const char *name) { snprintf(path, size, "%s/%s", proc.dir, name); }

/* ---- a tiny model with torch's numbers: y = linear(x, w, b), loss mse(y, t) ---- */

static const float tiny_x[6] = {0.5f, -1.0f, 2.0f, 1.5f, 0.25f, -0.75f};
static const float tiny_t[4] = {1.0f, -1.0f, 0.5f, 2.0f};
static const float tiny_w[6] = {0.1f, -0.2f, 0.3f, -0.4f, 0.5f, 0.6f};
static const float tiny_b[2] = {0.05f, -0.05f};

static tt_module *tiny(const char *device) {
  tt_graph *g = tt_graph_create(client, 1);
  tt_tensor *w = tt_tensor_from_host(client, tiny_w, TT_FLOAT32, (int64_t[]){2, 3}, 2);
  tt_tensor *b = tt_tensor_from_host(client, tiny_b, TT_FLOAT32, (int64_t[]){2}, 1);
  tt_value in[3] = {tt_graph_input(g, "x", TT_FLOAT32, (int64_t[]){2, 3}, 2), tt_graph_param_from(g, "w", w),
                    tt_graph_param_from(g, "b", b)};
  tt_graph_output(g, tt_graph_op(g, "linear", in, 3, NULL));
  tt_module *m = tt_compile(client, g);
  ck_assert_msg(m != NULL, "%s", tt_last_error(client));
  tt_graph_free(g);
  tt_tensor_free(w);
  tt_tensor_free(b);
  ck_assert_int_eq(tt_module_to(m, device), TT_OK);
  return m;
}

/* steps training steps of the tiny model: zero_grad, forward, mse loss, backward, step. */
static void tiny_steps(tt_module *m, tt_optimizer *opt, int steps) {
  tt_tensor *xh = tt_tensor_from_host(client, tiny_x, TT_FLOAT32, (int64_t[]){2, 3}, 2);
  tt_tensor *t = tt_tensor_from_host(client, tiny_t, TT_FLOAT32, (int64_t[]){2, 2}, 2);
  tt_tensor *x = tt_to(xh, tt_module_device(m));
  for (int s = 0; s < steps; s++) {
    tt_tensor *y = NULL;
    ck_assert_int_eq(tt_zero_grad(opt), TT_OK);
    ck_assert_msg(tt_forward(m, &x, 1, &y) == TT_OK, "%s", tt_last_error(client));
    tt_tensor *yh = tt_to(y, "cpu"), *loss = tt_mse_loss(yh, t);
    ck_assert_msg(tt_backward(loss) == TT_OK, "%s", tt_last_error(client));
    ck_assert_msg(tt_step(opt) == TT_OK, "%s", tt_last_error(client));
    tt_tensor_free(loss);
    tt_tensor_free(yh);
    tt_tensor_free(y);
  }
  tt_tensor_free(x);
  tt_tensor_free(t);
  tt_tensor_free(xh);
}

/* The named parameter's values on the host, into out (n floats). */
static void param_values(tt_module *m, const char *name, float *out, size_t n) {
  tt_tensor *p = tt_module_param(m, name);
  ck_assert_msg(p != NULL, "%s", tt_last_error(client));
  tt_tensor *h = tt_to(p, "cpu");
  ck_assert_msg(h != NULL, "%s", tt_last_error(client));
  ck_assert_uint_eq(tt_tensor_numel(h), n);
  memcpy(out, tt_tensor_data(h), n * sizeof(float));
  tt_tensor_free(h);
  tt_tensor_free(p);
}

/* w then b against torch's values. */
static void expect_tiny(tt_module *m, const float want[8], const char *what) {
  float got[8];
  param_values(m, "w", got, 6);
  param_values(m, "b", got + 6, 2);
  for (int i = 0; i < 8; i++) {
    ck_assert_msg(fabsf(got[i] - want[i]) <= 2e-6f + 2e-6f * fabsf(want[i]), "%s on %s: parameter %d is %.9g, torch %.9g",
                  what, tt_module_device(m), i, got[i], want[i]);
  }
}

static const char *const places[] = {"tt", "cpu"};

/* ---- 1. bad arguments fail when the optimizer is made ---- */

typedef struct bad_case {
  tt_optimizer *(*make)(tt_module *m);
  const char *message; /* the whole message */
} bad_case;

/* A case: options of type filled by init, then changed, passed to make. */
#define CASE(fn, type, init, make, ...) \
  static tt_optimizer *fn(tt_module *m) { \
    type o;                               \
    init(&o);                             \
    __VA_ARGS__;                          \
    return make(m, &o);                   \
  }
#define SGD_CASE(fn, ...) CASE(fn, tt_sgd_options, tt_sgd_options_init, tt_sgd_opts, __VA_ARGS__)
#define ADAM_CASE(fn, ...) CASE(fn, tt_adam_options, tt_adam_options_init, tt_adam_opts, __VA_ARGS__)
SGD_CASE(sgd_lr_nan, o.lr = NAN)
SGD_CASE(sgd_lr_negative, o.lr = -1.0f)
SGD_CASE(sgd_lr_inf, o.lr = INFINITY)
SGD_CASE(sgd_momentum_negative, o.momentum = -0.5f)
SGD_CASE(sgd_momentum_inf, o.momentum = INFINITY)
SGD_CASE(sgd_dampening_nan, o.dampening = NAN)
SGD_CASE(sgd_weight_decay_negative, o.weight_decay = -1e-4f)
SGD_CASE(sgd_nesterov_without_momentum, o.nesterov = 1)
SGD_CASE(sgd_nesterov_with_dampening, o.nesterov = 1; o.momentum = 0.9f; o.dampening = 0.1f)
ADAM_CASE(adam_lr_negative, o.lr = -1.0f)
ADAM_CASE(adam_lr_inf, o.lr = -INFINITY)
ADAM_CASE(adam_eps_zero, o.eps = 0.0f)
ADAM_CASE(adam_eps_negative, o.eps = -1e-8f)
ADAM_CASE(adam_eps_inf, o.eps = INFINITY)
ADAM_CASE(adam_beta1_one, o.beta1 = 1.0f)
ADAM_CASE(adam_beta1_negative, o.beta1 = -0.1f)
ADAM_CASE(adam_beta2_large, o.beta2 = 1.5f)
ADAM_CASE(adam_beta2_nan, o.beta2 = NAN)
ADAM_CASE(adam_weight_decay_negative, o.weight_decay = -1.0f)
ADAM_CASE(adamw_weight_decay_nan, o.decoupled = 1; o.weight_decay = NAN)
static tt_optimizer *sgd_short_nan(tt_module *m) { return tt_sgd(m, NAN, 0, 0, 0); }
static tt_optimizer *sgd_short_momentum(tt_module *m) { return tt_sgd(m, 0.1f, -0.9f, 0, 0); }
static tt_optimizer *sgd_short_weight_decay(tt_module *m) { return tt_sgd(m, 0.1f, 0.9f, -1.0f, 0); }
static tt_optimizer *adam_short_lr(tt_module *m) { return tt_adam(m, -1.0f, 0, 0); }
static tt_optimizer *adam_short_weight_decay(tt_module *m) { return tt_adam(m, 1e-3f, -0.01f, 1); }

static const bad_case bad_cases[] = {
    {sgd_lr_nan, "tt_sgd_opts: lr is nan; it must be a finite number >= 0"},
    {sgd_lr_negative, "tt_sgd_opts: lr is -1; it must be a finite number >= 0"},
    {sgd_lr_inf, "tt_sgd_opts: lr is inf; it must be a finite number >= 0"},
    {sgd_momentum_negative, "tt_sgd_opts: momentum is -0.5; it must be a finite number >= 0"},
    {sgd_momentum_inf, "tt_sgd_opts: momentum is inf; it must be a finite number >= 0"},
    {sgd_dampening_nan, "tt_sgd_opts: dampening is nan; it must be a finite number"},
    {sgd_weight_decay_negative, "tt_sgd_opts: weight_decay is -0.0001; it must be a finite number >= 0"},
    {sgd_nesterov_without_momentum,
     "tt_sgd_opts: nesterov needs momentum > 0 and dampening 0; momentum is 0 and dampening 0"},
    {sgd_nesterov_with_dampening,
     "tt_sgd_opts: nesterov needs momentum > 0 and dampening 0; momentum is 0.9 and dampening 0.1"},
    {adam_lr_negative, "tt_adam_opts: lr is -1; it must be a finite number >= 0"},
    {adam_lr_inf, "tt_adam_opts: lr is -inf; it must be a finite number >= 0"},
    {adam_eps_zero, "tt_adam_opts: eps is 0; it must be a finite number > 0"},
    {adam_eps_negative, "tt_adam_opts: eps is -1e-08; it must be a finite number > 0"},
    {adam_eps_inf, "tt_adam_opts: eps is inf; it must be a finite number > 0"},
    {adam_beta1_one, "tt_adam_opts: beta1 is 1; it must be a finite number in [0, 1)"},
    {adam_beta1_negative, "tt_adam_opts: beta1 is -0.1; it must be a finite number in [0, 1)"},
    {adam_beta2_large, "tt_adam_opts: beta2 is 1.5; it must be a finite number in [0, 1)"},
    {adam_beta2_nan, "tt_adam_opts: beta2 is nan; it must be a finite number in [0, 1)"},
    {adam_weight_decay_negative, "tt_adam_opts: weight_decay is -1; it must be a finite number >= 0"},
    {adamw_weight_decay_nan, "tt_adam_opts: weight_decay is nan; it must be a finite number >= 0"},
    {sgd_short_nan, "tt_sgd: lr is nan; it must be a finite number >= 0"},
    {sgd_short_momentum, "tt_sgd: momentum is -0.9; it must be a finite number >= 0"},
    {sgd_short_weight_decay, "tt_sgd: weight_decay is -1; it must be a finite number >= 0"},
    {adam_short_lr, "tt_adam: lr is -1; it must be a finite number >= 0"},
    {adam_short_weight_decay, "tt_adam: weight_decay is -0.01; it must be a finite number >= 0"},
};

/* Each bad argument of each constructor: NULL at once, INVALID_ARGUMENT, the message naming
 * the argument, its value and the range; edge values torch accepts are accepted. */
START_TEST(test_bad_arguments_refused_when_made) {
  tt_module *m = tiny("cpu");
  for (size_t i = 0; i < sizeof(bad_cases) / sizeof(bad_cases[0]); i++) {
    tt_optimizer *o = bad_cases[i].make(m);
    ck_assert_msg(o == NULL, "case %zu (%s) was accepted", i, bad_cases[i].message);
    ck_assert_int_eq(tt_errcode(client), TT_INVALID_ARGUMENT);
    ck_assert_str_eq(tt_last_error(client), bad_cases[i].message);
  }
  /* torch's edges: lr 0, betas 0, momentum 0 with dampening 1, any finite dampening. */
  tt_adam_options a;
  tt_adam_options_init(&a);
  a.lr = 0.0f;
  a.beta1 = 0.0f;
  a.beta2 = 0.0f;
  tt_optimizer *ok[4] = {tt_adam_opts(m, &a), tt_sgd(m, 0.0f, 0.0f, 0.0f, 0), NULL, tt_adam_opts(m, NULL)};
  tt_sgd_options s;
  tt_sgd_options_init(&s);
  s.momentum = 0.9f;
  s.dampening = -3.0f;
  ok[2] = tt_sgd_opts(m, &s);
  for (int i = 0; i < 4; i++) ck_assert_msg(ok[i] != NULL, "edge %d: %s", i, tt_last_error(client));
  ck_assert_float_eq(tt_optimizer_lr(ok[3]), 1e-3f);
  ck_assert_ptr_null(tt_sgd(NULL, 0.1f, 0, 0, 0));
  ck_assert_ptr_null(tt_adam_opts(NULL, &a));
  for (int i = 0; i < 4; i++) tt_optimizer_free(ok[i]);
  tt_module_free(m);
}
END_TEST

/* tt_optimizer_set_lr refuses what the constructors refuse and leaves the rate unchanged. */
START_TEST(test_set_lr_checked) {
  tt_module *m = tiny("cpu");
  tt_optimizer *o = tt_sgd(m, 0.1f, 0.9f, 0, 0);
  const struct {
    float lr;
    const char *message;
  } bad[] = {
      {NAN, "tt_optimizer_set_lr: lr is nan; it must be a finite number >= 0"},
      {-1e-3f, "tt_optimizer_set_lr: lr is -0.001; it must be a finite number >= 0"},
      {INFINITY, "tt_optimizer_set_lr: lr is inf; it must be a finite number >= 0"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    ck_assert_int_eq(tt_optimizer_set_lr(o, bad[i].lr), TT_INVALID_ARGUMENT);
    ck_assert_str_eq(tt_last_error(client), bad[i].message);
    ck_assert_float_eq(tt_optimizer_lr(o), 0.1f);
  }
  ck_assert_int_eq(tt_optimizer_set_lr(o, 0.0f), TT_OK);
  ck_assert_float_eq(tt_optimizer_lr(o), 0.0f);
  ck_assert_int_eq(tt_optimizer_set_lr(NULL, 0.1f), TT_INVALID_ARGUMENT);
  ck_assert(isnan(tt_optimizer_lr(NULL)));
  tt_optimizer_free(o);
  tt_module_free(m);
}
END_TEST

/* ---- 2. betas, eps and dampening reach the update; 3. the rate changes between steps ---- */

static const float torch_adam_betas[8] = {0.341363579f, -0.18252328f, 0.231850043f, -0.10627307f,
                                          0.794361055f, 0.305557698f, 0.295286685f, 0.242783442f};
static const float torch_adam_beta1_zero[8] = {0.227089435f, -0.15893665f, 0.208341971f, -0.254495233f,
                                               0.645930588f, 0.454071224f, 0.17721048f, 0.0950436592f};
static const float torch_adamw[8] = {0.216119766f, -0.182281405f, 0.229824096f, -0.253097922f,
                                     0.628523886f, 0.448044747f, 0.160086364f, 0.0816957876f};
static const float torch_sgd_dampening[8] = {0.270621806f, -0.190589279f, 0.254205167f, 0.310018927f,
                                             0.894217134f, -0.327992439f, 0.175456345f, 0.253573239f};
static const float torch_sgd_lr_change[8] = {0.242343798f, -0.192035317f, 0.26155895f, 0.193375871f,
                                             0.827405691f, -0.171285048f, 0.154593885f, 0.204962552f};
static const float torch_adam_lr_change[8] = {0.319889605f, -0.171897978f, 0.226785421f, -0.161278397f,
                                              0.7389099f, 0.36111033f, 0.274947256f, 0.188541293f};

/* Three steps with given betas, eps, weight decay, dampening: torch's parameters, on the card
 * and on "cpu" (beta1 = 0 is 0, not a default). */
START_TEST(test_options_reach_the_update) {
  for (int p = 0; p < 2; p++) {
    tt_adam_options a;
    tt_sgd_options s;
    tt_optimizer *opts[4];
    tt_module *ms[4];
    for (int k = 0; k < 4; k++) ms[k] = tiny(places[p]);
    tt_adam_options_init(&a);
    a.lr = 0.1f, a.beta1 = 0.5f, a.beta2 = 0.8f, a.eps = 1e-3f;
    opts[0] = tt_adam_opts(ms[0], &a);
    tt_adam_options_init(&a);
    a.lr = 0.05f, a.beta1 = 0.0f, a.beta2 = 0.9f, a.eps = 1e-6f, a.weight_decay = 0.01f;
    opts[1] = tt_adam_opts(ms[1], &a);
    tt_adam_options_init(&a);
    a.lr = 0.05f, a.beta1 = 0.8f, a.beta2 = 0.95f, a.eps = 0.1f, a.weight_decay = 0.1f, a.decoupled = 1;
    opts[2] = tt_adam_opts(ms[2], &a);
    tt_sgd_options_init(&s);
    s.lr = 0.1f, s.momentum = 0.9f, s.dampening = 0.5f;
    opts[3] = tt_sgd_opts(ms[3], &s);
    const float *want[4] = {torch_adam_betas, torch_adam_beta1_zero, torch_adamw, torch_sgd_dampening};
    const char *what[4] = {"Adam betas (0.5, 0.8) eps 1e-3", "Adam betas (0, 0.9)", "AdamW eps 0.1",
                           "SGD dampening 0.5"};
    for (int k = 0; k < 4; k++) {
      ck_assert_msg(opts[k] != NULL, "%s", tt_last_error(client));
      tiny_steps(ms[k], opts[k], 3);
      expect_tiny(ms[k], want[k], what[k]);
      tt_optimizer_free(opts[k]);
      tt_module_free(ms[k]);
    }
  }
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 0);
}
END_TEST

/* Two steps at one rate, then two at another (set after a step still queued on the card: it
 * keeps its rate): torch's parameters, SGD with momentum and Adam, on the card and on "cpu",
 * and on the card with the CPU optimizer. */
START_TEST(test_lr_change_between_steps) {
  for (int way = 0; way < 3; way++) {
    for (int adam = 0; adam < 2; adam++) {
      tt_module *m = tiny(way == 1 ? "cpu" : "tt");
      tt_optimizer *o = adam ? tt_adam(m, 0.1f, 0, 0) : tt_sgd(m, 0.1f, 0.9f, 0, 0);
      if (way == 2) tt_optimizer_on_cpu(o, 1);
      tiny_steps(m, o, 2);
      ck_assert_int_eq(tt_optimizer_set_lr(o, adam ? 0.02f : 0.01f), TT_OK);
      ck_assert_float_eq(tt_optimizer_lr(o), adam ? 0.02f : 0.01f);
      tiny_steps(m, o, 2);
      expect_tiny(m, adam ? torch_adam_lr_change : torch_sgd_lr_change, adam ? "Adam, lr changed" : "SGD, lr changed");
      tt_optimizer_free(o);
      tt_module_free(m);
    }
  }
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 0);
}
END_TEST

/* ---- 4. the optimizer state in checkpoints: a resumed run continues bit for bit ---- */

enum { N = 8, IN = 12, HID = 16, OUT = 3, BEFORE = 3, AFTER = 4 };

static tt_module *mlp(uint64_t seed, int hidden, const char *device) {
  tt_graph *g = tt_graph_create(client, seed);
  tt_value x = tt_graph_input(g, "x", TT_FLOAT32, (int64_t[]){N, IN}, 2);
  tt_graph_output(g, tt_nn_linear(g, tt_relu(g, tt_nn_linear(g, x, hidden, 1)), OUT, 1));
  tt_module *m = tt_compile(client, g);
  ck_assert_msg(m != NULL, "%s", tt_last_error(client));
  tt_graph_free(g);
  ck_assert_int_eq(tt_module_to(m, device), TT_OK);
  return m;
}

/* Training steps first .. first+n-1 of the mlp, each on its own batch (cross-entropy). */
static void mlp_steps(tt_module *m, tt_optimizer *o, int first, int n) {
  for (int s = first; s < first + n; s++) {
    float xv[N * IN];
    int32_t yv[N];
    for (int i = 0; i < N * IN; i++) xv[i] = sinf((float)(i + 31 * s) * 0.77f);
    for (int i = 0; i < N; i++) yv[i] = (i + s) % OUT;
    tt_tensor *xh = tt_tensor_from_host(client, xv, TT_FLOAT32, (int64_t[]){N, IN}, 2);
    tt_tensor *labels = tt_tensor_from_host(client, yv, TT_INT32, (int64_t[]){N}, 1);
    tt_tensor *x = tt_to(xh, tt_module_device(m)), *y = NULL;
    ck_assert_int_eq(tt_zero_grad(o), TT_OK);
    ck_assert_msg(tt_forward(m, &x, 1, &y) == TT_OK, "%s", tt_last_error(client));
    tt_tensor *yh = tt_to(y, "cpu"), *loss = tt_cross_entropy(yh, labels);
    ck_assert_msg(tt_backward(loss) == TT_OK, "%s", tt_last_error(client));
    ck_assert_msg(tt_step(o) == TT_OK, "%s", tt_last_error(client));
    tt_tensor *done[] = {loss, yh, y, x, labels, xh};
    for (int k = 0; k < 6; k++) tt_tensor_free(done[k]);
  }
}

static tt_optimizer *make_optimizer(tt_module *m, int adam, float lr) {
  tt_adam_options a;
  tt_adam_options_init(&a);
  a.lr = lr, a.beta1 = 0.8f, a.beta2 = 0.99f, a.eps = 1e-6f, a.weight_decay = 0.01f;
  tt_sgd_options s;
  tt_sgd_options_init(&s);
  s.lr = lr, s.momentum = 0.9f, s.dampening = 0.1f, s.weight_decay = 0.001f;
  tt_optimizer *o = adam ? tt_adam_opts(m, &a) : tt_sgd_opts(m, &s);
  ck_assert_msg(o != NULL, "%s", tt_last_error(client));
  return o;
}

/* Every parameter of a and b equal bit for bit. */
static void expect_same_bits(tt_module *a, tt_module *b, const char *what) {
  ck_assert_int_eq(tt_module_param_count(a), tt_module_param_count(b));
  for (int p = 0; p < tt_module_param_count(a); p++) {
    const char *name = tt_module_param_name(a, p);
    tt_tensor *pa = tt_module_param(a, name), *pb = tt_module_param(b, name);
    tt_tensor *ha = tt_to(pa, "cpu"), *hb = tt_to(pb, "cpu");
    const float *x = tt_tensor_data(ha), *y = tt_tensor_data(hb);
    for (uint64_t k = 0; k < tt_tensor_numel(ha); k++) {
      ck_assert_msg(memcmp(&x[k], &y[k], sizeof(float)) == 0, "%s: %s[%" PRIu64 "] %.9g uninterrupted, %.9g resumed",
                    what, name, k, x[k], y[k]);
    }
    tt_tensor *done[] = {hb, ha, pb, pa};
    for (int k = 0; k < 4; k++) tt_tensor_free(done[k]);
  }
}

/* An uninterrupted run of BEFORE + AFTER steps against one saved after BEFORE steps and
 * resumed in a fresh module and optimizer (other initial parameters, another lr: the file's
 * is restored), loading the module first or the optimizer first. */
static void resume(const char *device, int adam, int optimizer_first, int on_cpu) {
  char what[96], model_path[160], state_path[160];
  snprintf(what, sizeof(what), "%s on %s%s, %s loaded first", adam ? "Adam" : "SGD", device, on_cpu ? " (CPU optimizer)" : "",
           optimizer_first ? "optimizer" : "module");
  path_in(model_path, sizeof(model_path), "model.safetensors");
  path_in(state_path, sizeof(state_path), "optimizer.safetensors");
  tt_module *whole = mlp(5, HID, device);
  tt_optimizer *ow = make_optimizer(whole, adam, 0.05f);
  tt_optimizer_on_cpu(ow, on_cpu);
  mlp_steps(whole, ow, 0, BEFORE + AFTER);

  tt_module *first = mlp(5, HID, device);
  tt_optimizer *of = make_optimizer(first, adam, 0.05f);
  tt_optimizer_on_cpu(of, on_cpu);
  mlp_steps(first, of, 0, BEFORE);
  ck_assert_msg(tt_module_save(first, model_path) == TT_OK, "%s", tt_last_error(client));
  ck_assert_msg(tt_optimizer_save(of, state_path) == TT_OK, "%s", tt_last_error(client));
  tt_optimizer_free(of);
  tt_module_free(first);

  tt_module *resumed = mlp(77, HID, device);
  tt_optimizer *orr = make_optimizer(resumed, adam, 0.5f);
  tt_optimizer_on_cpu(orr, on_cpu);
  if (optimizer_first) ck_assert_msg(tt_optimizer_load(orr, state_path) == TT_OK, "%s: %s", what, tt_last_error(client));
  ck_assert_msg(tt_module_load(resumed, model_path) == TT_OK, "%s: %s", what, tt_last_error(client));
  if (!optimizer_first) ck_assert_msg(tt_optimizer_load(orr, state_path) == TT_OK, "%s: %s", what, tt_last_error(client));
  ck_assert_float_eq(tt_optimizer_lr(orr), 0.05f);
  mlp_steps(resumed, orr, BEFORE, AFTER);
  expect_same_bits(whole, resumed, what);
  tt_optimizer_free(orr);
  tt_module_free(resumed);
  tt_optimizer_free(ow);
  tt_module_free(whole);
  remove(model_path);
  remove(state_path);
}

/* A module moved after its optimizer stepped would go on from fresh moments: the next step
 * is refused, saying what to do. Saving the state before the move and loading it after
 * carries it over: the result equals three steps that never moved. Plain SGD keeps no state
 * and steps on after a move. */
START_TEST(test_move_after_steps) {
  char state_path[160];
  path_in(state_path, sizeof(state_path), "moved.safetensors");
  tt_module *stay = tiny("cpu");
  tt_optimizer *os = tt_adam(stay, 0.1f, 0, 0);
  tiny_steps(stay, os, 3);

  tt_module *m = tiny("tt");
  tt_optimizer *o = tt_adam(m, 0.1f, 0, 0);
  tiny_steps(m, o, 2);
  ck_assert_msg(tt_optimizer_save(o, state_path) == TT_OK, "%s", tt_last_error(client));
  ck_assert_int_eq(tt_module_to(m, "cpu"), TT_OK);
  ck_assert_int_eq(tt_step(o), TT_FAILED_PRECONDITION);
  ck_assert_msg(strstr(tt_last_error(client), "Adam optimizer's state (exp_avg, exp_avg_sq)") &&
                strstr(tt_last_error(client), "tt_optimizer_save before the move"), "%s", tt_last_error(client));
  ck_assert_int_eq(tt_module_to(m, "tt"), TT_OK); /* back on a card, but beside new tensors */
  ck_assert_int_eq(tt_step(o), TT_FAILED_PRECONDITION);
  ck_assert_int_eq(tt_module_to(m, "cpu"), TT_OK);
  ck_assert_msg(tt_optimizer_load(o, state_path) == TT_OK, "%s", tt_last_error(client));
  tiny_steps(m, o, 1);
  float want[8], got[8];
  param_values(stay, "w", want, 6);
  param_values(stay, "b", want + 6, 2);
  param_values(m, "w", got, 6);
  param_values(m, "b", got + 6, 2);
  for (int i = 0; i < 8; i++) ck_assert_msg(fabsf(got[i] - want[i]) <= 1e-6f, "%d: %.9g against %.9g", i, got[i], want[i]);

  tt_optimizer *plain = tt_sgd(m, 0.1f, 0, 0, 0);
  tiny_steps(m, plain, 1);
  ck_assert_int_eq(tt_module_to(m, "tt"), TT_OK);
  tiny_steps(m, plain, 1);
  tt_optimizer_free(plain);
  tt_optimizer_free(o);
  tt_module_free(m);
  tt_optimizer_free(os);
  tt_module_free(stay);
  remove(state_path);
}
END_TEST

START_TEST(test_resume_on_card_bit_identical) {
  for (int adam = 0; adam < 2; adam++) {
    for (int order = 0; order < 2; order++) resume("tt", adam, order, 0);
  }
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 0);
}
END_TEST

START_TEST(test_resume_on_cpu_bit_identical) {
  for (int adam = 0; adam < 2; adam++) {
    for (int order = 0; order < 2; order++) resume("cpu", adam, order, 0);
    resume("tt", adam, 0, 1); /* a module on the card with the CPU optimizer */
  }
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 0);
}
END_TEST

/* The same with every call on its own (TTD_INLINE=0): nothing queued rides anywhere. */
START_TEST(test_resume_on_card_without_inline) {
  setenv("TTD_INLINE", "0", 1);
  tt_client *plain = harness_connect(&proc, 0);
  tt_client *saved = client;
  client = plain;
  resume("tt", 1, 1, 0);
  resume("tt", 0, 0, 0);
  client = saved;
  tt_disconnect(plain);
  unsetenv("TTD_INLINE");
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 0);
}
END_TEST

/* What the file holds: torch's names, I32 steps, float32 buffers, the arguments as metadata;
 * before any step every parameter's step is 0 and it has no buffers. */
START_TEST(test_state_file_layout) {
  char path[160];
  path_in(path, sizeof(path), "adam.safetensors");
  tt_module *m = tiny("tt");
  tt_adam_options a;
  tt_adam_options_init(&a);
  a.lr = 0.1f, a.beta1 = 0.5f, a.beta2 = 0.8f, a.eps = 1e-3f;
  tt_optimizer *o = tt_adam_opts(m, &a);
  ck_assert_int_eq(tt_optimizer_save(o, path), TT_OK);
  tt_safetensors *f = NULL;
  ck_assert_int_eq(tt_safetensors_open(client, path, &f), TT_OK);
  ck_assert_int_eq(tt_safetensors_count(f), 2);
  ck_assert_str_eq(tt_safetensors_name(f, 0), "w.step");
  ck_assert_str_eq(tt_safetensors_name(f, 1), "b.step");
  tt_safetensors_close(f);
  tiny_steps(m, o, 3);
  ck_assert_int_eq(tt_optimizer_save(o, path), TT_OK);
  ck_assert_int_eq(tt_safetensors_open(client, path, &f), TT_OK);
  const char *names[] = {"w.step", "b.step", "w.exp_avg", "w.exp_avg_sq", "b.exp_avg", "b.exp_avg_sq"};
  ck_assert_int_eq(tt_safetensors_count(f), 6);
  for (int i = 0; i < 6; i++) ck_assert_str_eq(tt_safetensors_name(f, i), names[i]);
  tt_tensor *step = tt_safetensors_get(f, "w.step"), *v = tt_safetensors_get(f, "w.exp_avg_sq");
  ck_assert_int_eq(tt_tensor_dtype(step), TT_INT32);
  ck_assert_int_eq(tt_tensor_ndim(step), 0);
  ck_assert_int_eq(*(int32_t *)tt_tensor_data(step), 3);
  ck_assert_int_eq(tt_tensor_dtype(v), TT_FLOAT32);
  ck_assert_int_eq(tt_tensor_ndim(v), 2);
  ck_assert_int_eq(tt_tensor_shape(v)[0], 2);
  ck_assert_int_eq(tt_tensor_shape(v)[1], 3);
  for (int i = 0; i < 6; i++) ck_assert_float_gt(((float *)tt_tensor_data(v))[i], 0.0f); /* squares of gradients */
  tt_tensor_free(v);
  tt_tensor_free(step);
  tt_safetensors_close(f);
  /* The metadata, raw: the JSON header of the file. */
  FILE *fp = fopen(path, "rb");
  char header[4096] = "";
  size_t got = fp ? fread(header, 1, sizeof(header) - 1, fp) : 0;
  header[got] = '\0';
  if (fp) fclose(fp);
  const char *want[] = {"\"format\":\"ttd.optimizer\"", "\"optimizer\":\"Adam\"", "\"lr\":\"0.100000001\"",
                        "\"beta1\":\"0.5\"", "\"beta2\":\"0.800000012\"", "\"eps\":\"0.00100000005\""};
  for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
    ck_assert_msg(memmem(header, got, want[i], strlen(want[i])), "no %s in the header", want[i]);
  }
  tt_optimizer_free(o);
  tt_module_free(m);
  remove(path);
}
END_TEST

/* A state of another optimizer, a module checkpoint, another model's state, a missing file:
 * refused whole, named, the optimizer unchanged (its lr, and its next steps: torch's values). */
START_TEST(test_state_load_errors) {
  char sgd_path[160], adam_path[160], model_path[160], wide_path[160], missing[160];
  path_in(sgd_path, sizeof(sgd_path), "sgd.safetensors");
  path_in(adam_path, sizeof(adam_path), "adam.safetensors");
  path_in(model_path, sizeof(model_path), "model.safetensors");
  path_in(wide_path, sizeof(wide_path), "wide.safetensors");
  path_in(missing, sizeof(missing), "none.safetensors");
  tt_module *m = tiny("tt");
  tt_optimizer *sgd = tt_sgd(m, 0.1f, 0.9f, 0, 0), *adam = tt_adam(m, 0.1f, 0, 0), *adamw = tt_adam(m, 0.1f, 0, 1);
  ck_assert_int_eq(tt_optimizer_save(sgd, sgd_path), TT_OK);
  ck_assert_int_eq(tt_optimizer_save(adam, adam_path), TT_OK);
  ck_assert_int_eq(tt_module_save(m, model_path), TT_OK);
  tt_module *wide = mlp(1, HID, "cpu"), *narrow = mlp(1, HID / 2, "cpu");
  tt_optimizer *ow = make_optimizer(wide, 1, 0.1f), *on = make_optimizer(narrow, 1, 0.2f);
  mlp_steps(wide, ow, 0, 1);
  ck_assert_int_eq(tt_optimizer_save(ow, wide_path), TT_OK);
  char want[512];
  const struct {
    tt_optimizer *o;
    const char *path;
    tt_status code;
    const char *fmt; /* %s: the path */
  } cases[] = {
      {adam, sgd_path, TT_INVALID_ARGUMENT, "optimizer state '%s' was saved by SGD; this optimizer is Adam"},
      {sgd, adam_path, TT_INVALID_ARGUMENT, "optimizer state '%s' was saved by Adam; this optimizer is SGD"},
      {adamw, adam_path, TT_INVALID_ARGUMENT, "optimizer state '%s' was saved by Adam; this optimizer is AdamW"},
      {adam, model_path, TT_INVALID_ARGUMENT, "'%s' holds no optimizer state"},
      {ow, adam_path, TT_INVALID_ARGUMENT, "optimizer state '%s' has no 'linear1.weight.step' for parameter 'linear1.weight'"},
      {on, wide_path, TT_INVALID_ARGUMENT,
       "optimizer state '%s': 'linear1.weight.exp_avg' must be float32 [8, 12] for parameter 'linear1.weight', got "
       "float32 [16, 12]"},
      {adam, missing, TT_NOT_FOUND, "checkpoint '%s' does not exist"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    ck_assert_int_eq(tt_optimizer_load(cases[i].o, cases[i].path), cases[i].code);
    snprintf(want, sizeof(want), cases[i].fmt, cases[i].path);
    ck_assert_msg(strstr(tt_last_error(client), want), "case %zu: '%s' lacks '%s'", i, tt_last_error(client), want);
  }
  ck_assert_float_eq(tt_optimizer_lr(on), 0.2f);
  tt_optimizer_free(on);
  tt_optimizer_free(ow);
  tt_module_free(narrow);
  tt_module_free(wide);
  /* The failed loads changed nothing: Adam's three steps give torch's values. */
  tt_optimizer_free(sgd);
  tt_optimizer_free(adamw);
  tt_optimizer_free(adam);
  tt_adam_options a;
  tt_adam_options_init(&a);
  a.lr = 0.1f, a.beta1 = 0.5f, a.beta2 = 0.8f, a.eps = 1e-3f;
  adam = tt_adam_opts(m, &a);
  ck_assert_int_eq(tt_optimizer_load(adam, sgd_path), TT_INVALID_ARGUMENT);
  tiny_steps(m, adam, 3);
  expect_tiny(m, torch_adam_betas, "Adam after a refused load");
  tt_optimizer_free(adam);
  tt_module_free(m);
  remove(sgd_path);
  remove(adam_path);
  remove(model_path);
  remove(wide_path);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 0);
}
END_TEST

/* ---- the OptimizerState RPC, raw, in the client's own session ---- */

static raw_md client_md(tt_client *c, char hex[17]) {
  snprintf(hex, 17, "%016" PRIx64, tt_session_id(c));
  return (raw_md){.session = hex, .instance = tt_instance_id(c)};
}

static uint64_t param_handle(tt_module *m, const char *name) {
  tt_tensor *p = tt_module_param(m, name);
  uint64_t h = tt_tensor_handle(p);
  tt_tensor_free(p);
  return h;
}

/* A read returns copies (new handles, charged to the session, freed by the caller) holding
 * what tt_optimizer_save wrote, with the step; a write of another state is read back. */
START_TEST(test_state_rpc_reads_and_writes) {
  char path[160], hex[17];
  path_in(path, sizeof(path), "adam.safetensors");
  tt_module *m = tiny("tt");
  tt_optimizer *o = tt_adam(m, 0.1f, 0, 0);
  tiny_steps(m, o, 2);
  ck_assert_int_eq(tt_optimizer_save(o, path), TT_OK); /* sends the queued step */
  raw_md md = client_md(client, hex);
  uint64_t w = param_handle(m, "w"), b = param_handle(m, "b");
  uint64_t before = harness_used_bytes(&proc, 0, 0);
  Ttd__V1__OptimizerStateRequest req = TTD__V1__OPTIMIZER_STATE_REQUEST__INIT;
  uint64_t params[2] = {w, b};
  req.parameters = params;
  req.n_parameters = 2;
  Ttd__V1__OptimizerStateResponse *r = (Ttd__V1__OptimizerStateResponse *)raw_unary(
      proc.target, "/ttd.v1.Device/OptimizerState", &req.base, md, &ttd__v1__optimizer_state_response__descriptor, 0, NULL);
  ck_assert_uint_eq(r->n_states, 2);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), before + 2 * (6 + 2) * sizeof(float)); /* the copies */
  tt_safetensors *f = NULL;
  ck_assert_int_eq(tt_safetensors_open(client, path, &f), TT_OK);
  const char *names[2][2] = {{"w.exp_avg", "w.exp_avg_sq"}, {"b.exp_avg", "b.exp_avg_sq"}};
  for (int i = 0; i < 2; i++) {
    ck_assert_uint_eq(r->states[i]->parameter, params[i]);
    ck_assert_int_eq(r->states[i]->step, 2);
    ck_assert_uint_eq(r->states[i]->n_buffers, 2);
    for (int k = 0; k < 2; k++) {
      float got[6];
      tt_tensor *saved = tt_safetensors_get(f, names[i][k]);
      raw_download(proc.target, md, r->states[i]->buffers[k], got, tt_tensor_numel(saved));
      ck_assert_int_eq(memcmp(got, tt_tensor_data(saved), tt_tensor_nbytes(saved)), 0);
      tt_tensor_free(saved);
    }
  }
  tt_safetensors_close(f);
  /* Written back swapped (exp_avg of w as its exp_avg_sq too) with step 7, then read again. */
  Ttd__V1__ParameterState ps = TTD__V1__PARAMETER_STATE__INIT, *set[1] = {&ps};
  uint64_t bufs[2] = {r->states[0]->buffers[0], r->states[0]->buffers[0]};
  ps.parameter = w;
  ps.step = 7;
  ps.buffers = bufs;
  ps.n_buffers = 2;
  Ttd__V1__OptimizerStateRequest wr = TTD__V1__OPTIMIZER_STATE_REQUEST__INIT;
  wr.set = set;
  wr.n_set = 1;
  protobuf_c_message_free_unpacked(raw_unary(proc.target, "/ttd.v1.Device/OptimizerState", &wr.base, md,
                                             &ttd__v1__optimizer_state_response__descriptor, 0, NULL), NULL);
  req.n_parameters = 1;
  Ttd__V1__OptimizerStateResponse *r2 = (Ttd__V1__OptimizerStateResponse *)raw_unary(
      proc.target, "/ttd.v1.Device/OptimizerState", &req.base, md, &ttd__v1__optimizer_state_response__descriptor, 0, NULL);
  ck_assert_int_eq(r2->states[0]->step, 7);
  float m1[6], v1[6];
  raw_download(proc.target, md, r2->states[0]->buffers[0], m1, 6);
  raw_download(proc.target, md, r2->states[0]->buffers[1], v1, 6);
  ck_assert_int_eq(memcmp(m1, v1, sizeof(m1)), 0);
  /* A write with no buffers drops the state: step 0, none read. */
  ps.step = 0;
  ps.n_buffers = 0;
  protobuf_c_message_free_unpacked(raw_unary(proc.target, "/ttd.v1.Device/OptimizerState", &wr.base, md,
                                             &ttd__v1__optimizer_state_response__descriptor, 0, NULL), NULL);
  Ttd__V1__OptimizerStateResponse *r3 = (Ttd__V1__OptimizerStateResponse *)raw_unary(
      proc.target, "/ttd.v1.Device/OptimizerState", &req.base, md, &ttd__v1__optimizer_state_response__descriptor, 0, NULL);
  ck_assert_int_eq(r3->states[0]->step, 0);
  ck_assert_uint_eq(r3->states[0]->n_buffers, 0);
  Ttd__V1__FreeRequest fr = TTD__V1__FREE_REQUEST__INIT;
  uint64_t doomed[6] = {r->states[0]->buffers[0], r->states[0]->buffers[1], r->states[1]->buffers[0],
                        r->states[1]->buffers[1], r2->states[0]->buffers[0], r2->states[0]->buffers[1]};
  fr.handles = doomed;
  fr.n_handles = 6;
  protobuf_c_message_free_unpacked(
      raw_unary(proc.target, "/ttd.v1.Device/Free", &fr.base, md, &ttd__v1__free_response__descriptor, 0, NULL), NULL);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), before - 6 * 2 * sizeof(float)); /* w's state went */
  protobuf_c_message_free_unpacked(&r3->base, NULL);
  protobuf_c_message_free_unpacked(&r2->base, NULL);
  protobuf_c_message_free_unpacked(&r->base, NULL);
  tt_optimizer_free(o);
  tt_module_free(m);
  remove(path);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 0);
}
END_TEST

/* Bad inputs the bad-input table cannot make: a buffer on another card; another session's
 * parameter, refused word for word as a never-issued handle. */
START_TEST(test_state_rpc_other_card_and_session) {
  char hex[17], other_hex[17];
  tt_module *m = mlp(3, HID, "tt");
  tt_optimizer *o = tt_adam(m, 0.1f, 0, 0);
  mlp_steps(m, o, 0, 1);
  raw_md md = client_md(client, hex);
  uint64_t w1 = param_handle(m, "linear1.weight"), b1 = param_handle(m, "linear1.bias");
  float ones[HID];
  for (int i = 0; i < HID; i++) ones[i] = 1.0f;
  uint64_t on_tt1 = raw_upload(proc.target, md, ones, TTD__V1__DTYPE__DTYPE_FLOAT32, 1, HID, 0, "tt:1");
  Ttd__V1__ParameterState ps = TTD__V1__PARAMETER_STATE__INIT, *set[1] = {&ps};
  ps.parameter = b1;
  ps.step = 1;
  ps.buffers = &on_tt1;
  ps.n_buffers = 1;
  Ttd__V1__OptimizerStateRequest wr = TTD__V1__OPTIMIZER_STATE_REQUEST__INIT;
  wr.set = set;
  wr.n_set = 1;
  raw_expect(proc.target, "/ttd.v1.Device/OptimizerState", &wr.base, md, 3,
             "buffer 0 must be float32 [16] on tt:0 dram like the parameter, got float32 [16] on tt:1 dram");
  tt_client *other = harness_connect(&proc, 0);
  raw_md other_md = client_md(other, other_hex);
  Ttd__V1__OptimizerStateRequest rd = TTD__V1__OPTIMIZER_STATE_REQUEST__INIT;
  uint64_t never = 0x0123456789abcdefull;
  rd.parameters = &w1;
  rd.n_parameters = 1;
  raw_result foreign, forged;
  unsigned char buf[64];
  raw_call(proc.target, "/ttd.v1.Device/OptimizerState", other_md, buf, ttd__v1__optimizer_state_request__pack(&rd, buf),
           &foreign);
  rd.parameters = &never;
  raw_call(proc.target, "/ttd.v1.Device/OptimizerState", other_md, buf, ttd__v1__optimizer_state_request__pack(&rd, buf),
           &forged);
  ck_assert_int_eq(foreign.code, 5);
  ck_assert_int_eq(forged.code, 5);
  char *at = strstr(foreign.details, "0x");
  ck_assert_ptr_nonnull(at);
  memcpy(at + 2, "0123456789abcdef", 16); /* the same words but the handle */
  ck_assert_str_eq(foreign.details, forged.details);
  raw_result_free(&foreign);
  raw_result_free(&forged);
  tt_disconnect(other);
  Ttd__V1__FreeRequest fr = TTD__V1__FREE_REQUEST__INIT;
  fr.handles = &on_tt1;
  fr.n_handles = 1;
  protobuf_c_message_free_unpacked(
      raw_unary(proc.target, "/ttd.v1.Device/Free", &fr.base, md, &ttd__v1__free_response__descriptor, 0, NULL), NULL);
  tt_optimizer_free(o);
  tt_module_free(m);
  ck_assert_uint_eq(harness_used_bytes(&proc, 1, 0), 0);
}
END_TEST

/* Copies and new buffers count against the session's quota like any tensor: a read whose
 * copies do not fit and a write whose new buffers do not are RESOURCE_EXHAUSTED and leave
 * nothing behind, the state as it was. */
START_TEST(test_state_rpc_quota) {
  enum { P = (IN * HID + HID + HID * OUT + OUT) * 4 }; /* the mlp's parameter bytes */
  char hex[17];
  tt_connect_options opts;
  tt_connect_options_init(&opts);
  opts.quota_bytes = 5 * P; /* parameters, .grad and Adam's 2 buffers fit, with P to spare */
  tt_client *c = NULL;
  ck_assert_int_eq(tt_connect(proc.target, &opts, &c), TT_OK);
  tt_client *saved = client;
  client = c;
  tt_module *m = mlp(3, HID, "tt");
  tt_optimizer *o = tt_adam(m, 0.1f, 0, 0);
  mlp_steps(m, o, 0, 1);
  float w1[IN * HID];
  param_values(m, "linear1.weight", w1, IN * HID); /* reading it sends the waiting Backward and the step */
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 4 * P);
  raw_md md = client_md(c, hex);
  const char *names[4] = {"linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias"};
  uint64_t params[4];
  for (int i = 0; i < 4; i++) params[i] = param_handle(m, names[i]);
  Ttd__V1__OptimizerStateRequest rd = TTD__V1__OPTIMIZER_STATE_REQUEST__INIT;
  rd.parameters = params;
  rd.n_parameters = 4;
  raw_expect(proc.target, "/ttd.v1.Device/OptimizerState", &rd.base, md, 8, "session memory quota exceeded");
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 4 * P); /* the copies made before went */
  /* Every state dropped (step 0, no buffers), then a write needing 2P of new buffers from
   * 2P of uploaded ones: refused, the states still empty. */
  Ttd__V1__ParameterState ps[4], *set[4];
  uint64_t sources[4][2];
  for (int i = 0; i < 4; i++) {
    ttd__v1__parameter_state__init(&ps[i]);
    ps[i].parameter = params[i];
    set[i] = &ps[i];
  }
  Ttd__V1__OptimizerStateRequest wr = TTD__V1__OPTIMIZER_STATE_REQUEST__INIT;
  wr.set = set;
  wr.n_set = 4;
  protobuf_c_message_free_unpacked(raw_unary(proc.target, "/ttd.v1.Device/OptimizerState", &wr.base, md,
                                             &ttd__v1__optimizer_state_response__descriptor, 0, NULL), NULL);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 2 * P);
  for (int i = 0; i < 4; i++) {
    tt_tensor *p = tt_module_param(m, names[i]);
    for (int k = 0; k < 2; k++) sources[i][k] = raw_allocate_shape(proc.target, hex, tt_tensor_shape(p), tt_tensor_ndim(p));
    tt_tensor_free(p);
    ps[i].step = 3;
    ps[i].buffers = sources[i];
    ps[i].n_buffers = 2;
  }
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 4 * P);
  raw_expect(proc.target, "/ttd.v1.Device/OptimizerState", &wr.base, md, 8, "session memory quota exceeded");
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 4 * P);
  Ttd__V1__OptimizerStateResponse *r = (Ttd__V1__OptimizerStateResponse *)raw_unary(
      proc.target, "/ttd.v1.Device/OptimizerState", &rd.base, md, &ttd__v1__optimizer_state_response__descriptor, 0, NULL);
  for (int i = 0; i < 4; i++) ck_assert_int_eq(r->states[i]->step, 0);
  protobuf_c_message_free_unpacked(&r->base, NULL);
  Ttd__V1__FreeRequest fr = TTD__V1__FREE_REQUEST__INIT;
  fr.handles = &sources[0][0];
  fr.n_handles = 8;
  protobuf_c_message_free_unpacked(
      raw_unary(proc.target, "/ttd.v1.Device/Free", &fr.base, md, &ttd__v1__free_response__descriptor, 0, NULL), NULL);
  tt_optimizer_free(o);
  tt_module_free(m);
  client = saved;
  tt_disconnect(c);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 0);
}
END_TEST

Suite *e2e_optimizers_suite(void) {
  Suite *s = suite_create("e2e_optimizers");
  TCase *tc = tcase_create("optimizers");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_bad_arguments_refused_when_made);
  tcase_add_test(tc, test_set_lr_checked);
  tcase_add_test(tc, test_options_reach_the_update);
  tcase_add_test(tc, test_lr_change_between_steps);
  tcase_add_test(tc, test_move_after_steps);
  tcase_add_test(tc, test_resume_on_card_bit_identical);
  tcase_add_test(tc, test_resume_on_cpu_bit_identical);
  tcase_add_test(tc, test_resume_on_card_without_inline);
  tcase_add_test(tc, test_state_file_layout);
  tcase_add_test(tc, test_state_load_errors);
  tcase_add_test(tc, test_state_rpc_reads_and_writes);
  tcase_add_test(tc, test_state_rpc_other_card_and_session);
  tcase_add_test(tc, test_state_rpc_quota);
  suite_add_tcase(s, tc);
  return s;
}
