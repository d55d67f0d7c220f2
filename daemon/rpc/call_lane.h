/* The daemon's side of the call lanes (wire/call_lane.h): the lanes local clients have
 * registered, one thread that sleeps on their ring eventfds, and the taking of a posted
 * request (copied out once, checked) and the writing of its answer. A taken call goes to
 * the server (rpc/server.c), which runs it as it runs a gRPC call of the same method.
 *
 * Bounds: one lane per session (so a tenant's lanes are bounded by its sessions), one call
 * at a time per lane, the lane's mapping counted with every shared-memory segment
 * (ttd_shm_segment_limit). A lane goes when its session closes (by its client, its lease
 * or an admin), or when ttd stops; a call in flight keeps it mapped until it is answered. */
#ifndef TTD_RPC_CALL_LANE_H
#define TTD_RPC_CALL_LANE_H

#include <grpc/slice.h>
#include <stdint.h>

#include "core/core.h"
#include "rpc/method.h"
#include "session/session.h"
#include "wire/call_lane.h"

typedef struct ttd_lanes ttd_lanes;
typedef struct ttd_lane ttd_lane;

/* A request taken off a lane: its fields read once from the client's memory. */
typedef struct ttd_lane_call {
  const ttd_method *method;
  uint64_t seq;
  int64_t timeout_ms; /* 0: none */
  char authorization[TTD_LANE_AUTHORIZATION_BYTES + 1];
  uint32_t authorization_len;
  char session_hex[17]; /* the lane's session, as ttd-session metadata names it */
  grpc_slice request;   /* a copy of the request's bytes; the callee takes it */
} ttd_lane_call;

/* Runs a taken call: on the thread that took it (the lanes' thread, or an executor that
 * lingered for it). It answers through ttd_lane_answer, now or later, and keeps its own
 * reference to the lane until then. */
typedef void (*ttd_lane_run_fn)(void *arg, ttd_lane *lane, ttd_lane_call *call);

/* Starts the lanes' thread. */
ttd_status_t ttd_lanes_start(ttd_core *core, ttd_lane_run_fn run, void *arg, ttd_lanes **out_lanes);

/* ttd stops: calls posted from now on are answered UNAVAILABLE. NULL ok. */
void ttd_lanes_stop(ttd_lanes *lanes);

/* Once no call of any lane is in flight: joins the thread and closes every lane; the
 * registry goes with the last lane (a card's thread may still linger over one). NULL ok. */
void ttd_lanes_destroy(ttd_lanes *lanes);

/* Registers the lane of session over memfd (mapped here; the fd stays the caller's) and
 * makes its eventfds, returned in out_fds ([0] ring, [1] answer; the lane keeps its own:
 * the caller closes these once sent). INVALID_ARGUMENT for a memfd that is not one, not
 * sealed against shrinking or under TTD_LANE_BYTES; ALREADY_EXISTS when the session has a
 * lane; FAILED_PRECONDITION when it has closed; RESOURCE_EXHAUSTED past the mappings'
 * limit or out of descriptors. */
ttd_status_t ttd_lanes_add(ttd_lanes *lanes, ttd_session *session, int memfd, int out_fds[2]);

/* Lanes open now. */
int ttd_lanes_open(ttd_lanes *lanes);

ttd_lane *ttd_lane_retain(ttd_lane *lane);
void ttd_lane_release(ttd_lane *lane); /* NULL ok */

/* Writes the answer of the call numbered seq: code (0: OK, then bytes/len, the packed
 * response) and message, and wakes the client if it sleeps. An answer larger than the
 * lane's room is RESOURCE_EXHAUSTED instead. The lane is then free for the next call. */
void ttd_lane_answer(ttd_lane *lane, uint64_t seq, int code, const char *message, const void *bytes, uint64_t len);

/* After answering: polls the lane for the client's next call for up to the lane's window
 * while still_idle(arg) holds, and runs it if it comes (ttd_lane_run_fn, on this thread).
 * The window adapts to how soon the client comes back, as ttd_cq_spin's does, at most
 * --device-spin-us (core->device_spin, whose counters it adds to). The client sees
 * daemon_watching meanwhile and does not ring. */
void ttd_lane_linger(ttd_lane *lane, bool (*still_idle)(void *arg), void *arg);

#endif
