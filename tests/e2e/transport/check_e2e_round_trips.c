/* Fewer round trips through a real ttd: the seed training flow takes one RPC a
 * step (Execute, carrying the previous step's Backward and step; counted on the admin
 * /metrics), the inline path gives
 * bit-identical losses and parameters to the plain one (TTD_INLINE=0, the explicit calls),
 * and bad inline data is INVALID_ARGUMENT saying what to fix, with nothing left behind. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_builder.h"
#include "raw_rpc.h"
#include "suites.h"
#include "ttd/v1/ttd.pb-c.h"
#include "ttd_harness.h"

static ttd_proc proc;
static int admin_port;
static char session[17], instance[40];

static void setup(void) {
  admin_port = ttd_proc_start_admin(&proc);
  raw_open_session(proc.target, session, instance);
}

static void teardown(void) {
  unsetenv("TTD_INLINE");
  unsetenv("TTD_SHM");
  ck_assert_msg(ttd_proc_alive(&proc), "ttd died; see %s", proc.log_path);
  ck_assert_int_eq(ttd_proc_stop(&proc), 0);
}

/* ---- the admin endpoint ---- */

/* GET /metrics; the response, malloc'd. */
static char *scrape(void) {
  char *buf = harness_http(admin_port, "GET", "/metrics");
  ck_assert_ptr_nonnull(strstr(buf, "200 OK"));
  return buf;
}

static const char *const methods[] = {"OpenSession", "KeepAlive", "CloseSession", "ListDevices", "Allocate",
                                      "Upload",      "Download",  "Move",         "Free",        "Compile",
                                      "Execute",     "Backward",  "ReleaseRun",   "ZeroGrad",    "OptimizerStep"};
enum { N_METHODS = sizeof(methods) / sizeof(methods[0]) };

/* Calls of each method so far (ttd_rpc_duration_seconds_count). */
static void rpc_counts(double *out) {
  char *body = scrape();
  for (int i = 0; i < N_METHODS; i++) {
    char series[128];
    snprintf(series, sizeof(series), "ttd_rpc_duration_seconds_count{method=\"%s\"}", methods[i]);
    double count = harness_metric(body, series);
    out[i] = count < 0 ? 0 : count;
  }
  free(body);
}

static double delta(const double *before, const double *after, const char *method) {
  for (int i = 0; i < N_METHODS; i++) {
    if (strcmp(methods[i], method) == 0) return after[i] - before[i];
  }
  ck_abort_msg("unknown method %s", method);
  return 0;
}

static double delta_total(const double *before, const double *after) {
  double total = 0;
  for (int i = 0; i < N_METHODS; i++) total += after[i] - before[i];
  return total;
}

/* ---- the seed flow through the public API ---- */

enum { B = 16, IN = 512, H = 32, OUT = 10 }; /* x: 32 KiB, inline by shared memory */

static tt_module *model(tt_client *c, uint64_t seed) {
  tt_graph *g = tt_graph_create(c, seed);
  int64_t xs[2] = {B, IN};
  tt_value x = tt_graph_input(g, "x", TT_FLOAT32, xs, 2);
  tt_graph_output(g, tt_nn_linear(g, tt_relu(g, tt_nn_linear(g, x, H, 1)), OUT, 1));
  tt_module *m = tt_compile(c, g);
  tt_graph_free(g);
  ck_assert_ptr_nonnull(m);
  ck_assert_int_eq(tt_module_to(m, "tt"), TT_OK);
  return m;
}

static void batch(int step, float *x, int32_t *y) {
  harness_fill_random(x, sizeof(float) * B * IN, (uint64_t)step + 1);
  for (int i = 0; i < B * IN; i++) { /* random bits into floats in [-1, 1) */
    uint32_t bits;
    memcpy(&bits, &x[i], 4);
    x[i] = (float)(bits >> 8) / (float)(1u << 23) - 1.0f;
  }
  for (int i = 0; i < B; i++) y[i] = (int32_t)((i * 7 + step) % OUT);
}

/* One step of client/examples/train_common.h: inputs up, forward, output down, the loss on
 * the CPU, zero_grad, backward, step. zero_first: torch's other habit, zero_grad before the
 * forward. Returns the loss. */
static float seed_step(tt_client *c, tt_module *m, tt_optimizer *opt, int step, int zero_first) {
  float x[B * IN];
  int32_t y[B];
  batch(step, x, y);
  int64_t xs[2] = {B, IN}, ys[1] = {B};
  if (zero_first) ck_assert_int_eq(tt_zero_grad(opt), TT_OK);
  tt_tensor *xh = tt_tensor_from_host(c, x, TT_FLOAT32, xs, 2), *labels = tt_tensor_from_host(c, y, TT_INT32, ys, 1);
  tt_tensor *xd = tt_to(xh, tt_module_device(m)), *out = NULL;
  ck_assert_msg(xd != NULL, "%s", tt_last_error(c));
  ck_assert_msg(tt_forward(m, &xd, 1, &out) == TT_OK, "%s", tt_last_error(c));
  tt_tensor *out_cpu = tt_to(out, "cpu");
  ck_assert_msg(out_cpu != NULL, "%s", tt_last_error(c));
  tt_tensor *loss = tt_cross_entropy(out_cpu, labels);
  ck_assert_ptr_nonnull(loss);
  if (!zero_first) ck_assert_int_eq(tt_zero_grad(opt), TT_OK);
  ck_assert_msg(tt_backward(loss) == TT_OK, "%s", tt_last_error(c));
  ck_assert_msg(tt_step(opt) == TT_OK, "%s", tt_last_error(c));
  float value = tt_tensor_item(loss);
  tt_tensor *done[] = {loss, out_cpu, out, xd, xh, labels};
  for (size_t k = 0; k < sizeof(done) / sizeof(done[0]); k++) tt_tensor_free(done[k]);
  return value;
}

