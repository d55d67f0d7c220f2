#include "tensor.h"

#include <stdlib.h>

ttd_status_t ttd_tensor_spec_finish(ttd_tensor_spec *spec) {
  size_t esize = ttd_dtype_size(spec->dtype);
  if (esize == 0) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                           "dtype %d is not supported; use float32, bfloat16 or int32", (int)spec->dtype);
  }
  if (spec->ndim < 0 || spec->ndim > TTD_MAX_DIMS) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "tensor has %d dims; at most %d are supported",
                           spec->ndim, TTD_MAX_DIMS);
  }
  /* The product of the nonzero dims is bounded too, not only the element count: a tensor
   * with a 0 dim holds no element whatever its other dims, but kernels and shape inference
   * still multiply those dims into strides and counts, which must not overflow. */
  uint64_t span = 1;
  int empty = 0;
  for (int i = 0; i < spec->ndim; i++) {
    if (spec->shape[i] < 0) {
      return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "dim %d of the shape is %lld; dims must be >= 0",
                             i, (long long)spec->shape[i]);
    }
    empty |= spec->shape[i] == 0;
    if (spec->shape[i] && (__builtin_mul_overflow(span, (uint64_t)spec->shape[i], &span) || span > (uint64_t)INT64_MAX)) {
      return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                             "shape has more than 2^63 elements (overflow at dim %d)", i);
    }
  }
  uint64_t span_bytes;
  if (__builtin_mul_overflow(span, (uint64_t)esize, &span_bytes) || span_bytes > (uint64_t)INT64_MAX) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "tensor of %llu %s elements exceeds 2^63 bytes",
                           (unsigned long long)span, ttd_dtype_name(spec->dtype));
  }
  spec->numel = empty ? 0 : span;
  spec->nbytes = empty ? 0 : span_bytes;
  return TTD_OK;
}

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
