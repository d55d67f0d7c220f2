/* mnist_linear: tt-forge-fe's MNISTLinear, one Linear 784->10 on the card, trained with the
 * L1 loss against one-hot targets computed on the CPU, SGD on the device. Options: see
 * train_common.h. Ends with "test accuracy: 0.XXXX". */
#include "train_common.h"

static tt_value model(tt_graph *g, tt_value x) { return tt_nn_linear(g, x, 10, 1); }

int main(int argc, char **argv) {
  static const int64_t pixels[1] = {784};
  /* The L1 gradient is a sign: steps of lr * x per weight add up over 784 inputs, so the
   * rate is far below cross-entropy's (0.1 oscillates; 0.01 measured best of 0.003-0.5). */
  train_options defaults = {.epochs = 5, .batch = 64, .lr = 0.01f};
  return train_example(argc, argv, defaults, "mnist_linear: Linear 784->10, L1 loss on one-hot targets", model, pixels,
                       1, LOSS_L1_ONE_HOT, 0.0f);
}
