/* mlp: Fashion-MNIST with a 784-512-10 ReLU MLP on the card, cross-entropy on the CPU and
 * SGD on the device. Options: see train_common.h. Ends with "test accuracy: 0.XXXX".
 * Started by mpirun with 2 ranks or more, it runs its data-parallel build, mlp_dp beside it
 * (linked with libttparallel and MPI, which this program does without). */
#include <limits.h>
#include <unistd.h>

#include "train_common.h"

static tt_value model(tt_graph *g, tt_value x) { return tt_nn_linear(g, tt_relu(g, tt_nn_linear(g, x, 512, 1)), 10, 1); }

/* Under mpirun (Open MPI sets OMPI_COMM_WORLD_SIZE) with several ranks: exec mlp_dp. */
static void data_parallel(char **argv) {
  const char *ranks = getenv("OMPI_COMM_WORLD_SIZE");
  if (!ranks || atoi(ranks) < 2) return;
  char self[PATH_MAX], dp[PATH_MAX + 8];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return;
  self[n] = '\0';
  char *slash = strrchr(self, '/');
  snprintf(dp, sizeof(dp), "%.*s/mlp_dp", slash ? (int)(slash - self) : 1, slash ? self : ".");
  argv[0] = dp;
  execv(dp, argv);
  fprintf(stderr, "mlp: started by mpirun with %s ranks, but its data-parallel build %s cannot run; build it with "
          "`make` (Open MPI's libopenmpi-dev)\n", ranks, dp);
  exit(2);
}

int main(int argc, char **argv) {
  data_parallel(argv);
  static const int64_t pixels[1] = {784};
  train_options defaults = {.epochs = 5, .batch = 64, .lr = 0.1f};
  return train_example(argc, argv, defaults, "mlp: 784-512-10 ReLU, cross-entropy", model, pixels, 1, LOSS_CROSS_ENTROPY,
                       0.0f);
}
