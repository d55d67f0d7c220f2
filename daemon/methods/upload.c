/* Upload: a client stream of chunks host -> device, into a new or an allocated tensor.
 * Bytes arrive in order; when their dtype differs from the tensor's (float32 into
 * bfloat16) they are converted element by element, carrying a split element across
 * chunks. A stream that breaks or ends short frees a new tensor; nothing leaks. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "methods/methods.h"
#include "rpc/tensor_proto.h"
#include "wire/wire_frame.h"

typedef struct upload_state {
  ttd_tensor *tensor;     /* one reference */
  bool is_new;            /* created by this upload; added to the session at the end */
  bool writing;           /* an allocated tensor marked written (ttd_tensor_write_begin) */
  uint64_t handle;        /* for an existing tensor */
  ttd_dtype source_dtype;
  uint64_t expected;      /* source bytes the stream must deliver */
  uint64_t received;      /* source bytes received so far */
  uint64_t written;       /* device bytes written so far */
  unsigned char carry[8]; /* bytes of a source element split across chunks */
  size_t carry_len;
  unsigned char *scratch; /* converted elements */
  size_t scratch_cap;
  bool from_shm;          /* every byte came from shared memory with the header */
} upload_state;

static void state_free(ttd_call *call) {
  upload_state *st = call->stream;
  if (!st) return;
  if (st->writing) ttd_tensor_write_end(st->tensor);
  ttd_tensor_release(st->tensor);
  free(st->scratch);
  free(st);
  call->stream = NULL;
}

static ttd_status_t begin(ttd_call *call, const Ttd__V1__UploadHeader *header, upload_state *st) {
  ttd_dtype tensor_dtype;
  if (header->source_dtype && ttd_dtype_size((ttd_dtype)header->source_dtype) == 0) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                           "source_dtype %d is not a dtype; use DTYPE_FLOAT32, DTYPE_BFLOAT16 or DTYPE_INT32, or leave "
                           "it unspecified for the tensor's own", (int)header->source_dtype);
  }
  if (header->target_case == TTD__V1__UPLOAD_HEADER__TARGET_SPEC) {
    ttd_tensor_spec spec;
    TTD_RETURN_IF_ERROR(ttd_tensor_spec_from_proto(call->core, header->spec, &spec));
    tensor_dtype = spec.dtype;
    st->source_dtype = header->source_dtype ? (ttd_dtype)header->source_dtype : tensor_dtype;
    if (!ttd_dtype_convertible(st->source_dtype, tensor_dtype)) goto not_convertible;
    TTD_RETURN_IF_ERROR(ttd_tensor_create(call->core->backend, call->session->quota, &spec, &st->tensor));
    st->is_new = true;
  } else if (header->target_case == TTD__V1__UPLOAD_HEADER__TARGET_HANDLE) {
    TTD_RETURN_IF_ERROR(ttd_session_tensor_lookup(call->session, header->handle, &st->tensor));
    st->handle = header->handle;
    if (!ttd_tensor_write_begin(st->tensor)) { /* a program reading it must not see its bytes change */
      return ttd_make_status(GRPC_STATUS_FAILED_PRECONDITION,
                             "tensor %016" PRIx64 " is being read by a running Execute or Backward, or written by "
                             "another Upload: upload into it after that call answers, or into a new tensor",
                             header->handle);
    }
    st->writing = true;
    tensor_dtype = st->tensor->spec.dtype;
    st->source_dtype = header->source_dtype ? (ttd_dtype)header->source_dtype : tensor_dtype;
    if (!ttd_dtype_convertible(st->source_dtype, tensor_dtype)) goto not_convertible;
  } else {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                           "Upload header names no target: set either handle (an allocated tensor) or spec (a new one)");
  }
  st->expected = st->tensor->spec.numel * ttd_dtype_size(st->source_dtype);
  return TTD_OK;
not_convertible:
  return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "cannot upload %s bytes into a %s tensor; send %s%s",
                         ttd_dtype_name((ttd_dtype)header->source_dtype), ttd_dtype_name(tensor_dtype),
                         ttd_dtype_name(tensor_dtype), tensor_dtype == TTD_DTYPE_BFLOAT16 ? " or float32" : "");
}

