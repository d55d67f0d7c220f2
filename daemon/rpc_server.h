/* The gRPC server: one completion queue, a pool of worker threads draining it, the
 * method table registered before start, and a call state machine per in-flight call. */
#ifndef TTD_RPC_SERVER_H
#define TTD_RPC_SERVER_H

#include "core.h"

typedef struct ttd_server ttd_server;

/* Binds every address (INVALID_ARGUMENT / UNAVAILABLE naming the one that failed),
 * registers the methods and starts `threads` workers. grpc_init must have been called. */
ttd_status_t ttd_server_start(ttd_core *core, const char *const *addresses, int address_count,
                              int threads, ttd_server **out_server);

/* Stops accepting, lets in-flight calls finish for up to drain_ms, cancels the rest,
 * joins the workers and frees the server. The core is left to the caller. NULL ok. */
void ttd_server_stop(ttd_server *server, int64_t drain_ms);

#endif
