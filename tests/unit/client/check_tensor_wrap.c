/* Host tensors over the caller's memory (tt_tensor_wrap_host, client/tensor/tensor.c): no
 * copy is made, release runs once after the last reference, uploads to a card (streamed,
 * through shared memory, deferred) and back are byte-exact and leave the memory unwritten, a
 * module on "cpu" trains on them, and bad arguments get precise errors. Tensors need a
 * client, so a real ttd runs. */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/tensor.h"
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
  ck_assert_uint_eq(harness_wait_used_bytes(&proc, 0, 0, 0, 2000), 0);
  ck_assert_int_eq(ttd_proc_stop(&proc), 0);
}

/* What a release callback saw: how often it ran, and memory it frees when it runs (so that
 * ASan catches any read after it). */
typedef struct release_log {
  int calls;
  void *owned;
} release_log;

static void release_note(void *ctx) {
  release_log *log = ctx;
  log->calls++;
  free(log->owned);
  log->owned = NULL;
}

/* Memory of bytes filled from seed, owned by log until its release. */
static void *owned_random(release_log *log, size_t bytes, uint64_t seed) {
  memset(log, 0, sizeof(*log));
  log->owned = malloc(bytes ? bytes : 1);
  ck_assert_ptr_nonnull(log->owned);
  harness_fill_random(log->owned, bytes, seed);
  return log->owned;
}

/* release runs exactly once, and only when the last of the references (the caller's, a
 * retain, and tt_to(.., "cpu") returning the tensor itself) is freed. */
START_TEST(test_release_once_after_last_reference) {
  release_log log;
  int64_t shape[2] = {3, 5};
  float *data = owned_random(&log, sizeof(float) * 15, 1);
  tt_tensor *t = tt_tensor_wrap_host(client, data, TT_FLOAT32, shape, 2, release_note, &log);
  ck_assert_msg(t != NULL, "%s", tt_last_error(client));
  tt_tensor *again = tt_tensor_retain(t);
  tt_tensor *same = tt_to(t, "cpu");
  ck_assert_ptr_eq(again, t);
  ck_assert_ptr_eq(same, t);
  tt_tensor_free(t);
  ck_assert_int_eq(log.calls, 0);
  tt_tensor_free(again);
  ck_assert_int_eq(log.calls, 0);
  ck_assert_float_eq(((float *)tt_tensor_data(same))[14], data[14]); /* still the caller's, still valid */
  tt_tensor_free(same);
  ck_assert_int_eq(log.calls, 1);
  ck_assert_ptr_null(log.owned);
  tt_tensor_free(NULL);
  ck_assert_int_eq(log.calls, 1);
}
END_TEST

/* A NULL release is allowed (memory that outlives the tensor); nothing is called. */
START_TEST(test_null_release) {
  static int32_t data[4] = {1, 2, 3, 4};
  int64_t n = 4;
  tt_tensor *t = tt_tensor_wrap_host(client, data, TT_INT32, &n, 1, NULL, NULL);
  ck_assert_msg(t != NULL, "%s", tt_last_error(client));
  ck_assert_ptr_eq(tt_tensor_data(t), data);
  tt_tensor_free(t);
  ck_assert_int_eq(data[3], 4);
}
END_TEST

/* No copy: the tensor's data is the caller's pointer, the caller's writes show through it,
 * and its metadata are those given. */
START_TEST(test_data_is_not_copied) {
  release_log log;
  int64_t shape[3] = {2, 3, 4};
  uint16_t *data = owned_random(&log, sizeof(uint16_t) * 24, 2);
  tt_tensor *t = tt_tensor_wrap_host(client, data, TT_BFLOAT16, shape, 3, release_note, &log);
  ck_assert_msg(t != NULL, "%s", tt_last_error(client));
  ck_assert_ptr_eq(tt_tensor_data(t), data);
  ck_assert_int_eq(tt_tensor_is_host(t), 1);
  ck_assert_str_eq(tt_tensor_device(t), "cpu");
  ck_assert_int_eq(tt_tensor_dtype(t), TT_BFLOAT16);
  ck_assert_int_eq(tt_tensor_ndim(t), 3);
  ck_assert_int_eq(tt_tensor_shape(t)[2], 4);
  ck_assert_uint_eq(tt_tensor_numel(t), 24);
  ck_assert_uint_eq(tt_tensor_nbytes(t), 48);
  data[7] = 0x3f80;
  ck_assert_uint_eq(((uint16_t *)tt_tensor_data(t))[7], 0x3f80);
  tt_tensor_free(t);
  ck_assert_int_eq(log.calls, 1);
}
END_TEST