/* The seed flow takes 1 RPC a step once training runs (Execute, carrying the previous
 * step's Backward; the step and zero_grad ride along, input and output travel inline,
 * nothing is freed by call), where the plain path (TTD_INLINE=0) takes 10: Upload x2,
 * Execute, Download, ZeroGrad, Backward, OptimizerStep, Free x3. */
START_TEST(test_seed_flow_takes_one_round_trip) {
  enum { K = 12 };
  double before[N_METHODS], after[N_METHODS];
  for (int plain = 0; plain < 2; plain++) {
    if (plain) setenv("TTD_INLINE", "0", 1);
    tt_client *c = harness_connect(&proc, 0); /* no keep-alive thread: its calls would count */
    tt_module *m = model(c, 5);
    tt_optimizer *opt = tt_sgd(m, 0.1f, 0.9f, 0.0f, 0);
    for (int s = 0; s < 2; s++) seed_step(c, m, opt, s, 0); /* warm up: compile, first backward */
    rpc_counts(before);
    for (int s = 0; s < K; s++) seed_step(c, m, opt, 2 + s, 0);
    rpc_counts(after);
    double per_step = delta_total(before, after) / K;
    if (!plain) {
      ck_assert_msg(per_step <= 1, "%g RPCs per step", per_step);
      ck_assert_double_eq(delta(before, after, "Execute"), K);
      const char *none[] = {"Backward", "Upload", "Download", "Free", "ZeroGrad", "OptimizerStep", "Allocate", "ReleaseRun"};
      for (size_t i = 0; i < sizeof(none) / sizeof(none[0]); i++) {
        ck_assert_msg(delta(before, after, none[i]) == 0, "%s called %g times", none[i], delta(before, after, none[i]));
      }
    } else {
      ck_assert_msg(per_step == 10, "the plain path took %g RPCs per step", per_step);
      ck_assert_double_eq(delta(before, after, "Upload"), 2 * K);
      ck_assert_double_eq(delta(before, after, "Free"), 3 * K);
    }
    tt_optimizer_free(opt);
    tt_module_free(m);
    tt_disconnect(c);
  }
}
END_TEST

/* Trains a fresh model for steps, in one of the two step orders; fills losses, the final
 * parameters (concatenated bytes) and an eval forward's output. */
static size_t train(int adam, int zero_first, float *losses, int steps, unsigned char *params, float *eval_out) {
  tt_client *c = harness_connect(&proc, 0);
  tt_module *m = model(c, 11);
  tt_optimizer *opt = adam ? tt_adam(m, 0.01f, 0.01f, 1) : tt_sgd(m, 0.2f, 0.9f, 0.01f, 1);
  for (int s = 0; s < steps; s++) losses[s] = seed_step(c, m, opt, s % 2, zero_first); /* two batches, learnable */
  /* Queued work is sent before a parameter or a .grad is read. */
  size_t n = 0;
  for (int p = 0; p < tt_module_param_count(m); p++) {
    tt_tensor *d = tt_module_param(m, tt_module_param_name(m, p)), *h = tt_to(d, "cpu");
    ck_assert_msg(h != NULL, "%s", tt_last_error(c));
    memcpy(params + n, tt_tensor_data(h), tt_tensor_nbytes(h));
    n += tt_tensor_nbytes(h);
    tt_tensor_free(h);
    tt_tensor_free(d);
  }
  ck_assert_int_eq(tt_zero_grad(opt), TT_OK);
  tt_tensor *g = tt_param_grad(m, "linear2.bias"), *gh = tt_to(g, "cpu");
  ck_assert_msg(gh != NULL, "%s", tt_last_error(c));
  for (int k = 0; k < OUT; k++) ck_assert_float_eq(((float *)tt_tensor_data(gh))[k], 0.0f);
  tt_tensor_free(gh);
  tt_tensor_free(g);
  tt_module_train(m, 0);
  float x[B * IN];
  int32_t y[B];
  batch(99, x, y);
  int64_t xs[2] = {B, IN};
  tt_tensor *xh = tt_tensor_from_host(c, x, TT_FLOAT32, xs, 2), *xd = tt_to(xh, "tt"), *out = NULL;
  ck_assert_int_eq(tt_forward(m, &xd, 1, &out), TT_OK);
  tt_tensor *oh = tt_to(out, "cpu");
  memcpy(eval_out, tt_tensor_data(oh), sizeof(float) * B * OUT);
  tt_tensor *done[] = {oh, out, xd, xh};
  for (size_t k = 0; k < 4; k++) tt_tensor_free(done[k]);
  tt_optimizer_free(opt);
  tt_module_free(m);
  tt_disconnect(c);
  return n;
}

/* The inline path (inputs and outputs inline, step and zero_grad riding along) gives the
 * same bits as the plain path of explicit calls: every loss, every parameter after the
 * steps, an eval forward; for SGD (Nesterov, weight decay) and AdamW, in both step orders.
 * The 32 KiB input goes inline by shared memory, or (TTD_SHM=0) as bytes in the call. */
