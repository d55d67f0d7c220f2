/* Counters the daemon exports in Prometheus text format on its admin listener: RPCs by
 * method and status code with latency histograms, bytes moved each way, calls in flight.
 * Lock-free (atomics); thread-safe. Gauges (memory, sessions, tensors) are read live when
 * rendering. */
#ifndef TTD_METRICS_H
#define TTD_METRICS_H

#include <grpc/status.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "graph/ops.h"

#define TTD_METRICS_MAX_METHODS 32
#define TTD_METRICS_CODES 17
#define TTD_LATENCY_BUCKETS 13 /* 100 us .. 2.5 s, then +Inf */

typedef struct ttd_method_metrics {
  atomic_ullong by_code[TTD_METRICS_CODES];
  atomic_ullong latency[TTD_LATENCY_BUCKETS + 1]; /* per bucket, not cumulative */
  atomic_ullong latency_sum_ns;
} ttd_method_metrics;

/* Device work per tenant: the first TTD_METRICS_MAX_TENANTS tenant names seen get a slot
 * each; later ones share the last, named "other". */
#define TTD_METRICS_MAX_TENANTS 64
#define TTD_METRICS_TENANT_NAME 64

typedef struct ttd_tenant_metrics {
  char name[TTD_METRICS_TENANT_NAME]; /* "" while the slot is free */
  atomic_ullong card_ns;              /* time its programs held a card */
  atomic_ullong programs;             /* device jobs run */
} ttd_tenant_metrics;

/* Where a card's time goes: each op's nodes, forward and backward (wall time on the card's
 * thread, its kernels' threads included), and each device call's phases. */
typedef struct ttd_op_metrics {
  atomic_ullong ns[2], runs[2]; /* [0] forward, [1] backward */
} ttd_op_metrics;
typedef enum ttd_call_phase {
  TTD_PHASE_WAITING,   /* from its arrival to its turn on the card */
  TTD_PHASE_RUNNING,   /* the method on the card's thread: nodes, optimizer steps, copies */
  TTD_PHASE_ANSWERING, /* packing the answer and handing it to gRPC, on the card's thread */
  TTD_PHASE_COUNT
} ttd_call_phase;

typedef struct ttd_metrics {
  ttd_method_metrics methods[TTD_METRICS_MAX_METHODS];
  ttd_tenant_metrics tenants[TTD_METRICS_MAX_TENANTS];
  atomic_int n_tenants; /* slots named so far; names are written under tenants_lock */
  pthread_mutex_t tenants_lock;
  atomic_ullong bytes_to_device, bytes_to_host;
  atomic_llong in_flight;
  atomic_ullong calls_total; /* every finished RPC, whatever its method */
  /* Connections of the gate's listeners (rpc/conn_gate.h). */
  atomic_ullong connections_refused;      /* past a bound, or no descriptor left */
  atomic_ullong connections_timed_out;    /* no HTTP/2 preface within --handshake-timeout */
  atomic_ullong connections_reset_closed; /* closed for resetting calls too fast */
  atomic_ullong connections_protocol_closed; /* closed for HTTP/2 ttd refuses (h2_frames.h's verdicts) */
  atomic_uint listeners_down;             /* bit i: --listen i did not answer the last probe */
  /* Connections of the admin HTTP listener (service/admin_http.h). */
  atomic_llong admin_connections;         /* open now */
  atomic_ullong admin_connections_refused; /* closed at once, past --admin-max-connections */
  ttd_op_metrics ops[TTD_OP_COUNT];
  atomic_ullong optimizer_ns, optimizer_steps; /* one parameter's update each */
  atomic_ullong phase_ns[TTD_PHASE_COUNT], device_calls;
  /* Same-host call lanes (rpc/call_lane.h). */
  atomic_llong lanes_open;   /* registered now */
  atomic_ullong lane_calls;  /* calls answered on a lane, refused ones included */
} ttd_metrics;

/* Upper bounds of the latency buckets, in seconds. */
extern const double ttd_latency_bounds[TTD_LATENCY_BUCKETS];

/* One finished RPC of method index m (the method table's index; the last slot counts
 * unknown methods). */
void ttd_metrics_record(ttd_metrics *metrics, int m, grpc_status_code code, int64_t duration_ns);

/* One device job of tenant ran for duration_ns on a card. */
void ttd_metrics_record_card(ttd_metrics *metrics, const char *tenant, int64_t duration_ns);

/* A node of op ran for ns, forward or backward: a ttd_run_mode's node_timed, its ctx the
 * ttd_metrics. */
void ttd_metrics_record_node(void *metrics, int op, bool backward, int64_t ns);
/* One parameter's optimizer update took ns. */
void ttd_metrics_record_optimizer(ttd_metrics *metrics, int64_t ns);
/* A device call's phases, in nanoseconds (ttd_call_phase's order). */
void ttd_metrics_record_phases(ttd_metrics *metrics, const int64_t ns[TTD_PHASE_COUNT]);
/* The number of tenant slots in use (read the first that many of metrics->tenants). */
int ttd_metrics_tenant_count(ttd_metrics *metrics);

#endif
