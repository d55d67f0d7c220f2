/* The training step the train and sessions benches time: the 784-512-10 ReLU MLP on the
 * card, cross-entropy on the CPU, SGD (lr 0.1) on the device, made through the public API
 * exactly as client/examples/train_common.h makes one step of mlp, on synthetic data (a few
 * fixed random batches, used in turn). */
#ifndef TTD_BENCH_MLP_H
#define TTD_BENCH_MLP_H

#include "ttclient.h"

typedef struct bench_mlp bench_mlp;

/* Connects to target (options may be NULL), builds the MLP for `batch` and puts it on "tt".
 * Exits via bench_die on error. */
bench_mlp *bench_mlp_create(const char *target, const tt_connect_options *options, int batch);

/* The same on a client the caller keeps (it must outlive the model; the fault and soak
 * clients reconnect on their own). NULL on error: tt_last_error(client) says why. */
bench_mlp *bench_mlp_create_on(tt_client *client, int batch);

/* The same MLP with its four parameters made by hand and held as dtype (TT_FLOAT32 or
 * TT_BFLOAT16): values uniform in torch's default bounds, rounded to bfloat16 for both dtypes,
 * so a float32 and a bfloat16 model start equal. On a client the caller keeps; NULL on
 * error. */
bench_mlp *bench_mlp_create_dtype(tt_client *client, int batch, tt_dtype dtype);

/* One training step; exits via bench_die on error. */
void bench_mlp_step(bench_mlp *m);

/* One training step; its loss into *out_loss (may be NULL). On error the code, and
 * tt_last_error of the model's client says why. */
tt_status bench_mlp_try_step(bench_mlp *m, float *out_loss);

/* The calls of a step, for a hook that wants to act just before or after one: the batch's
 * upload, the forward, the forward's output downloaded, the backward, the optimizer step. */
typedef enum bench_mlp_stage {
  BENCH_MLP_UPLOAD,
  BENCH_MLP_FORWARD,
  BENCH_MLP_DOWNLOAD,
  BENCH_MLP_BACKWARD,
  BENCH_MLP_STEP,
} bench_mlp_stage;

/* Called by bench_mlp_try_step before (done 0) and after (done 1) each stage's call. */
typedef void (*bench_mlp_hook)(void *arg, bench_mlp_stage stage, int done);

/* Sets the step's hook (NULL: none); the losses stay as without one. */
void bench_mlp_set_hook(bench_mlp *m, bench_mlp_hook hook, void *arg);

/* The model's module (lent), for a step that does more with it (bench_dp's all-reduce). */
tt_module *bench_mlp_module(bench_mlp *m);

/* Frees the model, and disconnects a client bench_mlp_create made. Accepts NULL. */
void bench_mlp_destroy(bench_mlp *m);

#endif