START_TEST(test_inline_path_is_bit_identical) {
  enum { STEPS = 8 };
  static const char *const ways[] = {"inline by shared memory", "plain", "inline in the call"};
  static unsigned char params[3][(IN * H + H + H * OUT + OUT) * 4];
  float losses[3][STEPS], eval[3][B * OUT];
  for (int adam = 0; adam < 2; adam++) {
    for (int way = 0; way < 3; way++) {
      if (way == 1) setenv("TTD_INLINE", "0", 1);
      else unsetenv("TTD_INLINE");
      if (way == 2) setenv("TTD_SHM", "0", 1);
      else unsetenv("TTD_SHM");
      int registered = harness_log_count(&proc, "event=shm-register");
      size_t n = train(adam, adam, losses[way], STEPS, params[way], eval[way]);
      ck_assert_uint_eq(n, sizeof(params[0]));
      int used_shm = harness_log_count(&proc, "event=shm-register") > registered;
      ck_assert_msg(used_shm == (way == 0), "%s: shared memory %sused", ways[way], used_shm ? "" : "not ");
    }
    unsetenv("TTD_INLINE");
    unsetenv("TTD_SHM");
    for (int way = 1; way < 3; way++) {
      for (int s = 0; s < STEPS; s++) {
        ck_assert_msg(memcmp(&losses[0][s], &losses[way][s], 4) == 0, "%s step %d: loss %.9g %s, %.9g %s",
                      adam ? "adamw" : "sgd", s, losses[0][s], ways[0], losses[way][s], ways[way]);
      }
      ck_assert_msg(memcmp(params[0], params[way], sizeof(params[0])) == 0, "parameters differ after %d steps: %s, %s",
                    STEPS, ways[0], ways[way]);
      ck_assert_msg(memcmp(eval[0], eval[way], sizeof(eval[0])) == 0, "eval outputs differ: %s, %s", ways[0], ways[way]);
    }
    ck_assert_msg(losses[0][STEPS - 1] < losses[0][0], "the loss did not fall");
  }
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 0);
}
END_TEST

/* A host -> device tt_to during a training loop is deferred: no device memory until a handle
 * is needed; its bytes come back without the daemon; tt_tensor_handle uploads it. An optimizer
 * with options the daemon would refuse is refused when made, not at a step. */
START_TEST(test_deferred_tensor_and_checked_step) {
  tt_client *c = harness_connect(&proc, 0);
  tt_module *m = model(c, 3);
  tt_optimizer *opt = tt_sgd(m, 0.1f, 0, 0, 0);
  seed_step(c, m, opt, 0, 0);
  tt_tensor *grad = tt_param_grad(m, "linear2.bias"); /* sends the waiting Backward: a training loop on tt:0 now */
  ck_assert_msg(grad != NULL, "%s", tt_last_error(c));
  tt_tensor_free(grad);
  ck_assert_int_eq(tt_zero_grad(opt), TT_OK); /* queued: the next read sends it */
  uint64_t params = (uint64_t)(IN * H + H + H * OUT + OUT) * 4, grads = params;
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), params + grads);
  float v[256];
  for (int i = 0; i < 256; i++) v[i] = (float)i - 100.5f;
  int64_t shape[1] = {256};
  tt_tensor *h = tt_tensor_from_host(c, v, TT_FLOAT32, shape, 1), *d = tt_to(h, "tt");
  ck_assert_str_eq(tt_tensor_device(d), "tt:0");
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), params + grads);
  tt_tensor *back = tt_to(d, "cpu");
  ck_assert_int_eq(memcmp(tt_tensor_data(back), v, sizeof(v)), 0);
  ck_assert_uint_ne(tt_tensor_handle(d), 0);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), params + grads + sizeof(v));
  tt_tensor *l1 = tt_to(d, "tt:0/l1"), *l1_back = tt_to(l1, "cpu");
  ck_assert_int_eq(memcmp(tt_tensor_data(l1_back), v, sizeof(v)), 0);
  tt_tensor *done[] = {l1_back, l1, back, d, h};
  for (size_t k = 0; k < 5; k++) tt_tensor_free(done[k]);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), params + grads);
  ck_assert_ptr_null(tt_sgd(m, -1.0f, 0, 0, 0)); /* refused when made, as torch.optim does */
  ck_assert_int_eq(tt_errcode(c), TT_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(tt_last_error(c), "tt_sgd: lr is -1"));
  ck_assert_ptr_null(tt_sgd(m, 0.1f, 0, 0, 1));
  ck_assert_ptr_nonnull(strstr(tt_last_error(c), "nesterov needs momentum > 0"));
  tt_optimizer_free(opt);
  tt_module_free(m);
  tt_disconnect(c);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 0);
}
END_TEST

/* ---- the wire, raw ---- */

static raw_md md(void) { return (raw_md){.session = session, .instance = instance}; }

/* Calls method with msg; asserts the code and (if needle) a part of the message; returns the
 * unpacked response when OK (free with protobuf_c_message_free_unpacked), else NULL. */
static ProtobufCMessage *rpc(const char *method, const ProtobufCMessage *msg, const ProtobufCMessageDescriptor *resp_type,
                             int want_code, const char *needle) {
  char path[64];
  snprintf(path, sizeof(path), "/ttd.v1.Device/%s", method);
  return raw_unary(proc.target, path, msg, md(), resp_type, want_code, needle);
}

/* A new float32 tensor on tt:0 holding n floats of data, shaped d0 (x d1). */
static uint64_t put(const float *data, int64_t d0, int64_t d1) {
  return raw_upload(proc.target, md(), data, TTD__V1__DTYPE__DTYPE_FLOAT32, d1 ? 2 : 1, d0, d1, NULL);
}

