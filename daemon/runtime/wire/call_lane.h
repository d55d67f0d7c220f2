/* The call lane of the same-host fast path: a memfd segment a local client shares with the
 * daemon, through which it makes its device calls (Execute, Backward, ZeroGrad,
 * OptimizerStep, OptimizerState) without gRPC. The request and the answer are the same
 * protobuf messages as on gRPC, and the daemon runs a lane call through the same dispatch
 * (authorization, session, admission, scheduler) as a gRPC one: only the transport differs.
 * A training step's call pays a few microseconds of transport where a gRPC unary call pays
 * a few hundred on a guest whose caches the step's kernels have just emptied
 * (docs/performance.md).
 *
 * One lane per session, one call at a time. The client registers the lane on the side
 * socket (TTD_SHM_LANE, shm_protocol.h), the memfd attached; the daemon answers with two
 * eventfds of its own: `ring`, which the client writes to wake the daemon, and `answer`,
 * which the daemon writes to wake the client. The header's state word says whose turn it
 * is:
 *   IDLE -> POSTED   the client wrote a request (method, length, timeout, token, bytes)
 *   POSTED -> TAKEN  the daemon copied it out (once, checked, into its own memory)
 *   TAKEN -> ANSWERED the daemon wrote the answer (code, message, bytes, the seq echoed)
 *   ANSWERED -> IDLE the client read it
 * When the session closes, the daemon sets lane_closed and writes `answer`: a client takes
 * back a call still POSTED (POSTED -> IDLE, a compare-and-swap against the daemon's take)
 * and makes it over gRPC, which answers it as a closed session's call.
 * Each side polls the state while it expects a change soon, and says so in its flag
 * (daemon_watching, client_waiting), so that the other writes the eventfd only when it
 * sleeps. Both sides store their state change, then load the other's flag, sequentially
 * consistent: one of them always sees the other.
 *
 * Everything in the segment is writable by the client: the daemon reads each field once,
 * into its own memory, bounds-checked, and takes at most one call of a lane at a time,
 * whatever the state word says. Shared by ttd and libttclient. */
#ifndef TTD_CALL_LANE_H
#define TTD_CALL_LANE_H

#include <stdatomic.h>
#include <stdint.h>

#include "ttd/v1/protocol.h"

enum { TTD_LANE_IDLE = 0, TTD_LANE_POSTED = 1, TTD_LANE_TAKEN = 2, TTD_LANE_ANSWERED = 3 };

#define TTD_LANE_METHOD_BYTES 64
#define TTD_LANE_AUTHORIZATION_BYTES 1024
#define TTD_LANE_MESSAGE_BYTES 1024

typedef struct ttd_lane_header {
  _Atomic uint32_t state;
  _Atomic uint32_t daemon_watching; /* the daemon polls state: no need to ring */
  _Atomic uint32_t client_waiting;  /* the client sleeps on the answer eventfd */
  uint32_t request_len;             /* client: the request's bytes at TTD_LANE_REQUEST_OFFSET */
  uint64_t seq;                     /* client: this call's number, echoed in answer_seq */
  int64_t timeout_ms;               /* client: the call's deadline from posting; 0: none */
  char method[TTD_LANE_METHOD_BYTES]; /* client: "/ttd.v1.Device/Execute", NUL-terminated */
  uint32_t authorization_len;         /* client: the "authorization" metadata it would send */
  char authorization[TTD_LANE_AUTHORIZATION_BYTES];
  _Atomic uint32_t lane_closed;       /* daemon: the session closed; nothing posted is taken any more */
  uint64_t answer_seq;                /* daemon: the seq of the call answered */
  int32_t code;                       /* daemon: the gRPC status code */
  uint32_t answer_len;                /* daemon: the response's bytes at TTD_LANE_ANSWER_OFFSET (code 0) */
  char message[TTD_LANE_MESSAGE_BYTES]; /* daemon: the status message, NUL-terminated */
} ttd_lane_header;

/* A request or an answer is at most a gRPC message of ttd's (protocol.h); a request that
 * does not fit goes over gRPC, an answer that does not fit is RESOURCE_EXHAUSTED as gRPC's
 * receive limit would make it. The pages a call does not touch are never allocated. */
#define TTD_LANE_HEADER_BYTES 4096u
#define TTD_LANE_REQUEST_BYTES ((uint64_t)TTD_MAX_MESSAGE_BYTES)
#define TTD_LANE_ANSWER_BYTES ((uint64_t)TTD_MAX_MESSAGE_BYTES)
#define TTD_LANE_REQUEST_OFFSET ((uint64_t)TTD_LANE_HEADER_BYTES)
#define TTD_LANE_ANSWER_OFFSET (TTD_LANE_REQUEST_OFFSET + TTD_LANE_REQUEST_BYTES)
#define TTD_LANE_BYTES (TTD_LANE_ANSWER_OFFSET + TTD_LANE_ANSWER_BYTES)

_Static_assert(sizeof(ttd_lane_header) <= TTD_LANE_HEADER_BYTES, "the lane header fits its page");
_Static_assert(sizeof(ttd_lane_header) == 2168, "the layout make_corpus.py writes (tests/fuzz)");

/* A client's call that waits past its timeout by this much more is given up: the lane is
 * broken for it (its state unknown), and it makes its calls over gRPC. */
#define TTD_LANE_GRACE_MS 5000

#endif
