/* dp_worker: the program mpirun starts for the e2e_parallel suite. A small MLP (64-32-10,
 * cross-entropy) trained on fixed synthetic batches for --steps steps: each rank takes its
 * slice of the global batch of --batch, the gradients are averaged with
 * tt_dp_allreduce_grads, the optimizer (--opt sgd | adam) steps. Each rank saves its
 * parameters to PREFIX.rR.safetensors. Under one rank it is the one-process reference.
 *   dp_worker --target T[,T2...] --steps N --batch B --opt sgd|adam --save PREFIX
 *             [--bucket-bytes N] [--timeout-ms N] [--die-at K] [--stall-at K]
 *             [--kill-daemon-at K --daemon-pid PID]
 * --die-at K: rank 1 kills itself (SIGKILL, as the OOM killer would) at step K, before the all-reduce (a rank that
 * dies); --stall-at K: rank 1 sleeps instead (a rank that stops answering);
 * --kill-daemon-at K: rank 1 SIGKILLs the ttd of --daemon-pid (its own) at step K, and goes
 * on to the all-reduce (a daemon that dies). Prints, per rank,
 * "rank R of N: device D target T" and, at the end, "rank R: bytes per step X, parameter
 * bytes Y, buckets per step Z". An error prints "dp_worker: rank R: ..." and aborts the job. */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ttparallel.h"

#define IN 64
#define HIDDEN 32
#define CLASSES 10

static int rank;

static int fail(const char *what, const char *why) {
  fprintf(stderr, "dp_worker: rank %d: %s failed: %s\n", rank, what, why);
  fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  return 1;
}

