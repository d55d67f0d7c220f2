/* Backward beyond a single loss, through the client library and a real ttd: gradients of a
 * forward's inputs (tt_tensor_set_requires_grad), a chain of two modules trained by passing
 * the second one's input gradient to the first (tt_backward_grads), retain_graph and a second
 * backward, tt_release_run and the card memory it gives back, and the errors of each; on the
 * card (loop 0) and on "cpu" (loop 1), against the gradients worked out on the host. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "suites.h"
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

enum { N = 4, IN = 5, H = 6, OUT = 3 };

static const char *where(int loop) { return loop == 0 ? "tt" : "cpu"; }

/* y = x W^T + b: one Linear layer of in -> out features, on device. */
static tt_module *linear(int in, int out, uint64_t seed, const char *device) {
  tt_graph *g = tt_graph_create(client, seed);
  int64_t xs[2] = {N, in};
  tt_value x = tt_graph_input(g, "x", TT_FLOAT32, xs, 2);
  ck_assert_int_eq(tt_graph_output(g, tt_nn_linear(g, x, out, 1)), 0);
  tt_module *m = tt_compile(client, g);
  tt_graph_free(g);
  ck_assert_ptr_nonnull(m);
  ck_assert_int_eq(tt_module_to(m, device), TT_OK);
  return m;
}

/* A host float32 tensor [rows, cols] of small distinct values. */
static tt_tensor *host_matrix(int rows, int cols, float scale) {
  int64_t s[2] = {rows, cols};
  tt_tensor *t = tt_tensor_from_host(client, NULL, TT_FLOAT32, s, 2);
  float *d = tt_tensor_data(t);
  for (int i = 0; i < rows * cols; i++) d[i] = scale * (float)((i * 7) % 11 - 5);
  return t;
}

/* A tensor's values on the host (a new host tensor). */
static tt_tensor *on_host(tt_tensor *t) {
  tt_tensor *h = tt_to(t, "cpu");
  ck_assert_msg(h != NULL, "%s", tt_last_error(client));
  return h;
}

/* A module's parameter and its .grad, as host tensors (on "cpu" the module's own: its .grad
 * accumulates in place, as torch's). */
static tt_tensor *param(tt_module *m, const char *name) {
  tt_tensor *p = tt_module_param(m, name);
  tt_tensor *h = on_host(p);
  tt_tensor_free(p);
  return h;
}

static tt_tensor *grad(tt_module *m, const char *name) {
  tt_tensor *g = tt_param_grad(m, name);
  ck_assert_msg(g != NULL, "%s", tt_last_error(client));
  tt_tensor *h = on_host(g);
  tt_tensor_free(g);
  return h;
}

/* c[i][j] = sum_k a[i][k] * b[k][j], with either operand read transposed. */
static void matmul(const float *a, int ta, const float *b, int tb, float *c, int n, int k, int m) {
  for (int i = 0; i < n; i++) {
    for (int j = 0; j < m; j++) {
      double s = 0;
      for (int q = 0; q < k; q++) s += (double)(ta ? a[q * n + i] : a[i * k + q]) * (tb ? b[j * k + q] : b[q * m + j]);
      c[i * m + j] = (float)s;
    }
  }
}

static void assert_close(const float *got, const float *want, int n, const char *what) {
  for (int i = 0; i < n; i++) {
    ck_assert_msg(fabsf(got[i] - want[i]) <= 1e-4f + 1e-4f * fabsf(want[i]), "%s[%d]: %g, want %g", what, i, got[i],
                  want[i]);
  }
}

/* The input's gradient is G W and the weight's G^T x, for an output gradient G given
 * straight to the device output; an input that does not require grad gets none. */
