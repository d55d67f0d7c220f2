/* mlp_dp: mlp trained data-parallel over the ranks of mpirun, one card per rank:
 *   mpirun -np 2 build/bin/mlp --target unix:/a.sock,unix:/b.sock
 * (mlp execs this program when mpirun starts it with several ranks). Each rank talks to the
 * ttd that --target's entry (local rank mod the count) names, or, without --target, to its
 * host's ttd ($TTD_ADDRESS, else the default socket), and takes card tt:<local rank mod its
 * devices>. Rank 0's parameters are broadcast at the start; each rank trains on its slice of
 * every global batch of --batch examples, and the gradients are averaged
 * (tt_dp_allreduce_grads) before each SGD step. Rank 0 prints the test accuracy. */
#include <mpi.h>

#include "train_common.h"
#include "ttparallel.h"

static int sync_grads(void *arg) {
  tt_dp *dp = arg;
  if (tt_dp_allreduce_grads(dp) == TT_OK) return 0;
  fprintf(stderr, "mlp_dp: averaging the gradients failed: %s\n", tt_dp_last_error(dp));
  return 1;
}

/* Ends the whole job: the other ranks would wait for this one in their next all-reduce. */
static int fail(int rank, const char *what, const char *why) {
  fprintf(stderr, "mlp_dp: rank %d: %s failed: %s\n", rank, what, why);
  MPI_Abort(MPI_COMM_WORLD, 1);
  return 1;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  train_options o = {.epochs = 5, .batch = 64, .lr = 0.1f, .rank = rank, .ranks = ranks};
  if (train_parse(argc, argv, &o) != 0) return MPI_Finalize(), 2;
  if (o.batch % ranks != 0) {
    if (rank == 0) fprintf(stderr, "mlp_dp: --batch %d does not split into %d equal slices\n", o.batch, ranks);
    return MPI_Finalize(), 2;
  }
  char target[256], device[16];
  if (tt_dp_pick_target(o.target, MPI_COMM_WORLD, target, sizeof(target)) != TT_OK)
    return fail(rank, "--target", "an entry is too long");
  tt_client *c = NULL;
  if (tt_connect(*target ? target : NULL, NULL, &c) != TT_OK) return fail(rank, "connect", tt_last_error(c));
  if (tt_dp_pick_device(c, MPI_COMM_WORLD, device, sizeof(device)) != TT_OK)
    return fail(rank, "listing the devices", tt_last_error(c));
  int64_t xs[2] = {o.batch / ranks, 784};
  tt_graph *g = tt_graph_create(c, 1);
  tt_value x = tt_graph_input(g, "x", TT_FLOAT32, xs, 2);
  tt_graph_output(g, tt_nn_linear(g, tt_relu(g, tt_nn_linear(g, x, 512, 1)), 10, 1));
  tt_module *m = tt_compile(c, g);
  tt_graph_free(g);
  if (!m || tt_module_to(m, device) != TT_OK) return fail(rank, "putting the model on the card", tt_last_error(c));
  tt_dp *dp = NULL;
  if (tt_dp_create(m, MPI_COMM_WORLD, NULL, &dp) != TT_OK || tt_dp_broadcast_params(dp, 0) != TT_OK)
    return fail(rank, "starting data-parallel training", tt_dp_last_error(dp));
  tt_optimizer *opt = tt_sgd(m, o.lr, 0.0f, 0.0f, 0);
  printf("mlp_dp: rank %d of %d on %s of %s\n", rank, ranks, device, *target ? target : "the default ttd");
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0)
    printf("mlp: 784-512-10 ReLU, cross-entropy, data-parallel over %d ranks; SGD lr %g, global batch %d (%d a rank), "
           "%d epochs\n", ranks, (double)o.lr, o.batch, o.batch / ranks, o.epochs);
  fflush(stdout);
  o.sync = sync_grads;
  o.sync_arg = dp;
  int rc = train_run(c, m, opt, &o, LOSS_CROSS_ENTROPY, xs, 2);
  if (rc) return fail(rank, "training", "see above");
  tt_optimizer_free(opt);
  tt_dp_free(dp);
  tt_module_free(m);
  tt_disconnect(c);
  MPI_Finalize();
  return 0;
}
