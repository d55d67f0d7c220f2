/* Dropout through a real ttd, with raw calls: ExecuteRequest.eval runs y = dropout(x) as the
 * identity, forward and Backward; in training each ExecuteRequest.dropout_step draws the mask
 * that the in-process kernel draws for (seed, step), a request without the fields is
 * training at step 0, and a Backward, on its own or carried by the next step's Execute,
 * uses its run's mask. */
#include <check.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "graph_builder.h"
#include "kernels.h"
#include "raw_rpc.h"
#include "suites.h"
#include "ttd/v1/ttd.pb-c.h"
#include "ttd_harness.h"

enum { ROWS = 40, COLS = 400, N = ROWS * COLS };
#define SEED 31337u
#define P 0.5f /* dropout's default p */

static ttd_proc proc;
static char session[17], instance[40];
static uint64_t program, x, dy;
static float host_x[N], host_dy[N];

static raw_md md(void) { return (raw_md){.session = session, .instance = instance}; }

static void setup(void) {
  ttd_proc_start(&proc, NULL);
  raw_open_session(proc.target, session, instance);
  graph_builder b;
  gb_init(&b);
  gb_value(&b, 0, "x", TTD__V1__DTYPE__DTYPE_FLOAT32, 2, ROWS, COLS, 0, 0);
  gb_int(&b, gb_node(&b, "y", "dropout", "x", NULL, NULL), "seed", SEED);
  gb_output(&b, "y");
  Ttd__V1__CompileResponse *c = gb_compile(&b, proc.target, session, 0, NULL);
  program = c->program;
  ttd__v1__compile_response__free_unpacked(c, NULL);
  for (int i = 0; i < N; i++) {
    host_x[i] = (float)(i % 97) - 48.25f;
    host_dy[i] = 0.5f + (float)(i % 11);
  }
  x = raw_upload(proc.target, md(), host_x, TTD__V1__DTYPE__DTYPE_FLOAT32, 2, ROWS, COLS, NULL);
  dy = raw_upload(proc.target, md(), host_dy, TTD__V1__DTYPE__DTYPE_FLOAT32, 2, ROWS, COLS, NULL);
}

static void teardown(void) {
  ck_assert_msg(ttd_proc_alive(&proc), "ttd died; see %s", proc.log_path);
  ck_assert_int_eq(ttd_proc_stop(&proc), 0);
}

/* The Backward of run with output gradient dy, asking for dx. */
static Ttd__V1__BackwardRequest backward_request(uint64_t run) {
  static uint64_t grads[1];
  grads[0] = dy;
  Ttd__V1__BackwardRequest req = TTD__V1__BACKWARD_REQUEST__INIT;
  req.run = run;
  req.output_grads = grads;
  req.n_output_grads = 1;
  req.input_grads = true;
  return req;
}

/* Downloads the tensor under handle into out (N floats). */
static void download(uint64_t handle, float *out) { raw_download(proc.target, md(), handle, out, N); }

/* Executes y = dropout(x) keeping the run (and carrying a Backward when given) with eval and
 * dropout_step as given; y into out, and the carried Backward's dx into carried_dx. Returns
 * the run. */
static uint64_t execute(bool eval, uint64_t step, Ttd__V1__BackwardRequest *carried, float *out, float *carried_dx) {
  Ttd__V1__ExecuteRequest req = TTD__V1__EXECUTE_REQUEST__INIT;
  req.program = program;
  req.inputs = &x;
  req.n_inputs = 1;
  req.keep_for_backward = true;
  req.eval = eval;
  req.dropout_step = step;
  req.backward = carried;
  Ttd__V1__ExecuteResponse *resp = (Ttd__V1__ExecuteResponse *)raw_unary(
      proc.target, "/ttd.v1.Device/Execute", &req.base, md(), &ttd__v1__execute_response__descriptor, 0, NULL);
  ck_assert(resp->mode_applied);
  ck_assert_uint_eq(resp->n_outputs, 1);
  download(resp->outputs[0]->handle, out);
  if (carried) {
    ck_assert_ptr_nonnull(resp->backward);
    ck_assert_uint_eq(resp->backward->n_input_grads, 1);
    download(resp->backward->input_grads[0]->handle, carried_dx);
  }
  uint64_t run = resp->run;
  ck_assert_uint_ne(run, 0);
  protobuf_c_message_free_unpacked(&resp->base, NULL);
  return run;
}

/* A Backward of run on its own; dx into out. */
static void backward(uint64_t run, float *out) {
  Ttd__V1__BackwardRequest req = backward_request(run);
  Ttd__V1__BackwardResponse *resp = (Ttd__V1__BackwardResponse *)raw_unary(
      proc.target, "/ttd.v1.Device/Backward", &req.base, md(), &ttd__v1__backward_response__descriptor, 0, NULL);
  ck_assert_uint_eq(resp->n_input_grads, 1);
  download(resp->input_grads[0]->handle, out);
  protobuf_c_message_free_unpacked(&resp->base, NULL);
}