START_TEST(test_input_grad_of_a_linear_layer) {
  tt_module *m = linear(IN, OUT, 3, where(_i));
  tt_tensor *xh = host_matrix(N, IN, 0.1f), *gh = host_matrix(N, OUT, 0.05f), *ph = host_matrix(N, IN, 0.1f);
  tt_tensor *x = tt_to(xh, where(_i)), *plain = tt_to(ph, where(_i)); /* on "cpu", tt_to gives the same tensor */
  ck_assert_int_eq(tt_tensor_requires_grad(x), 0);
  ck_assert_int_eq(tt_tensor_set_requires_grad(x, 1), TT_OK);
  ck_assert_int_eq(tt_tensor_requires_grad(x), 1);
  ck_assert_ptr_null(tt_tensor_grad(x));
  ck_assert_int_eq(tt_errcode(client), TT_FAILED_PRECONDITION);
  ck_assert_ptr_nonnull(strstr(tt_last_error(client), "no gradient yet"));
  tt_tensor *y = NULL;
  ck_assert_int_eq(tt_forward(m, &x, 1, &y), TT_OK);
  ck_assert_int_eq(tt_backward_grads(&y, &gh, 1, 0), TT_OK);
  tt_tensor *gx = tt_tensor_grad(x);
  ck_assert_msg(gx != NULL, "%s", tt_last_error(client));
  ck_assert_str_eq(tt_tensor_device(gx), tt_tensor_device(x));
  ck_assert_int_eq(tt_tensor_ndim(gx), 2);
  ck_assert_int_eq(tt_tensor_shape(gx)[0], N);
  ck_assert_int_eq(tt_tensor_shape(gx)[1], IN);
  tt_tensor *gxh = on_host(gx), *w = param(m, "linear1.weight"), *gw = grad(m, "linear1.weight");
  float want_x[N * IN], want_w[OUT * IN];
  matmul(tt_tensor_data(gh), 0, tt_tensor_data(w), 0, want_x, N, OUT, IN);
  matmul(tt_tensor_data(gh), 1, tt_tensor_data(xh), 0, want_w, OUT, N, IN);
  assert_close(tt_tensor_data(gxh), want_x, N * IN, "x.grad");
  assert_close(tt_tensor_data(gw), want_w, OUT * IN, "weight.grad");
  /* a second forward and backward accumulate into x.grad, as torch's; clearing restarts it */
  tt_tensor *y2 = NULL;
  ck_assert_int_eq(tt_forward(m, &x, 1, &y2), TT_OK);
  ck_assert_int_eq(tt_backward_grads(&y2, &gh, 1, 0), TT_OK);
  tt_tensor *gx2 = tt_tensor_grad(x), *gx2h = on_host(gx2);
  float twice[N * IN];
  for (int i = 0; i < N * IN; i++) twice[i] = 2 * want_x[i];
  assert_close(tt_tensor_data(gx2h), twice, N * IN, "x.grad after two backwards");
  tt_tensor_clear_grad(x);
  ck_assert_ptr_null(tt_tensor_grad(x));
  ck_assert_int_eq(tt_errcode(client), TT_FAILED_PRECONDITION);
  /* without requires_grad the input has no .grad, and the message says how to get one */
  tt_tensor *y3 = NULL;
  ck_assert_int_eq(tt_forward(m, &plain, 1, &y3), TT_OK);
  ck_assert_int_eq(tt_backward_grads(&y3, &gh, 1, 0), TT_OK);
  ck_assert_ptr_null(tt_tensor_grad(plain));
  ck_assert_ptr_nonnull(strstr(tt_last_error(client), "tt_tensor_set_requires_grad"));
  tt_tensor *list[] = {xh, gh, ph, x, plain, y, gx, gxh, w, gw, y2, gx2, gx2h, y3};
  for (size_t i = 0; i < sizeof(list) / sizeof(list[0]); i++) tt_tensor_free(list[i]);
  tt_module_free(m);
}
END_TEST

/* Two modules in a chain, x -> A -> h -> B -> y, with a loss on the CPU: tt_backward trains
 * B and fills h.grad, which is A's output gradient; both modules' gradients are those of
 * the composed function. */
