/* A module on any batch size, through libttclient and a real ttd, on the card and on "cpu":
 * compiled at [64, IN], it runs [1, IN] and [32, IN] with the values the [64, IN] program
 * gives those rows; a training loop whose last batch is partial trains exactly as a module
 * declared at the partial batch does; the programs per shape are bounded (8, least recently
 * used evicted) and a pending run survives its program's eviction; another dtype or rank
 * keeps today's error, and a graph that hard-codes the batch fails naming the node. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "module/module.h" /* the cache, for its bound */
#include "suites.h"
#include "ttd_harness.h"

enum { B = 64, IN = 12, H = 16, OUT = 3, PARTIAL = 32, TOTAL = 3 * B + PARTIAL };

static const char *const devices[] = {"cpu", "tt"};
static ttd_proc proc;
static tt_client *client;
static float data_x[TOTAL * IN];
static int32_t data_y[TOTAL];

static void setup(void) {
  ttd_proc_start(&proc, NULL);
  client = harness_connect(&proc, 1);
  for (int i = 0; i < TOTAL * IN; i++) data_x[i] = sinf((float)i * 0.37f) + 0.25f * cosf((float)i * 1.91f);
  for (int i = 0; i < TOTAL; i++) data_y[i] = (i * 7 + i / 5) % OUT;
}

static void teardown(void) {
  tt_disconnect(client);
  ck_assert_msg(ttd_proc_alive(&proc), "ttd died; see %s", proc.log_path);
  ck_assert_int_eq(ttd_proc_stop(&proc), 0);
}

/* Linear, ReLU, Linear with input [batch, IN]: the same parameters at any batch (seed 42). */
static tt_module *mlp_at(int64_t batch, const char *device) {
  tt_graph *g = tt_graph_create(client, 42);
  tt_value x = tt_graph_input(g, "x", TT_FLOAT32, (int64_t[]){batch, IN}, 2);
  tt_graph_output(g, tt_nn_linear(g, tt_relu(g, tt_nn_linear(g, x, H, 1)), OUT, 1));
  tt_module *m = tt_compile(client, g);
  tt_graph_free(g);
  ck_assert_msg(m != NULL, "%s", tt_last_error(client));
  ck_assert_msg(tt_module_to(m, device) == TT_OK, "%s", tt_last_error(client));
  return m;
}

/* Examples [first, first + n) as a host tensor. */
static tt_tensor *rows(int first, int n) {
  return tt_tensor_from_host(client, data_x + (size_t)first * IN, TT_FLOAT32, (int64_t[]){n, IN}, 2);
}

/* The forward of m on examples [first, first + n), brought to the host (it keeps the run). */
static tt_tensor *forward_rows(tt_module *m, int first, int n) {
  tt_tensor *h = rows(first, n), *x = tt_to(h, tt_module_device(m)), *y = NULL;
  ck_assert_msg(tt_forward(m, &x, 1, &y) == TT_OK, "%s: %s", tt_module_device(m), tt_last_error(client));
  ck_assert_int_eq(tt_tensor_ndim(y), 2);
  ck_assert_int_eq(tt_tensor_shape(y)[0], n);
  ck_assert_int_eq(tt_tensor_shape(y)[1], OUT);
  tt_tensor *out = tt_to(y, "cpu");
  ck_assert_ptr_nonnull(out);
  tt_tensor_free(y);
  tt_tensor_free(x);
  tt_tensor_free(h);
  return out;
}

/* Rows of got equal rows [first, first + n) of want, bit for bit. */
static void assert_rows_equal(tt_tensor *got, tt_tensor *want, int first, int n, const char *what) {
  const float *g = tt_tensor_data(got), *w = (const float *)tt_tensor_data(want) + (size_t)first * OUT;
  for (int k = 0; k < n * OUT; k++) {
    ck_assert_msg(g[k] == w[k], "%s: row %d col %d: %.9g, at the compiled batch %.9g", what, first + k / OUT, k % OUT,
                  (double)g[k], (double)w[k]);
  }
}

