#define _GNU_SOURCE /* pthread_setname_np */
#include "rpc/server.h"
#include "rpc/server_internal.h"

#include <errno.h>
#include <sys/socket.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc_posix.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "telemetry/log.h"
#include "rpc/call_lane.h"
#include "rpc/conn_gate.h"
#include "rpc/dispatch.h"
#include "rpc/listener_credentials.h"
#include "work/work_queue.h"
#include "ttd/v1/protocol.h"

/* Streams one HTTP/2 connection may have open at once (GRPC_ARG_MAX_CONCURRENT_STREAMS). */
#define TTD_MAX_CONNECTION_STREAMS 1024

/* Calls requested per method ahead of arrival. */
#define TTD_REQUESTS_PER_METHOD 4


/* The calls a client has started are listed so that a stop past its drain timeout can end
 * each one with UNAVAILABLE "ttd is shutting down" rather than gRPC's bare CANCELLED. */
static void active_add(ttd_call *c) {
  pthread_mutex_lock(&c->server->lock);
  c->active_next = c->server->active;
  if (c->active_next) c->active_next->active_prev = c;
  c->server->active = c;
  c->active_listed = true;
  pthread_mutex_unlock(&c->server->lock);
}

static void active_remove(ttd_call *c) {
  if (!c->active_listed) return;
  pthread_mutex_lock(&c->server->lock);
  if (c->active_prev) c->active_prev->active_next = c->active_next;
  else c->server->active = c->active_next;
  if (c->active_next) c->active_next->active_prev = c->active_prev;
  c->active_listed = false;
  pthread_mutex_unlock(&c->server->lock);
}

/* ---- call lifecycle ---- */

/* Calls of methods not in the table arrive here and are answered UNIMPLEMENTED. */
static const ttd_method unknown_method = {.path = "(unknown)", .kind = TTD_METHOD_UNARY};

static ttd_status_t request_call(ttd_server *server, const ttd_method *method, void *registered) {
  ttd_call *c = calloc(1, sizeof(*c));
  if (!c) return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
  atomic_fetch_add(&server->live_calls, 1);
  ttd_call_init(c, server->core, method);
  c->state = TTD_CALL_REQUESTED;
  c->server = server;
  grpc_call_error err;
  if (method == &unknown_method) {
    grpc_call_details_init(&c->details);
    err = grpc_server_request_call(server->server, &c->call, &c->details, &c->request_metadata, server->cq,
                                   server->cq, c);
  } else {
    bool with_payload = method->kind != TTD_METHOD_CLIENT_STREAM;
    err = grpc_server_request_registered_call(server->server, registered, &c->call, &c->deadline,
                                              &c->request_metadata, with_payload ? &c->received : NULL,
                                              server->cq, server->cq, c);
  }
  if (err != GRPC_CALL_OK) {
    grpc_metadata_array_destroy(&c->request_metadata);
    atomic_fetch_sub(&server->live_calls, 1);
    free(c);
    return ttd_make_status(GRPC_STATUS_INTERNAL, "request_registered_call(%s): error %d", method->path, err);
  }
  return TTD_OK;
}

static void call_destroy(ttd_call *c) {
  active_remove(c);
  if (c->lane) { /* the metadata lane_run made: the slices are its own, not gRPC's */
    for (size_t i = 0; i < c->request_metadata.count; i++) {
      grpc_slice_unref(c->request_metadata.metadata[i].key);
      grpc_slice_unref(c->request_metadata.metadata[i].value);
    }
    ttd_lane_release(c->lane);
  }
  if (c->session) ttd_session_stream_remove(c->session, &c->session_stream);
  if (c->holds_lease) ttd_session_device_call_end(c->session, ttd_now_ms());
  ttd_call_deinit(c);
  if (c->method == &unknown_method) grpc_call_details_destroy(&c->details);
  if (c->call) grpc_call_unref(c->call);
  atomic_fetch_sub(&c->server->live_calls, 1);
  free(c);
}

static void start_batch(ttd_call *c, grpc_op *ops, size_t n) {
  grpc_call_error err = grpc_call_start_batch(c->call, ops, n, c, NULL);
  if (err != GRPC_CALL_OK) {
    /* Only a programming error gets here; the call cannot complete, so drop it. */
    TTD_LOG(TTD_LOG_ERROR, "method=%s event=start-batch-failed error=%d", c->method->path, err);
    call_destroy(c);
  }
}

