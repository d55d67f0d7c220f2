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
} ttd_tensor;

/* Allocates device memory for spec (already finished and validated), charged to quota
 * (NULL: unaccounted) before the device is asked. One reference, owned by the caller. */
ttd_status_t ttd_tensor_create(ttd_backend *backend, ttd_quota *quota, const ttd_tensor_spec *spec,
                               ttd_tensor **out_tensor);

/* The same, with every byte zeroed (for Allocate: no tensor may show old device data). */
ttd_status_t ttd_tensor_create_zeroed(ttd_backend *backend, ttd_quota *quota, const ttd_tensor_spec *spec,
                                      ttd_tensor **out_tensor);

ttd_tensor *ttd_tensor_retain(ttd_tensor *tensor);

/* Drops a reference; the last one frees the device memory. Accepts NULL. */
void ttd_tensor_release(ttd_tensor *tensor);

#endif