/* The batch dims of m's programs of other shapes, in slot order. */
static int cached_batches(const tt_module *m, int64_t *out) {
  for (int i = 0; i < m->n_shapes; i++) out[i] = m->shapes[i].dims[0];
  return m->n_shapes;
}

static bool cached(const tt_module *m, int64_t batch) {
  int64_t b[TT_MODULE_SHAPES];
  int n = cached_batches(m, b);
  for (int i = 0; i < n; i++) {
    if (b[i] == batch) return true;
  }
  return false;
}

/* Compiled at [64, IN], the module runs [1, IN] and [32, IN] (one program each, kept), in
 * eval and in training, with the values the compiled shape gives those rows, and again
 * once moved to the other place; the output count is the graph's. */
START_TEST(test_any_batch_equals_compiled) {
  const char *device = devices[_i];
  tt_module *m = mlp_at(B, device);
  ck_assert_int_eq(tt_module_output_count(m), 1);
  for (int training = 0; training < 2; training++) {
    tt_module_train(m, training);
    tt_tensor *full = forward_rows(m, 0, B);
    ck_assert_int_eq(m->n_shapes, training ? 2 : 0); /* the declared shape needs no other program */
    int singles[] = {0, 17, B - 1};
    for (int k = 0; k < 3; k++) {
      tt_tensor *one = forward_rows(m, singles[k], 1);
      assert_rows_equal(one, full, singles[k], 1, training ? "batch 1, training" : "batch 1, eval");
      tt_tensor_free(one);
    }
    tt_tensor *part = forward_rows(m, 0, PARTIAL);
    assert_rows_equal(part, full, 0, PARTIAL, "batch 32");
    tt_tensor *again = forward_rows(m, 0, B);
    assert_rows_equal(again, full, 0, B, "batch 64 after the others");
    ck_assert_int_eq(m->n_shapes, 2);
    ck_assert(cached(m, 1) && cached(m, PARTIAL));
    tt_tensor_free(again);
    tt_tensor_free(part);
    tt_tensor_free(full);
  }
  /* Moved, it runs the programs it keeps at the other place (onto a card: compiled there now). */
  ck_assert_int_eq(tt_module_to(m, devices[1 - _i]), TT_OK);
  tt_tensor *full = forward_rows(m, 0, B), *one = forward_rows(m, 17, 1);
  assert_rows_equal(one, full, 17, 1, "batch 1 after moving");
  ck_assert_int_eq(m->n_shapes, 2);
  tt_tensor_free(one);
  tt_tensor_free(full);
  tt_module_free(m);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 0);
}
END_TEST

/* Two epochs of SGD with momentum over TOTAL examples in batches of B, the last one of each
 * epoch partial (TOTAL = 3 B + 32), with the loss on the CPU: the Backward of the last full
 * batch rides on the partial batch's Execute and the partial batch's on the next epoch's
 * first. Returns the module, trained, on "cpu". */
static tt_module *train_epochs(const char *device, int64_t declared) {
  tt_module *m = mlp_at(declared, device);
  tt_optimizer *opt = tt_sgd(m, 0.2f, 0.9f, 0.0f, 0);
  for (int epoch = 0; epoch < 2; epoch++) {
    for (int first = 0; first < TOTAL; first += B) {
      int n = TOTAL - first < B ? TOTAL - first : B;
      tt_tensor *labels = tt_tensor_from_host(client, data_y + first, TT_INT32, (int64_t[]){n}, 1);
      tt_tensor *logits = forward_rows(m, first, n), *loss = tt_cross_entropy(logits, labels);
      ck_assert_msg(loss != NULL, "%s", tt_last_error(client));
      ck_assert_int_eq(tt_zero_grad(opt), TT_OK);
      ck_assert_msg(tt_backward(loss) == TT_OK, "%s batch %d: %s", device, n, tt_last_error(client));
      ck_assert_msg(tt_step(opt) == TT_OK, "%s batch %d: %s", device, n, tt_last_error(client));
      tt_tensor_free(loss);
      tt_tensor_free(logits);
      tt_tensor_free(labels);
    }
  }
  tt_optimizer_free(opt);
  ck_assert_msg(tt_module_to(m, "cpu") == TT_OK, "%s", tt_last_error(client));
  return m;
}

