/* tt_copy_ through a real ttd: values into a device tensor in place (same handle), from a
 * device tensor to the host, float32 into bfloat16, into a parameter's .grad that the next
 * tt_step then uses (what a data-parallel step does with averaged gradients), on the card
 * and on "cpu"; and the refusals. tt_read: a tensor's bytes into the caller's memory, from
 * the host, the card (small, and large through shared memory), an inline output and a
 * parameter with a step queued. */
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

static tt_tensor *host_values(int64_t n, float scale) {
  tt_tensor *t = tt_tensor_from_host(client, NULL, TT_FLOAT32, &n, 1);
  for (int64_t i = 0; i < n; i++) ((float *)tt_tensor_data(t))[i] = scale * (float)(i + 1);
  return t;
}

static tt_tensor *to_host(tt_tensor *t) {
  tt_tensor *h = tt_to(t, "cpu");
  ck_assert_msg(h != NULL, "%s", tt_last_error(client));
  return h;
}

START_TEST(test_copy_into_device_and_back) {
  enum { N = 6 };
  tt_tensor *a = host_values(N, 1.0f), *b = host_values(N, -0.5f);
  tt_tensor *d = tt_to(a, "tt");
  ck_assert_ptr_nonnull(d);
  uint64_t before = tt_tensor_nbytes(d);
  ck_assert_int_eq(tt_copy_(d, b), TT_OK); /* host -> device, in place */
  ck_assert_uint_eq(tt_tensor_nbytes(d), before);
  tt_tensor *back = to_host(d);
  ck_assert_int_eq(memcmp(tt_tensor_data(back), tt_tensor_data(b), N * sizeof(float)), 0);
  tt_tensor *h = host_values(N, 0.0f);
  ck_assert_int_eq(tt_copy_(h, d), TT_OK); /* device -> host */
  ck_assert_int_eq(memcmp(tt_tensor_data(h), tt_tensor_data(b), N * sizeof(float)), 0);
  /* float32 into a bfloat16 tensor on the card: rounded as tt_to_dtype rounds. */
  tt_tensor *bf = tt_to_dtype(a, "tt", TT_BFLOAT16);
  ck_assert_int_eq(tt_copy_(bf, b), TT_OK);
  tt_tensor *bf_back = tt_to_dtype(bf, "cpu", TT_FLOAT32);
  for (int i = 0; i < N; i++) ck_assert_float_eq(((float *)tt_tensor_data(bf_back))[i], -0.5f * (float)(i + 1));
  /* Refusals: another shape, int32 from float, NULL. */
  tt_tensor *other = host_values(N + 1, 1.0f);
  ck_assert_int_eq(tt_copy_(d, other), TT_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(tt_last_error(client), "differ in shape"));
  int32_t ints[N] = {0};
  int64_t n = N;
  tt_tensor *it = tt_tensor_from_host(client, ints, TT_INT32, &n, 1);
  ck_assert_int_eq(tt_copy_(d, it), TT_INVALID_ARGUMENT);
  ck_assert_int_eq(tt_copy_(d, NULL), TT_INVALID_ARGUMENT);
  tt_tensor *all[] = {a, b, d, back, h, bf, bf_back, other, it};
  for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) tt_tensor_free(all[i]);
}
END_TEST

/* One linear layer, 3 features in and 2 out (linear1.weight 2 x 3), on device. */
static tt_module *linear_module(uint64_t seed, const char *device) {
  tt_graph *g = tt_graph_create(client, seed);
  int64_t xs[2] = {2, 3};
  tt_value x = tt_graph_input(g, "x", TT_FLOAT32, xs, 2);
  ck_assert_int_eq(tt_graph_output(g, tt_nn_linear(g, x, 2, 1)), 0);
  tt_module *m = tt_compile(client, g);
  tt_graph_free(g);
  ck_assert_int_eq(tt_module_to(m, device), TT_OK);
  return m;
}

