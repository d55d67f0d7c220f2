/* Download: a server stream of chunks device -> host. The first message carries the
 * tensor info and the total byte count. The tensor is referenced for the whole stream,
 * so a concurrent Free cannot pull the memory from under it, until the session closes:
 * then the stream lets it go at once (its sends pin host memory only, ttd_host_pin). It
 * holds the tensor's read mark as long, so that no Upload or optimizer step writes the
 * bytes it sends: the client gets one version of the tensor, never a torn one. A session
 * has at most TTD_SESSION_MAX_DOWNLOADS open, and the buffers a stream copies through (a
 * conversion, or a backend without host views) are charged to its quota while it lasts. */
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>

#include "methods/methods.h"
#include "rpc/tensor_proto.h"
#include "wire/wire_frame.h"

#define DEFAULT_CHUNK_BYTES (1u << 20)
#define MAX_CHUNK_BYTES (4u << 20)

typedef struct download_state {
  pthread_mutex_t lock; /* tensor against a cancel from the closing session's thread */
  ttd_tensor *tensor;   /* one reference; NULL once cancelled */
  bool reading;         /* the tensor's read mark is held (ttd_tensor_read_begin) */
  ttd_session *session; /* counted in its downloads (the call's session, which outlives the stream) */
  uint64_t charged;     /* copy buffers' bytes charged to the session's quota */
  ttd_dtype target;
  size_t out_size, in_size;
  uint64_t total;       /* target bytes */
  uint64_t sent;
  size_t chunk;         /* bytes per message, a multiple of out_size */
  unsigned char *raw;   /* device bytes before conversion */
  Ttd__V1__DownloadResponse message;
  bool shm;             /* written to shared memory: one message without data */
} download_state;

/* Reads chunk bytes of target data at st->sent into out (converting when the dtypes differ). */
static ttd_status_t read_chunk(download_state *st, unsigned char *out, size_t n) {
  ttd_backend *backend = st->tensor->backend;
  if (st->target == st->tensor->spec.dtype) return backend->vtable->buffer_read(backend, st->tensor->buffer, st->sent, out, n);
  size_t elems = n / st->out_size;
  uint64_t offset = st->sent / st->out_size * st->in_size;
  TTD_RETURN_IF_ERROR(backend->vtable->buffer_read(backend, st->tensor->buffer, offset, st->raw, elems * st->in_size));
  ttd_dtype_convert(out, st->target, st->raw, st->tensor->spec.dtype, elems);
  return TTD_OK;
}

/* The same-host fast path: every byte straight into the client's segment, then one
 * message with the info and no data. */
static ttd_status_t to_shared_memory(ttd_call *call, download_state *st, const Ttd__V1__ShmRange *r) {
  ttd_shm_segment *segment = NULL;
  TTD_RETURN_IF_ERROR(ttd_session_segment_lookup(call->session, r->segment, &segment));
  ttd_status_t status = ttd_shm_segment_check_range(segment, r->offset, r->length, st->total);
  while (!status && st->sent < st->total) {
    size_t n = st->total - st->sent < st->chunk ? (size_t)(st->total - st->sent) : st->chunk;
    if (st->target == st->tensor->spec.dtype) n = (size_t)(st->total - st->sent); /* one copy */
    status = read_chunk(st, segment->addr + r->offset + st->sent, n);
    st->sent += n;
  }
  ttd_shm_segment_release(segment);
  atomic_fetch_add_explicit(&call->core->metrics.bytes_to_host, st->total, memory_order_relaxed);
  st->shm = true;
  return status;
}

ttd_status_t ttd_download_begin(ttd_call *call, const ProtobufCMessage *request) {
  const Ttd__V1__DownloadRequest *req = (const Ttd__V1__DownloadRequest *)request;
  if (req->chunk_bytes > MAX_CHUNK_BYTES) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "chunk_bytes %u is above the limit of %u; use 0 for the default",
                           req->chunk_bytes, MAX_CHUNK_BYTES);
  }
  download_state *st = calloc(1, sizeof(*st));
  if (!st) return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  pthread_mutex_init(&st->lock, NULL);
  call->stream = st;
  if (atomic_fetch_add(&call->session->downloads, 1) >= TTD_SESSION_MAX_DOWNLOADS) {
    atomic_fetch_sub(&call->session->downloads, 1);
    return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED,
                           "session %016" PRIx64 " has %d Downloads open already: read them to their end (or cancel "
                           "them) before starting more",
                           call->session->id, TTD_SESSION_MAX_DOWNLOADS);
  }
  st->session = call->session;
  TTD_RETURN_IF_ERROR(ttd_session_tensor_lookup(call->session, req->handle, &st->tensor));
  if (!(st->reading = ttd_tensor_read_begin(st->tensor))) {
    return ttd_make_status(GRPC_STATUS_FAILED_PRECONDITION,
                           "tensor %016" PRIx64 " is being written by an Upload, a ZeroGrad or an optimizer step of "
                           "this session: download it after that call answers", req->handle);
  }
  ttd_dtype source = st->tensor->spec.dtype;
  if (req->target_dtype && ttd_dtype_size((ttd_dtype)req->target_dtype) == 0) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                           "target_dtype %d is not a dtype; use DTYPE_FLOAT32, DTYPE_BFLOAT16 or DTYPE_INT32, or leave "
                           "it unspecified for the tensor's own", (int)req->target_dtype);
  }
  st->target = req->target_dtype ? (ttd_dtype)req->target_dtype : source;
  if (!ttd_dtype_convertible(source, st->target)) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "cannot download a %s tensor as %s; ask for %s%s",
                           ttd_dtype_name(source), ttd_dtype_name(st->target), ttd_dtype_name(source),
                           source == TTD_DTYPE_BFLOAT16 ? " or float32" : "");
  }
  st->in_size = ttd_dtype_size(source);
  st->out_size = ttd_dtype_size(st->target);
  st->total = st->tensor->spec.numel * st->out_size;
  size_t chunk = req->chunk_bytes ? req->chunk_bytes : DEFAULT_CHUNK_BYTES;
  chunk -= chunk % st->out_size;
  st->chunk = chunk ? chunk : st->out_size;
  size_t first = st->total < st->chunk ? (size_t)st->total : st->chunk;
  size_t raw_bytes = source != st->target ? first / st->out_size * st->in_size + 1 : 0;
  bool copies = source != st->target || !st->tensor->backend->vtable->buffer_host_view;
  uint64_t charge = raw_bytes + (copies && !req->shm ? first : 0); /* a message in flight at a time */
  ttd_status_t status = charge ? ttd_quota_charge(call->session->quota, charge) : TTD_OK;
  if (status) {
    ttd_status_t named = ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED,
                                         "this Download copies through %" PRIu64 " bytes of buffers, which with the "
                                         "session's other memory pass its quota (ask for smaller chunk_bytes, or "
                                         "free tensors): %s", charge, ttd_status_message(status));
    ttd_status_free(status);
    return named;
  }
  st->charged = charge;
  if (raw_bytes && !(st->raw = malloc(raw_bytes))) {
    return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  }
  ttd__v1__download_response__init(&st->message);
  st->message.tensor = ttd_tensor_info_to_proto(call, req->handle, &st->tensor->spec);
  TTD_CHECK_ALLOC(st->message.tensor);
  st->message.total_bytes = st->total;
  if (req->shm) return to_shared_memory(call, st, req->shm);
  return TTD_OK;
}