/* Each parameter of a and b: equal bit for bit (tolerance 0), or within tol. */
static void assert_same_params(tt_module *a, tt_module *b, float tol, const char *what) {
  for (int p = 0; p < tt_module_param_count(a); p++) {
    const char *name = tt_module_param_name(a, p);
    tt_tensor *ta = tt_module_param(a, name), *tb = tt_module_param(b, name);
    const float *va = tt_tensor_data(ta), *vb = tt_tensor_data(tb);
    for (uint64_t k = 0; k < tt_tensor_numel(ta); k++) {
      ck_assert_msg(fabsf(va[k] - vb[k]) <= tol * (1.0f + fabsf(va[k])), "%s: %s[%llu] %.9g vs %.9g", what, name,
                    (unsigned long long)k, (double)va[k], (double)vb[k]);
    }
    tt_tensor_free(ta);
    tt_tensor_free(tb);
  }
}

/* A training loop with a last partial batch: a module declared at 64 trains exactly as one
 * declared at 32 (each runs the other's batch at another shape), on the card and on "cpu";
 * the card and "cpu" agree; the parameters moved. Then evaluation with batch 1 on the card
 * gives the rows of the batch-64 evaluation. */
START_TEST(test_partial_last_batch_and_eval_batch_1) {
  tt_module *card64 = train_epochs("tt", B), *card32 = train_epochs("tt", PARTIAL);
  tt_module *cpu64 = train_epochs("cpu", B), *cpu32 = train_epochs("cpu", PARTIAL);
  assert_same_params(card64, card32, 0.0f, "card: declared 64 vs declared 32");
  assert_same_params(cpu64, cpu32, 0.0f, "cpu: declared 64 vs declared 32");
  assert_same_params(card64, cpu64, 1e-4f, "card vs cpu");
  tt_module *fresh = mlp_at(B, "cpu");
  tt_tensor *w0 = tt_module_param(fresh, "linear1.weight"), *w1 = tt_module_param(card64, "linear1.weight");
  ck_assert(memcmp(tt_tensor_data(w0), tt_tensor_data(w1), tt_tensor_nbytes(w0)) != 0);
  tt_tensor_free(w0);
  tt_tensor_free(w1);
  ck_assert_int_eq(tt_module_to(card64, "tt"), TT_OK);
  tt_module_train(card64, 0);
  tt_tensor *full = forward_rows(card64, B, B);
  for (int i = 0; i < 5; i++) {
    tt_tensor *one = forward_rows(card64, B + i, 1);
    assert_rows_equal(one, full, i, 1, "eval batch 1 after training");
    tt_tensor_free(one);
  }
  tt_tensor_free(full);
  tt_module *all[] = {card64, card32, cpu64, cpu32, fresh};
  for (int i = 0; i < 5; i++) tt_module_free(all[i]);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 0);
}
END_TEST

/* The gradient of linear2.bias of a forward at batch n of examples [first, ...) and a
 * cross-entropy loss, where m is (its .grad zeroed first). */
static void bias_grad(tt_module *m, tt_tensor *logits, int first, int n, float *out) {
  tt_optimizer *opt = tt_sgd(m, 0.1f, 0, 0, 0);
  tt_tensor *labels = tt_tensor_from_host(client, data_y + first, TT_INT32, (int64_t[]){n}, 1);
  tt_tensor *loss = tt_cross_entropy(logits, labels);
  ck_assert_int_eq(tt_zero_grad(opt), TT_OK);
  ck_assert_msg(tt_backward(loss) == TT_OK, "%s", tt_last_error(client));
  tt_tensor *g = tt_param_grad(m, "linear2.bias");
  ck_assert_msg(g != NULL, "%s", tt_last_error(client));
  tt_tensor *h = tt_to(g, "cpu");
  memcpy(out, tt_tensor_data(h), sizeof(float) * OUT);
  tt_tensor *done[] = {h, g, loss, labels};
  for (int i = 0; i < 4; i++) tt_tensor_free(done[i]);
  tt_optimizer_free(opt);
}

