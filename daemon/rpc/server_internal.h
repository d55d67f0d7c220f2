/* What the server's files share (server.c: calls; server_stop.c: the drain and the stop):
 * the server itself. Private to daemon/rpc/. */
#ifndef TTD_RPC_SERVER_INTERNAL_H
#define TTD_RPC_SERVER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "rpc/server.h"
#include "work/work_queue.h"

struct ttd_server {
  ttd_core *core;
  grpc_server *server;
  grpc_completion_queue *cq;
  void **registered; /* per method */
  pthread_t poller;     /* the one thread draining cq */
  int thread_count;     /* 1 once the poller runs */
  ttd_work_queue *heavy; /* runs the events of methods marked heavy; NULL: the poller does */
  int shutdown_tag; /* its address is the tag of grpc_server_shutdown_and_notify */
  pthread_mutex_t lock;
  pthread_cond_t shutdown_done_cond;
  bool shutdown_done;
  atomic_long live_calls; /* call contexts not yet destroyed, requested ones included */
  atomic_ullong next_request_id;
  atomic_bool cancelling; /* the drain timeout passed: queued device work is not run */
  ttd_call *active;       /* calls a client started, not yet destroyed; under lock */
  ttd_conn_gate *gate;    /* accepts for every listener (ends TLS, relays TCP); probes them */
  grpc_server_credentials *fd_creds; /* insecure: for the connections the gate hands over */
  ttd_lanes *lanes;       /* the same-host call lanes, whose calls run here as gRPC ones do */
};

/* The one switch that drives a call: the poller's (or, with none, the stop's) events. */
void ttd_server_on_call_event(ttd_call *c, bool ok);

/* Frees what ttd_server_start made around the gRPC server (the gate, the credentials, the
 * method table) and the server. */
void ttd_server_free(ttd_server *server);

#endif