static ttd_status_t write_device(upload_state *st, const void *src, uint64_t bytes) {
  ttd_backend *backend = st->tensor->backend;
  TTD_RETURN_IF_ERROR(backend->vtable->buffer_write(backend, st->tensor->buffer, st->written, src, bytes));
  st->written += bytes;
  return TTD_OK;
}

/* Converts whole source elements into the tensor's dtype and writes them. */
static ttd_status_t write_converted(upload_state *st, const unsigned char *data, size_t len) {
  size_t in_size = ttd_dtype_size(st->source_dtype);
  size_t out_size = ttd_dtype_size(st->tensor->spec.dtype);
  if (st->carry_len) {
    size_t take = in_size - st->carry_len < len ? in_size - st->carry_len : len;
    memcpy(st->carry + st->carry_len, data, take);
    st->carry_len += take;
    data += take;
    len -= take;
    if (st->carry_len < in_size) return TTD_OK;
    unsigned char one[8];
    ttd_dtype_convert(one, st->tensor->spec.dtype, st->carry, st->source_dtype, 1);
    st->carry_len = 0;
    TTD_RETURN_IF_ERROR(write_device(st, one, out_size));
  }
  size_t elems = len / in_size;
  if (elems) {
    size_t need = elems * out_size;
    if (need > st->scratch_cap) {
      unsigned char *grown = realloc(st->scratch, need);
      if (!grown) return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
      st->scratch = grown;
      st->scratch_cap = need;
    }
    ttd_dtype_convert(st->scratch, st->tensor->spec.dtype, data, st->source_dtype, elems);
    TTD_RETURN_IF_ERROR(write_device(st, st->scratch, need));
  }
  size_t rest = len - elems * in_size;
  memcpy(st->carry, data + elems * in_size, rest);
  st->carry_len = rest;
  return TTD_OK;
}

/* INVALID_ARGUMENT if `more` bytes would run past the tensor's end. */
static ttd_status_t check_room(const upload_state *st, uint64_t more) {
  if (more <= st->expected - st->received) return TTD_OK;
  return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                         "upload runs past the tensor's end: it holds %" PRIu64 " %s bytes, the stream sent %" PRIu64,
                         st->expected, ttd_dtype_name(st->source_dtype), st->received + more);
}

/* The next len source bytes of the tensor, from a message or a shared-memory range. */
static ttd_status_t consume(ttd_call *call, upload_state *st, const unsigned char *data, uint64_t len) {
  TTD_RETURN_IF_ERROR(check_room(st, len));
  st->received += len;
  atomic_fetch_add_explicit(&call->core->metrics.bytes_to_device, len, memory_order_relaxed);
  if (len == 0) return TTD_OK;
  if (st->source_dtype == st->tensor->spec.dtype) return write_device(st, data, len);
  return write_converted(st, data, (size_t)len);
}

/* Starts the stream from its header; shared memory moves every byte at once. */
static ttd_status_t take_header(ttd_call *call, const Ttd__V1__UploadHeader *header) {
  upload_state *st = calloc(1, sizeof(*st));
  if (!st) return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  call->stream = st;
  TTD_RETURN_IF_ERROR(begin(call, header, st));
  if (!header->shm) return TTD_OK;
  st->from_shm = true;
  const Ttd__V1__ShmRange *r = header->shm;
  ttd_shm_segment *segment = NULL;
  TTD_RETURN_IF_ERROR(ttd_session_segment_lookup(call->session, r->segment, &segment));
  ttd_status_t status = ttd_shm_segment_check_range(segment, r->offset, r->length, st->expected);
  if (!status) status = consume(call, st, segment->addr + r->offset, r->length);
  ttd_shm_segment_release(segment); /* held until the copy is done: a release meanwhile waits */
  return status;
}

/* One UploadRequest walked in place (wire_frame.h): the header (field 1) is small and
 * unpacked; the data (field 2) goes from the received slices to the device in one copy. */
