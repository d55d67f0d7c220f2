/* mnist_linear: tt-forge-fe's MNISTLinear, one Linear 784->10 on the card, trained with the
 * L1 loss against one-hot targets computed on the CPU, SGD on the device. Options: see
 * train_common.h. Ends with "test accuracy: 0.XXXX". */
#include "train_common.h"

int main(int argc, char **argv) {
  train_options o = {.epochs = 5, .batch = 64, .lr = 0.1f};
  if (train_parse(argc, argv, &o) != 0) return 2;
  tt_client *c = NULL;
  if (tt_connect(o.target, NULL, &c) != TT_OK) return train_die(c, "connect");
  tt_graph *g = tt_graph_create(c, 1);
  int64_t xs[2] = {o.batch, 784};
  tt_value x = tt_graph_input(g, "x", TT_FLOAT32, xs, 2);
  tt_graph_output(g, tt_nn_linear(g, x, 10, 1));
  tt_module *m = tt_compile(c, g);
  tt_graph_free(g);
  if (!m || tt_module_to(m, "tt") != TT_OK) return train_die(c, "putting the model on the card");
  tt_optimizer *opt = tt_sgd(m, o.lr, 0.0f, 0.0f, 0);
  printf("mnist_linear: Linear 784->10 on %s, L1 loss on the CPU, SGD lr %g on the device, batch %d, %d epochs\n",
         tt_module_device(m), (double)o.lr, o.batch, o.epochs);
  int rc = train_run(c, m, opt, &o, LOSS_L1_ONE_HOT, xs, 2);
  tt_optimizer_free(opt);
  tt_module_free(m);
  tt_disconnect(c);
  return rc;
}
