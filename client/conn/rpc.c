/* gRPC calls of libttclient: unary calls, the Upload client stream and the Download
 * server stream, each on its own pluck completion queue so that threads never share one.
 * A finished call's queue goes back to the client's small cache for the next call. */
#include <grpc/byte_buffer_reader.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire/wire_frame.h"
#include "conn/conn.h"

static const char *const rpc_paths[TT_RPC_COUNT] = {
    "/ttd.v1.Device/OpenSession", "/ttd.v1.Device/KeepAlive", "/ttd.v1.Device/CloseSession",
    "/ttd.v1.Device/ListDevices", "/ttd.v1.Device/Allocate",  "/ttd.v1.Device/Upload",
    "/ttd.v1.Device/Download",    "/ttd.v1.Device/Move",      "/ttd.v1.Device/Free",
    "/ttd.v1.Device/Compile",     "/ttd.v1.Device/Execute",   "/ttd.v1.Device/Backward",
    "/ttd.v1.Device/ReleaseRun",  "/ttd.v1.Device/ZeroGrad",  "/ttd.v1.Device/OptimizerStep",
    "/ttd.v1.Device/ListSessions", "/ttd.v1.Device/KillSession", "/ttd.v1.Device/OptimizerState",
};

void tt_rpc_register(tt_client *client) {
  for (int i = 0; i < TT_RPC_COUNT; i++) {
    client->registered[i] = grpc_channel_register_call(client->channel, rpc_paths[i], NULL, NULL);
  }
}

typedef struct rpc {
  tt_client *client;
  grpc_completion_queue *cq;
  grpc_call *call;
  grpc_metadata md[3];
  size_t md_count;
  grpc_metadata_array initial_md, trailing_md;
  grpc_status_code status;
  grpc_slice details;
  int tag;
  int pending; /* batches started and not plucked yet: the queue is reusable only at 0 */
  gpr_timespec give_up; /* a deadline kept here, not sent (see rpc_start) */
  ttd_cq_spin *spin; /* poll for the answer before sleeping (cq_spin.h): unary calls */
} rpc;

static gpr_timespec deadline_after(int64_t ms, gpr_clock_type clock) {
  if (ms <= 0) return gpr_inf_future(clock);
  return gpr_time_add(gpr_now(clock), gpr_time_from_millis(ms, GPR_TIMESPAN));
}

/* Device work waits its turn in the daemon's queue, which drops it once its deadline has
 * passed: only these calls send their deadline. The list is the DEVICE_WORK entries of the
 * daemon's method table (daemon/methods/table.c): a new device method goes in both. */
static bool daemon_uses_deadline(tt_rpc_method method) {
  return method == TT_RPC_EXECUTE || method == TT_RPC_BACKWARD || method == TT_RPC_ZERO_GRAD ||
         method == TT_RPC_OPTIMIZER_STEP || method == TT_RPC_OPTIMIZER_STATE;
}

#define CLOSED_MESSAGE "this client was disconnected (tt_disconnect): its session and device tensors are gone; connect again"

static void cq_destroy(grpc_completion_queue *cq) {
  grpc_completion_queue_shutdown(cq);
  while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_past(GPR_CLOCK_REALTIME), NULL).type != GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(cq);
}

/* A queue from the cache, or a new one. */
static grpc_completion_queue *cq_take(tt_client *client) {
  pthread_mutex_lock(&client->cq_lock);
  grpc_completion_queue *cq = client->cq_count > 0 ? client->cq_free[--client->cq_count] : NULL;
  pthread_mutex_unlock(&client->cq_lock);
  return cq ? cq : grpc_completion_queue_create_for_pluck(NULL);
}

/* Keeps an empty queue for the next call, unless the cache is full or the client closed. A
 * queue that may still hold an event is destroyed: a later call could pluck it, its tag being
 * an address on some stack. */
