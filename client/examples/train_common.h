/* What the training examples share: options, batching, the training loop of the .to()
 * flow (module on the card, loss on the CPU, backward reaching the card, optimizer on the
 * card) and the test-set evaluation that prints "test accuracy: 0.XXXX". Header-only:
 * each example is one program. */
#ifndef TT_EXAMPLES_TRAIN_COMMON_H
#define TT_EXAMPLES_TRAIN_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ttclient.h"

typedef struct train_options {
  const char *data, *target, *save;
  int epochs, batch;
  float lr;
  /* Data-parallel (mlp_dp): this process is rank `rank` of `ranks` (0 and 0 alone: one
   * process). Each rank trains on its slice of every global batch of `batch` examples, and
   * sync(sync_arg), called after the backward and before the step, averages the gradients
   * over the ranks (non-zero: it failed and said why). Rank 0 alone shows progress and
   * evaluates. */
  int rank, ranks;
  int (*sync)(void *sync_arg);
  void *sync_arg;
} train_options;

typedef enum loss_kind { LOSS_CROSS_ENTROPY, LOSS_L1_ONE_HOT } loss_kind;

static int train_die(tt_client *c, const char *what) {
  fprintf(stderr, "%s failed: %s: %s\n", what, tt_status_name(tt_errcode(c)), tt_last_error(c));
  return 1;
}

/* Parses --data DIR --epochs N --batch N --lr X --target ADDR --save FILE over defaults. */
static int train_parse(int argc, char **argv, train_options *o) {
  for (int i = 1; i < argc; i += 2) {
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) goto usage;
    if (!strcmp(argv[i], "--data")) o->data = v;
    else if (!strcmp(argv[i], "--epochs")) o->epochs = atoi(v);
    else if (!strcmp(argv[i], "--batch")) o->batch = atoi(v);
    else if (!strcmp(argv[i], "--lr")) o->lr = (float)atof(v);
    else if (!strcmp(argv[i], "--target")) o->target = v;
    else if (!strcmp(argv[i], "--save")) o->save = v;
    else goto usage;
  }
  if (o->epochs >= 1 && o->batch >= 1 && o->lr > 0) return 0;
usage:
  fprintf(stderr, "usage: %s [--data DIR] [--epochs N>=1] [--batch N>=1] [--lr X>0] [--target ADDR] [--save FILE]\n",
          argv[0]);
  return -1;
}

/* Copies examples order[first .. first+batch) (order NULL: first ..) into x and y; the
 * caller keeps first + batch within the dataset. */
static void train_gather(const tt_dataset *d, const int64_t *order, int64_t first, int batch, float *x, int32_t *y) {
  int64_t pixels = (int64_t)d->rows * d->cols;
  for (int i = 0; i < batch; i++) {
    int64_t e = order ? order[first + i] : first + i;
    memcpy(x + i * pixels, d->images + e * pixels, sizeof(float) * (size_t)pixels);
    y[i] = d->labels[e];
  }
}

/* The loss on the CPU, recorded for tt_backward. */
static tt_tensor *train_loss(tt_client *c, loss_kind kind, tt_tensor *out_cpu, const int32_t *y, int batch) {
  if (kind == LOSS_CROSS_ENTROPY) {
    int64_t ys[1] = {batch};
    tt_tensor *labels = tt_tensor_from_host(c, y, TT_INT32, ys, 1);
    tt_tensor *loss = tt_cross_entropy(out_cpu, labels);
    tt_tensor_free(labels);
    return loss;
  }
  int64_t hs[2] = {batch, 10};
  tt_tensor *onehot = tt_tensor_from_host(c, NULL, TT_FLOAT32, hs, 2);
  for (int i = 0; i < batch; i++) ((float *)tt_tensor_data(onehot))[i * 10 + y[i]] = 1.0f;
  tt_tensor *loss = tt_l1_loss(out_cpu, onehot);
  tt_tensor_free(onehot);
  return loss;
}

/* Trains m (on the card) for o->epochs, then prints the test accuracy. x_shape is the
 * graph input's shape (batch first). Training drops an epoch's last partial batch (torch's
 * drop_last: one small batch at the end of an epoch moves these models' accuracy by several
 * points); the test set's last batch holds what is left, since a module runs on any batch
 * size. Returns 0 on success. */
