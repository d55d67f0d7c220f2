/* bench_dp: data-parallel scaling of the MLP training step (bench_mlp.h), under mpirun -np 2:
 *   mpirun -np 2 bench_dp --target ADDR
 * records dp2_mlp_step_b256 (ms per step of 2 ranks at global batch 256, 128 a rank, the
 * gradients averaged with tt_dp_allreduce_grads before each step, against 1 rank alone at
 * batch 256; repetitions alternate, the rank not running waits asleep) and
 * dp2_allreduce_bytes_per_step (bytes a rank all-reduces per step against the model's
 * parameter bytes: 1x). Both ranks use the ttd of ADDR and its cards as tt_dp_pick_device
 * assigns them. Rank 0 prints the records. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_common.h"
#include "bench_mlp.h"
#include "ttparallel.h"

#define GLOBAL_BATCH 256
#define WARMUP_STEPS 10
#define STEPS 20

/* A barrier that sleeps while it waits: a spinning rank would take a core from the other. */
static void idle_barrier(void) {
  MPI_Request req;
  MPI_Ibarrier(MPI_COMM_WORLD, &req);
  for (int done = 0; MPI_Test(&req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done;) usleep(200);
}

static double allreduce_s; /* time inside tt_dp_allreduce_grads, for the log */

static void allreduce_hook(void *arg, bench_mlp_stage stage, int done) {
  tt_dp *dp = arg;
  if (stage != BENCH_MLP_STEP || done) return;
  double t0 = bench_now();
  if (tt_dp_allreduce_grads(dp) != TT_OK) bench_die("tt_dp_allreduce_grads", tt_dp_last_error(dp));
  allreduce_s += bench_now() - t0;
}

static double timed_steps(bench_mlp *m, int steps) {
  for (int i = 0; i < WARMUP_STEPS; i++) bench_mlp_step(m);
  double t0 = bench_now();
  for (int i = 0; i < steps; i++) bench_mlp_step(m);
  return (bench_now() - t0) * 1e3 / steps;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const char *target = argc == 3 && !strcmp(argv[1], "--target") ? argv[2] : NULL;
  if (!target || ranks != 2) {
    if (rank == 0) fprintf(stderr, "usage: mpirun -np 2 bench_dp --target ADDR\n");
    MPI_Finalize();
    return 2;
  }
  tt_client *c = NULL;
  char device[16];
  if (tt_connect(target, NULL, &c) != TT_OK) bench_die("tt_connect", tt_last_error(c));
  if (tt_dp_pick_device(c, MPI_COMM_WORLD, device, sizeof(device)) != TT_OK) bench_die("devices", tt_last_error(c));
  bench_mlp *dp_model = bench_mlp_create_on(c, GLOBAL_BATCH / ranks);
  bench_mlp *alone = rank == 0 ? bench_mlp_create_on(c, GLOBAL_BATCH) : NULL;
  if (!dp_model || (rank == 0 && !alone)) bench_die("putting the MLP on the card", tt_last_error(c));
  tt_dp *dp = NULL;
  if (tt_dp_create(bench_mlp_module(dp_model), MPI_COMM_WORLD, NULL, &dp) != TT_OK ||
      tt_dp_broadcast_params(dp, 0) != TT_OK)
    bench_die("tt_dp_create", tt_dp_last_error(dp));
  bench_mlp_set_hook(dp_model, allreduce_hook, dp);
  int reps = bench_reps(7);
  double *one = calloc((size_t)reps, sizeof(double)), *two = calloc((size_t)reps, sizeof(double));
  tt_dp_stats before, after;
  for (int r = 0; r < reps; r++) {
    if (rank == 0) one[r] = timed_steps(alone, STEPS);
    idle_barrier();
    tt_dp_get_stats(dp, &before);
    allreduce_s = 0;
    two[r] = timed_steps(dp_model, STEPS);
    tt_dp_get_stats(dp, &after);
    idle_barrier();
  }
  if (rank == 0) {
    bench_log("the last repetition's all-reduce: %.3f ms a step (its warm-up steps included)",
              allreduce_s * 1e3 / (STEPS + WARMUP_STEPS));
    double bytes = (double)(after.allreduce_bytes - before.allreduce_bytes) / (double)(after.allreduce_calls - before.allreduce_calls);
    bench_log("2 ranks on %s (rank 0 on %s): %.3f ms/step at 128 a rank; 1 rank at 256: %.3f; %.0f bytes all-reduced a step "
              "in %llu bucket(s), parameters %llu bytes",
              target, device, bench_median(two, reps), bench_median(one, reps), bytes,
              (unsigned long long)((after.buckets - before.buckets) / (after.allreduce_calls - before.allreduce_calls)),
              (unsigned long long)after.param_bytes);
    bench_record("dp2_mlp_step_b256", bench_median(two, reps), bench_median(one, reps), "ms", "lower");
    bench_record("dp2_allreduce_bytes_per_step", bytes, (double)after.param_bytes, "bytes", "lower");
  }
  free(one), free(two);
  tt_dp_free(dp);
  bench_mlp_destroy(alone);
  bench_mlp_destroy(dp_model);
  tt_disconnect(c);
  MPI_Finalize();
  return 0;
}