/* An empty tensor may wrap NULL; a scalar may have a NULL shape. */
START_TEST(test_empty_and_scalar) {
  release_log log = {0};
  int64_t shape[2] = {4, 0};
  tt_tensor *e = tt_tensor_wrap_host(client, NULL, TT_FLOAT32, shape, 2, release_note, &log);
  ck_assert_msg(e != NULL, "%s", tt_last_error(client));
  ck_assert_uint_eq(tt_tensor_nbytes(e), 0);
  tt_tensor *d = tt_to(e, "tt");
  ck_assert_msg(d != NULL, "%s", tt_last_error(client));
  tt_tensor *back = tt_to(d, "cpu");
  ck_assert_msg(back != NULL, "%s", tt_last_error(client));
  ck_assert_uint_eq(tt_tensor_numel(back), 0);
  tt_tensor_free(back);
  tt_tensor_free(d);
  tt_tensor_free(e);
  ck_assert_int_eq(log.calls, 1);
  float one = 1.5f;
  tt_tensor *s = tt_tensor_wrap_host(client, &one, TT_FLOAT32, NULL, 0, NULL, NULL);
  ck_assert_msg(s != NULL, "%s", tt_last_error(client));
  ck_assert_float_eq(tt_tensor_item(s), 1.5f);
  tt_tensor_free(s);
}
END_TEST

/* Wraps bytes of dtype and shape, uploads them (converting to device_dtype when it differs)
 * and checks the download equals what tt_tensor_from_host's copy gives, byte for byte, the
 * caller's memory is untouched, and release ran once when the last reference went. */
static void check_round_trip(tt_client *c, tt_dtype dtype, tt_dtype device_dtype, const int64_t *shape, int ndim,
                             uint64_t seed) {
  uint64_t numel = 1;
  for (int i = 0; i < ndim; i++) numel *= (uint64_t)shape[i];
  size_t bytes = (size_t)numel * tt_dtype_size(dtype);
  release_log log;
  unsigned char *data = owned_random(&log, bytes, seed);
  if (dtype == TT_FLOAT32) { /* no NaN payloads: a conversion would quieten them */
    for (uint64_t i = 0; i < numel; i++) {
      if (((float *)data)[i] != ((float *)data)[i]) ((float *)data)[i] = (float)i;
    }
  }
  unsigned char *before = malloc(bytes);
  memcpy(before, data, bytes);
  tt_tensor *w = tt_tensor_wrap_host(c, data, dtype, shape, ndim, release_note, &log);
  ck_assert_msg(w != NULL, "%s", tt_last_error(c));
  tt_tensor *copy = tt_tensor_from_host(c, data, dtype, shape, ndim);
  tt_tensor *dw = tt_to_dtype(w, "tt", device_dtype), *dc = tt_to_dtype(copy, "tt", device_dtype);
  ck_assert_msg(dw != NULL && dc != NULL, "%s", tt_last_error(c));
  tt_tensor_free(w); /* the device tensor needs none of the caller's memory */
  ck_assert_int_eq(log.calls, 1);
  tt_tensor *bw = tt_to(dw, "cpu"), *bc = tt_to(dc, "cpu");
  ck_assert_msg(bw != NULL && bc != NULL, "%s", tt_last_error(c));
  size_t device_bytes = (size_t)numel * tt_dtype_size(device_dtype);
  ck_assert_uint_eq(tt_tensor_nbytes(bw), device_bytes);
  ck_assert_int_eq(memcmp(tt_tensor_data(bw), tt_tensor_data(bc), device_bytes), 0);
  if (device_dtype == dtype) ck_assert_int_eq(memcmp(tt_tensor_data(bw), before, bytes), 0);
  ck_assert_int_eq(memcmp(tt_tensor_data(copy), before, bytes), 0);
  tt_tensor *list[] = {bw, bc, dw, dc, copy};
  for (size_t i = 0; i < sizeof(list) / sizeof(list[0]); i++) tt_tensor_free(list[i]);
  free(before);
}

