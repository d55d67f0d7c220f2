/* The gRPC server: one completion queue drained by one poller thread, a work queue for
 * the calls of heavy methods (rpc/method.h), the method table registered before start,
 * and a call state machine per in-flight call. */
#ifndef TTD_RPC_SERVER_H
#define TTD_RPC_SERVER_H

#include "core/core.h"
#include "rpc/call.h"
#include "rpc/call_lane.h"
#include "rpc/conn_gate.h"

typedef struct ttd_server ttd_server;

/* Binds every address (INVALID_ARGUMENT / UNAVAILABLE naming the one that failed),
 * registers the methods and starts `threads` threads: the poller and threads-1 for heavy
 * calls (with 1, the poller runs them too). grpc_init must have been called. */
ttd_status_t ttd_server_start(ttd_core *core, const char *const *addresses, int address_count,
                              int threads, ttd_server **out_server);

/* Stops accepting, lets in-flight calls finish for up to drain_ms, cancels the rest,
 * joins the threads and frees the server. The core is left to the caller. NULL ok. */
void ttd_server_stop(ttd_server *server, int64_t drain_ms);

/* The server's call lanes, where the shared-memory side socket registers a session's. */
ttd_lanes *ttd_server_lanes(ttd_server *server);

/* Who made call: the peer the connection gate recorded for its connection (a Unix peer's
 * uid and pid, a TCP address), a TLS listener's peer as gRPC names it (kind TCP), or kind
 * TTD_CONN_PEER_UNKNOWN with an empty name for a call run in process. The poller's or the
 * call's own thread (the call is not shared). */
void ttd_call_peer(ttd_call *call, ttd_conn_peer *out);

#endif