/* At most 8 programs of other shapes, the least recently used evicted: batches 1..10 leave
 * 3..10, a batch of 1 again evicts 3 and gives the same values. A training forward whose
 * program is evicted before its backward still backpropagates at its own shape, with the
 * gradient a module declared at that batch computes. */
START_TEST(test_cache_bound_and_eviction) {
  const char *device = devices[_i];
  tt_module *m = mlp_at(B, device);
  tt_module_train(m, 0);
  tt_tensor *full = forward_rows(m, 0, B);
  for (int n = 1; n <= 10; n++) {
    tt_tensor *y = forward_rows(m, 0, n);
    assert_rows_equal(y, full, 0, n, "batches 1 to 10");
    tt_tensor_free(y);
    ck_assert_int_le(m->n_shapes, TT_MODULE_SHAPES);
  }
  ck_assert_int_eq(m->n_shapes, TT_MODULE_SHAPES);
  for (int n = 3; n <= 10; n++) ck_assert_msg(cached(m, n), "batch %d was evicted", n);
  tt_tensor *one = forward_rows(m, 5, 1);
  assert_rows_equal(one, full, 5, 1, "batch 1 again");
  tt_tensor_free(one);
  ck_assert(cached(m, 1) && !cached(m, 3) && cached(m, 4));

  tt_module_train(m, 1);
  tt_tensor *y5 = forward_rows(m, 0, 5); /* batch 5: cached, and now the most recent */
  tt_module_train(m, 0);
  for (int n = 11; n < 11 + TT_MODULE_SHAPES; n++) tt_tensor_free(forward_rows(m, 0, n));
  ck_assert(!cached(m, 5)); /* evicted while its run is pending */
  tt_module_train(m, 1);
  float got[OUT], want[OUT];
  bias_grad(m, y5, 0, 5, got);
  tt_module *at5 = mlp_at(5, device);
  tt_tensor *y5_declared = forward_rows(at5, 0, 5);
  bias_grad(at5, y5_declared, 0, 5, want);
  ck_assert_int_eq(memcmp(got, want, sizeof(got)), 0);
  tt_tensor *done[] = {y5_declared, y5, full};
  for (int i = 0; i < 3; i++) tt_tensor_free(done[i]);
  tt_module_free(at5);
  tt_module_free(m);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 0);
}
END_TEST

/* A forward of host tensor h on m that fails with INVALID_ARGUMENT; returns the message. */
static char *forward_fails(tt_module *m, tt_tensor *h) {
  tt_tensor *x = tt_to(h, tt_module_device(m)), *y = NULL;
  ck_assert_ptr_nonnull(x);
  ck_assert_int_eq(tt_forward(m, &x, 1, &y), TT_INVALID_ARGUMENT);
  ck_assert_ptr_null(y);
  tt_tensor_free(x);
  char *msg = strdup(tt_last_error(client));
  ck_assert_ptr_nonnull(msg);
  return msg;
}

/* Another dtype or rank is refused with the message of today (the declared dtype and shape
 * named), at the declared batch or another; a graph that reshapes to the declared batch fails
 * at another batch with INVALID_ARGUMENT naming the input, both shapes and the node, the same from the
 * daemon's Compile and in process, caches nothing, and still runs at its batch; one that
 * reshapes to [-1, ...] runs at any batch. */
