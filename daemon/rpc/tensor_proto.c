#include "rpc/tensor_proto.h"

#include <stdio.h>
#include <string.h>

ttd_status_t ttd_memloc_from_proto(int wire, ttd_memloc *out_loc) {
  *out_loc = TTD_MEM_DRAM;
  switch (wire) {
    case TTD__V1__MEMORY_LOCATION__MEMORY_LOCATION_UNSPECIFIED:
    case TTD__V1__MEMORY_LOCATION__MEMORY_LOCATION_DRAM: *out_loc = TTD_MEM_DRAM; return TTD_OK;
    case TTD__V1__MEMORY_LOCATION__MEMORY_LOCATION_L1: *out_loc = TTD_MEM_L1; return TTD_OK;
    default:
      return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                             "memory location %d is unknown; use MEMORY_LOCATION_DRAM or MEMORY_LOCATION_L1", wire);
  }
}

ttd_status_t ttd_tensor_spec_from_proto(const ttd_core *core, const Ttd__V1__TensorSpec *wire,
                                        ttd_tensor_spec *out_spec) {
  memset(out_spec, 0, sizeof(*out_spec));
  if (!wire) return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "the tensor spec is missing; set dtype, shape and device");
  if (wire->dtype == TTD__V1__DTYPE__DTYPE_UNSPECIFIED || ttd_dtype_size((ttd_dtype)wire->dtype) == 0) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                           "dtype %d is not supported; use DTYPE_FLOAT32, DTYPE_BFLOAT16 or DTYPE_INT32", (int)wire->dtype);
  }
  if (wire->n_shape > TTD_MAX_DIMS) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "shape has %zu dims; at most %d are supported",
                           wire->n_shape, TTD_MAX_DIMS);
  }
  out_spec->dtype = (ttd_dtype)wire->dtype;
  out_spec->ndim = (int)wire->n_shape;
  for (size_t i = 0; i < wire->n_shape; i++) out_spec->shape[i] = wire->shape[i];
  TTD_RETURN_IF_ERROR(ttd_tensor_spec_finish(out_spec));
  TTD_RETURN_IF_ERROR(ttd_core_parse_device(core, wire->device, &out_spec->device));
  return ttd_memloc_from_proto(wire->location, &out_spec->location);
}

Ttd__V1__TensorInfo *ttd_tensor_info_to_proto(ttd_call *call, uint64_t handle, const ttd_tensor_spec *spec) {
  Ttd__V1__TensorInfo *info = ttd_call_alloc(call, sizeof(*info));
  Ttd__V1__TensorSpec *wire = ttd_call_alloc(call, sizeof(*wire));
  int64_t *shape = ttd_call_alloc(call, sizeof(int64_t) * (spec->ndim ? (size_t)spec->ndim : 1));
  char *device = ttd_call_alloc(call, 16);
  if (!info || !wire || !shape || !device) return NULL;
  ttd__v1__tensor_info__init(info);
  ttd__v1__tensor_spec__init(wire);
  for (int i = 0; i < spec->ndim; i++) shape[i] = spec->shape[i];
  snprintf(device, 16, "tt:%d", spec->device);
  wire->dtype = (Ttd__V1__DType)spec->dtype;
  wire->n_shape = (size_t)spec->ndim;
  wire->shape = shape;
  wire->device = device;
  wire->location = (Ttd__V1__MemoryLocation)spec->location;
  info->handle = handle;
  info->spec = wire;
  info->nbytes = spec->nbytes;
  return info;
}