static void release_pin(void *pin) { ((ttd_host_pin *)pin)->release(pin); }

/* The next message's data: a view pinned into the tensor's memory (*out_view set), or a copy. */
static ttd_status_t next_data(download_state *st, size_t n, grpc_slice *out, bool *out_view) {
  *out_view = false;
  if (!st->tensor) {
    return ttd_make_status(GRPC_STATUS_FAILED_PRECONDITION,
                           "the session was closed (by its client, an admin or its lease) during this stream");
  }
  ttd_backend *backend = st->tensor->backend;
  ttd_host_pin *pin = NULL;
  const void *view = st->target == st->tensor->spec.dtype && backend->vtable->buffer_host_view
                         ? backend->vtable->buffer_host_view(backend, st->tensor->buffer, st->sent, n, &pin)
                         : NULL;
  if (view) { /* zero copy */
    *out = grpc_slice_new_with_user_data((void *)view, n, release_pin, pin);
    *out_view = true;
    return TTD_OK;
  }
  *out = grpc_slice_malloc(n);
  ttd_status_t status = read_chunk(st, GRPC_SLICE_START_PTR(*out), n);
  if (status) grpc_slice_unref(*out);
  return status;
}

ttd_status_t ttd_download_next(ttd_call *call, grpc_byte_buffer **out_message, bool *out_last) {
  download_state *st = call->stream;
  *out_message = NULL;
  if (st->shm) { /* the bytes are in the client's segment already: info only */
    size_t len = ttd__v1__download_response__get_packed_size(&st->message);
    grpc_slice slice = grpc_slice_malloc(len);
    ttd__v1__download_response__pack(&st->message, GRPC_SLICE_START_PTR(slice));
    *out_message = grpc_raw_byte_buffer_create(&slice, 1);
    grpc_slice_unref(slice);
    *out_last = true;
    return TTD_OK;
  }
  uint64_t left = st->total - st->sent;
  size_t n = left < st->chunk ? (size_t)left : st->chunk;
  grpc_slice data;
  bool view;
  pthread_mutex_lock(&st->lock);
  ttd_status_t status = next_data(st, n, &data, &view);
  pthread_mutex_unlock(&st->lock);
  if (status) return status;
  /* Views of the same buffer follow: the poller sends them (rpc/call.h). A copy, a
   * conversion or a real card's read stays on the work queue. */
  call->light_events = view;
  /* The info and total travel in the first message only, ahead of the data field. */
  *out_message = ttd_wire_frame(st->sent == 0 ? &st->message.base : NULL, 3, data);
  st->sent += n;
  atomic_fetch_add_explicit(&call->core->metrics.bytes_to_host, n, memory_order_relaxed);
  *out_last = st->sent == st->total;
  return TTD_OK;
}

void ttd_download_done(ttd_call *call) {
  download_state *st = call->stream;
  if (!st) return;
  if (st->reading) ttd_tensor_read_end(st->tensor);
  ttd_tensor_release(st->tensor);
  if (st->session) {
    ttd_quota_refund(st->session->quota, st->charged);
    atomic_fetch_sub(&st->session->downloads, 1);
  }
  pthread_mutex_destroy(&st->lock);
  free(st->raw);
  free(st);
  call->stream = NULL;
}

void ttd_download_cancel(ttd_call *call) {
  download_state *st = call->stream;
  pthread_mutex_lock(&st->lock);
  ttd_tensor *tensor = st->tensor;
  bool reading = st->reading;
  st->tensor = NULL;
  st->reading = false;
  pthread_mutex_unlock(&st->lock);
  if (reading) ttd_tensor_read_end(tensor);
  ttd_tensor_release(tensor);
}