/* A gradient written into .grad is what tt_step uses: p -= lr * g, exactly. */
START_TEST(test_copy_into_grad_feeds_the_step) {
  const char *device = _i ? "cpu" : "tt";
  tt_module *m = linear_module(5, device);
  tt_optimizer *opt = tt_sgd(m, 0.5f, 0, 0, 0);
  /* One backward so that .grad exists, then its values replaced. */
  tt_tensor *xh = host_values(6, 0.1f);
  int64_t shape[2] = {2, 3};
  tt_tensor *x2 = tt_tensor_from_host(client, tt_tensor_data(xh), TT_FLOAT32, shape, 2);
  tt_tensor *xd = tt_to(x2, device), *y = NULL;
  ck_assert_int_eq(tt_forward(m, &xd, 1, &y), TT_OK);
  tt_tensor *yh = to_host(y), *loss = tt_sum(yh);
  ck_assert_int_eq(tt_backward(loss), TT_OK);
  tt_tensor *w = tt_module_param(m, "linear1.weight"), *w0 = to_host(w);
  float before[6]; /* on "cpu", w0 is the parameter itself */
  memcpy(before, tt_tensor_data(w0), sizeof(before));
  tt_tensor *grad = tt_param_grad(m, "linear1.weight");
  ck_assert_ptr_nonnull(grad);
  tt_tensor *mine = host_values(6, 0.25f);
  int64_t ws[2] = {2, 3};
  tt_tensor *mine2 = tt_tensor_from_host(client, tt_tensor_data(mine), TT_FLOAT32, ws, 2);
  ck_assert_msg(tt_copy_(grad, mine2) == TT_OK, "%s", tt_last_error(client));
  ck_assert_int_eq(tt_step(opt), TT_OK);
  tt_tensor *w1 = to_host(w);
  for (int i = 0; i < 6; i++) {
    float want = before[i] - 0.5f * 0.25f * (float)(i + 1);
    ck_assert_float_eq_tol(((float *)tt_tensor_data(w1))[i], want, 1e-6f);
  }
  /* Values written into a zeroed .grad stay: the next backward adds its gradient to them
   * (dsum/dW[o][i] is x's column sum, 0.5 0.7 0.9) rather than writing over them. */
  ck_assert_int_eq(tt_zero_grad(opt), TT_OK);
  ck_assert_msg(tt_copy_(grad, mine2) == TT_OK, "%s", tt_last_error(client));
  tt_tensor *y2 = NULL;
  ck_assert_int_eq(tt_forward(m, &xd, 1, &y2), TT_OK);
  tt_tensor *y2h = to_host(y2), *loss2 = tt_sum(y2h);
  ck_assert_int_eq(tt_backward(loss2), TT_OK);
  tt_tensor *grad2 = tt_param_grad(m, "linear1.weight"), *g2 = to_host(grad2);
  for (int k = 0; k < 6; k++) {
    float want = 0.25f * (float)(k + 1) + (0.1f * (float)(k % 3 + 1) + 0.1f * (float)(k % 3 + 4));
    ck_assert_float_eq_tol(((float *)tt_tensor_data(g2))[k], want, 1e-6f);
  }
  tt_tensor *all[] = {xh, x2, xd, y, yh, loss, w, w0, grad, mine, mine2, w1, y2, y2h, loss2, grad2, g2};
  for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) tt_tensor_free(all[i]);
  tt_optimizer_free(opt);
  tt_module_free(m);
}
END_TEST

/* tt_read gives the bytes tt_to(t, "cpu") gives, wherever t is. */
static void assert_read_equals_to_host(tt_tensor *t) {
  tt_tensor *h = to_host(t);
  uint64_t n = tt_tensor_nbytes(t);
  unsigned char *buf = malloc(n + 1);
  memset(buf, 0xA5, n + 1);
  ck_assert_msg(tt_read(t, buf, n) == TT_OK, "%s", tt_last_error(client));
  ck_assert_int_eq(memcmp(buf, tt_tensor_data(h), n), 0);
  ck_assert_uint_eq(buf[n], 0xA5); /* nothing past the tensor's bytes */
  free(buf);
  tt_tensor_free(h);
}

START_TEST(test_read_into_caller_memory) {
  enum { N = 6 };
  tt_tensor *a = host_values(N, 1.5f);
  assert_read_equals_to_host(a); /* a host tensor */
  tt_tensor *d = tt_to(a, "tt");
  assert_read_equals_to_host(d); /* downloaded */
  tt_tensor *big = host_values(1 << 18, 0.25f), *big_d = tt_to(big, "tt");
  assert_read_equals_to_host(big_d); /* 1 MiB: through a shared-memory segment on this host */
  /* A training forward's output (inline, its bytes here), and a parameter whose step is
   * queued: the read sends the step first, so it sees the stepped values. */
  tt_module *m = linear_module(7, "tt");
  int64_t xs[2] = {2, 3};
  tt_optimizer *opt = tt_sgd(m, 0.5f, 0, 0, 0);
  tt_tensor *x2 = tt_tensor_from_host(client, tt_tensor_data(a), TT_FLOAT32, xs, 2);
  tt_tensor *xd = tt_to(x2, "tt"), *y = NULL;
  ck_assert_int_eq(tt_forward(m, &xd, 1, &y), TT_OK);
  assert_read_equals_to_host(y);
  tt_tensor *yh = to_host(y), *loss = tt_sum(yh);
  ck_assert_int_eq(tt_backward(loss), TT_OK);
  tt_tensor *w = tt_module_param(m, "linear1.weight");
  float before[6], after[6];
  ck_assert_int_eq(tt_read(w, before, sizeof(before)), TT_OK);
  ck_assert_int_eq(tt_step(opt), TT_OK); /* queued until something reads the parameter */
  ck_assert_int_eq(tt_read(w, after, sizeof(after)), TT_OK);
  for (int k = 0; k < 6; k++) { /* dsum/dW[o][i] is x's column sum: 1.5 * (1+4, 2+5, 3+6) */
    ck_assert_float_eq_tol(after[k], before[k] - 0.5f * 1.5f * (float)(2 * (k % 3) + 5), 1e-5f);
  }
  assert_read_equals_to_host(w);
  /* Refusals: another size, NULL. */
  float small[N - 1];
  ck_assert_int_eq(tt_read(d, small, sizeof(small)), TT_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(tt_last_error(client), "dst holds 20 bytes but the tensor 24"));
  ck_assert_int_eq(tt_read(d, NULL, N * sizeof(float)), TT_INVALID_ARGUMENT);
  ck_assert_int_eq(tt_read(NULL, small, sizeof(small)), TT_INVALID_ARGUMENT);
  tt_tensor *all[] = {a, d, big, big_d, x2, xd, y, yh, loss, w};
  for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) tt_tensor_free(all[i]);
  tt_optimizer_free(opt);
  tt_module_free(m);
}
END_TEST

Suite *e2e_copy_suite(void) {
  Suite *s = suite_create("e2e_copy");
  TCase *tc = tcase_create("copy");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_copy_into_device_and_back);
  tcase_add_loop_test(tc, test_copy_into_grad_feeds_the_step, 0, 2);
  tcase_add_test(tc, test_read_into_caller_memory);
  suite_add_tcase(s, tc);
  return s;
}