/* Adds SEND_INITIAL_METADATA the first time the server sends anything. */
static size_t add_initial_metadata(ttd_call *c, grpc_op *ops) {
  if (c->initial_metadata_sent) return 0;
  c->initial_metadata_sent = true;
  memset(ops, 0, sizeof(*ops));
  ops->op = GRPC_OP_SEND_INITIAL_METADATA;
  if (c->request_id) {
    c->initial_md.key = grpc_slice_from_static_string("ttd-request-id");
    c->initial_md.value = grpc_slice_from_static_string(c->request_id_text);
    ops->data.send_initial_metadata.count = 1;
    ops->data.send_initial_metadata.metadata = &c->initial_md;
  }
  return 1;
}

static size_t add_status(ttd_call *c, grpc_op *ops, ttd_status_t status) {
  grpc_slice_unref(c->status_details);
  c->status_details = grpc_slice_from_copied_string(ttd_status_message(status));
  memset(ops, 0, 2 * sizeof(*ops));
  ops[0].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  ops[0].data.send_status_from_server.status = ttd_status_code(status);
  ops[0].data.send_status_from_server.status_details = status ? &c->status_details : NULL;
  ops[1].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  ops[1].data.recv_close_on_server.cancelled = &c->cancelled;
  return 2;
}

/* A lane call's answer: written to its lane, and the call goes. */
static void finish_on_lane(ttd_call *c, grpc_byte_buffer *message, ttd_status_t status) {
  grpc_slice flat = grpc_empty_slice();
  grpc_byte_buffer_reader reader;
  if (message && grpc_byte_buffer_reader_init(&reader, message)) {
    flat = grpc_byte_buffer_reader_readall(&reader);
    grpc_byte_buffer_reader_destroy(&reader);
  }
  ttd_lane_answer(c->lane, c->lane_seq, (int)ttd_status_code(status), status ? ttd_status_message(status) : "",
                  GRPC_SLICE_START_PTR(flat), GRPC_SLICE_LENGTH(flat));
  grpc_slice_unref(flat);
  if (message) grpc_byte_buffer_destroy(message);
  ttd_status_free(status);
  call_destroy(c);
}

/* Sends an optional last message and the status; takes ownership of status. */
static void finish(ttd_call *c, grpc_byte_buffer *message, ttd_status_t status) {
  int index = c->method == &unknown_method ? (int)ttd_method_count : (int)(c->method - ttd_methods);
  ttd_metrics_record(&c->core->metrics, index, ttd_status_code(status), ttd_now_ns() - c->started_ns);
  atomic_fetch_sub_explicit(&c->core->metrics.in_flight, 1, memory_order_relaxed);
  if (c->lane) {
    finish_on_lane(c, message, status);
    return;
  }
  grpc_op ops[4];
  size_t n = add_initial_metadata(c, ops);
  if (message) {
    memset(&ops[n], 0, sizeof(ops[n]));
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n].data.send_message.send_message = message;
    if (c->sending) grpc_byte_buffer_destroy(c->sending);
    c->sending = message;
    n++;
  }
  if (ttd_log_threshold <= TTD_LOG_DEBUG) {
    ttd_log_set_call(c->request_id, c->session ? c->session->id : 0);
    TTD_LOG(TTD_LOG_DEBUG, "event=call method=%s tenant=%s code=%s us=%" PRId64 "%s%s%s",
            c->method->path, c->principal.tenant[0] ? c->principal.tenant : "-",
            ttd_code_name(ttd_status_code(status)), (ttd_now_ns() - c->started_ns) / 1000,
            status ? " message=\"" : "", status ? ttd_status_message(status) : "", status ? "\"" : "");
  }
  n += add_status(c, &ops[n], status);
  ttd_status_free(status);
  c->state = TTD_CALL_FINISHING;
  start_batch(c, ops, n);
}

static ttd_status_t pack_message(const ProtobufCMessage *msg, grpc_byte_buffer **out) {
  *out = NULL;
  size_t len = protobuf_c_message_get_packed_size(msg);
  grpc_slice slice = grpc_slice_malloc(len);
  protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(slice));
  *out = grpc_raw_byte_buffer_create(&slice, 1);
  grpc_slice_unref(slice);
  return TTD_OK;
}

static void send_stream_message(ttd_call *c);

static void run_unary(ttd_call *c, const ProtobufCMessage *request) {
  ProtobufCMessage *response = NULL;
  ttd_status_t status = c->method->unary(c, request, &response);
  grpc_byte_buffer *out = NULL;
  if (!status) status = pack_message(response, &out);
  finish(c, out, status);
}

/* Device work waiting for the card holds its request in host memory: at most
 * TTD_SESSION_MAX_QUEUED calls a session, the bytes each holds charged to its quota until
 * their turn (so queued inline inputs count as the tensors they become). That is the
 * unpacked request, not its size on the wire: protobuf-c makes a struct of every element of
 * a repeated field, and a message of empty elements unpacks to 40 times its size. */
