/* Layer daemon/rpc: gRPC calls, their dispatch through the method table and the server's
 * completion-queue threads; request tensors to and from protobuf. Calls daemon/core and below.
 *
 * One in-flight RPC on the server. The struct is its own completion-queue tag; its
 * state says which batch is outstanding (there is never more than one), and
 * rpc/server.c drives it through one switch.
 *
 * Memory for the unpacked request and the response comes from the call's arena and is
 * released with the call, so handlers never free protobuf messages. */
#ifndef TTD_RPC_CALL_H
#define TTD_RPC_CALL_H

#include <grpc/grpc.h>
#include <protobuf-c/protobuf-c.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "core/core.h"
#include "work/scheduler.h"
#include "session/session.h"
#include "work/work_queue.h"

typedef struct ttd_method ttd_method;
typedef struct ttd_server ttd_server;

typedef enum ttd_call_state {
  TTD_CALL_REQUESTED, /* waiting for a client to start a call of this method */
  TTD_CALL_RECEIVING, /* client stream: a RECV_MESSAGE is outstanding */
  TTD_CALL_SENDING,   /* server stream: a SEND_MESSAGE is outstanding */
  TTD_CALL_FINISHING, /* the status is being sent */
} ttd_call_state;

typedef struct ttd_arena_block ttd_arena_block;

typedef struct ttd_call {
  ttd_call_state state;
  const ttd_method *method;
  ttd_server *server;
  ttd_core *core;
  grpc_call *call;
  gpr_timespec deadline;
  grpc_metadata_array request_metadata;
  grpc_call_details details;    /* only for calls of methods not in the table */
  grpc_byte_buffer *received;   /* initial payload, or the latest streamed message */
  grpc_byte_buffer *sending;    /* the message of the outstanding batch */
  grpc_slice status_details;
  int cancelled;                /* set by RECV_CLOSE_ON_SERVER */
  int gate_fd;                  /* the connection's descriptor when the gate handed it over, else -1 */
  bool initial_metadata_sent;
  ttd_principal principal;      /* who is calling (authenticated before any handler runs) */
  ttd_session *session;         /* for methods that need one; one reference */
  void *stream;                 /* a streaming handler's state */
  ttd_job job;                  /* device work waits in the scheduler as this */
  uint64_t queued_bytes;        /* the waiting request's size, charged to the session's quota */
  bool holds_lease;             /* a device call admitted: its session does not expire until the call goes */
  ProtobufCMessage *request;    /* the unpacked request of a scheduled call */
  int64_t started_ns;           /* monotonic, when the call arrived (for latency metrics) */
  uint64_t request_id;          /* counts calls since start; in logs and ttd-request-id metadata */
  char request_id_text[24];
  grpc_metadata initial_md;     /* ttd-request-id */
  ttd_arena_block *arena;
  ProtobufCAllocator allocator; /* allocates from the arena */
  ttd_session_stream session_stream; /* a stream's place in its session: cancelled at close */
  ttd_work heavy_work;          /* a heavy method's event waits for a work-queue thread as this */
  bool heavy_ok;                /* ... with its completion's success */
  /* Set by a heavy method's handler when its next events cost next to nothing (a Download
   * sending zero-copy views): the poller runs them itself instead of handing each one to a
   * work-queue thread, two thread wake-ups fewer per message. */
  bool light_events;
  atomic_bool on_device; /* handed to the scheduler: queued for or running on a card */
  /* A call taken off a same-host call lane (rpc/call_lane.h) rather than gRPC: no grpc_call;
   * its answer goes to the lane, under the number the client gave it. One reference. */
  struct ttd_lane *lane;
  uint64_t lane_seq;
  /* The server's list of calls a client has started (rpc/server.c). */
  struct ttd_call *active_prev, *active_next;
  bool active_listed;
} ttd_call;

/* Readies a zeroed call of method on core: the arena allocator for protobuf-c, empty
 * request metadata and status details. The transport fills in the rest (rpc/server.c for
 * gRPC calls; the fuzz harnesses in process). */
void ttd_call_init(ttd_call *call, ttd_core *core, const ttd_method *method);

/* Releases what the call holds, its grpc_call aside: the received and sending buffers,
 * the status details, the request metadata array, the session reference and the arena
 * (every request and response unpacked or built in it). */
void ttd_call_deinit(ttd_call *call);

/* The bytes taken from the call's arena (the unpacked request and what its handlers made), with
 * the received message while the call keeps it: what a call waiting for the card costs. */
size_t ttd_call_held_bytes(const ttd_call *call);

/* Frees the arena's blocks (ttd_call_deinit does as well): every ttd_call_alloc pointer goes. */
void ttd_call_arena_free(ttd_call *call);

/* Zeroed memory that lives until the call ends; NULL if out of memory. */
void *ttd_call_alloc(ttd_call *call, size_t bytes);

/* A copy of s in the call's arena. */
char *ttd_call_strdup(ttd_call *call, const char *s);

/* The value of a request metadata key, or NULL; *out_len gets its length. */
const char *ttd_call_metadata(const ttd_call *call, const char *key, size_t *out_len);

#endif