static void cq_give_back(tt_client *client, grpc_completion_queue *cq, bool empty) {
  if (empty) {
    pthread_mutex_lock(&client->cq_lock);
    if (!client->closed && client->cq_count < TT_CQ_CACHE) {
      client->cq_free[client->cq_count++] = cq;
      cq = NULL;
    }
    pthread_mutex_unlock(&client->cq_lock);
  }
  if (cq) cq_destroy(cq);
}

void tt_rpc_cq_cache_clear(tt_client *client) {
  pthread_mutex_lock(&client->cq_lock);
  int n = client->cq_count;
  client->cq_count = 0;
  pthread_mutex_unlock(&client->cq_lock);
  for (int i = 0; i < n; i++) cq_destroy(client->cq_free[i]);
}

/* Other calls keep theirs here and cancel the call when it passes, with the status a sent
 * deadline gives: a deadline sent costs a timer on each side of every call. */
static void rpc_start(rpc *r, tt_client *client, tt_rpc_method method, int64_t timeout_ms) {
  memset(r, 0, sizeof(*r));
  r->client = client;
  r->cq = cq_take(client);
  bool sent = daemon_uses_deadline(method);
  r->give_up = deadline_after(sent ? 0 : timeout_ms, GPR_CLOCK_MONOTONIC);
  r->call = grpc_channel_create_registered_call(client->channel, NULL, GRPC_PROPAGATE_DEFAULTS, r->cq,
                                                client->registered[method],
                                                deadline_after(sent ? timeout_ms : 0, GPR_CLOCK_REALTIME), NULL);
  if (client->session_hex[0]) {
    r->md[0].key = grpc_slice_from_static_string("ttd-session");
    r->md[0].value = grpc_slice_from_static_string(client->session_hex);
    r->md[1].key = grpc_slice_from_static_string("ttd-instance");
    r->md[1].value = grpc_slice_from_static_string(client->instance_id);
    r->md_count = 2;
  }
  if (client->authorization[0]) {
    r->md[r->md_count].key = grpc_slice_from_static_string("authorization");
    r->md[r->md_count].value = grpc_slice_from_static_string(client->authorization);
    r->md_count++;
  }
  grpc_metadata_array_init(&r->initial_md);
  grpc_metadata_array_init(&r->trailing_md);
  r->details = grpc_empty_slice();
}

/* Runs one batch and waits for it. Returns 1 if it succeeded. */
static int rpc_batch(rpc *r, grpc_op *ops, size_t n) {
  if (grpc_call_start_batch(r->call, ops, n, &r->tag, NULL) != GRPC_CALL_OK) return 0;
  r->pending++;
  grpc_event ev = r->spin ? ttd_cq_spin_wait(r->spin, r->cq, &r->tag, r->give_up)
                          : grpc_completion_queue_pluck(r->cq, &r->tag, r->give_up, NULL);
  if (ev.type == GRPC_QUEUE_TIMEOUT) { /* the batch ends at once, failed; the status says why */
    grpc_call_cancel_with_status(r->call, GRPC_STATUS_DEADLINE_EXCEEDED, "Deadline Exceeded", NULL);
    r->give_up = gpr_inf_future(GPR_CLOCK_MONOTONIC);
    ev = grpc_completion_queue_pluck(r->cq, &r->tag, r->give_up, NULL);
  }
  if (ev.type == GRPC_OP_COMPLETE) r->pending--;
  return ev.type == GRPC_OP_COMPLETE && ev.success;
}

static void op_init(grpc_op *op, grpc_op_type type) {
  memset(op, 0, sizeof(*op));
  op->op = type;
}

/* Receives the final status; returns it as a tt_status and fills err. */
static tt_status rpc_status(rpc *r, char *err, size_t err_len) {
  grpc_op op;
  op_init(&op, GRPC_OP_RECV_STATUS_ON_CLIENT);
  op.data.recv_status_on_client.trailing_metadata = &r->trailing_md;
  op.data.recv_status_on_client.status = &r->status;
  op.data.recv_status_on_client.status_details = &r->details;
  if (!rpc_batch(r, &op, 1)) {
    snprintf(err, err_len, "the call failed before the daemon sent a status");
    return TT_INTERNAL;
  }
  if (r->status != GRPC_STATUS_OK) {
    snprintf(err, err_len, "%.*s", (int)GRPC_SLICE_LENGTH(r->details), (const char *)GRPC_SLICE_START_PTR(r->details));
  }
  return (tt_status)r->status;
}