static void get(uint64_t handle, float *out, size_t n) { raw_download(proc.target, md(), handle, out, n); }

/* An inline tensor: float32 of shape (d0, d1), or (d0) when d1 is 0. */
typedef struct inline_tensor {
  Ttd__V1__InlineTensor wire;
  Ttd__V1__TensorSpec spec;
  int64_t shape[2];
} inline_tensor;

static Ttd__V1__InlineTensor *inline_of(inline_tensor *t, const void *data, size_t len, int dtype, int64_t d0, int64_t d1) {
  ttd__v1__inline_tensor__init(&t->wire);
  ttd__v1__tensor_spec__init(&t->spec);
  t->shape[0] = d0;
  t->shape[1] = d1;
  t->spec.dtype = dtype;
  t->spec.n_shape = d1 ? 2 : 1;
  t->spec.shape = t->shape;
  t->wire.spec = &t->spec;
  t->wire.data.data = (uint8_t *)data;
  t->wire.data.len = len;
  return &t->wire;
}

enum { RN = 4, RIN = 5, RH = 3, ROUT = 2, RPARAMS = RH * RIN + RH + ROUT * RH + ROUT };

/* x [4, 5] -> linear 3 -> relu -> linear 2 = y. */
static uint64_t compile_small(void) {
  graph_builder b;
  gb_init(&b);
  gb_value(&b, 0, "x", TTD__V1__DTYPE__DTYPE_FLOAT32, 2, RN, RIN, 0, 0);
  gb_value(&b, 1, "w1", TTD__V1__DTYPE__DTYPE_FLOAT32, 2, RH, RIN, 0, 0);
  gb_value(&b, 1, "b1", TTD__V1__DTYPE__DTYPE_FLOAT32, 1, RH, 0, 0, 0);
  gb_value(&b, 1, "w2", TTD__V1__DTYPE__DTYPE_FLOAT32, 2, ROUT, RH, 0, 0);
  gb_value(&b, 1, "b2", TTD__V1__DTYPE__DTYPE_FLOAT32, 1, ROUT, 0, 0, 0);
  gb_node(&b, "z", "linear", "x", "w1", "b1");
  gb_node(&b, "h", "relu", "z", NULL, NULL);
  gb_node(&b, "y", "linear", "h", "w2", "b2");
  gb_output(&b, "y");
  Ttd__V1__CompileResponse *c = gb_compile(&b, proc.target, session, 0, NULL);
  uint64_t program = c->program;
  ttd__v1__compile_response__free_unpacked(c, NULL);
  return program;
}

static void small_params(float *all) {
  harness_fill_random(all, sizeof(float) * RPARAMS, 77);
  for (int i = 0; i < RPARAMS; i++) {
    uint32_t bits;
    memcpy(&bits, &all[i], 4);
    all[i] = (float)(bits >> 8) / (float)(1u << 23) - 1.0f;
  }
}

static void put_params(const float *all, uint64_t *handles) {
  handles[0] = put(all, RH, RIN);
  handles[1] = put(all + RH * RIN, RH, 0);
  handles[2] = put(all + RH * RIN + RH, ROUT, RH);
  handles[3] = put(all + RH * RIN + RH + ROUT * RH, ROUT, 0);
}

static void get_params(const uint64_t *handles, float *all) {
  get(handles[0], all, RH * RIN);
  get(handles[1], all + RH * RIN, RH);
  get(handles[2], all + RH * RIN + RH, ROUT * RH);
  get(handles[3], all + RH * RIN + RH + ROUT * RH, ROUT);
}

/* An Execute of the small program on its 4 parameters, keeping the run for Backward; the
 * caller adds the input. */
static void small_execute(Ttd__V1__ExecuteRequest *ex, uint64_t program, uint64_t *params) {
  ttd__v1__execute_request__init(ex);
  ex->program = program;
  ex->parameters = params;
  ex->n_parameters = 4;
  ex->keep_for_backward = 1;
}

/* The input inline, the outputs inline only. */
static void inline_in_out(Ttd__V1__ExecuteRequest *ex, Ttd__V1__InlineTensor **x) {
  ex->inline_inputs = x;
  ex->n_inline_inputs = 1;
  ex->output_mode = TTD__V1__OUTPUT_MODE__OUTPUT_MODE_INLINE;
}

/* The same forward, backward and SGD step by handles with explicit calls and by the new
 * fields (input and output inline, the gradient inline, the step chained after the backward
 * on the parameters it reached): the same output bytes and parameter bytes. Frees riding on
 * Execute take effect, even for the call's own input. */
