/* tt_to: torch's .to() across host and device, by handle. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "client_internal.h"

static int same_place(const tt_place *a, const tt_place *b) {
  if (a->is_host || b->is_host) return a->is_host == b->is_host;
  return a->device == b->device && a->l1 == b->l1;
}

static void wire_place(const tt_place *place, char *device, size_t len, Ttd__V1__MemoryLocation *out_location) {
  snprintf(device, len, "tt:%d", place->device);
  *out_location = place->l1 ? TTD__V1__MEMORY_LOCATION__MEMORY_LOCATION_L1 : TTD__V1__MEMORY_LOCATION__MEMORY_LOCATION_DRAM;
}

static tt_tensor *host_to_host(tt_tensor *src, tt_dtype dtype) {
  tt_tensor *t = tt_tensor_from_host(src->client, NULL, dtype, src->shape, src->ndim);
  if (t) ttd_dtype_convert(t->data, (ttd_dtype)dtype, src->data, (ttd_dtype)src->dtype, (size_t)src->numel);
  return t;
}

static tt_tensor *upload(tt_tensor *src, const tt_place *place, tt_dtype dtype) {
  tt_tensor *t = tt_tensor_like(src, place, dtype);
  if (!t) return NULL;
  char device[16];
  Ttd__V1__TensorSpec spec = TTD__V1__TENSOR_SPEC__INIT;
  wire_place(place, device, sizeof(device), &spec.location);
  spec.dtype = (Ttd__V1__DType)dtype;
  spec.n_shape = (size_t)src->ndim;
  spec.shape = src->shape;
  spec.device = device;
  Ttd__V1__UploadHeader header = TTD__V1__UPLOAD_HEADER__INIT;
  header.target_case = TTD__V1__UPLOAD_HEADER__TARGET_SPEC;
  header.spec = &spec;
  header.source_dtype = (Ttd__V1__DType)src->dtype;
  Ttd__V1__ShmRange shm = TTD__V1__SHM_RANGE__INIT;
  const void *data = src->data;
  uint64_t bytes = src->nbytes;
  if (src->shm_segment) { /* same host: the daemon copies straight from the segment */
    shm.segment = src->shm_segment;
    shm.length = src->nbytes;
    header.shm = &shm;
    data = NULL;
    bytes = 0;
  }
  Ttd__V1__UploadResponse *resp = NULL;
  if (tt_rpc_upload(src->client, &header, data, bytes, &resp) != TT_OK) {
    tt_tensor_free(t);
    return NULL;
  }
  t->handle = resp->tensor ? resp->tensor->handle : 0;
  protobuf_c_message_free_unpacked(&resp->base, NULL);
  return t;
}

static tt_tensor *download(tt_tensor *src, tt_dtype dtype) {
  if (src->host_copy) return tt_inline_to_host(src, dtype); /* inline.c: its bytes are here already */
  if (tt_deferred_flush_for(src) != TT_OK) return NULL;      /* a parameter or .grad: queued work first */
  tt_tensor *t = tt_tensor_host_uninit(src->client, dtype, src->shape, src->ndim);
  if (!t) return NULL;
  if (tt_rpc_download(src->client, src->handle, dtype, t->data, t->nbytes, t->shm_segment) != TT_OK) {
    tt_tensor_free(t);
    return NULL;
  }
  return t;
}

static tt_tensor *move(tt_tensor *src, const tt_place *place) {
  if (tt_tensor_materialize(src) != TT_OK || tt_deferred_flush_for(src) != TT_OK) return NULL; /* inline.c, module.c */
  tt_tensor *t = tt_tensor_like(src, place, src->dtype);
  if (!t) return NULL;
  char device[16];
  Ttd__V1__MoveRequest req = TTD__V1__MOVE_REQUEST__INIT;
  wire_place(place, device, sizeof(device), &req.location);
  req.handle = src->handle;
  req.device = device;
  ProtobufCMessage *out = NULL;
  if (tt_rpc_unary(src->client, TT_RPC_MOVE, &req.base, &ttd__v1__move_response__descriptor, &out) != TT_OK) {
    tt_tensor_free(t);
    return NULL;
  }
  t->handle = ((Ttd__V1__MoveResponse *)out)->tensor->handle;
  protobuf_c_message_free_unpacked(out, NULL);
  return t;
}

tt_tensor *tt_to_dtype(tt_tensor *tensor, const char *device, tt_dtype dtype) {
  if (!tensor) return NULL;
  tt_client *client = tensor->client;
  tt_place place;
  if (tt_place_parse(device, &place) != 0) {
    tt_client_fail(client, TT_INVALID_ARGUMENT, "device '%s' is not valid; use cpu, tt, tt:N, tt:N/dram or tt:N/l1",
                   device ? device : "(null)");
    return NULL;
  }
  if (!ttd_dtype_convertible((ttd_dtype)tensor->dtype, (ttd_dtype)dtype)) {
    tt_client_fail(client, TT_INVALID_ARGUMENT, "cannot convert %s to %s; only float32 <-> bfloat16 converts",
                   ttd_dtype_name((ttd_dtype)tensor->dtype), ttd_dtype_name((ttd_dtype)dtype));
    return NULL;
  }
  if (same_place(&tensor->place, &place) && tensor->dtype == dtype) {
    atomic_fetch_add_explicit(&tensor->refs, 1, memory_order_relaxed);
    return tensor;
  }
  if (tensor->place.is_host && place.is_host) return host_to_host(tensor, dtype);
  if (tensor->place.is_host && tt_inline_defer_wanted(client, &place, tensor->numel * tt_dtype_size(dtype))) {
    return tt_inline_defer(tensor, &place, dtype); /* inline.c: travels with the next Execute */
  }
  if (tensor->place.is_host) return upload(tensor, &place, dtype);
  if (place.is_host) {
    tt_tensor *host = download(tensor, dtype);
    if (host && tensor->run && tt_autograd_track_to_cpu(host, tensor) != TT_OK) { /* the register_hook of the proposal */
      tt_tensor_free(host);
      return NULL;
    }
    return host;
  }
  if (dtype != tensor->dtype) {
    tt_client_fail(client, TT_INVALID_ARGUMENT,
                   "a device-to-device move keeps the dtype; convert on the way to or from the host");
    return NULL;
  }
  return move(tensor, &place);
}

tt_tensor *tt_to(tt_tensor *tensor, const char *device) {
  return tensor ? tt_to_dtype(tensor, device, tensor->dtype) : NULL;
}
