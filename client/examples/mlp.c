/* mlp: Fashion-MNIST with a 784-512-10 ReLU MLP on the card, cross-entropy on the CPU and
 * SGD on the device. Options: see train_common.h. Ends with "test accuracy: 0.XXXX". */
#include "train_common.h"

static tt_value model(tt_graph *g, tt_value x) { return tt_nn_linear(g, tt_relu(g, tt_nn_linear(g, x, 512, 1)), 10, 1); }

int main(int argc, char **argv) {
  static const int64_t pixels[1] = {784};
  train_options defaults = {.epochs = 5, .batch = 64, .lr = 0.1f};
  return train_example(argc, argv, defaults, "mlp: 784-512-10 ReLU, cross-entropy", model, pixels, 1, LOSS_CROSS_ENTROPY,
                       0.0f);
}
