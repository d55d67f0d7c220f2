/* Host and device tensors of libttclient: creation, storage, reference counting, accessors. */
#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "tensor/tensor.h"

size_t tt_dtype_size(tt_dtype dtype) { return ttd_dtype_size((ttd_dtype)dtype); }

tt_tensor *tt_tensor_alloc(tt_client *client) {
  tt_tensor *t = calloc(1, sizeof(*t));
  if (!t) {
    tt_client_fail(client, TT_RESOURCE_EXHAUSTED, "out of host memory");
    return NULL;
  }
  atomic_init(&t->refs, 1);
  t->client = tt_client_retain(client);
  return t;
}

tt_tensor *tt_tensor_retain(tt_tensor *tensor) {
  if (tensor) atomic_fetch_add_explicit(&tensor->refs, 1, memory_order_relaxed);
  return tensor;
}

tt_tensor *tt_tensor_like(const tt_tensor *src, const tt_place *place, tt_dtype dtype) {
  tt_tensor *t = tt_tensor_alloc(src->client);
  if (!t) return NULL;
  if (tt_tensor_describe(src->client, t, dtype, src->shape, src->ndim) != TT_OK) {
    tt_tensor_free(t);
    return NULL;
  }
  t->place = *place;
  tt_place_format(place, t->device_name, sizeof(t->device_name));
  return t;
}

tt_status tt_tensor_describe(tt_client *client, tt_tensor *tensor, tt_dtype dtype, const int64_t *shape, int ndim) {
  size_t esize = tt_dtype_size(dtype);
  if (esize == 0) {
    return tt_client_fail(client, TT_INVALID_ARGUMENT, "dtype %d is not supported; use TT_FLOAT32, TT_BFLOAT16 or TT_INT32",
                          (int)dtype);
  }
  if (ndim < 0 || ndim > TT_MAX_DIMS || (ndim > 0 && !shape)) {
    return tt_client_fail(client, TT_INVALID_ARGUMENT, "ndim is %d; use 0..%d with a shape array", ndim, TT_MAX_DIMS);
  }
  uint64_t numel = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0) {
      return tt_client_fail(client, TT_INVALID_ARGUMENT, "dim %d of the shape is %" PRId64 "; dims must be >= 0", i,
                            shape[i]);
    }
    if (__builtin_mul_overflow(numel, (uint64_t)shape[i], &numel) || numel > (uint64_t)INT64_MAX / esize) {
      return tt_client_fail(client, TT_INVALID_ARGUMENT, "shape has too many elements (overflow at dim %d)", i);
    }
    tensor->shape[i] = shape[i];
  }
  tensor->dtype = dtype;
  tensor->ndim = ndim;
  tensor->numel = numel;
  tensor->nbytes = numel * esize;
  return TT_OK;
}

/* Host data for a tensor of bytes (shared memory when large and available); NULL if out
 * of memory. Freed with host_free. */
static void *host_alloc(tt_client *client, uint64_t bytes, uint64_t *out_segment, size_t *out_block) {
  *out_segment = 0;
  *out_block = 0;
  if (bytes > SIZE_MAX) return NULL;
  void *data = tt_shm_alloc(client, bytes, TT_SHM_MIN_BYTES, out_segment);
  return data ? data : ttd_block_cache_alloc(&client->blocks, (size_t)bytes, out_block);
}

static void host_free(tt_client *client, void *data, uint64_t segment, size_t block) {
  if (segment) tt_shm_free(client, data);
  else ttd_block_cache_free(&client->blocks, data, block);
}

void tt_tensor_host_copy_free(tt_tensor *t) {
  if (t->host_copy_segment) tt_shm_free(t->client, t->host_copy);
  else free(t->host_copy);
  t->host_copy = NULL;
  t->host_copy_segment = 0;
}

/* A new host tensor struct of dtype and shape with no storage yet; NULL on error. */
static tt_tensor *host_struct(tt_client *client, tt_dtype dtype, const int64_t *shape, int ndim) {
  tt_tensor *t = tt_tensor_alloc(client);
  if (!t) return NULL;
  t->place.is_host = true;
  strcpy(t->device_name, "cpu");
  if (tt_tensor_describe(client, t, dtype, shape, ndim) != TT_OK) {
    tt_tensor_free(t);
    return NULL;
  }
  return t;
}

tt_tensor *tt_tensor_host_uninit(tt_client *client, tt_dtype dtype, const int64_t *shape, int ndim) {
  tt_tensor *t = host_struct(client, dtype, shape, ndim);
  if (!t) return NULL;
  if (!(t->data = host_alloc(client, t->nbytes, &t->shm_segment, &t->host_block))) {
    tt_client_fail(client, TT_RESOURCE_EXHAUSTED, "out of host memory for a %" PRIu64 "-byte tensor", t->nbytes);
    tt_tensor_free(t);
    return NULL;
  }
  return t;
}

tt_tensor *tt_tensor_from_host(tt_client *client, const void *data, tt_dtype dtype, const int64_t *shape, int ndim) {
  tt_tensor *t = tt_tensor_host_uninit(client, dtype, shape, ndim);
  if (!t) return NULL;
  if (data) memcpy(t->data, data, (size_t)t->nbytes);
  else memset(t->data, 0, (size_t)t->nbytes);
  return t;
}

