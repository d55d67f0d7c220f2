/* The victims: a client that makes one kind of call over and over, saying BEGIN before and
 * END (with the call's duration) after each, so the driver can SIGKILL it inside the call.
 *   upload    tt_to of a 64 MiB host tensor to "tt"
 *   download  tt_to of a 64 MiB device tensor to "cpu"
 *   execute   tt_forward of a 2048-2048-256 MLP at batch 1024, eval mode (one Execute)
 *   backward  tt_backward through that MLP in training mode (one Backward)
 * a->shm chooses the transfer path (shared memory or gRPC streams). */
#include <stdlib.h>
#include <string.h>

#include "faults.h"
#include "scripts/bench/bench_common.h"

#define TRANSFER_FLOATS ((int64_t)16 << 20) /* 64 MiB */
#define BATCH 1024
#define WIDTH 2048

static tt_module *make_mlp(tt_client *c, int training) {
  int64_t xs[2] = {BATCH, WIDTH};
  tt_graph *g = tt_graph_create(c, 7);
  tt_value x = tt_graph_input(g, "x", TT_FLOAT32, xs, 2);
  tt_graph_output(g, tt_nn_linear(g, tt_relu(g, tt_nn_linear(g, x, WIDTH, 0)), 256, 0));
  tt_module *m = tt_compile(c, g);
  tt_graph_free(g);
  if (!m || tt_module_to(m, "tt") != TT_OK) fc_die(c, "putting the MLP on the card");
  tt_module_train(m, training);
  return m;
}

static tt_tensor *random_host(tt_client *c, int64_t rows, int64_t cols) {
  int64_t shape[2] = {rows, cols};
  tt_tensor *t = tt_tensor_from_host(c, NULL, TT_FLOAT32, shape, 2);
  if (!t) fc_die(c, "tt_tensor_from_host");
  unsigned long long rng = 99;
  bench_fill_random(tt_tensor_data(t), (size_t)(rows * cols), &rng);
  return t;
}

/* The call under fire, once; the tensors it makes are freed after END. */
static tt_status one_call(const char *role, tt_client *c, tt_module *m, tt_tensor *host, tt_tensor *dev) {
  double t0 = bench_now();
  tt_tensor *made = NULL, *out = NULL, *out_cpu = NULL, *loss = NULL;
  tt_status st = TT_OK;
  if (!strcmp(role, "backward")) { /* the forward and the loss first, outside BEGIN..END */
    made = tt_to(host, "tt");
    st = made && tt_forward(m, &made, 1, &out) == TT_OK && (out_cpu = tt_to(out, "cpu")) && (loss = tt_mean(out_cpu))
             ? TT_OK
             : tt_errcode(c);
    t0 = bench_now();
  }
  ft_report(FT_MSG_BEGIN, 0, tt_session_id(c), NULL, NULL);
  if (st != TT_OK) {
  } else if (!strcmp(role, "upload")) {
    made = tt_to(host, "tt");
  } else if (!strcmp(role, "download")) {
    made = tt_to(dev, "cpu");
  } else if (!strcmp(role, "execute")) {
    st = tt_forward(m, &dev, 1, &out);
  } else {
    st = tt_backward(loss);
  }
  if (st == TT_OK && !made && strcmp(role, "execute") != 0) st = tt_errcode(c);
  ft_report(FT_MSG_END, st, tt_session_id(c), (double[6]){bench_now() - t0}, NULL);
  tt_tensor *done[] = {loss, out_cpu, out, made};
  for (size_t i = 0; i < sizeof(done) / sizeof(done[0]); i++) tt_tensor_free(done[i]);
  return st;
}

int fc_victim_main(const fc_args *a) {
  tt_client *c = fc_connect(a, 1);
  int transfer = !strcmp(a->role, "upload") || !strcmp(a->role, "download");
  tt_tensor *host = transfer ? random_host(c, TRANSFER_FLOATS / 1024, 1024) : random_host(c, BATCH, WIDTH);
  tt_module *m = transfer ? NULL : make_mlp(c, !strcmp(a->role, "backward"));
  tt_tensor *dev = strcmp(a->role, "upload") && strcmp(a->role, "backward") ? tt_to(host, "tt") : NULL;
  if (!strcmp(a->role, "download") || !strcmp(a->role, "execute")) {
    if (!dev) fc_die(c, "uploading the input");
  }
  ft_report(FT_MSG_SESSION, 0, tt_session_id(c), NULL, NULL);
  ft_report(FT_MSG_READY, 0, tt_session_id(c), NULL, NULL);
  for (;;) { /* until the driver's SIGKILL */
    if (one_call(a->role, c, m, host, dev) != TT_OK) fc_die(c, a->role);
  }
}