typedef struct upload_walk {
  ttd_call *call;
  uint8_t *header;          /* gathered header bytes */
  uint64_t header_len;
  bool header_seen, data_seen;
  ttd_status_t status;
} upload_walk;

static int on_number(void *ctx, uint32_t field, uint64_t value) {
  (void)ctx;
  (void)field;
  (void)value;
  return 0; /* UploadRequest has no number fields: unknown ones are skipped, as protobuf does */
}

static int on_bytes(void *ctx, uint32_t field, const uint8_t *data, size_t len, uint64_t at, uint64_t total) {
  upload_walk *w = ctx;
  ttd_call *call = w->call;
  if (field == 1) { /* header */
    if (w->data_seen || call->stream || (at == 0 && w->header_seen)) {
      w->status = ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                                  "only the first Upload message may carry a header, ahead of its data");
      return 1;
    }
    if (at == 0) {
      w->header_seen = true;
      w->header = malloc(total ? total : 1);
      w->header_len = total;
      if (!w->header) {
        w->status = ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
        return 1;
      }
    }
    if (len) memcpy(w->header + at, data, len); /* the header may span slices */
    if (at + len < total) return 0;
    Ttd__V1__UploadHeader *header = ttd__v1__upload_header__unpack(NULL, w->header_len, w->header);
    if (!header) {
      w->status = ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                                  "the Upload header is not a valid ttd.v1.UploadHeader message");
      return 1;
    }
    w->status = take_header(call, header);
    ttd__v1__upload_header__free_unpacked(header, NULL);
    return w->status ? 1 : 0;
  }
  if (field == 2) { /* data */
    w->data_seen = true;
    upload_state *st = call->stream;
    if (!st) {
      w->status = ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                                  "the first Upload message must carry a header naming the target tensor");
      return 1;
    }
    if (len && st->from_shm) {
      w->status = ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                                  "an Upload from shared memory carries no data in its messages; send the header alone");
      return 1;
    }
    if (at == 0) w->status = check_room(st, total); /* the whole field, before its first slice */
    if (!w->status) w->status = consume(call, st, data, len);
    return w->status ? 1 : 0;
  }
  return 0;
}

ttd_status_t ttd_upload_message(ttd_call *call, grpc_byte_buffer *message) {
  static const ttd_wire_visitor visitor = {on_number, on_bytes};
  upload_walk w = {.call = call};
  int rc = ttd_wire_walk(message, &visitor, &w);
  free(w.header);
  if (w.status) return w.status;
  if (rc) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                           "an Upload message is not a valid ttd.v1.UploadRequest (truncated or garbage bytes); "
                           "send messages generated from proto/ttd/v1/ttd.proto");
  }
  if (!call->stream) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                           "the first Upload message must carry a header naming the target tensor");
  }
  return TTD_OK;
}

ttd_status_t ttd_upload_end(ttd_call *call, ProtobufCMessage **out_response) {
  upload_state *st = call->stream;
  if (!st) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                           "Upload stream ended before its header: send an UploadRequest with header first");
  }
  ttd_status_t status = TTD_OK;
  if (st->received != st->expected) {
    status = ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                             "Upload stream ended after %" PRIu64 " of %" PRIu64 " bytes; nothing was kept",
                             st->received, st->expected);
  }
  Ttd__V1__UploadResponse *resp = NULL;
  if (!status) {
    resp = ttd_call_alloc(call, sizeof(*resp));
    if (!resp) status = ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  }
  uint64_t handle = st->handle;
  if (!status && st->is_new) status = ttd_session_tensor_add(call->session, st->tensor, &handle);
  if (!status) {
    ttd__v1__upload_response__init(resp);
    resp->bytes_received = st->received;
    resp->tensor = ttd_tensor_info_to_proto(call, handle, &st->tensor->spec);
    if (!resp->tensor) status = ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  }
  if (status && st->is_new && handle) {
    uint64_t n, bytes;
    ttd_status_free(ttd_session_tensors_free(call->session, &handle, 1, &n, &bytes));
  }
  state_free(call);
  if (!status) *out_response = &resp->base;
  return status;
}

void ttd_upload_abort(ttd_call *call) { state_free(call); }