static ttd_status_t queue_admit(ttd_call *c, const ProtobufCMessage *request) {
  ttd_session *s = c->session;
  if (!s) return TTD_OK;
  if (atomic_fetch_add(&s->queued_calls, 1) >= TTD_SESSION_MAX_QUEUED) {
    atomic_fetch_sub(&s->queued_calls, 1);
    return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED,
                           "session %016" PRIx64 " has %d calls waiting for the card already: wait for their answers "
                           "before sending more",
                           s->id, TTD_SESSION_MAX_QUEUED);
  }
  uint64_t bytes = protobuf_c_message_get_packed_size(request);
  size_t held = ttd_call_held_bytes(c);
  if (held > bytes) bytes = held;
  ttd_status_t status = ttd_quota_charge(s->quota, bytes);
  if (status) {
    atomic_fetch_sub(&s->queued_calls, 1);
    ttd_status_t named = ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED,
                                         "this call's %" PRIu64 " bytes wait for the card with the session's other "
                                         "calls, and with them pass its quota: %s",
                                         bytes, ttd_status_message(status));
    ttd_status_free(status);
    return named;
  }
  c->queued_bytes = bytes;
  ttd_session_device_call_begin(s);
  c->holds_lease = true;
  return TTD_OK;
}

/* The call's turn has come: it no longer waits. */
static void queue_leave(ttd_call *c) {
  if (!c->session) return;
  ttd_quota_refund(c->session->quota, c->queued_bytes);
  c->queued_bytes = 0;
  atomic_fetch_sub(&c->session->queued_calls, 1);
}

/* The call's deadline on the monotonic clock of ttd_now_ns, or 0 when it has none. */
static int64_t monotonic_deadline(gpr_timespec deadline) {
  if (gpr_time_cmp(deadline, gpr_inf_future(deadline.clock_type)) == 0) return 0;
  gpr_timespec left = gpr_time_sub(deadline, gpr_now(deadline.clock_type));
  if (left.tv_sec > 1000000000) return 0; /* decades away: none */
  int64_t left_ns = left.tv_sec < 0 ? 0 : left.tv_sec * 1000000000 + left.tv_nsec;
  return ttd_now_ns() + left_ns;
}

/* The call's session closes (by its client, an admin or its lease) while its program runs:
 * the program stops at its next check. Under the session's lock; the call unregisters
 * before it answers, so the flag is still its own. */
static void stop_device_call(ttd_session_stream *stream) {
  ttd_call *c = (ttd_call *)((char *)stream - offsetof(ttd_call, session_stream));
  int clear = 0;
  atomic_compare_exchange_strong(&c->job.cancel->code, &clear, (int)GRPC_STATUS_FAILED_PRECONDITION);
}

/* Registers the call with its session for its run, so that closing the session stops it;
 * false when the session has closed already. */
static bool watch_device_call(ttd_call *c) {
  c->session_stream.cancel = stop_device_call;
  if (ttd_session_stream_add(c->session, &c->session_stream)) return true;
  c->session_stream.cancel = NULL;
  return false;
}

/* A status of a run its flag stopped, with why in front; others as they are. Takes status. */
static ttd_status_t explain_stop(ttd_call *c, ttd_status_t status, int64_t ran_ns) {
  int code = atomic_load(&c->job.cancel->code);
  if (!status || !code || (int)ttd_status_code(status) != code) return status;
  ttd_status_t why;
  if (code == GRPC_STATUS_DEADLINE_EXCEEDED) {
    why = ttd_make_status(GRPC_STATUS_DEADLINE_EXCEEDED,
                          "%s passed its deadline after %.1f ms on the device and was stopped, keeping nothing it "
                          "made (%s); raise the deadline or split the program",
                          c->method->path, (double)ran_ns / 1e6, ttd_status_message(status));
  } else if (code == GRPC_STATUS_FAILED_PRECONDITION) {
    why = ttd_make_status(GRPC_STATUS_FAILED_PRECONDITION,
                          "session %016" PRIx64 " was closed (closed, expired or killed by an admin) after %.1f ms of "
                          "%s on the device, which was stopped (%s); open a new session",
                          c->session->id, (double)ran_ns / 1e6, c->method->path, ttd_status_message(status));
  } else if (code == GRPC_STATUS_ABORTED) { /* stop_device_work: the drain timeout passed */
    why = ttd_make_status(GRPC_STATUS_ABORTED,
                          "ttd is shutting down: its drain timeout passed while %s ran on the device, which was "
                          "stopped after %.1f ms (%s); what the call carried that ran before the stop (a queued "
                          "optimizer step, a Backward) may have taken effect, so it is not repeated for you: "
                          "check the state (or load a checkpoint) once ttd is back",
                          c->method->path, (double)ran_ns / 1e6, ttd_status_message(status));
  } else {
    why = ttd_make_status((grpc_status_code)code, "%s was stopped after %.1f ms on the device (%s)", c->method->path,
                          (double)ran_ns / 1e6, ttd_status_message(status));
  }
  ttd_status_free(status);
  return why;
}