static void rpc_end(rpc *r) {
  if (r->call) grpc_call_unref(r->call);
  grpc_metadata_array_destroy(&r->initial_md);
  grpc_metadata_array_destroy(&r->trailing_md);
  grpc_slice_unref(r->details);
  cq_give_back(r->client, r->cq, r->pending == 0);
}

static grpc_byte_buffer *pack(const ProtobufCMessage *msg) {
  size_t len = protobuf_c_message_get_packed_size(msg);
  grpc_slice slice = grpc_slice_malloc(len);
  protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(slice));
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&slice, 1);
  grpc_slice_unref(slice);
  return bb;
}

static ProtobufCMessage *unpack(const ProtobufCMessageDescriptor *type, grpc_byte_buffer *bb) {
  grpc_byte_buffer_reader reader;
  if (!grpc_byte_buffer_reader_init(&reader, bb)) return NULL;
  grpc_slice flat = grpc_byte_buffer_reader_readall(&reader);
  grpc_byte_buffer_reader_destroy(&reader);
  ProtobufCMessage *msg = protobuf_c_message_unpack(type, NULL, GRPC_SLICE_LENGTH(flat), GRPC_SLICE_START_PTR(flat));
  grpc_slice_unref(flat);
  return msg;
}

/* The four ops that send one request and half-close: metadata, message, close, and the
 * receipt of the server's initial metadata. */
static void add_request_ops(rpc *r, grpc_op *ops, grpc_byte_buffer *request) {
  op_init(&ops[0], GRPC_OP_SEND_INITIAL_METADATA);
  ops[0].data.send_initial_metadata.count = r->md_count;
  ops[0].data.send_initial_metadata.metadata = r->md;
  op_init(&ops[1], GRPC_OP_SEND_MESSAGE);
  ops[1].data.send_message.send_message = request;
  op_init(&ops[2], GRPC_OP_SEND_CLOSE_FROM_CLIENT);
  op_init(&ops[3], GRPC_OP_RECV_INITIAL_METADATA);
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &r->initial_md;
}

static tt_status unary_once(tt_client *client, tt_rpc_method method, const ProtobufCMessage *request,
                            const ProtobufCMessageDescriptor *response_type, ProtobufCMessage **out_response,
                            char *err, size_t err_len) {
  *out_response = NULL;
  err[0] = '\0';
  if (client->closed) {
    snprintf(err, err_len, CLOSED_MESSAGE);
    return TT_FAILED_PRECONDITION;
  }
  if (daemon_uses_deadline(method)) { /* device work: the call lane's, where the client has one */
    int lane = tt_lane_call(client, rpc_paths[method], request, response_type, out_response, client->call_timeout_ms,
                            err, err_len);
    if (lane >= 0) return (tt_status)lane;
  }
  rpc r;
  rpc_start(&r, client, method, client->call_timeout_ms);
  /* Other calls are answered in tens of microseconds; device work in milliseconds, polled
   * with a window of its own that shrinks to nothing while answers take longer (many
   * clients sharing the card). */
  r.spin = daemon_uses_deadline(method) ? &client->device_spin : &client->spin;
  grpc_byte_buffer *request_bb = pack(request);
  grpc_byte_buffer *response_bb = NULL;
  grpc_op ops[6];
  add_request_ops(&r, ops, request_bb);
  op_init(&ops[4], GRPC_OP_RECV_MESSAGE);
  ops[4].data.recv_message.recv_message = &response_bb;
  op_init(&ops[5], GRPC_OP_RECV_STATUS_ON_CLIENT);
  ops[5].data.recv_status_on_client.trailing_metadata = &r.trailing_md;
  ops[5].data.recv_status_on_client.status = &r.status;
  ops[5].data.recv_status_on_client.status_details = &r.details;
  tt_status st = TT_OK;
  if (!rpc_batch(&r, ops, 6)) {
    st = TT_INTERNAL;
    snprintf(err, err_len, "the call to ttd could not be run");
  } else if (r.status != GRPC_STATUS_OK) {
    st = (tt_status)r.status;
    snprintf(err, err_len, "%.*s", (int)GRPC_SLICE_LENGTH(r.details), (const char *)GRPC_SLICE_START_PTR(r.details));
  } else if (!response_bb || !(*out_response = unpack(response_type, response_bb))) {
    st = TT_INTERNAL;
    snprintf(err, err_len, "ttd answered with a response that is not a %s", response_type->name);
  }
  grpc_byte_buffer_destroy(request_bb);
  if (response_bb) grpc_byte_buffer_destroy(response_bb);
  rpc_end(&r);
  return st;
}