/* The global batch of step s: the same on every rank. */
static void batch_of(int s, int batch, float *x, int32_t *y) {
  unsigned long long r = 0x9e3779b97f4a7c15ull * (unsigned long long)(s + 1);
  for (int i = 0; i < batch * IN; i++) {
    r = r * 6364136223846793005ull + 1442695040888963407ull;
    x[i] = (float)((r >> 40) & 0xffff) / 65536.0f - 0.5f;
  }
  for (int i = 0; i < batch; i++) {
    r = r * 6364136223846793005ull + 1442695040888963407ull;
    y[i] = (int32_t)((r >> 33) % CLASSES);
  }
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const char *targets = NULL, *opt_name = "sgd", *save = NULL;
  int steps = 20, batch = 32, die_at = -1, stall_at = -1, kill_daemon_at = -1, daemon_pid = 0;
  tt_dp_options dopts;
  tt_dp_options_init(&dopts);
  for (int i = 1; i + 1 < argc; i += 2) {
    const char *k = argv[i], *v = argv[i + 1];
    if (!strcmp(k, "--target")) targets = v;
    else if (!strcmp(k, "--steps")) steps = atoi(v);
    else if (!strcmp(k, "--batch")) batch = atoi(v);
    else if (!strcmp(k, "--opt")) opt_name = v;
    else if (!strcmp(k, "--save")) save = v;
    else if (!strcmp(k, "--bucket-bytes")) dopts.bucket_bytes = (size_t)atoll(v);
    else if (!strcmp(k, "--timeout-ms")) dopts.timeout_ms = atoll(v);
    else if (!strcmp(k, "--die-at")) die_at = atoi(v);
    else if (!strcmp(k, "--stall-at")) stall_at = atoi(v);
    else if (!strcmp(k, "--kill-daemon-at")) kill_daemon_at = atoi(v);
    else if (!strcmp(k, "--daemon-pid")) daemon_pid = atoi(v);
    else return fail("parsing the arguments", k);
  }
  if (batch % ranks) return fail("splitting the batch", "--batch is not a multiple of the ranks");
  int local = batch / ranks;
  char target[256], device[16];
  if (tt_dp_pick_target(targets, MPI_COMM_WORLD, target, sizeof(target)) != TT_OK) return fail("--target", targets);
  tt_client *c = NULL;
  if (tt_connect(*target ? target : NULL, NULL, &c) != TT_OK) return fail("connect", tt_last_error(c));
  if (tt_dp_pick_device(c, MPI_COMM_WORLD, device, sizeof(device)) != TT_OK) return fail("devices", tt_last_error(c));
  printf("rank %d of %d: device %s target %s\n", rank, ranks, device, target);
  fflush(stdout);

  tt_graph *g = tt_graph_create(c, 1000 + (uint64_t)rank); /* different inits: the broadcast must fix them */
  tt_value x = tt_graph_input(g, "x", TT_FLOAT32, (int64_t[]){local, IN}, 2);
  tt_graph_output(g, tt_nn_linear(g, tt_relu(g, tt_nn_linear(g, x, HIDDEN, 1)), CLASSES, 1));
  tt_module *m = tt_compile(c, g);
  tt_graph_free(g);
  if (!m || tt_module_to(m, device) != TT_OK) return fail("putting the model on the card", tt_last_error(c));
  tt_dp *dp = NULL;
  if (tt_dp_create(m, MPI_COMM_WORLD, &dopts, &dp) != TT_OK || tt_dp_broadcast_params(dp, 0) != TT_OK)
    return fail("starting data-parallel training", tt_dp_last_error(dp));
  tt_optimizer *opt = !strcmp(opt_name, "adam") ? tt_adam(m, 0.01f, 0.0f, 0) : tt_sgd(m, 0.1f, 0.9f, 0.0f, 0);
  if (!opt) return fail("making the optimizer", tt_last_error(c));

  float *xb = malloc(sizeof(float) * (size_t)batch * IN);
  int32_t *yb = malloc(sizeof(int32_t) * (size_t)batch);
  for (int s = 0; s < steps; s++) {
    batch_of(s, batch, xb, yb);
    tt_tensor *xh = tt_tensor_from_host(c, xb + (size_t)rank * local * IN, TT_FLOAT32, (int64_t[]){local, IN}, 2);
    tt_tensor *lh = tt_tensor_from_host(c, yb + (size_t)rank * local, TT_INT32, (int64_t[]){local}, 1);
    tt_tensor *xd = tt_to(xh, device), *out = NULL, *out_cpu = NULL, *loss = NULL;
    if (!xd || tt_zero_grad(opt) != TT_OK || tt_forward(m, &xd, 1, &out) != TT_OK || !(out_cpu = tt_to(out, "cpu")) ||
        !(loss = tt_cross_entropy(out_cpu, lh)) || tt_backward(loss) != TT_OK)
      return fail("training step", tt_last_error(c));
    if (rank == 1 && s == die_at) {
      fprintf(stderr, "dp_worker: rank 1 dies at step %d, as --die-at asks\n", s);
      fflush(stderr);
      raise(SIGKILL);
    }
    if (rank == 1 && s == stall_at) {
      fprintf(stderr, "dp_worker: rank 1 stops answering at step %d, as --stall-at asks\n", s);
      sleep(60);
    }
    if (rank == 1 && s == kill_daemon_at && daemon_pid > 0) {
      fprintf(stderr, "dp_worker: rank 1 kills its ttd (pid %d) at step %d, as --kill-daemon-at asks\n", daemon_pid, s);
      kill(daemon_pid, SIGKILL);
      usleep(200 * 1000);
    }
    if (tt_dp_allreduce_grads(dp) != TT_OK) return fail("averaging the gradients", tt_dp_last_error(dp));
    if (tt_step(opt) != TT_OK) return fail("optimizer step", tt_last_error(c));
    tt_tensor *done[] = {loss, out_cpu, out, xd, lh, xh};
    for (int k = 0; k < 6; k++) tt_tensor_free(done[k]);
  }
  if (save) {
    char path[512];
    snprintf(path, sizeof(path), "%s.r%d.safetensors", save, rank);
    if (tt_module_save(m, path) != TT_OK) return fail("saving", tt_last_error(c));
  }
  tt_dp_stats st;
  tt_dp_get_stats(dp, &st);
  printf("rank %d: bytes per step %llu, parameter bytes %llu, buckets per step %llu\n", rank,
         (unsigned long long)(st.allreduce_calls ? st.allreduce_bytes / st.allreduce_calls : 0),
         (unsigned long long)st.param_bytes,
         (unsigned long long)(st.allreduce_calls ? st.buckets / st.allreduce_calls : 0));
  free(xb), free(yb);
  tt_optimizer_free(opt);
  tt_dp_free(dp);
  tt_module_free(m);
  tt_disconnect(c);
  MPI_Finalize();
  return 0;
}
