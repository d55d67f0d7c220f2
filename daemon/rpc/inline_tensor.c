#include "rpc/inline_tensor.h"

#include <inttypes.h>
#include <string.h>

#include "session/session.h"
#include "rpc/tensor_proto.h"

uint64_t ttd_value_type_nbytes(const ttd_value_type *t) {
  return (uint64_t)ttd_kshape_numel(&t->shape) * ttd_dtype_size(t->dtype);
}

/* status with "what index ('name'): " in front of its message; takes status. */
static ttd_status_t name_it(ttd_status_t status, const char *what, int index, const char *name) {
  if (!status) return TTD_OK;
  ttd_status_t named = ttd_make_status(ttd_status_code(status), "%s %d ('%.128s'): %s", what, index, name,
                                       ttd_status_message(status));
  ttd_status_free(status);
  return named;
}

ttd_status_t ttd_inline_check(const ttd_core *core, const Ttd__V1__InlineTensor *wire, const ttd_value_type *want,
                              const char *what, int index, const char *name, int device, ttd_tensor_spec *out_spec) {
  if (!wire->spec) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "%s %d ('%.128s') has no spec; set its dtype and shape", what,
                           index, name);
  }
  TTD_RETURN_IF_ERROR(name_it(ttd_tensor_spec_from_proto(core, wire->spec, out_spec), what, index, name));
  if (wire->spec->device && wire->spec->device[0] && out_spec->device != device) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                           "%s %d ('%.128s') names tt:%d but the call runs on tt:%d; leave its device empty", what, index,
                           name, out_spec->device, device);
  }
  out_spec->device = device;
  out_spec->location = TTD_MEM_DRAM;
  ttd_kshape got = {.ndim = out_spec->ndim};
  memcpy(got.d, out_spec->shape, sizeof(int64_t) * (size_t)got.ndim);
  if (out_spec->dtype != want->dtype || got.ndim != want->shape.ndim ||
      memcmp(got.d, want->shape.d, sizeof(int64_t) * (size_t)got.ndim) != 0) {
    char b1[128], b2[128];
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "%s %d ('%.128s') must be %s %s, got %s %s", what, index, name,
                           ttd_dtype_name(want->dtype), ttd_kshape_format(&want->shape, b1, sizeof(b1)),
                           ttd_dtype_name(out_spec->dtype), ttd_kshape_format(&got, b2, sizeof(b2)));
  }
  if (wire->shm && wire->data.len) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                           "%s %d ('%.128s') has both data and a shared-memory range; send one of them", what, index, name);
  }
  uint64_t have = wire->shm ? wire->shm->length : (uint64_t)wire->data.len;
  if (out_spec->nbytes > TTD_INLINE_MAX_BYTES) { /* one alone past the limit: the sum cannot wrap */
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                           "%s %d ('%.128s') holds %" PRIu64 " bytes; at most %" PRIu64 " (4 MiB) travel inline: upload "
                           "it and pass its handle", what, index, name, out_spec->nbytes, TTD_INLINE_MAX_BYTES);
  }
  if (have != out_spec->nbytes) {
    char b1[128];
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                           "%s %d ('%.128s') has %" PRIu64 " bytes of %s; %s %s needs exactly %" PRIu64, what, index, name,
                           have, wire->shm ? "shared memory" : "data", ttd_dtype_name(want->dtype),
                           ttd_kshape_format(&want->shape, b1, sizeof(b1)), out_spec->nbytes);
  }
  return TTD_OK;
}

ttd_status_t ttd_inline_check_total(uint64_t total, const char *what, const char *instead) {
  if (total <= TTD_INLINE_MAX_BYTES) return TTD_OK;
  return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                         "%s add up to %" PRIu64 " bytes; at most %" PRIu64 " (4 MiB) travel inline: %s", what, total,
                         TTD_INLINE_MAX_BYTES, instead);
}

ttd_status_t ttd_inline_create(ttd_call *call, const ttd_tensor_spec *spec, const Ttd__V1__InlineTensor *wire,
                               ttd_tensor **out_tensor) {
  ttd_backend *backend = call->core->backend;
  *out_tensor = NULL;
  const void *bytes = wire->data.data;
  ttd_shm_segment *segment = NULL; /* held until the copy is done: a release meanwhile waits */
  if (wire->shm) {
    TTD_RETURN_IF_ERROR(ttd_session_segment_lookup(call->session, wire->shm->segment, &segment));
    ttd_status_t status = ttd_shm_segment_check_range(segment, wire->shm->offset, wire->shm->length, spec->nbytes);
    if (status) {
      ttd_shm_segment_release(segment);
      return status;
    }
    bytes = segment->addr + wire->shm->offset;
  }
  ttd_status_t status = ttd_tensor_create(backend, call->session->quota, spec, out_tensor);
  if (!status && spec->nbytes) status = backend->vtable->buffer_write(backend, (*out_tensor)->buffer, 0, bytes, spec->nbytes);
  ttd_shm_segment_release(segment);
  if (status) {
    ttd_tensor_release(*out_tensor);
    *out_tensor = NULL;
    return status;
  }
  atomic_fetch_add_explicit(&call->core->metrics.bytes_to_device, spec->nbytes, memory_order_relaxed);
  return TTD_OK;
}

ttd_status_t ttd_inline_read(ttd_call *call, const ttd_tensor *tensor, ProtobufCBinaryData *out_data) {
  out_data->len = 0;
  out_data->data = ttd_call_alloc(call, tensor->spec.nbytes ? tensor->spec.nbytes : 1);
  if (!out_data->data) return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  if (tensor->spec.nbytes) {
    TTD_RETURN_IF_ERROR(tensor->backend->vtable->buffer_read(tensor->backend, tensor->buffer, 0, out_data->data,
                                                             tensor->spec.nbytes));
  }
  out_data->len = tensor->spec.nbytes;
  atomic_fetch_add_explicit(&call->core->metrics.bytes_to_host, tensor->spec.nbytes, memory_order_relaxed);
  return TTD_OK;
}