/* The CPU time of the calling thread: what a program run beside others (on one of the card's
 * places, job->sharing) took of the card, host threads standing for its cores, whatever else
 * the host ran on that thread's CPU meanwhile. */
static int64_t thread_cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* A device call's turn has come (on the device's executor thread, or at one of its places
 * for programs run together). */
/* Whether device's queue is empty: a lingering executor (ttd_lane_linger) stops when not. */
typedef struct idle_device {
  ttd_scheduler *scheduler;
  int device;
} idle_device;

static bool device_idle(void *arg) {
  const idle_device *d = arg;
  return ttd_scheduler_queued(d->scheduler, d->device) == 0;
}

static void run_scheduled(ttd_job *job) {
  ttd_call *c = (ttd_call *)((char *)job - offsetof(ttd_call, job));
  ttd_backend *backend = c->core->backend;
  if (backend->vtable->device_wake) backend->vtable->device_wake(backend, job->device);
  ttd_log_set_call(c->request_id, c->session ? c->session->id : 0);
  queue_leave(c);
  ttd_status_t refused = TTD_OK;
  if (atomic_load(&c->server->cancelling)) {
    refused = ttd_make_status(GRPC_STATUS_UNAVAILABLE,
                              "ttd is shutting down: its drain timeout passed before this call's turn on the device; "
                              "reconnect when it is back");
  } else if (gpr_time_cmp(gpr_now(c->deadline.clock_type), c->deadline) > 0) {
    refused = ttd_make_status(GRPC_STATUS_DEADLINE_EXCEEDED,
                              "%s waited past its deadline for its turn on the device; the device is busy with "
                              "other sessions' programs (raise the deadline)", c->method->path);
  } else if (c->session && !watch_device_call(c)) {
    refused = ttd_make_status(GRPC_STATUS_FAILED_PRECONDITION,
                              "session %016" PRIx64 " was closed (closed, expired or killed by an admin) while "
                              "this call waited for the device; open a new session", c->session->id);
  }
  if (refused) {
    finish(c, NULL, refused);
    ttd_log_set_call(0, 0);
    return;
  }
  int64_t began = ttd_now_ns(), began_cpu = job->sharing > 1 ? thread_cpu_ns() : 0;
  int sharing = job->sharing;
  ttd_core *core = c->core; /* c may be gone once answered */
  /* A lane's client likely posts its next call soon (a training loop's next step, once its
   * loss has run): this thread watches for it, unless the card has other work or runs
   * programs together. */
  ttd_lane *lane = c->lane && sharing <= 1 ? ttd_lane_retain(c->lane) : NULL;
  idle_device idle = {c->server->core->scheduler, job->device};
  ttd_session *session = c->session ? ttd_session_retain(c->session) : NULL;
  ProtobufCMessage *response = NULL;
  ttd_status_t status = c->method->unary(c, c->request, &response);
  int64_t ran = ttd_now_ns();
  int64_t phases[TTD_PHASE_COUNT] = {[TTD_PHASE_WAITING] = began - c->started_ns, [TTD_PHASE_RUNNING] = ran - began};
  if (session) ttd_session_stream_remove(session, &c->session_stream); /* before the flag goes to the next job */
  status = explain_stop(c, status, ran - began);
  grpc_byte_buffer *out = NULL;
  if (!status) status = pack_message(response, &out);
  finish(c, out, status);
  phases[TTD_PHASE_ANSWERING] = ttd_now_ns() - ran;
  ttd_metrics_record_phases(&core->metrics, phases);
  if (session) { /* the card's time, for the tenant's share (/metrics) */
    ttd_metrics_record_card(&core->metrics, session->tenant,
                            sharing > 1 ? (thread_cpu_ns() - began_cpu) / sharing : ttd_now_ns() - began);
    ttd_session_release(session);
  }
  ttd_log_set_call(0, 0);
  if (lane) {
    ttd_lane_linger(lane, device_idle, &idle);
    ttd_lane_release(lane);
  }
}