/* Upload and download are byte-exact for each dtype, below the shared-memory threshold
 * (streamed from the caller's memory), above it (one copy into a segment), and with
 * shared memory off (streamed, however large); float32 -> bfloat16 on the way rounds as
 * a copied tensor's does. */
START_TEST(test_card_round_trip_exact) {
  int64_t small[2] = {64, 784}, large[2] = {256, 784}, odd[3] = {3, 5, 7};
  for (int shm = 1; shm >= 0; shm--) {
    tt_connect_options o;
    tt_connect_options_init(&o);
    o.disable_shm = !shm;
    o.disable_keepalive = 1;
    tt_client *c = NULL;
    ck_assert_msg(tt_connect(proc.target, &o, &c) == TT_OK, "%s", tt_last_error(c));
    check_round_trip(c, TT_FLOAT32, TT_FLOAT32, small, 2, 10);
    check_round_trip(c, TT_FLOAT32, TT_FLOAT32, large, 2, 11);
    check_round_trip(c, TT_BFLOAT16, TT_BFLOAT16, large, 2, 12);
    check_round_trip(c, TT_INT32, TT_INT32, odd, 3, 13);
    check_round_trip(c, TT_FLOAT32, TT_BFLOAT16, large, 2, 14);
    check_round_trip(c, TT_FLOAT32, TT_BFLOAT16, odd, 3, 15);
    tt_disconnect(c);
  }
  ck_assert_int_ge(harness_log_count(&proc, "event=shm-register"), 1); /* the shared-memory path ran */
}
END_TEST

enum { N = 4, IN = 6, OUT = 3 };

static tt_module *linear_module(void) {
  tt_graph *g = tt_graph_create(client, 5);
  int64_t xs[2] = {N, IN};
  tt_value y = tt_nn_linear(g, tt_graph_input(g, "x", TT_FLOAT32, xs, 2), OUT, 1);
  ck_assert_int_ge(y, 0);
  ck_assert_int_eq(tt_graph_output(g, y), 0);
  tt_module *m = tt_compile(client, g);
  tt_graph_free(g);
  ck_assert_msg(m != NULL, "%s", tt_last_error(client));
  return m;
}

/* Forward and backward of a module on "cpu" with a wrapped input and a wrapped target give
 * what copies give; the loss keeps the target (and so its memory) until the loss is freed. */
