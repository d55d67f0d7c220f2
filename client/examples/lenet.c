/* lenet: LeNet-5 on the card (conv 5x5 pad 2, ReLU, max pool, conv 5x5, ReLU, max pool,
 * 400-120-84-10), cross-entropy on the CPU, SGD with momentum on the device. Options: see
 * train_common.h. Ends with "test accuracy: 0.XXXX". */
#include "train_common.h"

static tt_value pool(tt_graph *g, tt_value x) { return tt_graph_op(g, "max_pool2d", &x, 1, "kernel=2"); }

int main(int argc, char **argv) {
  train_options o = {.epochs = 5, .batch = 64, .lr = 0.05f};
  if (train_parse(argc, argv, &o) != 0) return 2;
  tt_client *c = NULL;
  if (tt_connect(o.target, NULL, &c) != TT_OK) return train_die(c, "connect");
  tt_graph *g = tt_graph_create(c, 1);
  int64_t xs[4] = {o.batch, 1, 28, 28};
  tt_value x = tt_graph_input(g, "x", TT_FLOAT32, xs, 4);
  tt_value h = pool(g, tt_relu(g, tt_nn_conv2d(g, x, 6, 5, 1, 2, 1)));
  h = pool(g, tt_relu(g, tt_nn_conv2d(g, h, 16, 5, 1, 0, 1)));
  h = tt_graph_op(g, "flatten", &h, 1, NULL);
  h = tt_relu(g, tt_nn_linear(g, h, 120, 1));
  h = tt_relu(g, tt_nn_linear(g, h, 84, 1));
  tt_graph_output(g, tt_nn_linear(g, h, 10, 1));
  tt_module *m = tt_compile(c, g);
  tt_graph_free(g);
  if (!m || tt_module_to(m, "tt") != TT_OK) return train_die(c, "putting the model on the card");
  tt_optimizer *opt = tt_sgd(m, o.lr, 0.9f, 0.0f, 0);
  printf("lenet: LeNet-5 on %s, cross-entropy on the CPU, SGD lr %g momentum 0.9 on the device, batch %d, %d epochs\n",
         tt_module_device(m), (double)o.lr, o.batch, o.epochs);
  int rc = train_run(c, m, opt, &o, LOSS_CROSS_ENTROPY, xs, 4);
  tt_optimizer_free(opt);
  tt_module_free(m);
  tt_disconnect(c);
  return rc;
}