/* Closing a session ends its streams: one stalled on its client would hold its tensor. */
static void cancel_stream(ttd_session_stream *stream) {
  ttd_call *c = (ttd_call *)((char *)stream - offsetof(ttd_call, session_stream));
  if (c->method->stream_cancel) c->method->stream_cancel(c);
  grpc_call_cancel_with_status(c->call, GRPC_STATUS_FAILED_PRECONDITION,
                               "the session was closed (by its client, an admin or its lease) during this stream",
                               NULL);
}

/* Registers a stream with its session; FAILED_PRECONDITION if the session closed. */
static ttd_status_t watch_stream(ttd_call *c) {
  if (!c->session) return TTD_OK;
  c->session_stream.cancel = cancel_stream;
  if (ttd_session_stream_add(c->session, &c->session_stream)) return TTD_OK;
  c->session_stream.cancel = NULL;
  return ttd_make_status(GRPC_STATUS_FAILED_PRECONDITION, "session %016" PRIx64 " was closed; open a new session",
                         c->session->id);
}

/* Ends a server stream's state; unregistered first, so that a session closing now does not
 * cancel a stream whose state is gone. */
static void end_server_stream(ttd_call *c) {
  if (c->session) ttd_session_stream_remove(c->session, &c->session_stream);
  c->method->stream_done(c);
}

/* A call of this method has arrived. */
static void on_call_arrived(ttd_call *c) {
  const ttd_method *m = c->method;
  ProtobufCMessage *request = NULL;
  ttd_status_t status = ttd_dispatch_prepare(c, &request);
  if (c->session) ttd_log_set_call(c->request_id, c->session->id);
  if (status) {
    finish(c, NULL, status);
    return;
  }
  switch (m->kind) {
    case TTD_METHOD_UNARY:
      if (m->device_of) {
        int device = m->device_of(c, request);
        if (device < 0 || device >= ttd_scheduler_devices(c->core->scheduler)) device = 0;
        status = queue_admit(c, request);
        if (status) { /* the request lives in the call's arena, freed with it */
          finish(c, NULL, status);
          return;
        }
        c->request = request;
        c->job.key = c->session ? c->session->id : 0;
        c->job.group = c->session ? c->session->tenant_key : 0;
        c->job.weight = c->session ? atomic_load(&c->session->weight) : 1;
        c->job.run = run_scheduled;
        c->job.deadline_ns = monotonic_deadline(c->deadline);
        atomic_store(&c->on_device, true);
        ttd_scheduler_submit(c->core->scheduler, device, &c->job);
        return;
      }
      run_unary(c, request);
      return;
    case TTD_METHOD_CLIENT_STREAM: {
      status = watch_stream(c);
      if (status) {
        finish(c, NULL, status);
        return;
      }
      grpc_op op;
      memset(&op, 0, sizeof(op));
      op.op = GRPC_OP_RECV_MESSAGE;
      op.data.recv_message.recv_message = &c->received;
      c->state = TTD_CALL_RECEIVING;
      start_batch(c, &op, 1);
      return;
    }
    case TTD_METHOD_SERVER_STREAM:
      /* Registered once begun: a cancel finds the whole state. */
      status = m->stream_begin(c, request);
      if (!status) status = watch_stream(c);
      if (status) {
        end_server_stream(c);
        finish(c, NULL, status);
        return;
      }
      send_stream_message(c);
      return;
  }
}

static void on_stream_received(ttd_call *c, bool ok) {
  const ttd_method *m = c->method;
  if (!ok) {
    m->stream_abort(c);
    finish(c, NULL, ttd_make_status(GRPC_STATUS_CANCELLED, "stream broken by the client"));
    return;
  }
  if (!c->received) { /* the client closed its side: end of stream */
    ProtobufCMessage *response = NULL;
    ttd_status_t status = m->stream_end(c, &response);
    grpc_byte_buffer *out = NULL;
    if (!status) status = pack_message(response, &out);
    finish(c, out, status);
    return;
  }
  if (c->session) ttd_session_touch(c->session, ttd_now_ms());
  ttd_status_t status = m->stream_message(c, c->received);
  grpc_byte_buffer_destroy(c->received);
  c->received = NULL;
  if (status) {
    m->stream_abort(c);
    finish(c, NULL, status);
    return;
  }
  grpc_op op;
  memset(&op, 0, sizeof(op));
  op.op = GRPC_OP_RECV_MESSAGE;
  op.data.recv_message.recv_message = &c->received;
  start_batch(c, &op, 1);
}