/* Calls are run again after the session is resumed (resume.c); a few times at most, should
 * ttd restart again meanwhile. */
#define RESUME_ATTEMPTS 3

tt_status tt_rpc_unary_quiet(tt_client *client, tt_rpc_method method, const ProtobufCMessage *request,
                             const ProtobufCMessageDescriptor *response_type, ProtobufCMessage **out_response,
                             char *err, size_t err_len) {
  for (int attempt = 0;; attempt++) {
    unsigned generation = atomic_load(&client->resume_generation);
    tt_status st = unary_once(client, method, request, response_type, out_response, err, err_len);
    if (st == TT_OK || attempt == RESUME_ATTEMPTS || !tt_resume_wanted(client, method, st, err)) return st;
    st = tt_resume(client, method, generation, err, err_len);
    if (st != TT_OK) return st;
  }
}

tt_status tt_rpc_unary(tt_client *client, tt_rpc_method method, const ProtobufCMessage *request,
                       const ProtobufCMessageDescriptor *response_type, ProtobufCMessage **out_response) {
  char err[sizeof(client->errmsg)];
  tt_status st = tt_rpc_unary_quiet(client, method, request, response_type, out_response, err, sizeof(err));
  if (st != TT_OK) tt_client_fail(client, st, "%s", err);
  return st;
}

void tt_rpc_free_quiet(tt_client *client, uint64_t *handles, size_t n) {
  if (n == 0) return;
  Ttd__V1__FreeRequest req = TTD__V1__FREE_REQUEST__INIT;
  req.handles = handles;
  req.n_handles = n;
  ProtobufCMessage *out = NULL;
  char ignored[256];
  if (tt_rpc_unary_quiet(client, TT_RPC_FREE, &req.base, &ttd__v1__free_response__descriptor, &out, ignored,
                         sizeof(ignored)) == TT_OK) {
    protobuf_c_message_free_unpacked(out, NULL);
  }
}

static void keep_memory(void *p) { (void)p; } /* the caller's memory: nothing to release */

/* Sends bb (taking it) and waits for the send to complete. */
static int send_buffer(rpc *r, grpc_byte_buffer *bb) {
  grpc_op op;
  op_init(&op, GRPC_OP_SEND_MESSAGE);
  op.data.send_message.send_message = bb;
  int ok = rpc_batch(r, &op, 1);
  grpc_byte_buffer_destroy(bb);
  return ok;
}