/* dx as the mask of y says: dy / (1 - p) where y kept x (x is never 0 here), 0 elsewhere. */
static void assert_backward_follows(const float *y, const float *dx, const char *what) {
  for (int i = 0; i < N; i++) {
    float want = y[i] == 0.0f ? 0.0f : host_dy[i] * (1.0f / (1.0f - P));
    if (dx[i] != want) {
      ck_abort_msg("%s: dx[%d] = %g, want %g (y = %g)", what, i, (double)dx[i], (double)want, (double)y[i]);
    }
  }
}

static float *buf(void) {
  float *v = malloc(N * sizeof(float));
  ck_assert_ptr_nonnull(v);
  return v;
}

/* eval: y is x and dx is dy, exactly, at any dropout_step. */
START_TEST(test_eval_is_identity) {
  float *y = buf(), *dx = buf();
  for (uint64_t step = 0; step < 3; step++) {
    uint64_t run = execute(true, step * 1000, NULL, y, NULL);
    ck_assert_int_eq(memcmp(y, host_x, sizeof(host_x)), 0);
    backward(run, dx);
    ck_assert_int_eq(memcmp(dx, host_dy, sizeof(host_dy)), 0);
  }
  free(y), free(dx);
}
END_TEST

/* Training: dropout_step k gives the kernel's mask for (seed, k), the same again for the same
 * k and another for another k; a request without eval and dropout_step is training at step 0. */
START_TEST(test_training_mask_per_step) {
  float *y = buf(), *again = buf(), *other = buf(), *want = buf();
  Ttd__V1__ExecuteRequest bare = TTD__V1__EXECUTE_REQUEST__INIT; /* as a client that sets neither field */
  bare.program = program;
  bare.inputs = &x;
  bare.n_inputs = 1;
  Ttd__V1__ExecuteResponse *resp = (Ttd__V1__ExecuteResponse *)raw_unary(
      proc.target, "/ttd.v1.Device/Execute", &bare.base, md(), &ttd__v1__execute_response__descriptor, 0, NULL);
  download(resp->outputs[0]->handle, y);
  protobuf_c_message_free_unpacked(&resp->base, NULL);
  ttd_k_dropout(NULL, host_x, N, P, SEED, 0, want);
  ck_assert_int_eq(memcmp(y, want, N * sizeof(float)), 0);
  for (uint64_t step = 1; step <= 3; step++) {
    execute(false, step, NULL, y, NULL);
    execute(false, step, NULL, again, NULL);
    execute(false, step + 1, NULL, other, NULL);
    ttd_k_dropout(NULL, host_x, N, P, SEED, step, want);
    ck_assert_int_eq(memcmp(y, want, N * sizeof(float)), 0);
    ck_assert_int_eq(memcmp(y, again, N * sizeof(float)), 0);
    int differ = 0, dropped = 0;
    for (int i = 0; i < N; i++) {
      differ += (y[i] == 0.0f) != (other[i] == 0.0f);
      dropped += y[i] == 0.0f;
    }
    /* independent masks at p = 0.5: each drops and the two disagree on about half (3 sigma = 190) */
    ck_assert_msg(abs(differ - N / 2) < 190, "steps %d and %d disagree at %d of %d", (int)step, (int)step + 1, differ,
                  N);
    ck_assert_msg(abs(dropped - N / 2) < 190, "step %d dropped %d of %d", (int)step, dropped, N);
  }
  free(y), free(again), free(other), free(want);
}
END_TEST

/* A Backward uses its run's mask: on its own after a later step's Execute, and carried by
 * the next step's Execute (the training loop's one round trip), which then runs its own step. */
START_TEST(test_backward_uses_its_forward_mask) {
  float *y1 = buf(), *y2 = buf(), *y3 = buf(), *dx = buf();
  uint64_t run1 = execute(false, 1, NULL, y1, NULL);
  uint64_t run2 = execute(false, 2, NULL, y2, NULL);
  backward(run1, dx);
  assert_backward_follows(y1, dx, "Backward of step 1 after step 2's Execute");
  Ttd__V1__BackwardRequest carried = backward_request(run2);
  execute(false, 3, &carried, y3, dx);
  assert_backward_follows(y2, dx, "step 2's Backward carried by step 3's Execute");
  float *want = y1; /* step 1's mask is checked: the buffer is free for step 3's */
  ttd_k_dropout(NULL, host_x, N, P, SEED, 3, want);
  ck_assert_int_eq(memcmp(y3, want, N * sizeof(float)), 0);
  free(y1), free(y2), free(y3), free(dx);
}
END_TEST

Suite *e2e_dropout_suite(void) {
  Suite *s = suite_create("e2e_dropout");
  TCase *tc = tcase_create("dropout");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_eval_is_identity);
  tcase_add_test(tc, test_training_mask_per_step);
  tcase_add_test(tc, test_backward_uses_its_forward_mask);
  suite_add_tcase(s, tc);
  return s;
}