tt_tensor *tt_tensor_wrap_host(tt_client *client, void *data, tt_dtype dtype, const int64_t *shape, int ndim,
                               void (*release)(void *ctx), void *ctx) {
  static max_align_t no_elements; /* data of an empty tensor given none */
  if (!client) return NULL;
  tt_tensor *t = host_struct(client, dtype, shape, ndim);
  if (!t) return NULL;
  size_t esize = tt_dtype_size(dtype);
  if (!data && t->numel) {
    tt_client_fail(client, TT_INVALID_ARGUMENT,
                   "tt_tensor_wrap_host: data is NULL for a tensor of %" PRIu64 " elements; pass the memory of its "
                   "%" PRIu64 " bytes (NULL only for a shape with a 0 dim)",
                   t->numel, t->nbytes);
    tt_tensor_free(t);
    return NULL;
  }
  if ((uintptr_t)data % esize) {
    tt_client_fail(client, TT_INVALID_ARGUMENT,
                   "tt_tensor_wrap_host: data %p is not aligned to the %zu bytes of a %s element; "
                   "pass aligned memory or copy it with tt_tensor_from_host",
                   data, esize, ttd_dtype_name((ttd_dtype)dtype));
    tt_tensor_free(t);
    return NULL;
  }
  t->data = data ? data : &no_elements;
  t->wrapped = true;
  t->release = release;
  t->release_ctx = ctx;
  return t;
}

tt_tensor *tt_tensor_empty(tt_client *client, tt_dtype dtype, const int64_t *shape, int ndim, const char *device) {
  tt_place place;
  if (tt_place_parse(device, &place) != 0) {
    tt_client_fail(client, TT_INVALID_ARGUMENT, "device '%s' is not valid; use cpu, tt, tt:N or tt:N/l1",
                   device ? device : "(null)");
    return NULL;
  }
  if (place.is_host) return tt_tensor_from_host(client, NULL, dtype, shape, ndim);
  tt_tensor *t = tt_tensor_alloc(client);
  if (!t) return NULL;
  if (tt_tensor_describe(client, t, dtype, shape, ndim) != TT_OK) {
    tt_tensor_free(t);
    return NULL;
  }
  t->place = place;
  tt_place_format(&place, t->device_name, sizeof(t->device_name));
  char device_name[16];
  Ttd__V1__TensorSpec spec = TTD__V1__TENSOR_SPEC__INIT;
  spec.location = tt_place_wire(&place, device_name, sizeof(device_name));
  spec.dtype = (Ttd__V1__DType)dtype;
  spec.n_shape = (size_t)ndim;
  spec.shape = t->shape;
  spec.device = device_name;
  Ttd__V1__AllocateRequest req = TTD__V1__ALLOCATE_REQUEST__INIT;
  req.spec = &spec;
  ProtobufCMessage *out = NULL;
  if (tt_rpc_unary(client, TT_RPC_ALLOCATE, &req.base, &ttd__v1__allocate_response__descriptor, &out) != TT_OK) {
    tt_tensor_free(t);
    return NULL;
  }
  t->handle = ((Ttd__V1__AllocateResponse *)out)->tensor->handle;
  protobuf_c_message_free_unpacked(out, NULL);
  return t;
}

void tt_tensor_free(tt_tensor *tensor) {
  if (!tensor) return;
  if (atomic_fetch_sub_explicit(&tensor->refs, 1, memory_order_acq_rel) != 1) return;
  if (tensor->grad_fn) tensor->grad_fn->release(tensor->grad_fn);
  if (tensor->run) tensor->run->release(tensor->run);
  tt_tensor_free(tensor->from_output);
  tt_tensor_free(tensor->acc_grad);
  free(tensor->grad);
  tt_tensor_host_copy_free(tensor);
  if (tensor->wrapped) {
    if (tensor->release) tensor->release(tensor->release_ctx); /* the memory goes back to its owner */
  } else if (tensor->place.is_host) {
    host_free(tensor->client, tensor->data, tensor->shm_segment, tensor->host_block);
  } else if (tensor->handle && !tensor->borrowed) {
    tt_rpc_free_quiet(tensor->client, &tensor->handle, 1); /* a session already closed has freed it anyway */
  }
  tt_client_release(tensor->client);
  free(tensor);
}

tt_client *tt_tensor_client(const tt_tensor *tensor) { return tensor->client; }
tt_dtype tt_tensor_dtype(const tt_tensor *tensor) { return tensor->dtype; }
int tt_tensor_ndim(const tt_tensor *tensor) { return tensor->ndim; }
const int64_t *tt_tensor_shape(const tt_tensor *tensor) { return tensor->shape; }
uint64_t tt_tensor_numel(const tt_tensor *tensor) { return tensor->numel; }
uint64_t tt_tensor_nbytes(const tt_tensor *tensor) { return tensor->nbytes; }
const char *tt_tensor_device(const tt_tensor *tensor) { return tensor->device_name; }
int tt_tensor_is_host(const tt_tensor *tensor) { return tensor->place.is_host; }
void *tt_tensor_data(tt_tensor *tensor) { return tensor->place.is_host ? tensor->data : NULL; }