START_TEST(test_shape_errors) {
  char *msgs[2];
  for (int d = 0; d < 2; d++) {
    tt_module *m = mlp_at(B, devices[d]);
    tt_tensor *i32 = tt_tensor_from_host(client, NULL, TT_INT32, (int64_t[]){B, IN}, 2);
    tt_tensor *i32_one = tt_tensor_from_host(client, NULL, TT_INT32, (int64_t[]){1, IN}, 2);
    tt_tensor *rank3 = tt_tensor_from_host(client, NULL, TT_FLOAT32, (int64_t[]){1, IN, 1}, 3);
    char *a = forward_fails(m, i32), *b = forward_fails(m, i32_one), *c = forward_fails(m, rank3);
    ck_assert_msg(strstr(a, "input 'x' must be float32 [64, 12], got int32 [64, 12]"), "%s", a);
    ck_assert_msg(strstr(b, "input 'x' must be float32 [64, 12], got int32 [1, 12]"), "%s", b);
    ck_assert_msg(strstr(c, "input 'x' must be float32 [64, 12], got float32 [1, 12, 1]"), "%s", c);
    ck_assert_int_eq(m->n_shapes, 0);
    free(a), free(b), free(c);
    tt_tensor_free(i32), tt_tensor_free(i32_one), tt_tensor_free(rank3);
    tt_module_free(m);

    tt_graph *g = tt_graph_create(client, 1);
    tt_value x = tt_graph_input(g, "x", TT_FLOAT32, (int64_t[]){B, IN}, 2);
    tt_value r = tt_graph_op(g, "reshape", &x, 1, "shape=[64,3,4]");
    ck_assert_int_eq(tt_graph_output(g, tt_relu(g, r)), 0);
    ck_assert_int_eq(tt_graph_output_count(g), 1);
    m = tt_compile(client, g);
    tt_graph_free(g);
    ck_assert_int_eq(tt_module_to(m, devices[d]), TT_OK);
    tt_tensor *one = rows(0, 1);
    msgs[d] = forward_fails(m, one);
    ck_assert_msg(strstr(msgs[d], "input 0 ('x') is [1, 12] but the module was built for [64, 12]") &&
                      strstr(msgs[d], "node 'reshape1' (reshape)") && strstr(msgs[d], "cannot reshape [1, 12]"),
                  "%s", msgs[d]);
    ck_assert_int_eq(m->n_shapes, 0);
    tt_tensor *full = rows(0, B), *xin = tt_to(full, devices[d]), *y = NULL;
    ck_assert_int_eq(tt_forward(m, &xin, 1, &y), TT_OK);
    ck_assert_int_eq(tt_tensor_ndim(y), 3);
    tt_tensor *done[] = {y, xin, full, one};
    for (int i = 0; i < 4; i++) tt_tensor_free(done[i]);
    tt_module_free(m);

    g = tt_graph_create(client, 1); /* shape=[-1,...] follows the batch */
    x = tt_graph_input(g, "x", TT_FLOAT32, (int64_t[]){B, IN}, 2);
    ck_assert_int_eq(tt_graph_output(g, tt_graph_op(g, "reshape", &x, 1, "shape=[-1,3,4]")), 0);
    m = tt_compile(client, g);
    tt_graph_free(g);
    ck_assert_int_eq(tt_module_to(m, devices[d]), TT_OK);
    one = rows(0, 1);
    xin = tt_to(one, devices[d]);
    ck_assert_msg(tt_forward(m, &xin, 1, &y) == TT_OK, "%s", tt_last_error(client));
    ck_assert_int_eq(tt_tensor_shape(y)[0], 1);
    tt_tensor_free(y), tt_tensor_free(xin), tt_tensor_free(one);
    tt_module_free(m);
  }
  ck_assert_str_eq(msgs[0], msgs[1]);
  free(msgs[0]), free(msgs[1]);
  ck_assert_int_eq(tt_graph_output_count(NULL), -1);
  ck_assert_int_eq(tt_module_output_count(NULL), -1);
}
END_TEST

Suite *e2e_shapes_suite(void) {
  Suite *s = suite_create("e2e_shapes");
  TCase *tc = tcase_create("shapes");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_any_batch_equals_compiled, 0, 2);
  tcase_add_test(tc, test_partial_last_batch_and_eval_batch_1);
  tcase_add_loop_test(tc, test_cache_bound_and_eviction, 0, 2);
  tcase_add_test(tc, test_shape_errors);
  suite_add_tcase(s, tc);
  return s;
}