static int train_run(tt_client *c, tt_module *m, tt_optimizer *opt, const train_options *o, loss_kind kind,
                     const int64_t *x_shape, int x_ndim) {
  char err[512];
  tt_dataset *train = NULL, *test = NULL;
  if (tt_dataset_load_fashion_mnist(o->data, 1, &train, err, sizeof(err)) != TT_OK ||
      tt_dataset_load_fashion_mnist(o->data, 0, &test, err, sizeof(err)) != TT_OK) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  int ranks = o->ranks > 1 ? o->ranks : 1, batch = o->batch, local = batch / ranks;
  int64_t pixels = (int64_t)train->rows * train->cols;
  float *xb = malloc(sizeof(float) * (size_t)(batch * pixels));
  int32_t *yb = malloc(sizeof(int32_t) * (size_t)batch);
  int64_t *order = malloc(sizeof(int64_t) * (size_t)train->count);
  for (int64_t i = 0; i < train->count; i++) order[i] = i;
  uint64_t rng = 12345;
  int64_t steps = train->count / batch;
  int64_t shape[TT_MAX_DIMS];
  memcpy(shape, x_shape, sizeof(int64_t) * (size_t)x_ndim);
  int rc = 0;
  for (int epoch = 0; epoch < o->epochs && !rc; epoch++) {
    for (int64_t i = train->count - 1; i > 0; i--) {
      rng = rng * 6364136223846793005ull + 1442695040888963407ull;
      int64_t j = (int64_t)((rng >> 33) % (uint64_t)(i + 1)), t = order[i];
      order[i] = order[j];
      order[j] = t;
    }
    char label[32];
    snprintf(label, sizeof(label), "epoch %d/%d", epoch + 1, o->epochs);
    tt_progress *bar = o->rank == 0 ? tt_progress_start(label, steps, stdout, -1) : NULL;
    double loss_sum = 0;
    for (int64_t s = 0; s < steps && !rc; s++) {
      train_gather(train, order, s * batch + (int64_t)o->rank * local, local, xb, yb); /* this rank's slice */
      shape[0] = local;
      tt_tensor *xh = tt_tensor_from_host(c, xb, TT_FLOAT32, shape, x_ndim);
      tt_tensor *xd = tt_to(xh, tt_module_device(m)), *out = NULL, *out_cpu = NULL, *loss = NULL;
      if (!xd || tt_forward(m, &xd, 1, &out) != TT_OK || !(out_cpu = tt_to(out, "cpu")) ||
          !(loss = train_loss(c, kind, out_cpu, yb, local)) || tt_zero_grad(opt) != TT_OK ||
          tt_backward(loss) != TT_OK || (o->sync && o->sync(o->sync_arg) != 0 && (rc = 1)) || tt_step(opt) != TT_OK) {
        if (!rc) rc = train_die(c, "training step");
      } else {
        loss_sum += tt_tensor_item(loss);
        tt_progress_update(bar, s + 1, loss_sum / (double)(s + 1));
      }
      tt_tensor *done[] = {loss, out_cpu, out, xd, xh};
      for (size_t k = 0; k < sizeof(done) / sizeof(done[0]); k++) tt_tensor_free(done[k]);
    }
    tt_progress_finish(bar);
  }
  tt_module_train(m, 0);
  int64_t correct = 0;
  for (int64_t first = 0; first < test->count && !rc && o->rank == 0; first += batch) {
    int n = (int)(test->count - first < batch ? test->count - first : batch);
    train_gather(test, NULL, first, n, xb, yb);
    shape[0] = n;
    tt_tensor *xh = tt_tensor_from_host(c, xb, TT_FLOAT32, shape, x_ndim);
    tt_tensor *xd = tt_to(xh, tt_module_device(m)), *out = NULL, *out_cpu = NULL;
    if (!xd || tt_forward(m, &xd, 1, &out) != TT_OK || !(out_cpu = tt_to(out, "cpu"))) {
      rc = train_die(c, "evaluation");
    } else {
      const float *l = tt_tensor_data(out_cpu);
      for (int i = 0; i < n; i++) {
        int best = 0;
        for (int k = 1; k < 10; k++) best = l[i * 10 + k] > l[i * 10 + best] ? k : best;
        correct += best == yb[i];
      }
    }
    tt_tensor_free(out_cpu);
    tt_tensor_free(out);
    tt_tensor_free(xd);
    tt_tensor_free(xh);
  }
  if (!rc && o->rank == 0) printf("test accuracy: %.4f\n", (double)correct / (double)test->count);
  if (!rc && o->rank == 0 && o->save && tt_module_save(m, o->save) != TT_OK) rc = train_die(c, "saving the checkpoint");
  free(order);
  free(yb);
  free(xb);
  tt_dataset_free(train);
  tt_dataset_free(test);
  return rc;
}

/* One example program: parse options, build the model with build(graph, x) on an input
 * [batch, ...x_tail], put it on the card, train with SGD (momentum) and evaluate. */
typedef tt_value (*model_builder)(tt_graph *graph, tt_value x);

__attribute__((unused)) static int train_example(int argc, char **argv, train_options o, const char *title, model_builder build,
                         const int64_t *x_tail, int tail_ndim, loss_kind kind, float momentum) {
  if (train_parse(argc, argv, &o) != 0) return 2;
  tt_client *c = NULL;
  if (tt_connect(o.target, NULL, &c) != TT_OK) return train_die(c, "connect");
  int64_t xs[TT_MAX_DIMS] = {o.batch};
  memcpy(xs + 1, x_tail, sizeof(int64_t) * (size_t)tail_ndim);
  tt_graph *g = tt_graph_create(c, 1);
  tt_value x = tt_graph_input(g, "x", TT_FLOAT32, xs, tail_ndim + 1);
  tt_graph_output(g, build(g, x));
  tt_module *m = tt_compile(c, g);
  tt_graph_free(g);
  if (!m || tt_module_to(m, "tt") != TT_OK) return train_die(c, "putting the model on the card");
  tt_optimizer *opt = tt_sgd(m, o.lr, momentum, 0.0f, 0);
  printf("%s on %s; loss on the CPU, SGD lr %g momentum %g on the device, batch %d, %d epochs\n", title,
         tt_module_device(m), (double)o.lr, (double)momentum, o.batch, o.epochs);
  int rc = train_run(c, m, opt, &o, kind, xs, tail_ndim + 1);
  tt_optimizer_free(opt);
  tt_module_free(m);
  tt_disconnect(c);
  return rc;
}

#endif