static void send_stream_message(ttd_call *c) {
  const ttd_method *m = c->method;
  grpc_byte_buffer *out = NULL;
  bool last = false;
  ttd_status_t status = m->stream_next(c, &out, &last);
  if (status && out) {
    grpc_byte_buffer_destroy(out);
    out = NULL;
  }
  if (status || last) {
    end_server_stream(c);
    finish(c, out, status);
    return;
  }
  if (c->session) ttd_session_touch(c->session, ttd_now_ms());
  grpc_op ops[2];
  size_t n = add_initial_metadata(c, ops);
  memset(&ops[n], 0, sizeof(ops[n]));
  ops[n].op = GRPC_OP_SEND_MESSAGE;
  ops[n].data.send_message.send_message = out;
  if (c->sending) grpc_byte_buffer_destroy(c->sending);
  c->sending = out;
  c->state = TTD_CALL_SENDING;
  start_batch(c, ops, n + 1);
}

/* The descriptor of the call's connection when the gate handed it over (gRPC names it
 * "fd:N"), else -1. Read as the call arrives: gRPC forgets the peer of a cancelled call. */
static int call_gate_fd(ttd_call *c) {
  if (!ttd_conn_gate_listening(c->server->gate)) return -1;
  char *peer = grpc_call_get_peer(c->call);
  int fd = peer && strncmp(peer, "fd:", 3) == 0 ? atoi(peer + 3) : -1;
  gpr_free(peer);
  return fd;
}

void ttd_call_peer(ttd_call *c, ttd_conn_peer *out) {
  memset(out, 0, sizeof(*out));
  if (!c->call) { /* run in process, or taken off a call lane */
    if (c->lane) snprintf(out->name, sizeof(out->name), "call lane");
    return;
  }
  if (c->gate_fd >= 0) {
    ttd_conn_gate_peer(c->server->gate, c->gate_fd, out);
    return;
  }
  out->kind = TTD_CONN_PEER_UNKNOWN; /* not the gate's: every listener is, so never seen */
  char *peer = grpc_call_get_peer(c->call);
  snprintf(out->name, sizeof(out->name), "%s", peer ? peer : "?");
  gpr_free(peer);
}

/* A call taken off a call lane: made as the poller makes a gRPC call when it arrives, with
 * the metadata its client would have sent (its token, and the lane's session), and run
 * from there as one. */
static void lane_run(void *arg, ttd_lane *lane, ttd_lane_call *cl) {
  ttd_server *server = arg;
  ttd_call *c = calloc(1, sizeof(*c));
  grpc_metadata *md = gpr_zalloc(2 * sizeof(*md));
  if (!c || !md) {
    free(c);
    gpr_free(md);
    grpc_slice_unref(cl->request);
    ttd_lane_answer(lane, cl->seq, GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory", NULL, 0);
    return;
  }
  atomic_fetch_add(&server->live_calls, 1);
  ttd_call_init(c, server->core, cl->method);
  c->server = server;
  c->gate_fd = -1;
  c->lane = ttd_lane_retain(lane);
  c->lane_seq = cl->seq;
  c->deadline = cl->timeout_ms ? gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                              gpr_time_from_millis(cl->timeout_ms, GPR_TIMESPAN))
                               : gpr_inf_future(GPR_CLOCK_MONOTONIC);
  size_t n = 0;
  md[n].key = grpc_slice_from_static_string("ttd-session");
  md[n++].value = grpc_slice_from_copied_string(cl->session_hex);
  if (cl->authorization_len) {
    md[n].key = grpc_slice_from_static_string("authorization");
    md[n++].value = grpc_slice_from_copied_buffer(cl->authorization, cl->authorization_len);
  }
  grpc_metadata_array_destroy(&c->request_metadata);
  c->request_metadata.metadata = md;
  c->request_metadata.count = n;
  c->request_metadata.capacity = 2;
  c->received = grpc_raw_byte_buffer_create(&cl->request, 1);
  grpc_slice_unref(cl->request);
  c->started_ns = ttd_now_ns();
  c->request_id = atomic_fetch_add(&server->next_request_id, 1) + 1;
  snprintf(c->request_id_text, sizeof(c->request_id_text), "%" PRIu64, c->request_id);
  ttd_log_set_call(c->request_id, 0);
  atomic_fetch_add_explicit(&c->core->metrics.in_flight, 1, memory_order_relaxed);
  on_call_arrived(c);
  ttd_log_set_call(0, 0);
}

ttd_lanes *ttd_server_lanes(ttd_server *server) { return server->lanes; }