START_TEST(test_raw_inline_matches_handles) {
  uint64_t program = compile_small();
  float p0[RPARAMS], x[RN * RIN], g[RN * ROUT];
  small_params(p0);
  harness_fill_random(x, sizeof(x), 5);
  for (int i = 0; i < RN * RIN; i++) x[i] = (float)((int)(((unsigned char *)x)[i] % 17) - 8) / 8.0f;
  for (int i = 0; i < RN * ROUT; i++) g[i] = (float)(i % 5) / 4.0f - 0.5f;
  Ttd__V1__SgdOptions sgd = TTD__V1__SGD_OPTIONS__INIT;
  sgd.lr = 0.3f;
  sgd.momentum = 0.9f;
  sgd.weight_decay = 0.01f;
  float y_handles[RN * ROUT], after_handles[RPARAMS], after_inline[RPARAMS];

  /* By handles. */
  uint64_t ph[4], xh = put(x, RN, RIN), gh = put(g, RN, ROUT);
  put_params(p0, ph);
  Ttd__V1__ExecuteRequest ex;
  small_execute(&ex, program, ph);
  ex.inputs = &xh;
  ex.n_inputs = 1;
  Ttd__V1__ExecuteResponse *er =
      (Ttd__V1__ExecuteResponse *)rpc("Execute", &ex.base, &ttd__v1__execute_response__descriptor, 0, NULL);
  ck_assert_uint_eq(er->n_output_data, 0);
  get(er->outputs[0]->handle, y_handles, RN * ROUT);
  Ttd__V1__BackwardRequest bw = TTD__V1__BACKWARD_REQUEST__INIT;
  bw.run = er->run;
  bw.output_grads = &gh;
  bw.n_output_grads = 1;
  protobuf_c_message_free_unpacked(rpc("Backward", &bw.base, &ttd__v1__backward_response__descriptor, 0, NULL), NULL);
  Ttd__V1__OptimizerStepRequest step = TTD__V1__OPTIMIZER_STEP_REQUEST__INIT;
  step.parameters = ph;
  step.n_parameters = 4;
  step.optimizer_case = TTD__V1__OPTIMIZER_STEP_REQUEST__OPTIMIZER_SGD;
  step.sgd = &sgd;
  protobuf_c_message_free_unpacked(rpc("OptimizerStep", &step.base, &ttd__v1__optimizer_step_response__descriptor, 0, NULL),
                                   NULL);
  get_params(ph, after_handles);
  protobuf_c_message_free_unpacked(&er->base, NULL);

  /* Inline. */
  uint64_t pi[4];
  put_params(p0, pi);
  inline_tensor xi, gi;
  Ttd__V1__InlineTensor *xin = inline_of(&xi, x, sizeof(x), TTD__V1__DTYPE__DTYPE_FLOAT32, RN, RIN);
  small_execute(&ex, program, pi);
  inline_in_out(&ex, &xin);
  ex.free = &xh; /* the handle path's input, no longer needed */
  ex.n_free = 1;
  er = (Ttd__V1__ExecuteResponse *)rpc("Execute", &ex.base, &ttd__v1__execute_response__descriptor, 0, NULL);
  ck_assert_uint_eq(er->n_outputs, 1);
  ck_assert_uint_eq(er->outputs[0]->handle, 0);
  ck_assert_uint_eq(er->n_output_data, 1);
  ck_assert_uint_eq(er->output_data[0].len, sizeof(y_handles));
  ck_assert_int_eq(memcmp(er->output_data[0].data, y_handles, sizeof(y_handles)), 0);
  Ttd__V1__InlineTensor *gin = inline_of(&gi, g, sizeof(g), TTD__V1__DTYPE__DTYPE_FLOAT32, RN, ROUT);
  Ttd__V1__OptimizerStepRequest chained = TTD__V1__OPTIMIZER_STEP_REQUEST__INIT; /* no parameters: those reached */
  chained.optimizer_case = TTD__V1__OPTIMIZER_STEP_REQUEST__OPTIMIZER_SGD;
  chained.sgd = &sgd;
  Ttd__V1__ParameterWork after = TTD__V1__PARAMETER_WORK__INIT;
  after.step = &chained;
  ttd__v1__backward_request__init(&bw);
  bw.run = er->run;
  bw.inline_output_grads = &gin;
  bw.n_inline_output_grads = 1;
  bw.after = &after;
  bw.free = &gh;
  bw.n_free = 1;
  protobuf_c_message_free_unpacked(rpc("Backward", &bw.base, &ttd__v1__backward_response__descriptor, 0, NULL), NULL);
  get_params(pi, after_inline);
  ck_assert_int_eq(memcmp(after_handles, after_inline, sizeof(after_inline)), 0);
  ck_assert_int_ne(memcmp(p0, after_inline, sizeof(p0)), 0);
  protobuf_c_message_free_unpacked(&er->base, NULL);
  /* x and the gradient were freed by the calls that carried them; what is left: two sets of
   * parameters, their .grad and momentum, and the handle path's output. */
  uint64_t want = 2 * 3 * (uint64_t)RPARAMS * 4 + sizeof(y_handles);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), want);
  /* Queued work failing fails the call with nothing else done. */
  Ttd__V1__OptimizerStepRequest lost = step;
  uint64_t forged = 0x1234;
  lost.parameters = &forged;
  lost.n_parameters = 1;
  Ttd__V1__ParameterWork before = TTD__V1__PARAMETER_WORK__INIT;
  before.step = &lost;
  ex.before = &before;
  ex.n_free = 0;
  rpc("Execute", &ex.base, NULL, 5,
      "OptimizerStep queued before this Execute failed: tensor 0x0000000000001234 not found in this session");
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), want);
}
END_TEST

/* An Execute carrying the previous step's Backward (gradient inline, the step chained after
 * it) gives the same output and parameters as Backward and Execute sent one by one, and
 * answers the Backward in its response. A carried Backward that fails fails the Execute
 * with its code and says so; the forward does not run and nothing is left behind. */
