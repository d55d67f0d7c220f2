/* Work a module on a card queues (the Backward riding on its next Execute, the steps after
 * it) through the client library and a real ttd, against the same module on "cpu": another
 * module's parameter as a forward input, freeing and loading the module with work queued, a
 * backward that fails or comes after a step, and a thread reading one module while another
 * trains a second. */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "suites.h"
#include "training_fixture.h"
#include "ttd_harness.h"

enum { N = TF_N, IN = TF_IN, H = TF_H, OUT = TF_OUT };

static tt_graph *mlp(void) { return tf_mlp(harness_client); }

static void grad_of(tt_module *m, const char *name, float *out, size_t n) { tf_grad_of(harness_client, m, name, out, n); }

/* One SGD step of module a (on device) from an MSE loss against zeros at input x. */
static void queued_step(tt_module *a, tt_optimizer *o, tt_tensor *x) {
  tt_tensor *y = NULL;
  ck_assert_int_eq(tt_forward(a, &x, 1, &y), TT_OK);
  tt_tensor *yh = tt_to(y, "cpu"), *zero = tt_tensor_from_host(harness_client, NULL, TT_FLOAT32, tt_tensor_shape(yh), 2);
  tt_tensor *loss = tt_mse_loss(yh, zero);
  ck_assert_int_eq(tt_backward(loss), TT_OK);
  ck_assert_int_eq(tt_step(o), TT_OK); /* queued on a card, for a's next call */
  tt_tensor *done[] = {y, yh, zero, loss};
  for (size_t i = 0; i < 4; i++) tt_tensor_free(done[i]);
}

/* The MLP compiled onto dev, an SGD (lr 0.5) over it, and a batch there (*xt its host copy). */
static tt_module *mlp_on(const char *dev, tt_optimizer **o, tt_tensor **xt, tt_tensor **x) {
  tt_graph *g = mlp();
  tt_module *a = tt_compile(harness_client, g);
  tt_graph_free(g);
  ck_assert_int_eq(tt_module_to(a, dev), TT_OK);
  *o = tt_sgd(a, 0.5f, 0, 0, 0);
  float xh[N * IN];
  for (int i = 0; i < N * IN; i++) xh[i] = sinf((float)i * 0.7f);
  int64_t xs[2] = {N, IN};
  *xt = tt_tensor_from_host(harness_client, xh, TT_FLOAT32, xs, 2);
  *x = tt_to(*xt, dev);
  return a;
}

/* The H x IN values of w (a parameter, wherever it is) into out. */
static void read_weight(tt_tensor *w, float *out) {
  tt_tensor *h = tt_to(w, "cpu");
  ck_assert_msg(h != NULL, "%s", tt_last_error(harness_client));
  memcpy(out, tt_tensor_data(h), sizeof(float) * H * IN);
  tt_tensor_free(h);
}

/* Frees what mlp_on made. */
static void free_mlp(tt_module *a, tt_optimizer *o, tt_tensor *xt, tt_tensor *x) {
  tt_tensor_free(xt);
  tt_tensor_free(x);
  tt_optimizer_free(o);
  tt_module_free(a);
}

/* A forward of a on x (*y), its download (*yh) and its sum (*loss). */
static void forward_loss(tt_module *a, tt_tensor *x, tt_tensor **y, tt_tensor **yh, tt_tensor **loss) {
  ck_assert_int_eq(tt_forward(a, &x, 1, y), TT_OK);
  *yh = tt_to(*y, "cpu");
  *loss = tt_sum(*yh);
}

/* Frees n forwards' outputs, their downloads and their losses. */
static void free_losses(tt_tensor **y, tt_tensor **yh, tt_tensor **loss, int n) {
  for (int k = 0; k < n; k++) {
    tt_tensor_free(y[k]);
    tt_tensor_free(yh[k]);
    tt_tensor_free(loss[k]);
  }
}

/* Module b takes module a's weight as its input, right after a's step was queued: b reads the
 * stepped weight on the card as on "cpu" (the step is sent first), bit for bit. */
START_TEST(test_parameter_of_another_module_as_input) {
  float got[2][H * 2];
  for (int where = 0; where < 2; where++) {
    const char *dev = where ? "tt" : "cpu";
    tt_optimizer *o;
    tt_tensor *xt, *x;
    tt_module *a = mlp_on(dev, &o, &xt, &x);
    tt_graph *gb = tt_graph_create(harness_client, 5);
    int64_t ws[2] = {H, IN};
    tt_value w = tt_graph_input(gb, "w", TT_FLOAT32, ws, 2);
    ck_assert_int_eq(tt_graph_output(gb, tt_nn_linear(gb, w, 2, 1)), 0);
    tt_module *b = tt_compile(harness_client, gb);
    tt_graph_free(gb);
    ck_assert_int_eq(tt_module_to(b, dev), TT_OK);
    tt_module_train(b, 0);
    queued_step(a, o, x);
    tt_tensor *wa = tt_module_param(a, "linear1.weight"), *y = NULL;
    ck_assert_int_eq(tt_forward(b, &wa, 1, &y), TT_OK);
    tt_tensor *yh = tt_to(y, "cpu");
    memcpy(got[where], tt_tensor_data(yh), sizeof(got[where]));
    tt_tensor *done[] = {wa, y, yh};
    for (size_t i = 0; i < 3; i++) tt_tensor_free(done[i]);
    tt_module_free(b);
    free_mlp(a, o, xt, x);
  }
  ck_assert_mem_eq(got[0], got[1], sizeof(got[0]));
}
END_TEST