START_TEST(test_chain_of_two_modules_trains_both) {
  tt_module *a = linear(IN, H, 5, where(_i)), *b = linear(H, OUT, 6, where(_i));
  tt_tensor *xh = host_matrix(N, IN, 0.1f), *target = host_matrix(N, OUT, 0.02f);
  tt_tensor *x = tt_to(xh, where(_i)), *h = NULL, *y = NULL;
  ck_assert_int_eq(tt_forward(a, &x, 1, &h), TT_OK);
  ck_assert_int_eq(tt_tensor_set_requires_grad(h, 1), TT_OK);
  ck_assert_int_eq(tt_forward(b, &h, 1, &y), TT_OK);
  tt_tensor *yh = on_host(y), *loss = tt_mse_loss(yh, target);
  ck_assert_int_eq(tt_backward(loss), TT_OK);
  tt_tensor *gh_dev = tt_tensor_grad(h);
  ck_assert_msg(gh_dev != NULL, "%s", tt_last_error(client));
  tt_tensor *ghh = on_host(gh_dev);
  ck_assert_int_eq(tt_backward_grads(&h, &ghh, 1, 0), TT_OK);
  /* the host's chain rule: dy = 2 (y - t) / (N OUT), dh = dy W2, dW2 = dy^T h, dW1 = dh^T x */
  tt_tensor *w1 = param(a, "linear1.weight"), *w2 = param(b, "linear1.weight"), *hh = on_host(h);
  const float *yv = tt_tensor_data(yh), *tv = tt_tensor_data(target);
  float dy[N * OUT], dh[N * H], dw2[OUT * H], dw1[H * IN], db1[H] = {0};
  for (int i = 0; i < N * OUT; i++) dy[i] = 2.0f * (yv[i] - tv[i]) / (N * OUT);
  matmul(dy, 0, tt_tensor_data(w2), 0, dh, N, OUT, H);
  matmul(dy, 1, tt_tensor_data(hh), 0, dw2, OUT, N, H);
  matmul(dh, 1, tt_tensor_data(xh), 0, dw1, H, N, IN);
  for (int i = 0; i < N * H; i++) db1[i % H] += dh[i];
  tt_tensor *g2 = grad(b, "linear1.weight"), *g1 = grad(a, "linear1.weight"), *gb1 = grad(a, "linear1.bias");
  assert_close(tt_tensor_data(ghh), dh, N * H, "h.grad");
  assert_close(tt_tensor_data(g2), dw2, OUT * H, "B weight.grad");
  assert_close(tt_tensor_data(g1), dw1, H * IN, "A weight.grad");
  assert_close(tt_tensor_data(gb1), db1, H, "A bias.grad");
  tt_tensor *list[] = {xh, target, x, h, y, yh, loss, gh_dev, ghh, w1, w2, hh, g2, g1, gb1};
  for (size_t i = 0; i < sizeof(list) / sizeof(list[0]); i++) tt_tensor_free(list[i]);
  tt_module_free(a);
  tt_module_free(b);
}
END_TEST

/* Device memory in use on tt:0 (DRAM), as ttd reports it. */
static uint64_t dram_used(void) {
  tt_device_info *devs = NULL;
  size_t n = 0;
  ck_assert_int_eq(tt_list_devices(client, &devs, &n), TT_OK);
  uint64_t used = devs[0].dram.used_bytes;
  tt_device_list_free(devs);
  return used;
}

/* retain_graph keeps the run for a second backward, which adds the same gradient again; a
 * backward without it frees the run (its card memory comes back), and one more fails with
 * FAILED_PRECONDITION naming retain_graph. */
