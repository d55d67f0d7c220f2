/* libttparallel: data-parallel training over MPI, beside libttclient (which stays free of MPI).
 *
 * One training process (rank) per card, each talking to the ttd of its host; every step the
 * ranks average their modules' gradients, on Open MPI, as torch's DistributedDataParallel
 * does on its process group:
 *
 *   MPI_Init(&argc, &argv);
 *   char device[16];
 *   tt_dp_pick_device(client, MPI_COMM_WORLD, device, sizeof(device)); // tt:<local rank>
 *   tt_module_to(m, device);
 *   tt_dp *dp;
 *   if (tt_dp_create(m, MPI_COMM_WORLD, NULL, &dp) != TT_OK) { fprintf(stderr, "%s\n", tt_dp_last_error(dp)); ... }
 *   tt_dp_broadcast_params(dp, 0);            // rank 0's parameters everywhere
 *   for (...) {                               // each rank: its slice of the global batch
 *     tt_forward(..); tt_backward(loss);
 *     tt_dp_allreduce_grads(dp);              // .grad = the mean over the ranks
 *     tt_step(opt);
 *   }
 *   tt_dp_free(dp);
 *
 * Uses only the public API of ttclient.h plus MPI. Build with
 * `pkg-config --cflags --libs ttparallel` (which brings ttclient and ompi-c).
 * Errors, SQLite style as libttclient's: a tt_status, and tt_dp_last_error(dp) names the rank,
 * what failed and the MPI or ttd error. Threads: a tt_dp belongs to one thread at a time, the
 * one that makes MPI calls (MPI_THREAD_FUNNELED is enough: the helper thread that downloads
 * gradients makes no MPI call). */
#ifndef TTPARALLEL_H
#define TTPARALLEL_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "ttclient.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tt_dp tt_dp;

typedef struct tt_dp_options {
  /* Gradients travel in buckets of about this many bytes (a parameter larger than it is a
   * bucket of its own): bucket k+1 downloads from the card while bucket k is all-reduced.
   * 0: 25 MiB, torch DDP's bucket_cap_mb. */
  size_t bucket_bytes;
  /* The longest a collective may wait for the other ranks; past it the call fails with
   * TT_DEADLINE_EXCEEDED naming this rank and the collective, instead of hanging on a
   * rank that stopped. 0: $TT_DP_TIMEOUT_MS, else 300000 (5 minutes). */
  int64_t timeout_ms;
} tt_dp_options;

/* Sets the defaults. */
void tt_dp_options_init(tt_dp_options *options);

/* Byte and call counters since tt_dp_create, for tests and benches: one all-reduce moves
 * exactly the gradients' bytes (the module's float32 parameter bytes). */
typedef struct tt_dp_stats {
  uint64_t param_bytes;       /* float32 bytes of the module's parameters */
  uint64_t allreduce_calls;   /* tt_dp_allreduce_grads calls that succeeded */
  uint64_t allreduce_bytes;   /* bytes all-reduced (each rank's contribution), over all calls */
  uint64_t buckets;           /* MPI_Iallreduce calls, over all calls */
  uint64_t broadcast_bytes;   /* bytes of tt_dp_broadcast_params */
} tt_dp_stats;

/* A data-parallel context for module over the ranks of comm (duplicated: the caller's comm
 * is untouched; its error handler is set to MPI_ERRORS_RETURN so that MPI errors come back
 * here as statuses). The module must be on its card (or "cpu") with float32 parameters, the
 * same graph on every rank. options NULL: the defaults. *out_dp is set even on failure (NULL
 * only when out of memory) so that tt_dp_last_error says why; free it with tt_dp_free.
 * Collective: every rank of comm calls it. Errors: INVALID_ARGUMENT for a NULL module or
 * MPI not initialised; INTERNAL for an MPI error. */
tt_status tt_dp_create(tt_module *module, MPI_Comm comm, const tt_dp_options *options, tt_dp **out_dp);

/* Frees the context (not the module) and its duplicated communicator (a local operation
 * when the other ranks are gone). Accepts NULL. */
void tt_dp_free(tt_dp *dp);

/* Writes root's parameters into every rank's module, in place (tt_copy_ into the same
 * handles, so an optimizer made before keeps them), as DDP does at wrap time. Collective.
 * Errors as tt_dp_allreduce_grads's. */
tt_status tt_dp_broadcast_params(tt_dp *dp, int root);

/* Replaces each parameter's .grad with the mean of that .grad over the ranks: the grads
 * come to the host in buckets, bucket k+1 downloading on a helper thread while bucket k is
 * all-reduced (MPI_Iallreduce, sum, then divided by the number of ranks), and the results
 * are written back into the same .grad handles with tt_copy_. Call it after tt_backward and
 * before tt_step. Collective: every rank calls it once per step, in the same order.
 * Errors: FAILED_PRECONDITION before the first backward (a parameter without .grad); the
 * status of a failed ttd call (UNAVAILABLE when this rank's ttd is gone, ...);
 * INTERNAL for an MPI error ("rank 1 of 2: MPI_Iallreduce of bucket 0: MPI_ERR_...");
 * DEADLINE_EXCEEDED when the other ranks did not join within the timeout. After an error
 * the ranks are out of step: end the job (MPI_Abort). */
tt_status tt_dp_allreduce_grads(tt_dp *dp);

/* The counters (zeros for NULL). */
void tt_dp_get_stats(const tt_dp *dp, tt_dp_stats *out_stats);

/* This rank in the context's communicator and the number of ranks; -1 for NULL. */
int tt_dp_rank(const tt_dp *dp);
int tt_dp_size(const tt_dp *dp);

/* The message of the most recent failing call on dp, "" when none failed; "out of memory"
 * for NULL. Valid until the next call on dp. */
const char *tt_dp_last_error(const tt_dp *dp);

/* This process's rank among the ranks of comm on the same host (MPI_COMM_TYPE_SHARED), and
 * how many there are on this host. -1 on an MPI error. Collective. */
int tt_dp_local_rank(MPI_Comm comm, int *out_local_size);

/* A card per rank on one host: "tt:<local rank mod the daemon's device count>" into
 * out_device (len bytes; 16 is enough), so the ranks of a host served by one ttd started
 * with --devices N each take their own card (and ranks of a host served by one ttd each,
 * or by a one-card ttd, take tt:0 of theirs). Collective over comm. Errors: the status of
 * tt_list_devices (tt_last_error(client) says why), INTERNAL for an MPI error,
 * INVALID_ARGUMENT for a buffer too small. */
tt_status tt_dp_pick_device(tt_client *client, MPI_Comm comm, char *out_device, size_t len);

/* Which ttd a rank talks to: entry (local rank mod count) of a comma-separated list of
 * targets ("unix:/a.sock,unix:/b.sock"), copied into out_target (len bytes); a list of one
 * is that target; NULL or "" gives "" (tt_connect's default: $TTD_ADDRESS, else the host's
 * own socket). Collective over comm. INVALID_ARGUMENT for an entry longer than len - 1. */
tt_status tt_dp_pick_target(const char *targets, MPI_Comm comm, char *out_target, size_t len);

#ifdef __cplusplus
}
#endif

#endif
