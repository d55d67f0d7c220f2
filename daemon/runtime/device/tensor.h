/* Layer runtime/device (the top of the shared runtime, linked by ttd and libttclient alike):
 * device tensors, memory quotas, running programs and optimizer steps on a backend. Calls
 * runtime/backends and the layers below.
 *
 * A device tensor: a backend buffer plus its spec, reference counted so that a buffer
 * cannot be freed under a call still reading or writing it (a Free during a Download
 * only drops the table's reference). Thread-safe refcount; the spec is immutable. */
#ifndef TTD_TENSOR_H
#define TTD_TENSOR_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "backends/backend.h"
#include "device/quota.h"

typedef struct ttd_tensor {
  atomic_int refs;
  ttd_tensor_spec spec;
  ttd_backend *backend;
  ttd_backend_buffer *buffer;
  ttd_quota *quota;             /* charged with nbytes; NULL: not accounted */
  /* For parameters: torch's .grad and the optimizer state, made on first use, kept on
   * the device, freed with the tensor. Guarded by train_lock. */
  pthread_mutex_t train_lock;
  struct ttd_tensor *grad;
  uint64_t grad_handle;        /* the grad's handle in the owning session, 0 if none */
  struct ttd_tensor *opt_state[2];
  int64_t opt_step;
  /* Who uses the bytes now: > 0 calls reading them (a program run), -1 an Upload writing
   * them, 0 none. A run never reads a tensor while an Upload rewrites it, nor the reverse. */
  atomic_int access;
  /* For a .grad, what its bytes are known to hold (ttd_grad_state). A Backward writes a
   * .grad of known zeros in place (device/program_run.c), and zeroes it again if it stops. */
  atomic_int grad_state;
} ttd_tensor;

typedef enum ttd_grad_state {
  TTD_GRAD_UNKNOWN, /* anything: the state of every new tensor, and after an Upload began */
  TTD_GRAD_ZEROS,   /* all zeros: ZeroGrad zeroed it while no Upload or Backward wrote it */
  TTD_GRAD_SUMMING, /* a Backward is summing into it in place */
  /* A ZeroGrad that rides on a Backward left its zeros to that Backward, which writes the
   * .grad whole in place (as over TTD_GRAD_ZEROS) or zeroes it: its bytes are stale until
   * then, and the call holds its Upload lock (access -1) all along, so no one reads them. */
  TTD_GRAD_PENDING_ZEROS,
} ttd_grad_state;

/* Allocates device memory for spec (already finished and validated), charged to quota
 * (NULL: unaccounted) before the device is asked. One reference, owned by the caller. */
ttd_status_t ttd_tensor_create(ttd_backend *backend, ttd_quota *quota, const ttd_tensor_spec *spec,
                               ttd_tensor **out_tensor);

/* The same, with every byte zeroed (for Allocate: no tensor may show old device data). */
ttd_status_t ttd_tensor_create_zeroed(ttd_backend *backend, ttd_quota *quota, const ttd_tensor_spec *spec,
                                      ttd_tensor **out_tensor);

ttd_tensor *ttd_tensor_retain(ttd_tensor *tensor);

/* Marks the tensor read by one more call; false (nothing marked) while an Upload writes it
 * (or ZeroGrad zeroes it). */
bool ttd_tensor_read_begin(ttd_tensor *tensor);
void ttd_tensor_read_end(ttd_tensor *tensor);

/* Zeroes a .grad's bytes (ZeroGrad). They are known to be zeros afterwards only when no
 * call wrote them meanwhile: the zeroing holds the write mark, so an Upload cannot overlap
 * it, and a Backward summing into the .grad keeps it TTD_GRAD_SUMMING. */
ttd_status_t ttd_tensor_zero_grad(ttd_backend *backend, ttd_tensor *grad);

/* The same around another pass that zeroes a .grad (an optimizer step that zeroes the
 * gradient it reads): begin takes the write mark when it can and says whether it did; end
 * gives it back, the .grad known zeros when the pass succeeded with the mark held. */
bool ttd_tensor_zero_grad_begin(ttd_tensor *grad);
void ttd_tensor_zero_grad_end(ttd_tensor *grad, bool marked, bool zeroed);

/* Marks the tensor written by an Upload or ZeroGrad (known zeros become unknown); false
 * (nothing marked) while any call reads or writes it. */
bool ttd_tensor_write_begin(ttd_tensor *tensor);
void ttd_tensor_write_end(ttd_tensor *tensor);

/* Marks n tensors (NULL entries skipped) read, all or none: FAILED_PRECONDITION naming the
 * first one being written ("what %d", i). Undo with ttd_tensors_read_end. */
ttd_status_t ttd_tensors_read_begin(ttd_tensor *const *tensors, int n, const char *what);
void ttd_tensors_read_end(ttd_tensor *const *tensors, int n);

/* Drops a reference; the last one frees the device memory. Accepts NULL. */
void ttd_tensor_release(ttd_tensor *tensor);

#endif
