#include "device/tensor.h"

#include <stdlib.h>

ttd_status_t ttd_tensor_create(ttd_backend *backend, ttd_quota *quota, const ttd_tensor_spec *spec,
                               ttd_tensor **out_tensor) {
  *out_tensor = NULL;
  TTD_RETURN_IF_ERROR(ttd_quota_charge(quota, spec->nbytes));
  ttd_tensor *t = calloc(1, sizeof(*t));
  ttd_status_t status = t ? backend->vtable->buffer_alloc(backend, spec->device, spec->location, spec->nbytes, &t->buffer)
                          : ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  if (status) {
    ttd_quota_refund(quota, spec->nbytes);
    free(t);
    return status;
  }
  t->quota = ttd_quota_retain(quota);
  atomic_init(&t->refs, 1);
  atomic_init(&t->access, 0);
  atomic_init(&t->grad_state, TTD_GRAD_UNKNOWN);
  pthread_mutex_init(&t->train_lock, NULL);
  t->spec = *spec;
  t->backend = backend;
  *out_tensor = t;
  return TTD_OK;
}

ttd_status_t ttd_tensor_create_zeroed(ttd_backend *backend, ttd_quota *quota, const ttd_tensor_spec *spec,
                                      ttd_tensor **out_tensor) {
  TTD_RETURN_IF_ERROR(ttd_tensor_create(backend, quota, spec, out_tensor));
  ttd_status_t status = backend->vtable->buffer_zero(backend, (*out_tensor)->buffer);
  if (status) {
    ttd_tensor_release(*out_tensor);
    *out_tensor = NULL;
  }
  return status;
}

bool ttd_tensor_read_begin(ttd_tensor *tensor) {
  int v = atomic_load_explicit(&tensor->access, memory_order_relaxed);
  do {
    if (v < 0) return false;
  } while (!atomic_compare_exchange_weak_explicit(&tensor->access, &v, v + 1, memory_order_acquire, memory_order_relaxed));
  return true;
}

void ttd_tensor_read_end(ttd_tensor *tensor) { atomic_fetch_sub_explicit(&tensor->access, 1, memory_order_release); }

bool ttd_tensor_write_begin(ttd_tensor *tensor) {
  int idle = 0;
  if (!atomic_compare_exchange_strong_explicit(&tensor->access, &idle, -1, memory_order_acquire, memory_order_relaxed)) {
    return false;
  }
  int zeros = TTD_GRAD_ZEROS; /* a Backward summing into it ends its own state */
  atomic_compare_exchange_strong(&tensor->grad_state, &zeros, TTD_GRAD_UNKNOWN);
  return true;
}

bool ttd_tensor_zero_grad_begin(ttd_tensor *grad) {
  return ttd_tensor_write_begin(grad); /* else an Upload or a run has it: the state stays unknown */
}

void ttd_tensor_zero_grad_end(ttd_tensor *grad, bool marked, bool zeroed) {
  if (!marked) return;
  int unknown = TTD_GRAD_UNKNOWN; /* not over TTD_GRAD_SUMMING: that Backward ends it */
  if (zeroed) atomic_compare_exchange_strong(&grad->grad_state, &unknown, TTD_GRAD_ZEROS);
  ttd_tensor_write_end(grad);
}

ttd_status_t ttd_tensor_zero_grad(ttd_backend *backend, ttd_tensor *grad) {
  bool marked = ttd_tensor_zero_grad_begin(grad);
  ttd_status_t status = backend->vtable->buffer_zero(backend, grad->buffer);
  ttd_tensor_zero_grad_end(grad, marked, !status);
  return status;
}

void ttd_tensor_write_end(ttd_tensor *tensor) { atomic_store_explicit(&tensor->access, 0, memory_order_release); }

ttd_status_t ttd_tensors_read_begin(ttd_tensor *const *tensors, int n, const char *what) {
  for (int i = 0; i < n; i++) {
    if (!tensors[i] || ttd_tensor_read_begin(tensors[i])) continue;
    ttd_tensors_read_end(tensors, i);
    return ttd_make_status(GRPC_STATUS_FAILED_PRECONDITION,
                           "%s %d is being written by an Upload of this session (or, as a .grad, zeroed by a "
                           "ZeroGrad): send this call after that one answers",
                           what, i);
  }
  return TTD_OK;
}

void ttd_tensors_read_end(ttd_tensor *const *tensors, int n) {
  for (int i = 0; i < n; i++) {
    if (tensors[i]) ttd_tensor_read_end(tensors[i]);
  }
}

ttd_tensor *ttd_tensor_retain(ttd_tensor *tensor) {
  atomic_fetch_add_explicit(&tensor->refs, 1, memory_order_relaxed);
  return tensor;
}

void ttd_tensor_release(ttd_tensor *tensor) {
  if (!tensor) return;
  if (atomic_fetch_sub_explicit(&tensor->refs, 1, memory_order_acq_rel) != 1) return;
  ttd_tensor_release(tensor->grad);
  ttd_tensor_release(tensor->opt_state[0]);
  ttd_tensor_release(tensor->opt_state[1]);
  pthread_mutex_destroy(&tensor->train_lock);
  tensor->backend->vtable->buffer_free(tensor->backend, tensor->buffer);
  ttd_quota_refund(tensor->quota, tensor->spec.nbytes);
  ttd_quota_release(tensor->quota);
  free(tensor);
}
