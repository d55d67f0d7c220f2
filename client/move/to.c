/* tt_to: torch's .to() across host and device, by handle. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "move/move.h"

static int same_place(const tt_place *a, const tt_place *b) {
  if (a->is_host || b->is_host) return a->is_host == b->is_host;
  return a->device == b->device && a->l1 == b->l1;
}

/* Set by the module layer: sends its queued parameter work before a parameter is read. */
static _Atomic(tt_pending_flush_fn) pending_flush;

void tt_to_set_pending_flush(tt_pending_flush_fn flush) { atomic_store(&pending_flush, flush); }

tt_status tt_to_flush_pending(const tt_tensor *t) {
  tt_pending_flush_fn flush = atomic_load(&pending_flush);
  return flush ? flush(t) : TT_OK;
}

static tt_tensor *host_to_host(tt_tensor *src, tt_dtype dtype) {
  tt_tensor *t = tt_tensor_from_host(src->client, NULL, dtype, src->shape, src->ndim);
  if (t) ttd_dtype_convert(t->data, (ttd_dtype)dtype, src->data, (ttd_dtype)src->dtype, (size_t)src->numel);
  return t;
}

/* Uploads src as a new tensor of dtype at place. Its bytes go from where they are: a
 * shared-memory segment the daemon reads, or the host memory the Upload streams from (no
 * copy here). A wrapped tensor's memory is the caller's and in no segment: large enough for
 * the same-host path, it is copied once into a pooled segment, which beats streaming it. */
static tt_tensor *upload(tt_tensor *src, const tt_place *place, tt_dtype dtype) {
  tt_tensor *t = tt_tensor_like(src, place, dtype);
  if (!t) return NULL;
  const void *data = src->data;
  uint64_t segment = src->shm_segment;
  void *staged = src->wrapped ? tt_shm_alloc(src->client, src->nbytes, TT_SHM_MIN_BYTES, &segment) : NULL;
  if (staged) {
    memcpy(staged, src->data, (size_t)src->nbytes);
    data = staged;
  }
  tt_status st =
      tt_upload_new(src->client, place, dtype, src->dtype, src->shape, src->ndim, data, src->nbytes, segment, &t->handle);
  if (staged) tt_shm_free(src->client, staged);
  if (st != TT_OK) {
    tt_tensor_free(t);
    return NULL;
  }
  return t;
}

static tt_tensor *download(tt_tensor *src, tt_dtype dtype) {
  if (src->host_copy) return tt_inline_to_host(src, dtype); /* inline.c: its bytes are here already */
  if (tt_to_flush_pending(src) != TT_OK) return NULL;              /* a parameter or .grad: queued work first */
  tt_tensor *t = tt_tensor_host_uninit(src->client, dtype, src->shape, src->ndim);
  if (!t) return NULL;
  if (tt_rpc_download(src->client, src->handle, dtype, t->data, t->nbytes, t->shm_segment) != TT_OK) {
    tt_tensor_free(t);
    return NULL;
  }
  return t;
}

static tt_tensor *move(tt_tensor *src, const tt_place *place) {
  if (tt_tensor_materialize(src) != TT_OK || tt_to_flush_pending(src) != TT_OK) return NULL;
  tt_tensor *t = tt_tensor_like(src, place, src->dtype);
  if (!t) return NULL;
  char device[16];
  Ttd__V1__MoveRequest req = TTD__V1__MOVE_REQUEST__INIT;
  req.location = tt_place_wire(place, device, sizeof(device));
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
  if (same_place(&tensor->place, &place) && tensor->dtype == dtype) return tt_tensor_retain(tensor);
  if (tensor->place.is_host && place.is_host) return host_to_host(tensor, dtype);
  if (tensor->place.is_host && tt_inline_defer_wanted(client, &place, tensor->numel * tt_dtype_size(dtype))) {
    return tt_inline_defer(tensor, &place, dtype); /* inline.c: travels with the next Execute */
  }
  if (tensor->place.is_host) return upload(tensor, &place, dtype);
  if (place.is_host) {
    tt_tensor *host = download(tensor, dtype);
    if (host && tensor->run) host->from_output = tt_tensor_retain(tensor); /* its gradient goes back to the run */
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