/* The one switch that drives a call. */
void ttd_server_on_call_event(ttd_call *c, bool ok) {
  ttd_log_set_call(c->request_id, c->session ? c->session->id : 0);
  switch (c->state) {
    case TTD_CALL_REQUESTED: {
      ttd_server *server = c->server;
      if (!ok) { /* the server is shutting down */
        call_destroy(c);
        return;
      }
      c->started_ns = ttd_now_ns();
      active_add(c);
      c->gate_fd = call_gate_fd(c);
      c->request_id = atomic_fetch_add(&server->next_request_id, 1) + 1;
      snprintf(c->request_id_text, sizeof(c->request_id_text), "%" PRIu64, c->request_id);
      ttd_log_set_call(c->request_id, 0);
      atomic_fetch_add_explicit(&c->core->metrics.in_flight, 1, memory_order_relaxed);
      bool known = c->method != &unknown_method;
      ttd_status_t s = request_call(server, c->method, known ? server->registered[c->method - ttd_methods] : NULL);
      if (s) {
        TTD_LOG(TTD_LOG_ERROR, "method=%s event=re-request-failed message=\"%s\"", c->method->path,
                ttd_status_message(s));
        ttd_status_free(s);
      }
      if (known) {
        on_call_arrived(c);
      } else {
        finish(c, NULL, ttd_make_status(GRPC_STATUS_UNIMPLEMENTED, "method '%.*s' is not part of ttd.v1.Device",
                                        (int)(GRPC_SLICE_LENGTH(c->details.method) > 128 ? 128 : GRPC_SLICE_LENGTH(c->details.method)),
                                        (const char *)GRPC_SLICE_START_PTR(c->details.method)));
      }
      return;
    }
    case TTD_CALL_RECEIVING:
      on_stream_received(c, ok);
      return;
    case TTD_CALL_SENDING:
      if (!ok) {
        end_server_stream(c);
        finish(c, NULL, ttd_make_status(GRPC_STATUS_CANCELLED, "stream broken by the client"));
        return;
      }
      send_stream_message(c);
      return;
    case TTD_CALL_FINISHING:
      call_destroy(c);
      return;
  }
}

/* An event of a heavy method's call, on a work-queue thread. */
static void run_heavy_event(ttd_work *work) {
  ttd_call *c = (ttd_call *)((char *)work - offsetof(ttd_call, heavy_work));
  ttd_server_on_call_event(c, c->heavy_ok);
  ttd_log_set_call(0, 0);
}

/* The one thread that polls the completion queue. Light calls are answered here; events of
 * heavy calls (a call has one event at a time) go to the work queue, except a finishing
 * call's and those its handler marked light (ttd_call.light_events). */
static void *poller_main(void *arg) {
  ttd_server *server = arg;
  pthread_setname_np(pthread_self(), "ttd-poll");
  /* After a light call, the next call of a client making a run of them is likely tens of
   * microseconds away, and after the answer of device work a training loop's next step
   * comes once the client has run its loss: poll for it before sleeping (cq_spin.h), each
   * with a window of its own. An idle vCPU that halts costs a wake-up through the
   * hypervisor, which the call would pay. Not after other events of heavy calls or device
   * work: device work takes longer, and the CPU is the kernels'. */
  ttd_cq_spin *spin = &server->core->poll_spin;
  for (;;) {
    gpr_timespec forever = gpr_inf_future(GPR_CLOCK_MONOTONIC);
    grpc_event ev = spin ? ttd_cq_spin_wait(spin, server->cq, NULL, forever)
                         : grpc_completion_queue_next(server->cq, forever, NULL);
    spin = NULL;
    if (ev.type == GRPC_QUEUE_SHUTDOWN) return NULL;
    if (ev.type != GRPC_OP_COMPLETE) continue;
    if (ev.tag == &server->shutdown_tag) {
      pthread_mutex_lock(&server->lock);
      server->shutdown_done = true;
      pthread_cond_broadcast(&server->shutdown_done_cond);
      pthread_mutex_unlock(&server->lock);
      continue;
    }
    ttd_call *c = ev.tag;
    if (server->heavy && c->method->heavy && c->state != TTD_CALL_FINISHING && !c->light_events) {
      c->heavy_ok = ev.success != 0;
      c->heavy_work.run = run_heavy_event;
      ttd_work_queue_submit(server->heavy, &c->heavy_work);
      continue;
    }
    if (!c->method->heavy && !c->method->device_of) {
      spin = &server->core->poll_spin;
    } else if (c->method->device_of && c->state == TTD_CALL_FINISHING) {
      spin = &server->core->device_spin; /* its answer is out */
    }
    ttd_server_on_call_event(c, ev.success != 0);
    ttd_log_set_call(0, 0);
  }
}

