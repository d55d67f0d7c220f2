/* tt_copy_: a tensor's values written into another one's memory, as torch's dst.copy_(src):
 * the way a data-parallel step puts averaged gradients back into the card's .grad. tt_read:
 * a tensor's values written into the caller's memory (how ttd.torch fills a torch tensor). */
#include <string.h>

#include "dtype.h"
#include "move/move.h"

/* Uploads host bytes (src, of src_dtype) into dst's device tensor, by its handle. */
static tt_status upload_into(tt_tensor *dst, const tt_tensor *src) {
  Ttd__V1__UploadHeader header = TTD__V1__UPLOAD_HEADER__INIT;
  header.target_case = TTD__V1__UPLOAD_HEADER__TARGET_HANDLE;
  header.handle = dst->handle;
  header.source_dtype = (Ttd__V1__DType)src->dtype;
  Ttd__V1__ShmRange shm = TTD__V1__SHM_RANGE__INIT;
  const void *data = src->data;
  uint64_t nbytes = src->nbytes;
  if (src->shm_segment) { /* same host: the daemon copies straight from the segment */
    shm.segment = src->shm_segment;
    shm.length = nbytes;
    header.shm = &shm;
    data = NULL;
    nbytes = 0;
  }
  Ttd__V1__UploadResponse *resp = NULL;
  TT_RETURN_IF_FAILED(tt_rpc_upload(dst->client, &header, data, nbytes, &resp));
  protobuf_c_message_free_unpacked(&resp->base, NULL);
  return TT_OK;
}

tt_status tt_copy_(tt_tensor *dst, tt_tensor *src) {
  if (!dst || !src) return dst ? tt_client_fail(dst->client, TT_INVALID_ARGUMENT, "tt_copy_: src is NULL")
                               : TT_INVALID_ARGUMENT;
  tt_client *c = dst->client;
  if (src->client != c && !(src->place.is_host && dst->place.is_host)) {
    return tt_client_fail(c, TT_INVALID_ARGUMENT, "tt_copy_: src and dst are tensors of different clients; move src "
                          "to \"cpu\" first");
  }
  bool same_shape = src->ndim == dst->ndim;
  for (int d = 0; same_shape && d < src->ndim; d++) same_shape = src->shape[d] == dst->shape[d];
  if (!same_shape) return tt_client_fail(c, TT_INVALID_ARGUMENT, "tt_copy_: src and dst differ in shape");
  if (!ttd_dtype_convertible((ttd_dtype)src->dtype, (ttd_dtype)dst->dtype)) {
    return tt_client_fail(c, TT_INVALID_ARGUMENT, "tt_copy_: cannot convert %s to %s; only float32 <-> bfloat16 "
                          "converts", ttd_dtype_name((ttd_dtype)src->dtype), ttd_dtype_name((ttd_dtype)dst->dtype));
  }
  if (dst->wrapped) return tt_client_fail(c, TT_INVALID_ARGUMENT, "tt_copy_: dst lends the caller's memory, read only");
  /* src's values, on the host: itself, or a download (after the work queued on it). */
  tt_tensor *host = src->place.is_host ? tt_tensor_retain(src) : tt_to(src, "cpu");
  if (!host) return tt_errcode(c);
  tt_status st = TT_OK;
  if (dst->place.is_host) {
    if (host->dtype == dst->dtype) memmove(dst->data, host->data, (size_t)dst->nbytes);
    else ttd_dtype_convert(dst->data, (ttd_dtype)dst->dtype, host->data, (ttd_dtype)host->dtype, (size_t)dst->numel);
  } else if (!dst->handle && dst->host_copy) { /* deferred: its bytes are still here */
    if (host->dtype == dst->dtype) memcpy(dst->host_copy, host->data, (size_t)dst->nbytes);
    else ttd_dtype_convert(dst->host_copy, (ttd_dtype)dst->dtype, host->data, (ttd_dtype)host->dtype, (size_t)dst->numel);
  } else {
    /* Work queued on dst (a parameter's step, a Backward into its .grad) happens first; then
     * the bytes, converted on the card, replace its own. */
    st = tt_to_flush_pending(dst);
    if (st == TT_OK) st = upload_into(dst, host);
    if (st == TT_OK) tt_tensor_host_copy_free(dst); /* a host copy it kept is stale now */
  }
  tt_tensor_free(host);
  return st;
}

tt_status tt_read(tt_tensor *tensor, void *dst, uint64_t nbytes) {
  if (!tensor) return TT_INVALID_ARGUMENT;
  tt_client *c = tensor->client;
  if (!dst) return tt_client_fail(c, TT_INVALID_ARGUMENT, "tt_read: dst is NULL; give a buffer of tt_tensor_nbytes bytes");
  if (nbytes != tensor->nbytes) {
    return tt_client_fail(c, TT_INVALID_ARGUMENT, "tt_read: dst holds %llu bytes but the tensor %llu; give a buffer of "
                          "tt_tensor_nbytes bytes", (unsigned long long)nbytes, (unsigned long long)tensor->nbytes);
  }
  const void *here = tensor->place.is_host ? tensor->data : tensor->host_copy; /* its bytes, when they are here */
  if (here) {
    memcpy(dst, here, (size_t)nbytes);
    return TT_OK;
  }
  TT_RETURN_IF_FAILED(tt_to_flush_pending(tensor)); /* a parameter or .grad: queued work first */
  /* Same host, large enough: the daemon writes into a pooled segment, then one copy here,
   * which beats streaming the bytes through the call (as tt_to's download does). */
  uint64_t segment = 0;
  void *staged = tt_shm_alloc(c, nbytes, TT_SHM_MIN_BYTES, &segment);
  tt_status st = tt_rpc_download(c, tensor->handle, tensor->dtype, staged ? staged : dst, nbytes, segment);
  if (staged) {
    if (st == TT_OK) memcpy(dst, staged, (size_t)nbytes);
    tt_shm_free(c, staged);
  }
  return st;
}