START_TEST(test_retain_graph_then_release) {
  tt_module *m = linear(IN, OUT, 7, where(_i));
  tt_tensor *xh = host_matrix(N, IN, 0.1f), *gh = host_matrix(N, OUT, 0.05f);
  tt_tensor *x = tt_to(xh, where(_i)), *warm = NULL, *y = NULL;
  ck_assert_int_eq(tt_forward(m, &x, 1, &warm), TT_OK); /* .grad exists from here on */
  ck_assert_int_eq(tt_backward_grads(&warm, &gh, 1, 0), TT_OK);
  tt_tensor *g0 = grad(m, "linear1.weight");
  float v0[OUT * IN], v1[OUT * IN], v2[OUT * IN];
  memcpy(v0, tt_tensor_data(g0), sizeof(v0));
  uint64_t base = dram_used();
  ck_assert_int_eq(tt_forward(m, &x, 1, &y), TT_OK);
  ck_assert_int_eq(tt_backward_grads(&y, &gh, 1, 1), TT_OK);
  tt_tensor *g1 = grad(m, "linear1.weight"); /* reading .grad sends a waiting Backward */
  memcpy(v1, tt_tensor_data(g1), sizeof(v1));
  if (_i == 0) ck_assert_uint_gt(dram_used(), base); /* the run is kept on the card */
  ck_assert_int_eq(tt_backward_grads(&y, &gh, 1, 0), TT_OK);
  tt_tensor *g2 = grad(m, "linear1.weight");
  memcpy(v2, tt_tensor_data(g2), sizeof(v2));
  float want1[OUT * IN], want2[OUT * IN];
  for (int i = 0; i < OUT * IN; i++) {
    want1[i] = 2 * v0[i];
    want2[i] = 3 * v0[i];
  }
  assert_close(v1, want1, OUT * IN, "grad after a retained backward");
  assert_close(v2, want2, OUT * IN, "grad after the second backward");
  if (_i == 0) ck_assert_uint_eq(dram_used(), base);
  ck_assert_int_eq(tt_backward_grads(&y, &gh, 1, 0), TT_FAILED_PRECONDITION);
  ck_assert_ptr_nonnull(strstr(tt_last_error(client), "retain_graph"));
  ck_assert_int_eq(tt_module_to(m, where(_i)), TT_OK); /* no run is pending */
  tt_tensor *list[] = {xh, gh, x, warm, y, g0, g1, g2};
  for (size_t i = 0; i < sizeof(list) / sizeof(list[0]); i++) tt_tensor_free(list[i]);
  tt_module_free(m);
}
END_TEST

/* tt_release_run frees a run's activations at once, kept or never backpropagated, through
 * an output or its download; a backward after it fails; a waiting retained Backward frees
 * it when it is sent. */
START_TEST(test_release_run) {
  tt_module *m = linear(IN, OUT, 8, where(_i));
  tt_tensor *xh = host_matrix(N, IN, 0.1f), *gh = host_matrix(N, OUT, 0.05f);
  tt_tensor *x = tt_to(xh, where(_i)), *warm = NULL, *y = NULL, *y2 = NULL;
  ck_assert_int_eq(tt_forward(m, &x, 1, &warm), TT_OK); /* .grad exists from here on */
  ck_assert_int_eq(tt_backward_grads(&warm, &gh, 1, 0), TT_OK);
  tt_tensor *g0 = grad(m, "linear1.weight");
  uint64_t base = dram_used();
  ck_assert_int_eq(tt_forward(m, &x, 1, &y), TT_OK);
  if (_i == 0) ck_assert_uint_gt(dram_used(), base);
  tt_tensor *yh = on_host(y);
  ck_assert_int_eq(tt_release_run(yh), TT_OK); /* through its download */
  ck_assert_int_eq(tt_release_run(y), TT_OK);  /* twice is harmless */
  if (_i == 0) ck_assert_uint_eq(dram_used(), base);
  ck_assert_int_eq(tt_backward_grads(&y, &gh, 1, 0), TT_FAILED_PRECONDITION);
  ck_assert_int_eq(tt_release_run(xh), TT_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(tt_last_error(client), "no run to release"));
  /* a retained Backward waiting for the next Execute: released, it frees the run there */
  ck_assert_int_eq(tt_forward(m, &x, 1, &y2), TT_OK);
  ck_assert_int_eq(tt_backward_grads(&y2, &gh, 1, 1), TT_OK);
  ck_assert_int_eq(tt_release_run(y2), TT_OK);
  tt_tensor *g = grad(m, "linear1.weight"); /* sends it */
  if (_i == 0) ck_assert_uint_eq(dram_used(), base);
  ck_assert_int_eq(tt_backward_grads(&y2, &gh, 1, 0), TT_FAILED_PRECONDITION);
  tt_tensor *list[] = {xh, gh, x, warm, y, yh, y2, g0, g};
  for (size_t i = 0; i < sizeof(list) / sizeof(list[0]); i++) tt_tensor_free(list[i]);
  tt_module_free(m);
}
END_TEST

