/* lenet: LeNet-5 on the card (conv 5x5 pad 2, ReLU, max pool, conv 5x5, ReLU, max pool,
 * 400-120-84-10), cross-entropy on the CPU, SGD with momentum on the device. Options: see
 * train_common.h. Ends with "test accuracy: 0.XXXX". */
#include "train_common.h"

static tt_value pool(tt_graph *g, tt_value x) { return tt_graph_op(g, "max_pool2d", &x, 1, "kernel=2"); }

static tt_value model(tt_graph *g, tt_value x) {
  tt_value h = pool(g, tt_relu(g, tt_nn_conv2d(g, x, 6, 5, 1, 2, 1)));
  h = pool(g, tt_relu(g, tt_nn_conv2d(g, h, 16, 5, 1, 0, 1)));
  h = tt_graph_op(g, "flatten", &h, 1, NULL);
  h = tt_relu(g, tt_nn_linear(g, h, 120, 1));
  h = tt_relu(g, tt_nn_linear(g, h, 84, 1));
  return tt_nn_linear(g, h, 10, 1);
}

int main(int argc, char **argv) {
  static const int64_t image[3] = {1, 28, 28};
  train_options defaults = {.epochs = 5, .batch = 64, .lr = 0.02f};
  return train_example(argc, argv, defaults, "lenet: LeNet-5, cross-entropy", model, image, 3, LOSS_CROSS_ENTROPY, 0.9f);
}