START_TEST(test_raw_backward_carried_by_execute) {
  uint64_t program = compile_small();
  float p0[RPARAMS], x[RN * RIN], g[RN * ROUT];
  small_params(p0);
  for (int i = 0; i < RN * RIN; i++) x[i] = (float)(i % 13) / 6.0f - 1.0f;
  for (int i = 0; i < RN * ROUT; i++) g[i] = (float)(i % 5) / 4.0f - 0.5f;
  Ttd__V1__SgdOptions sgd = TTD__V1__SGD_OPTIONS__INIT;
  sgd.lr = 0.3f;
  sgd.momentum = 0.9f;
  Ttd__V1__OptimizerStepRequest chained = TTD__V1__OPTIMIZER_STEP_REQUEST__INIT; /* the parameters reached */
  chained.optimizer_case = TTD__V1__OPTIMIZER_STEP_REQUEST__OPTIMIZER_SGD;
  chained.sgd = &sgd;
  Ttd__V1__ParameterWork after = TTD__V1__PARAMETER_WORK__INIT;
  after.step = &chained;
  inline_tensor xi, gi;
  Ttd__V1__InlineTensor *xin = inline_of(&xi, x, sizeof(x), TTD__V1__DTYPE__DTYPE_FLOAT32, RN, RIN);
  Ttd__V1__InlineTensor *gin = inline_of(&gi, g, sizeof(g), TTD__V1__DTYPE__DTYPE_FLOAT32, RN, ROUT);
  float y[2][RN * ROUT], params[2][RPARAMS];
  for (int carried = 0; carried < 2; carried++) {
    uint64_t ph[4];
    put_params(p0, ph);
    Ttd__V1__ExecuteRequest ex;
    small_execute(&ex, program, ph);
    inline_in_out(&ex, &xin);
    Ttd__V1__ExecuteResponse *first =
        (Ttd__V1__ExecuteResponse *)rpc("Execute", &ex.base, &ttd__v1__execute_response__descriptor, 0, NULL);
    Ttd__V1__BackwardRequest bw = TTD__V1__BACKWARD_REQUEST__INIT;
    bw.run = first->run;
    bw.inline_output_grads = &gin;
    bw.n_inline_output_grads = 1;
    bw.after = &after;
    if (carried) {
      ex.backward = &bw;
    } else {
      protobuf_c_message_free_unpacked(rpc("Backward", &bw.base, &ttd__v1__backward_response__descriptor, 0, NULL), NULL);
    }
    ex.keep_for_backward = 0;
    Ttd__V1__ExecuteResponse *second =
        (Ttd__V1__ExecuteResponse *)rpc("Execute", &ex.base, &ttd__v1__execute_response__descriptor, 0, NULL);
    ck_assert_uint_eq(second->output_data[0].len, sizeof(y[0]));
    memcpy(y[carried], second->output_data[0].data, sizeof(y[0]));
    if (carried) { /* the Backward's answer: the four parameters' .grad */
      ck_assert_ptr_nonnull(second->backward);
      ck_assert_uint_eq(second->backward->n_parameter_grads, 4);
      for (int i = 0; i < 4; i++) ck_assert_uint_ne(second->backward->parameter_grads[i]->handle, 0);
    } else {
      ck_assert_ptr_null(second->backward);
    }
    get_params(ph, params[carried]);
    protobuf_c_message_free_unpacked(&second->base, NULL);
    protobuf_c_message_free_unpacked(&first->base, NULL);
  }
  ck_assert_int_eq(memcmp(y[0], y[1], sizeof(y[0])), 0);
  ck_assert_int_eq(memcmp(params[0], params[1], sizeof(params[0])), 0);
  ck_assert_int_ne(memcmp(params[0], p0, sizeof(p0)), 0);

  /* A run that is not there: NOT_FOUND, and no forward. */
  uint64_t before = harness_used_bytes(&proc, 0, 0), ph[4];
  put_params(p0, ph);
  Ttd__V1__ExecuteRequest ex;
  small_execute(&ex, program, ph);
  inline_in_out(&ex, &xin);
  Ttd__V1__BackwardRequest gone = TTD__V1__BACKWARD_REQUEST__INIT;
  gone.run = 0x4242;
  gone.inline_output_grads = &gin;
  gone.n_inline_output_grads = 1;
  ex.backward = &gone;
  rpc("Execute", &ex.base, NULL, 5,
      "the Backward carried by this Execute failed, so the forward did not run: run 0x0000000000004242 not found in "
      "this session");
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), before + (uint64_t)RPARAMS * 4); /* only the new parameters */
}
END_TEST

/* Through the library: tt_backward leaves its Backward for the next Execute. A second
 * backward through the same run is refused at once; reading a .grad, moving the module or
 * freeing it sends or releases the waiting Backward, leaving nothing behind. */