static tt_status upload_once(tt_client *client, const Ttd__V1__UploadHeader *header, const void *data, uint64_t bytes,
                             Ttd__V1__UploadResponse **out_response, char *err, size_t err_len) {
  *out_response = NULL;
  if (client->closed) {
    snprintf(err, err_len, CLOSED_MESSAGE);
    return TT_FAILED_PRECONDITION;
  }
  rpc r;
  rpc_start(&r, client, TT_RPC_UPLOAD, 0);
  grpc_op ops[4];
  op_init(&ops[0], GRPC_OP_SEND_INITIAL_METADATA);
  ops[0].data.send_initial_metadata.count = r.md_count;
  ops[0].data.send_initial_metadata.metadata = r.md;
  int ok = rpc_batch(&r, ops, 1);
  uint64_t sent = 0;
  /* Stop early when a send fails: the daemon has ended the call and its status says why. */
  do {
    /* Hand framed (wire_frame.h): the data field is a slice over the caller's memory, which
     * outlives the call; no protobuf-c copy. */
    Ttd__V1__UploadRequest req = TTD__V1__UPLOAD_REQUEST__INIT;
    if (sent == 0) req.header = (Ttd__V1__UploadHeader *)header;
    uint64_t n = bytes - sent < TT_CHUNK_BYTES ? bytes - sent : TT_CHUNK_BYTES;
    if (!ok) break;
    grpc_slice chunk = n ? grpc_slice_new((uint8_t *)data + sent, (size_t)n, keep_memory) : grpc_empty_slice();
    ok = send_buffer(&r, ttd_wire_frame(sent == 0 ? &req.base : NULL, 2, chunk));
    sent += n;
  } while (ok && sent < bytes);
  grpc_byte_buffer *response_bb = NULL;
  op_init(&ops[0], GRPC_OP_SEND_CLOSE_FROM_CLIENT);
  op_init(&ops[1], GRPC_OP_RECV_INITIAL_METADATA);
  ops[1].data.recv_initial_metadata.recv_initial_metadata = &r.initial_md;
  op_init(&ops[2], GRPC_OP_RECV_MESSAGE);
  ops[2].data.recv_message.recv_message = &response_bb;
  rpc_batch(&r, ok ? ops : ops + 1, ok ? 3 : 2);
  tt_status st = rpc_status(&r, err, err_len);
  if (st == TT_OK) {
    *out_response = response_bb ? (Ttd__V1__UploadResponse *)unpack(&ttd__v1__upload_response__descriptor, response_bb)
                                : NULL;
    if (!*out_response) {
      st = TT_INTERNAL;
      snprintf(err, err_len, "ttd answered Upload with a response that is not a ttd.v1.UploadResponse");
    }
  }
  if (response_bb) grpc_byte_buffer_destroy(response_bb);
  rpc_end(&r);
  return st;
}

tt_status tt_rpc_upload(tt_client *client, const Ttd__V1__UploadHeader *header, const void *data, uint64_t bytes,
                        Ttd__V1__UploadResponse **out_response) {
  char err[sizeof(client->errmsg)];
  for (int attempt = 0;; attempt++) {
    unsigned generation = atomic_load(&client->resume_generation);
    tt_status st = upload_once(client, header, data, bytes, out_response, err, sizeof(err));
    if (st != TT_OK && attempt < RESUME_ATTEMPTS && tt_resume_wanted(client, TT_RPC_UPLOAD, st, err)) {
      st = tt_resume(client, TT_RPC_UPLOAD, generation, err, sizeof(err));
      if (st == TT_OK) continue;
    }
    return st == TT_OK ? st : tt_client_fail(client, st, "%s", err);
  }
}

/* A DownloadResponse walked in place: total_bytes (field 2) checked, data (field 3) copied
 * once, from the received slices into the destination. */
typedef struct download_walk {
  unsigned char *dst;
  uint64_t bytes, received, total;
  char *err;
  size_t err_len;
} download_walk;

static int download_number(void *ctx, uint32_t field, uint64_t value) {
  if (field == 2) ((download_walk *)ctx)->total = value;
  return 0;
}

static int download_bytes(void *ctx, uint32_t field, const uint8_t *data, size_t len, uint64_t at, uint64_t total) {
  download_walk *w = ctx;
  (void)at;
  (void)total;
  if (field != 3 || len == 0) return 0;
  if (len > w->bytes - w->received) {
    snprintf(w->err, w->err_len, "Download sent more than the %" PRIu64 " bytes it announced", w->bytes);
    return 1;
  }
  memcpy(w->dst + w->received, data, len);
  w->received += len;
  return 0;
}

