#include "graph/tensor_spec.h"

#include <stdint.h>

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