START_TEST(test_waiting_backward_flushed_or_released) {
  tt_client *c = harness_connect(&proc, 0);
  tt_module *m = model(c, 21);
  tt_optimizer *opt = tt_sgd(m, 0.1f, 0, 0, 0);
  uint64_t params = (uint64_t)(IN * H + H + H * OUT + OUT) * 4;
  seed_step(c, m, opt, 0, 0);
  ck_assert_uint_gt(harness_used_bytes(&proc, 0, 0), params); /* the run waits, with its activations */
  /* Moving the module sends the Backward and the step first, where they were made. */
  ck_assert_msg(tt_module_to(m, "cpu") == TT_OK, "%s", tt_last_error(c));
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 0);
  ck_assert_int_eq(tt_module_to(m, "tt"), TT_OK);
  /* The same loss twice: the second backward is refused now, not at the next Execute. */
  float x[B * IN];
  int32_t y[B];
  batch(1, x, y);
  int64_t xs[2] = {B, IN}, ys[1] = {B};
  tt_tensor *xh = tt_tensor_from_host(c, x, TT_FLOAT32, xs, 2), *labels = tt_tensor_from_host(c, y, TT_INT32, ys, 1);
  tt_tensor *xd = tt_to(xh, "tt"), *out = NULL;
  ck_assert_int_eq(tt_forward(m, &xd, 1, &out), TT_OK);
  tt_tensor *out_cpu = tt_to(out, "cpu"), *loss = tt_cross_entropy(out_cpu, labels);
  ck_assert_int_eq(tt_backward(loss), TT_OK);
  ck_assert_int_eq(tt_backward(loss), TT_FAILED_PRECONDITION);
  ck_assert_ptr_nonnull(strstr(tt_last_error(c), "already backpropagated"));
  /* Its .grad, read now, is the Backward's. */
  tt_tensor *gd = tt_param_grad(m, "linear2.bias"), *gh = gd ? tt_to(gd, "cpu") : NULL;
  ck_assert_msg(gh != NULL, "%s", tt_last_error(c));
  float sum = 0;
  for (int k = 0; k < OUT; k++) sum += fabsf(((float *)tt_tensor_data(gh))[k]);
  ck_assert_float_gt(sum, 0.0f);
  tt_tensor *done[] = {gh, gd, loss, out_cpu, out, xd, xh, labels};
  for (size_t k = 0; k < sizeof(done) / sizeof(done[0]); k++) tt_tensor_free(done[k]);
  /* Freed with a Backward waiting: its run is released on the card with the parameters. */
  seed_step(c, m, opt, 2, 0);
  tt_optimizer_free(opt);
  tt_module_free(m);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 0);
  tt_disconnect(c);
}
END_TEST

/* Bad inline data is INVALID_ARGUMENT with a message saying what to fix; the daemon keeps
 * serving and holds nothing more than before (a failed Backward releases its run, as ever). */