/* A module freed with a Backward waiting and a step queued after it, its weight still held:
 * the weight read afterwards is the stepped one, on the card as on "cpu" (bit for bit). */
START_TEST(test_free_sends_queued_work) {
  float got[2][H * IN];
  for (int where = 0; where < 2; where++) {
    tt_optimizer *o;
    tt_tensor *xt, *x;
    tt_module *a = mlp_on(where ? "tt" : "cpu", &o, &xt, &x);
    tt_tensor *w = tt_module_param(a, "linear1.weight");
    queued_step(a, o, x);
    tt_optimizer_free(o);
    tt_module_free(a);
    read_weight(w, got[where]);
    tt_tensor_free(w);
    tt_tensor_free(xt);
    tt_tensor_free(x);
  }
  ck_assert_mem_eq(got[0], got[1], sizeof(got[0]));
}
END_TEST

/* tt_module_load between a backward and its step, on the card as on "cpu": .grad stays (the
 * values are copied into the parameters), and the step moves the loaded values by it, bit
 * for bit alike. */
START_TEST(test_load_keeps_grad) {
  float got[2][H * IN];
  char path[] = "/tmp/ttd-load-XXXXXX.safetensors";
  int fd = mkstemps(path, 12);
  ck_assert_int_ge(fd, 0);
  close(fd);
  for (int where = 0; where < 2; where++) {
    tt_optimizer *o;
    tt_tensor *xt, *x;
    tt_module *a = mlp_on(where ? "tt" : "cpu", &o, &xt, &x);
    if (where == 0) ck_assert_int_eq(tt_module_save(a, path), TT_OK); /* the initial values */
    queued_step(a, o, x); /* values moved away from the file's */
    tt_tensor *y = NULL;
    ck_assert_int_eq(tt_forward(a, &x, 1, &y), TT_OK);
    tt_tensor *yh = tt_to(y, "cpu"), *loss = tt_sum(yh);
    ck_assert_int_eq(tt_backward(loss), TT_OK);
    ck_assert_int_eq(tt_module_load(a, path), TT_OK);
    tt_tensor *grad = tt_param_grad(a, "linear1.weight");
    ck_assert_msg(grad != NULL, "%s", tt_last_error(harness_client));
    ck_assert_int_eq(tt_step(o), TT_OK);
    tt_tensor *w = tt_module_param(a, "linear1.weight");
    read_weight(w, got[where]); /* sends the step first */
    tt_tensor *done[] = {y, yh, loss, grad, w};
    for (size_t i = 0; i < 5; i++) tt_tensor_free(done[i]);
    free_mlp(a, o, xt, x);
  }
  unlink(path);
  ck_assert_mem_eq(got[0], got[1], sizeof(got[0]));
}
END_TEST

/* A loss of two runs, one already backpropagated: that backward fails FAILED_PRECONDITION
 * and adds nothing, so a later backward of the other run alone gives the .grad of a clean
 * pair of backwards, on the card and on "cpu" alike. */
START_TEST(test_failed_backward_adds_nothing) {
  float got[2][2][H * IN];
  for (int where = 0; where < 2; where++) {
    for (int clean = 0; clean < 2; clean++) {
      tt_optimizer *o;
      tt_tensor *xt, *x;
      tt_module *a = mlp_on(where ? "tt" : "cpu", &o, &xt, &x);
      tt_tensor *y[2], *yh[2], *loss[2];
      forward_loss(a, x, &y[0], &yh[0], &loss[0]);
      ck_assert_int_eq(tt_backward(loss[0]), TT_OK);
      forward_loss(a, x, &y[1], &yh[1], &loss[1]);
      if (!clean) {
        tt_tensor *both = tt_add(loss[0], loss[1]);
        ck_assert_int_eq(tt_backward(both), TT_FAILED_PRECONDITION);
        ck_assert_ptr_nonnull(strstr(tt_last_error(harness_client), "already backpropagated"));
        tt_tensor_free(both);
      }
      ck_assert_int_eq(tt_backward(loss[1]), TT_OK);
      grad_of(a, "linear1.weight", got[where][clean], H * IN);
      free_losses(y, yh, loss, 2);
      free_mlp(a, o, xt, x);
    }
    ck_assert_mem_eq(got[where][0], got[where][1], sizeof(got[where][0]));
  }
  ck_assert_mem_eq(got[0][0], got[1][0], sizeof(got[0][0]));
}
END_TEST