/* Bad arguments: a gradient of another shape, on a card, or of int32; a tensor of no
 * training forward; a many-element tensor without a gradient; requires_grad on int32. */
START_TEST(test_backward_grads_errors) {
  tt_module *m = linear(IN, OUT, 9, "tt");
  tt_tensor *xh = host_matrix(N, IN, 0.1f), *wrong = host_matrix(OUT, N, 0.1f), *gh = host_matrix(N, OUT, 0.1f);
  tt_tensor *x = tt_to(xh, "tt"), *y = NULL, *g_dev = tt_to(gh, "tt");
  ck_assert_int_eq(tt_forward(m, &x, 1, &y), TT_OK);
  ck_assert_int_eq(tt_backward_grads(&y, &wrong, 1, 0), TT_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(tt_last_error(client), "[4, 3]"));
  ck_assert_int_eq(tt_backward_grads(&y, &g_dev, 1, 0), TT_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(tt_last_error(client), "host tensor"));
  ck_assert_int_eq(tt_backward_grads(&y, NULL, 1, 0), TT_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(tt_last_error(client), "give its gradient"));
  ck_assert_int_eq(tt_backward_grads(&xh, &gh, 1, 0), TT_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(tt_last_error(client), "does not lead back to a training forward"));
  ck_assert_int_eq(tt_backward_grads(NULL, NULL, 0, 0), TT_INVALID_ARGUMENT);
  ck_assert_int_eq(tt_backward_grads(&y, &gh, 65, 0), TT_INVALID_ARGUMENT); /* read none past the first */
  ck_assert_ptr_nonnull(strstr(tt_last_error(client), "at most 64"));
  int64_t s[1] = {3};
  tt_tensor *ints = tt_tensor_from_host(client, NULL, TT_INT32, s, 1);
  ck_assert_int_eq(tt_tensor_set_requires_grad(ints, 1), TT_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(tt_last_error(client), "int32"));
  ck_assert_int_eq(tt_tensor_set_requires_grad(NULL, 1), TT_INVALID_ARGUMENT);
  /* after the errors the run is intact: a good backward works */
  ck_assert_int_eq(tt_backward_grads(&y, &gh, 1, 0), TT_OK);
  tt_tensor *list[] = {xh, wrong, gh, x, y, g_dev, ints};
  for (size_t i = 0; i < sizeof(list) / sizeof(list[0]); i++) tt_tensor_free(list[i]);
  tt_module_free(m);
}
END_TEST

Suite *e2e_input_grads_suite(void) {
  Suite *s = suite_create("e2e_input_grads");
  TCase *tc = tcase_create("input_grads");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_input_grad_of_a_linear_layer, 0, 2);
  tcase_add_loop_test(tc, test_chain_of_two_modules_trains_both, 0, 2);
  tcase_add_loop_test(tc, test_retain_graph_then_release, 0, 2);
  tcase_add_loop_test(tc, test_release_run, 0, 2);
  tcase_add_test(tc, test_backward_grads_errors);
  suite_add_tcase(s, tc);
  return s;
}