START_TEST(test_bad_inline_rejected) {
  uint64_t program = compile_small();
  float p0[RPARAMS], x[RN * RIN + 1] = {0}, g[RN * ROUT] = {0}; /* x: room for one float too many */
  const size_t xb = RN * RIN * 4;
  small_params(p0);
  uint64_t ph[4];
  put_params(p0, ph);
  uint64_t base = (uint64_t)RPARAMS * 4;
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), base);
  inline_tensor it;
  Ttd__V1__InlineTensor *wire;
  Ttd__V1__InlineTensor *two[2];
  Ttd__V1__ExecuteRequest ex;
  small_execute(&ex, program, ph);
  ex.n_inline_inputs = 1;
  ex.inline_inputs = &wire;
  struct {
    size_t len;
    int dtype;
    int64_t d0, d1;
    const char *device;
    const char *needle;
  } cases[] = {
      {xb - 4, 1, RN, RIN, NULL, "inline input 0 ('x') has 76 bytes of data; float32 [4, 5] needs exactly 80"},
      {xb + 4, 1, RN, RIN, NULL, "inline input 0 ('x') has 84 bytes of data; float32 [4, 5] needs exactly 80"},
      {xb, 1, RIN, RN, NULL, "inline input 0 ('x') must be float32 [4, 5], got float32 [5, 4]"},
      {xb, 3, RN, RIN, NULL, "inline input 0 ('x') must be float32 [4, 5], got int32 [4, 5]"},
      {xb, 0, RN, RIN, NULL, "inline input 0 ('x'): dtype 0 is not supported"},
      {xb, 1, RN, -RIN, NULL, "inline input 0 ('x'): dim 1 of the shape is -5"},
      {xb, 1, RN, RIN, "tt:1", "inline input 0 ('x') names tt:1 but the call runs on tt:0; leave its device empty"},
      {xb, 1, RN, RIN, "tt:9", "inline input 0 ('x'): "},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    wire = inline_of(&it, x, cases[i].len, cases[i].dtype, cases[i].d0, cases[i].d1);
    it.spec.device = (char *)cases[i].device;
    rpc("Execute", &ex.base, NULL, 3, cases[i].needle);
  }
  wire = inline_of(&it, x, xb, 1, RN, RIN);
  it.wire.spec = NULL;
  rpc("Execute", &ex.base, NULL, 3, "inline input 0 ('x') has no spec; set its dtype and shape");
  wire = inline_of(&it, x, xb, 1, RN, RIN);
  two[0] = two[1] = wire;
  ex.inline_inputs = two;
  ex.n_inline_inputs = 2;
  rpc("Execute", &ex.base, NULL, 3, "2 inline inputs given for 1 inputs marked inline");
  uint64_t zeros[2] = {0, 0};
  ex.inputs = zeros;
  ex.n_inputs = 2;
  rpc("Execute", &ex.base, NULL, 3, "the program takes 1 inputs, got 2 in inputs");
  ex.inputs = NULL;
  ex.n_inputs = 0;
  ex.inline_inputs = &wire;
  ex.n_inline_inputs = 1;
  ex.output_mode = 7;
  rpc("Execute", &ex.base, NULL, 3, "output_mode 7 is unknown");
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), base);

  /* More than 4 MiB inline in, or asked to come back inline. */
  size_t big_len = 1100 * 1000 * 4;
  float *big = calloc(1100 * 1000, sizeof(float));
  Ttd__V1__ExecuteRequest bx = TTD__V1__EXECUTE_REQUEST__INIT;
  bx.program = gb_compile_relu(proc.target, session, 2, 1100, 1000);
  wire = inline_of(&it, big, big_len, 1, 1100, 1000);
  bx.inline_inputs = &wire;
  bx.n_inline_inputs = 1;
  rpc("Execute", &bx.base, NULL, 3,
      "inline input 0 ('x') holds 4400000 bytes; at most 4194304 (4 MiB) travel inline: upload it and pass its handle");
  uint64_t big_handle = put(big, 1100, 1000);
  bx.inline_inputs = NULL;
  bx.n_inline_inputs = 0;
  bx.inputs = &big_handle;
  bx.n_inputs = 1;
  bx.output_mode = TTD__V1__OUTPUT_MODE__OUTPUT_MODE_HANDLES_AND_INLINE;
  bx.free = &big_handle;
  bx.n_free = 1;
  rpc("Execute", &bx.base, NULL, 3, "the program's outputs add up to 4400000 bytes; at most 4194304 (4 MiB) travel inline: "
                                    "ask for OUTPUT_MODE_HANDLES");
  free(big);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), base); /* the failed call still freed big_handle */

  /* Inline output gradients. */
  inline_tensor gt;
  wire = inline_of(&it, x, xb, 1, RN, RIN);
  ex.output_mode = TTD__V1__OUTPUT_MODE__OUTPUT_MODE_INLINE;
  struct {
    size_t len;
    int dtype;
    int64_t d0, d1;
    int also_handle;
    const char *needle;
  } gcases[] = {
      {sizeof(g), 1, RN, ROUT + 1, 0, "inline gradient of output 0 ('y') must be float32 [4, 2], got float32 [4, 3]"},
      {sizeof(g), 2, RN, ROUT, 0, "inline gradient of output 0 ('y') must be float32 [4, 2], got bfloat16 [4, 2]"},
      {sizeof(g) / 2, 1, RN, ROUT, 0, "inline gradient of output 0 ('y') has 16 bytes of data; float32 [4, 2] needs exactly 32"},
      {sizeof(g), 1, RN, ROUT, 1, "output 0 ('y') has a gradient by handle and one inline; give one"},
  };
  for (size_t i = 0; i < sizeof(gcases) / sizeof(gcases[0]); i++) {
    Ttd__V1__ExecuteResponse *er =
        (Ttd__V1__ExecuteResponse *)rpc("Execute", &ex.base, &ttd__v1__execute_response__descriptor, 0, NULL);
    ck_assert_uint_gt(harness_used_bytes(&proc, 0, 0), base); /* the run holds x and the activations */
    Ttd__V1__InlineTensor *gw = inline_of(&gt, g, gcases[i].len, gcases[i].dtype, gcases[i].d0, gcases[i].d1);
    Ttd__V1__BackwardRequest bw = TTD__V1__BACKWARD_REQUEST__INIT;
    bw.run = er->run;
    bw.inline_output_grads = &gw;
    bw.n_inline_output_grads = 1;
    uint64_t gh = gcases[i].also_handle ? put(g, RN, ROUT) : 0;
    if (gh) {
      bw.output_grads = &gh;
      bw.n_output_grads = 1;
      bw.free = &gh;
      bw.n_free = 1;
    }
    rpc("Backward", &bw.base, NULL, 3, gcases[i].needle);
    protobuf_c_message_free_unpacked(&er->base, NULL);
    ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), base);
  }
  Ttd__V1__ExecuteResponse *er =
      (Ttd__V1__ExecuteResponse *)rpc("Execute", &ex.base, &ttd__v1__execute_response__descriptor, 0, NULL);
  Ttd__V1__BackwardRequest bw = TTD__V1__BACKWARD_REQUEST__INIT;
  bw.run = er->run;
  Ttd__V1__InlineTensor *gws[2] = {inline_of(&gt, g, sizeof(g), 1, RN, ROUT), inline_of(&gt, g, sizeof(g), 1, RN, ROUT)};
  bw.inline_output_grads = gws;
  bw.n_inline_output_grads = 2;
  rpc("Backward", &bw.base, NULL, 3, "the program has 1 outputs, got 2 inline output gradients and 0 handles");
  protobuf_c_message_free_unpacked(&er->base, NULL);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), base);
  /* Queued work that fails fails the Backward, which releases its run as any failed one. */
  er = (Ttd__V1__ExecuteResponse *)rpc("Execute", &ex.base, &ttd__v1__execute_response__descriptor, 0, NULL);
  uint64_t forged = 0x4321;
  Ttd__V1__ZeroGradRequest zero = TTD__V1__ZERO_GRAD_REQUEST__INIT;
  zero.parameters = &forged;
  zero.n_parameters = 1;
  Ttd__V1__ParameterWork before = TTD__V1__PARAMETER_WORK__INIT;
  before.zero_grad = &zero;
  ttd__v1__backward_request__init(&bw);
  bw.run = er->run;
  bw.inline_output_grads = gws;
  bw.n_inline_output_grads = 1;
  bw.before = &before;
  rpc("Backward", &bw.base, NULL, 5, "ZeroGrad queued before this Backward failed: tensor 0x0000000000004321 not found");
  protobuf_c_message_free_unpacked(&er->base, NULL);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), base);
  ck_assert(ttd_proc_alive(&proc));
}
END_TEST

Suite *e2e_round_trips_suite(void) {
  Suite *s = suite_create("e2e_round_trips");
  TCase *tc = tcase_create("round_trips");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_seed_flow_takes_one_round_trip);
  tcase_add_test(tc, test_inline_path_is_bit_identical);
  tcase_add_test(tc, test_deferred_tensor_and_checked_step);
  tcase_add_test(tc, test_raw_inline_matches_handles);
  tcase_add_test(tc, test_raw_backward_carried_by_execute);
  tcase_add_test(tc, test_waiting_backward_flushed_or_released);
  tcase_add_test(tc, test_bad_inline_rejected);
  suite_add_tcase(s, tc);
  return s;
}