START_TEST(test_cpu_module_trains_on_wrapped) {
  float xv[N * IN], tv[N * OUT];
  for (int i = 0; i < N * IN; i++) xv[i] = (float)(i % 7) * 0.25f - 0.5f;
  for (int i = 0; i < N * OUT; i++) tv[i] = (float)(i % 3) - 1.0f;
  int64_t xs[2] = {N, IN}, ts[2] = {N, OUT};
  float grads[2][OUT], outs[2][N * OUT], losses[2];
  for (int wrapped = 0; wrapped <= 1; wrapped++) {
    tt_module *m = linear_module();
    release_log xlog, tlog;
    float *xd = owned_random(&xlog, sizeof(xv), 0), *td = owned_random(&tlog, sizeof(tv), 0);
    memcpy(xd, xv, sizeof(xv));
    memcpy(td, tv, sizeof(tv));
    tt_tensor *x = wrapped ? tt_tensor_wrap_host(client, xd, TT_FLOAT32, xs, 2, release_note, &xlog)
                           : tt_tensor_from_host(client, xd, TT_FLOAT32, xs, 2);
    tt_tensor *t = wrapped ? tt_tensor_wrap_host(client, td, TT_FLOAT32, ts, 2, release_note, &tlog)
                           : tt_tensor_from_host(client, td, TT_FLOAT32, ts, 2);
    ck_assert_msg(x && t, "%s", tt_last_error(client));
    tt_tensor *y = NULL;
    ck_assert_msg(tt_forward(m, &x, 1, &y) == TT_OK, "%s", tt_last_error(client));
    tt_tensor *loss = tt_mse_loss(y, t);
    ck_assert_msg(loss != NULL, "%s", tt_last_error(client));
    tt_tensor_free(x); /* the forward copied it into the in-process card */
    tt_tensor_free(t); /* the loss still holds it */
    if (wrapped) {
      ck_assert_int_eq(xlog.calls, 1);
      ck_assert_int_eq(tlog.calls, 0);
    }
    ck_assert_msg(tt_backward(loss) == TT_OK, "%s", tt_last_error(client));
    losses[wrapped] = tt_tensor_item(loss);
    memcpy(outs[wrapped], tt_tensor_data(y), sizeof(outs[0]));
    tt_tensor *gb = tt_param_grad(m, "linear1.bias");
    ck_assert_msg(gb != NULL, "%s", tt_last_error(client));
    memcpy(grads[wrapped], tt_tensor_data(gb), sizeof(grads[0]));
    tt_tensor_free(gb);
    tt_tensor_free(loss);
    if (wrapped) ck_assert_int_eq(tlog.calls, 1);
    tt_tensor_free(y);
    tt_module_free(m);
    free(xlog.owned);
    free(tlog.owned);
  }
  ck_assert_float_eq(losses[0], losses[1]);
  ck_assert_int_eq(memcmp(outs[0], outs[1], sizeof(outs[0])), 0);
  ck_assert_int_eq(memcmp(grads[0], grads[1], sizeof(grads[0])), 0);
  float sum = 0;
  for (int k = 0; k < OUT; k++) sum += grads[1][k] * grads[1][k];
  ck_assert_float_gt(sum, 0.0f);
}
END_TEST

/* During a training loop on the card a small tt_to is deferred: it keeps a copy of the
 * values at tt_to, not the caller's memory, which may change or go at once. */
START_TEST(test_deferred_upload_keeps_its_values) {
  tt_module *m = linear_module();
  ck_assert_int_eq(tt_module_to(m, "tt"), TT_OK);
  float xv[N * IN], tv[N * OUT] = {0};
  for (int i = 0; i < N * IN; i++) xv[i] = (float)i * 0.125f;
  int64_t xs[2] = {N, IN}, ts[2] = {N, OUT};
  tt_tensor *xh = tt_tensor_from_host(client, xv, TT_FLOAT32, xs, 2), *t = tt_tensor_from_host(client, tv, TT_FLOAT32, ts, 2);
  tt_tensor *x = tt_to(xh, "tt"), *y = NULL;
  ck_assert_int_eq(tt_forward(m, &x, 1, &y), TT_OK);
  tt_tensor *y_cpu = tt_to(y, "cpu");
  tt_tensor *loss = tt_mse_loss(y_cpu, t);
  ck_assert_msg(tt_backward(loss) == TT_OK, "%s", tt_last_error(client));
  tt_tensor *y1 = NULL;
  ck_assert_int_eq(tt_forward(m, &x, 1, &y1), TT_OK); /* carries that Backward: the training loop begins */
  release_log log;
  float *data = owned_random(&log, sizeof(xv), 0);
  memcpy(data, xv, sizeof(xv));
  tt_tensor *w = tt_tensor_wrap_host(client, data, TT_FLOAT32, xs, 2, release_note, &log);
  tt_tensor *dw = tt_to(w, "tt");
  ck_assert_msg(dw != NULL, "%s", tt_last_error(client));
  ck_assert_msg(dw->handle == 0 && dw->host_copy != NULL, "the upload was not deferred");
  data[0] = -99.0f;
  tt_tensor_free(w); /* frees data */
  ck_assert_int_eq(log.calls, 1);
  tt_tensor *y2 = NULL;
  ck_assert_msg(tt_forward(m, &dw, 1, &y2) == TT_OK, "%s", tt_last_error(client));
  tt_tensor *back = tt_to(dw, "cpu");
  ck_assert_int_eq(memcmp(tt_tensor_data(back), xv, sizeof(xv)), 0);
  ck_assert_msg(tt_tensor_handle(dw) != 0, "%s", tt_last_error(client));
  tt_tensor *list[] = {back, y2, y1, dw, loss, y_cpu, y, x, t, xh};
  for (size_t i = 0; i < sizeof(list) / sizeof(list[0]); i++) tt_tensor_free(list[i]);
  tt_module_free(m);
}
END_TEST