/* Every listener is the gate's: it accepts (and ends TLS), gRPC gets each connection. */
static ttd_status_t bind_address(ttd_server *server, const char *address) {
  SSL_CTX *tls = NULL;
  TTD_RETURN_IF_ERROR(ttd_listener_credentials(server->core->config, address, &tls));
  ttd_status_t status = ttd_conn_gate_listen(server->gate, address, tls);
  SSL_CTX_free(tls);
  return status;
}

/* A connection the gate admitted: gRPC owns it from here. */
static void gate_handoff(void *arg, int fd) {
  ttd_server *server = arg;
  grpc_server_add_channel_from_fd(server->server, fd, server->fd_creds);
}

void ttd_server_free(ttd_server *server) {
  ttd_conn_gate_destroy(server->gate);
  if (server->fd_creds) grpc_server_credentials_release(server->fd_creds);
  free(server->registered);
  pthread_mutex_destroy(&server->lock);
  pthread_cond_destroy(&server->shutdown_done_cond);
  free(server);
}

ttd_status_t ttd_server_start(ttd_core *core, const char *const *addresses, int address_count, int threads,
                              ttd_server **out_server) {
  *out_server = NULL;
  ttd_server *server = calloc(1, sizeof(*server));
  if (!server) return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
  server->core = core;
  server->registered = calloc(ttd_method_count, sizeof(void *));
  pthread_mutex_init(&server->lock, NULL);
  pthread_cond_init(&server->shutdown_done_cond, NULL);
  if (!server->registered) {
    ttd_server_free(server);
    return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
  }
  ttd_status_t gate_status = ttd_conn_gate_create(core, gate_handoff, server, &server->gate);
  if (gate_status) {
    ttd_server_free(server);
    return gate_status;
  }
  server->fd_creds = grpc_insecure_server_credentials_create();

  grpc_arg args[] = {
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, .value.integer = TTD_MAX_MESSAGE_BYTES},
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, .value.integer = -1},
      /* gRPC shares a TCP port between processes by default (SO_REUSEPORT): a second ttd
       * would take half the connections of the first. One daemon owns a port. */
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_ALLOW_REUSEPORT, .value.integer = 0},
      /* Streams one connection may have open; more are refused by the transport. */
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_CONCURRENT_STREAMS, .value.integer = TTD_MAX_CONNECTION_STREAMS},
  };
  grpc_channel_args channel_args = {sizeof(args) / sizeof(args[0]), args};
  server->server = grpc_server_create(&channel_args, NULL);
  server->cq = grpc_completion_queue_create_for_next(NULL);
  grpc_server_register_completion_queue(server->server, server->cq, NULL);
  for (size_t i = 0; i < ttd_method_count; i++) {
    grpc_server_register_method_payload_handling payload =
        ttd_methods[i].kind == TTD_METHOD_CLIENT_STREAM ? GRPC_SRM_PAYLOAD_NONE
                                                        : GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER;
    server->registered[i] = grpc_server_register_method(server->server, ttd_methods[i].path, NULL, payload, 0);
  }
  ttd_status_t status = TTD_OK;
  for (int i = 0; i < address_count && !status; i++) status = bind_address(server, addresses[i]);
  if (status) {
    /* Listeners already added must be shut down before the server is destroyed. */
    grpc_server_shutdown_and_notify(server->server, server->cq, &server->shutdown_tag);
    while (grpc_completion_queue_next(server->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).tag !=
           &server->shutdown_tag) {
    }
    grpc_server_destroy(server->server);
    grpc_completion_queue_shutdown(server->cq);
    while (grpc_completion_queue_next(server->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(server->cq);
    ttd_server_free(server);
    return status;
  }
  grpc_server_start(server->server);
  for (size_t i = 0; i < ttd_method_count && !status; i++) {
    for (int k = 0; k < TTD_REQUESTS_PER_METHOD && !status; k++) {
      status = request_call(server, &ttd_methods[i], server->registered[i]);
    }
  }
  if (!status) status = request_call(server, &unknown_method, NULL);
  if (!status) status = ttd_lanes_start(core, lane_run, server, &server->lanes);
  if (!status) status = ttd_conn_gate_start(server->gate);
  /* The poller, then threads-1 for heavy calls (none: the poller runs them too). */
  if (!status && threads > 1) status = ttd_work_queue_start(threads - 1, &server->heavy);
  server->thread_count = 0;
  if (!status && pthread_create(&server->poller, NULL, poller_main, server) == 0) server->thread_count = 1;
  *out_server = server;
  if (status || server->thread_count == 0) {
    ttd_server_stop(server, 0);
    *out_server = NULL;
    return status ? status : ttd_make_status(GRPC_STATUS_INTERNAL, "could not start the completion-queue poller thread");
  }
  return TTD_OK;
}
