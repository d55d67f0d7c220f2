/* Fewer round trips, the tensor side: device tensors whose bytes the host keeps. A small
 * host -> device tt_to during a training loop is deferred (the tensor keeps its bytes and no
 * handle: its first use sends it inline with Execute, or uploads it when a handle is needed),
 * and the outputs a forward returned inline come back to the host with no Download. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "move/move.h"

/* Serialises materialising deferred tensors, so that a tensor shared by threads is
 * uploaded once. */
static pthread_mutex_t materialize_lock = PTHREAD_MUTEX_INITIALIZER;

bool tt_inline_enabled(tt_client *c) {
  if (c->inline_mode == TT_INLINE_UNREAD) {
    const char *env = getenv("TTD_INLINE");
    c->inline_mode = env && strcmp(env, "0") == 0 ? TT_INLINE_OFF : TT_INLINE_ON;
  }
  return c->inline_mode == TT_INLINE_ON;
}

bool tt_inline_defer_wanted(tt_client *c, const tt_place *place, uint64_t nbytes) {
  if (place->is_host || place->l1 || place->device < 0 || place->device >= TT_LOOP_DEVICES) return false;
  if (nbytes > TTD_INLINE_MAX_BYTES || !tt_inline_enabled(c)) return false;
  return atomic_load_explicit(&c->training_loops[place->device], memory_order_relaxed) > 0;
}

tt_tensor *tt_inline_defer(tt_tensor *src, const tt_place *place, tt_dtype dtype) {
  tt_tensor *t = tt_tensor_like(src, place, dtype);
  if (!t) return NULL;
  t->host_copy = tt_shm_alloc(src->client, t->nbytes, TT_SHM_INLINE_MIN_BYTES, &t->host_copy_segment);
  if (!t->host_copy) t->host_copy = malloc(t->nbytes ? (size_t)t->nbytes : 1);
  if (!t->host_copy) {
    tt_client_fail(src->client, TT_RESOURCE_EXHAUSTED, "out of host memory");
    tt_tensor_free(t);
    return NULL;
  }
  if (dtype == src->dtype) memcpy(t->host_copy, src->data, (size_t)t->nbytes);
  else ttd_dtype_convert(t->host_copy, (ttd_dtype)dtype, src->data, (ttd_dtype)src->dtype, (size_t)src->numel);
  return t;
}

tt_status tt_tensor_materialize(tt_tensor *t) {
  if (t->place.is_host || !t->host_copy) return TT_OK;
  pthread_mutex_lock(&materialize_lock);
  tt_status st = TT_OK;
  if (!t->handle) {
    uint64_t handle = 0;
    st = tt_upload_new(t->client, &t->place, t->dtype, t->dtype, t->shape, t->ndim, t->host_copy, t->nbytes,
                       t->host_copy_segment, &handle);
    t->handle = handle; /* the host copy stays: the device bytes never change */
  }
  pthread_mutex_unlock(&materialize_lock);
  return st;
}

uint64_t tt_tensor_handle(const tt_tensor *tensor) {
  if (!tensor->place.is_host) tt_tensor_materialize((tt_tensor *)tensor); /* a deferred tensor gets its handle */
  return tensor->place.is_host ? 0 : tensor->handle;
}

tt_tensor *tt_inline_to_host(tt_tensor *src, tt_dtype dtype) {
  tt_tensor *t = tt_tensor_from_host(src->client, NULL, dtype, src->shape, src->ndim);
  if (!t) return NULL;
  if (dtype == src->dtype) memcpy(t->data, src->host_copy, (size_t)t->nbytes);
  else ttd_dtype_convert(t->data, (ttd_dtype)dtype, src->host_copy, (ttd_dtype)src->dtype, (size_t)src->numel);
  return t;
}

void tt_inline_fill(tt_inline_wire *w, const tt_tensor *t) {
  Ttd__V1__InlineTensor *wire = &w->wire;
  ttd__v1__inline_tensor__init(wire);
  ttd__v1__tensor_spec__init(&w->spec);
  snprintf(w->device, sizeof(w->device), "tt:%d", t->place.device);
  w->spec.dtype = (Ttd__V1__DType)t->dtype;
  w->spec.n_shape = (size_t)t->ndim;
  w->spec.shape = (int64_t *)t->shape;
  w->spec.device = w->device;
  wire->spec = &w->spec;
  if (t->host_copy_segment) { /* the daemon reads the bytes where they are */
    ttd__v1__shm_range__init(&w->range);
    w->range.segment = t->host_copy_segment;
    w->range.length = t->nbytes;
    wire->shm = &w->range;
    return;
  }
  wire->data.data = t->host_copy;
  wire->data.len = (size_t)t->nbytes;
}