/* Each bad argument: NULL, its code and a message naming the problem; release not called. */
START_TEST(test_argument_errors) {
  static float data[16];
  static const struct {
    void *data;
    int dtype;
    int64_t shape[TT_MAX_DIMS + 1];
    int ndim;
    int null_shape;
    const char *message;
  } rows[] = {
      {NULL, TT_FLOAT32, {2, 3}, 2, 0, "data is NULL for a tensor of 6 elements"},
      {data, 0, {2}, 1, 0, "dtype 0 is not supported"},
      {data, 9, {2}, 1, 0, "dtype 9 is not supported"},
      {data, TT_FLOAT32, {2}, -1, 0, "ndim is -1; use 0..8"},
      {data, TT_FLOAT32, {1, 1, 1, 1, 1, 1, 1, 1, 1}, TT_MAX_DIMS + 1, 0, "ndim is 9; use 0..8"},
      {data, TT_FLOAT32, {2, 3}, 2, 1, "ndim is 2; use 0..8 with a shape array"},
      {data, TT_FLOAT32, {2, -3}, 2, 0, "dim 1 of the shape is -3; dims must be >= 0"},
      {data, TT_FLOAT32, {INT64_MAX / 2, 2}, 2, 0, "shape has too many elements (overflow at dim 0)"},
      {data, TT_INT32, {1 << 30, 1 << 30, 1 << 30}, 3, 0, "shape has too many elements (overflow at dim 2)"},
      {(char *)data + 2, TT_FLOAT32, {2}, 1, 0, "is not aligned to the 4 bytes of a float32 element"},
      {(char *)data + 1, TT_BFLOAT16, {2}, 1, 0, "is not aligned to the 2 bytes of a bfloat16 element"},
  };
  for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
    release_log log = {0};
    tt_tensor *t = tt_tensor_wrap_host(client, rows[i].data, (tt_dtype)rows[i].dtype,
                                       rows[i].null_shape ? NULL : rows[i].shape, rows[i].ndim, release_note, &log);
    ck_assert_msg(t == NULL, "row %zu accepted", i);
    ck_assert_int_eq(tt_errcode(client), TT_INVALID_ARGUMENT);
    ck_assert_msg(strstr(tt_last_error(client), rows[i].message) != NULL, "row %zu: '%s' lacks '%s'", i,
                  tt_last_error(client), rows[i].message);
    ck_assert_int_eq(log.calls, 0);
  }
  int64_t two = 2;
  ck_assert_ptr_null(tt_tensor_wrap_host(NULL, data, TT_FLOAT32, &two, 1, NULL, NULL));
}
END_TEST

Suite *tensor_wrap_suite(void) {
  Suite *s = suite_create("tensor_wrap");
  TCase *tc = tcase_create("tensor_wrap");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_release_once_after_last_reference);
  tcase_add_test(tc, test_null_release);
  tcase_add_test(tc, test_data_is_not_copied);
  tcase_add_test(tc, test_empty_and_scalar);
  tcase_add_test(tc, test_card_round_trip_exact);
  tcase_add_test(tc, test_cpu_module_trains_on_wrapped);
  tcase_add_test(tc, test_deferred_upload_keeps_its_values);
  tcase_add_test(tc, test_argument_errors);
  suite_add_tcase(s, tc);
  return s;
}