/* Two forwards, the first backpropagated and stepped, then the second's backward: refused
 * FAILED_PRECONDITION on the card and on "cpu" alike (its forward saw the parameters before
 * the step), as torch refuses it; a forward after the step backpropagates. */
START_TEST(test_backward_of_a_run_older_than_a_step_refused) {
  for (int where = 0; where < 2; where++) {
    tt_optimizer *o;
    tt_tensor *xt, *x;
    tt_module *a = mlp_on(where ? "tt" : "cpu", &o, &xt, &x);
    tt_tensor *y[3], *yh[3], *loss[3];
    forward_loss(a, x, &y[0], &yh[0], &loss[0]);
    forward_loss(a, x, &y[1], &yh[1], &loss[1]);
    ck_assert_int_eq(tt_backward(loss[0]), TT_OK);
    ck_assert_int_eq(tt_step(o), TT_OK); /* after the first run's backward */
    forward_loss(a, x, &y[2], &yh[2], &loss[2]);
    ck_assert_int_eq(tt_backward(loss[1]), TT_FAILED_PRECONDITION);
    ck_assert_msg(strstr(tt_last_error(harness_client), "parameters were changed after its forward"), "%s",
                  tt_last_error(harness_client));
    ck_assert_int_eq(tt_backward(loss[2]), TT_OK);
    free_losses(y, yh, loss, 3);
    free_mlp(a, o, xt, x);
  }
}
END_TEST

/* Module b trained on one thread while another thread reads module a's parameters over and
 * over: b ends exactly as trained alone (reading a sends a's queued work only, never b's out
 * of its order). */
typedef struct reader {
  tt_module *a;
  atomic_bool stop;
  int reads;
} reader;

static void *read_params(void *arg) {
  reader *r = arg;
  while (!atomic_load(&r->stop)) {
    tt_tensor *w = tt_module_param(r->a, "linear1.weight"), *h = w ? tt_to(w, "cpu") : NULL;
    ck_assert_ptr_nonnull(h);
    tt_tensor_free(h);
    tt_tensor_free(w);
    r->reads++;
  }
  return NULL;
}

static void train_b(float *out, tt_module *a) {
  tt_graph *g = mlp();
  tt_module *b = tt_compile(harness_client, g);
  tt_graph_free(g);
  ck_assert_int_eq(tt_module_to(b, "tt"), TT_OK);
  tt_optimizer *o = tt_sgd(b, 0.1f, 0.9f, 0, 0);
  reader r = {.a = a};
  pthread_t thread;
  if (a) ck_assert_int_eq(pthread_create(&thread, NULL, read_params, &r), 0);
  for (int step = 0; step < 200; step++) { /* each step its own batch */
    float xh[N * IN];
    for (int i = 0; i < N * IN; i++) xh[i] = cosf((float)i * 0.3f) * (1.0f + 0.01f * (float)step);
    int64_t xs[2] = {N, IN};
    tt_tensor *xt = tt_tensor_from_host(harness_client, xh, TT_FLOAT32, xs, 2), *x = tt_to(xt, "tt");
    ck_assert_int_eq(tt_zero_grad(o), TT_OK);
    queued_step(b, o, x);
    tt_tensor_free(x);
    tt_tensor_free(xt);
  }
  if (a) {
    atomic_store(&r.stop, true);
    pthread_join(thread, NULL);
    ck_assert_int_gt(r.reads, 0);
  }
  grad_of(b, "linear1.weight", out, IN * H); /* sends what is queued */
  tt_tensor *w = tt_module_param(b, "linear1.weight"), *h = tt_to(w, "cpu");
  memcpy(out + IN * H, tt_tensor_data(h), sizeof(float) * IN * H);
  tt_tensor_free(w);
  tt_tensor_free(h);
  tt_optimizer_free(o);
  tt_module_free(b);
}

START_TEST(test_reading_one_module_beside_training_another) {
  tt_graph *g = mlp();
  tt_module *a = tt_compile(harness_client, g);
  tt_graph_free(g);
  ck_assert_int_eq(tt_module_to(a, "tt"), TT_OK);
  static float alone[2 * IN * H], beside[2 * IN * H];
  train_b(alone, NULL);
  train_b(beside, a);
  ck_assert_mem_eq(alone, beside, sizeof(alone));
  tt_module_free(a);
}
END_TEST

Suite *e2e_queued_work_suite(void) {
  Suite *s = suite_create("e2e_queued_work");
  TCase *tc = tcase_create("queued_work");
  tcase_add_checked_fixture(tc, harness_client_setup, harness_client_teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_parameter_of_another_module_as_input);
  tcase_add_test(tc, test_free_sends_queued_work);
  tcase_add_test(tc, test_load_keeps_grad);
  tcase_add_test(tc, test_failed_backward_adds_nothing);
  tcase_add_test(tc, test_backward_of_a_run_older_than_a_step_refused);
  tcase_add_test(tc, test_reading_one_module_beside_training_another);
  suite_add_tcase(s, tc);
  return s;
}
