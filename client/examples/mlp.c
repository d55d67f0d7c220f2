/* mlp: Fashion-MNIST with a 784-512-10 ReLU MLP on the card, cross-entropy on the CPU and
 * SGD on the device: the .to() flow of the README end to end.
 *
 *   mlp [--data DIR] [--epochs N] [--batch N] [--lr X] [--target ADDR]
 *
 * Ends with a line "test accuracy: 0.XXXX". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ttclient.h"

static int die(tt_client *c, const char *what) {
  fprintf(stderr, "mlp: %s: %s: %s\n", what, tt_status_name(tt_errcode(c)), tt_last_error(c));
  return 1;
}

/* Copies examples order[first .. first+batch) into x (zero rows past count) and y. */
static void gather(const tt_dataset *d, const int64_t *order, int64_t first, int batch, float *x, int32_t *y) {
  int64_t pixels = (int64_t)d->rows * d->cols;
  for (int i = 0; i < batch; i++) {
    int64_t k = first + i;
    if (k < d->count) {
      int64_t e = order ? order[k] : k;
      memcpy(x + i * pixels, d->images + e * pixels, sizeof(float) * (size_t)pixels);
      y[i] = d->labels[e];
    } else {
      memset(x + i * pixels, 0, sizeof(float) * (size_t)pixels);
      y[i] = 0;
    }
  }
}

int main(int argc, char **argv) {
  const char *data = NULL, *target = NULL;
  int epochs = 5, batch = 64;
  float lr = 0.1f;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--data")) data = argv[i + 1];
    else if (!strcmp(argv[i], "--epochs")) epochs = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--batch")) batch = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--lr")) lr = (float)atof(argv[i + 1]);
    else if (!strcmp(argv[i], "--target")) target = argv[i + 1];
    else {
      fprintf(stderr, "usage: mlp [--data DIR] [--epochs N] [--batch N] [--lr X] [--target ADDR]\n");
      return 2;
    }
  }
  if (epochs < 1 || batch < 1) {
    fprintf(stderr, "mlp: --epochs and --batch must be >= 1\n");
    return 2;
  }
  char err[512];
  tt_dataset *train = NULL, *test = NULL;
  if (tt_dataset_load_fashion_mnist(data, 1, &train, err, sizeof(err)) != TT_OK ||
      tt_dataset_load_fashion_mnist(data, 0, &test, err, sizeof(err)) != TT_OK) {
    fprintf(stderr, "mlp: %s\n", err);
    return 1;
  }
  tt_client *c = NULL;
  if (tt_connect(target, NULL, &c) != TT_OK) return die(c, "connect");
  int64_t pixels = (int64_t)train->rows * train->cols;

  /* The model: a few readable lines. */
  tt_graph *g = tt_graph_create(c, 1);
  int64_t xs[2] = {batch, pixels};
  tt_value x = tt_graph_input(g, "x", TT_FLOAT32, xs, 2);
  tt_value logits = tt_nn_linear(g, tt_relu(g, tt_nn_linear(g, x, 512, 1)), 10, 1);
  if (logits < 0 || tt_graph_output(g, logits) != 0) return die(c, "building the model");
  tt_module *m = tt_compile(c, g);
  tt_graph_free(g);
  if (!m || tt_module_to(m, "tt") != TT_OK) return die(c, "compiling the model onto the card");
  tt_optimizer *opt = tt_sgd(m, lr, 0.0f, 0.0f, 0);
  printf("mlp: 784-512-10 on %s, cross-entropy on the CPU, SGD lr %g on the device, batch %d, %d epochs\n",
         tt_module_device(m), (double)lr, batch, epochs);

  float *xb = malloc(sizeof(float) * (size_t)(batch * pixels));
  int32_t *yb = malloc(sizeof(int32_t) * (size_t)batch);
  int64_t *order = malloc(sizeof(int64_t) * (size_t)train->count);
  for (int64_t i = 0; i < train->count; i++) order[i] = i;
  uint64_t rng = 12345;
  int64_t steps = train->count / batch;
  int64_t ys[1] = {batch};
  for (int epoch = 0; epoch < epochs; epoch++) {
    for (int64_t i = train->count - 1; i > 0; i--) { /* shuffle */
      rng = rng * 6364136223846793005ull + 1442695040888963407ull;
      int64_t j = (int64_t)((rng >> 33) % (uint64_t)(i + 1));
      int64_t t = order[i];
      order[i] = order[j];
      order[j] = t;
    }
    char label[32];
    snprintf(label, sizeof(label), "epoch %d/%d", epoch + 1, epochs);
    tt_progress *bar = tt_progress_start(label, steps, stdout, -1);
    double loss_sum = 0;
    for (int64_t s = 0; s < steps; s++) {
      gather(train, order, s * batch, batch, xb, yb);
      tt_tensor *xh = tt_tensor_from_host(c, xb, TT_FLOAT32, xs, 2), *yh = tt_tensor_from_host(c, yb, TT_INT32, ys, 1);
      tt_tensor *xd = tt_to(xh, "tt"), *out = NULL;
      if (!xd || tt_forward(m, &xd, 1, &out) != TT_OK) return die(c, "forward");
      tt_tensor *out_cpu = tt_to(out, "cpu");
      tt_tensor *loss = tt_cross_entropy(out_cpu, yh);
      if (!loss || tt_zero_grad(opt) != TT_OK || tt_backward(loss) != TT_OK || tt_step(opt) != TT_OK) {
        return die(c, "training step");
      }
      loss_sum += tt_tensor_item(loss);
      tt_progress_update(bar, s + 1, loss_sum / (double)(s + 1));
      tt_tensor *done[] = {loss, out_cpu, out, xd, xh, yh};
      for (size_t k = 0; k < sizeof(done) / sizeof(done[0]); k++) tt_tensor_free(done[k]);
    }
    tt_progress_finish(bar);
  }

  tt_module_train(m, 0);
  int64_t correct = 0;
  for (int64_t first = 0; first < test->count; first += batch) {
    gather(test, NULL, first, batch, xb, yb);
    tt_tensor *xh = tt_tensor_from_host(c, xb, TT_FLOAT32, xs, 2), *xd = tt_to(xh, "tt"), *out = NULL;
    if (!xd || tt_forward(m, &xd, 1, &out) != TT_OK) return die(c, "evaluation");
    tt_tensor *out_cpu = tt_to(out, "cpu");
    const float *l = tt_tensor_data(out_cpu);
    for (int i = 0; i < batch && first + i < test->count; i++) {
      int best = 0;
      for (int k = 1; k < 10; k++) best = l[i * 10 + k] > l[i * 10 + best] ? k : best;
      correct += best == yb[i];
    }
    tt_tensor_free(out_cpu);
    tt_tensor_free(out);
    tt_tensor_free(xd);
    tt_tensor_free(xh);
  }
  printf("test accuracy: %.4f\n", (double)correct / (double)test->count);
  free(order);
  free(yb);
  free(xb);
  tt_optimizer_free(opt);
  tt_module_free(m);
  tt_disconnect(c);
  tt_dataset_free(train);
  tt_dataset_free(test);
  return 0;
}