static tt_status download_once(tt_client *client, uint64_t handle, tt_dtype target, void *dst, uint64_t bytes,
                               uint64_t shm_segment, char *out_err, size_t out_err_len) {
  if (client->closed) {
    snprintf(out_err, out_err_len, CLOSED_MESSAGE);
    return TT_FAILED_PRECONDITION;
  }
  rpc r;
  rpc_start(&r, client, TT_RPC_DOWNLOAD, 0);
  Ttd__V1__DownloadRequest req = TTD__V1__DOWNLOAD_REQUEST__INIT;
  req.handle = handle;
  req.target_dtype = (Ttd__V1__DType)target;
  Ttd__V1__ShmRange shm = TTD__V1__SHM_RANGE__INIT;
  if (shm_segment) { /* same host: the daemon writes into dst's segment, sends no data */
    shm.segment = shm_segment;
    shm.length = bytes;
    req.shm = &shm;
  }
  grpc_byte_buffer *request_bb = pack(&req.base);
  grpc_op ops[4];
  add_request_ops(&r, ops, request_bb);
  int ok = rpc_batch(&r, ops, 4);
  grpc_byte_buffer_destroy(request_bb);
  char err[sizeof(client->errmsg)];
  err[0] = '\0';
  tt_status local = TT_OK;
  download_walk w = {.dst = dst, .bytes = bytes, .err = err, .err_len = sizeof(err)};
  for (int first = 1; ok; first = 0) {
    grpc_byte_buffer *bb = NULL;
    op_init(&ops[0], GRPC_OP_RECV_MESSAGE);
    ops[0].data.recv_message.recv_message = &bb;
    if (!rpc_batch(&r, ops, 1) || !bb) break;
    static const ttd_wire_visitor visitor = {download_number, download_bytes};
    w.total = 0; /* proto3: an absent field is 0 */
    int rc = ttd_wire_walk(bb, &visitor, &w); /* the data goes straight into dst: one copy */
    grpc_byte_buffer_destroy(bb);
    if (rc == -1) {
      local = TT_INTERNAL;
      snprintf(err, sizeof(err), "ttd sent a Download message that is not a ttd.v1.DownloadResponse");
    } else if (rc) {
      local = TT_INTERNAL;
    } else if (first && w.total != bytes) {
      local = TT_INTERNAL;
      snprintf(err, sizeof(err), "Download announced %" PRIu64 " bytes, expected %" PRIu64, w.total, bytes);
    } else if (first && shm_segment) {
      w.received = bytes; /* announced, and already in the segment */
    }
    if (local != TT_OK) {
      grpc_call_cancel(r.call, NULL);
      break;
    }
  }
  uint64_t received = w.received;
  char status_err[sizeof(client->errmsg)];
  tt_status st = rpc_status(&r, status_err, sizeof(status_err));
  rpc_end(&r);
  if (local != TT_OK) {
    snprintf(out_err, out_err_len, "%s", err);
    return local;
  }
  if (st != TT_OK) {
    snprintf(out_err, out_err_len, "%s", status_err);
    return st;
  }
  if (received != bytes) {
    snprintf(out_err, out_err_len, "Download ended after %" PRIu64 " of %" PRIu64 " bytes", received, bytes);
    return TT_DATA_LOSS;
  }
  return TT_OK;
}

tt_status tt_rpc_download(tt_client *client, uint64_t handle, tt_dtype target, void *dst, uint64_t bytes,
                          uint64_t shm_segment) {
  char err[sizeof(client->errmsg)];
  for (int attempt = 0;; attempt++) {
    unsigned generation = atomic_load(&client->resume_generation);
    tt_status st = download_once(client, handle, target, dst, bytes, shm_segment, err, sizeof(err));
    if (st != TT_OK && attempt < RESUME_ATTEMPTS && tt_resume_wanted(client, TT_RPC_DOWNLOAD, st, err)) {
      st = tt_resume(client, TT_RPC_DOWNLOAD, generation, err, sizeof(err));
      if (st == TT_OK) continue;
    }
    return st == TT_OK ? st : tt_client_fail(client, st, "%s", err);
  }
}
