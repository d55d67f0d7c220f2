/* The admin HTTP listener on the libevent loop: /healthz, /readyz and /metrics (Prometheus
 * text format 0.0.4). Runs on the main thread; reads the core's counters and gauges. */
#ifndef TTD_ADMIN_HTTP_H
#define TTD_ADMIN_HTTP_H

#include <event2/event.h>
#include <stdbool.h>

#include "core/core.h"

typedef struct ttd_admin ttd_admin;

/* Listens on address ("host:port"). UNAVAILABLE naming the address if it cannot bind.
 * It holds at most max_connections connections; one more is closed at once (counted in
 * ttd_admin_connections_refused_total). Every peer is bounded: request headers of
 * ADMIN_MAX_HEADER_BYTES, a body of ADMIN_MAX_BODY_BYTES (the endpoints take none),
 * ADMIN_MAX_INPUT_BYTES read ahead of the request it answers (pipelined requests wait in the
 * socket) and timeout_ms without progress each way; past those the connection is answered
 * with an error or closed. When accept fails (no file
 * descriptor left, say) the listener pauses ADMIN_ACCEPT_RETRY_MS and tries again, and the
 * failures are logged at most once a second, counted. */
ttd_status_t ttd_admin_start(struct event_base *base, ttd_core *core, const char *address, int64_t timeout_ms,
                             int max_connections, ttd_admin **out_admin);

#define ADMIN_MAX_HEADER_BYTES 8192
#define ADMIN_MAX_BODY_BYTES 4096
#define ADMIN_MAX_INPUT_BYTES (ADMIN_MAX_HEADER_BYTES + ADMIN_MAX_BODY_BYTES + 4096)
#define ADMIN_ACCEPT_RETRY_MS 100

/* Routes libevent's own warnings through the log, at most one line a second (with the count
 * of those left out), so that a failure repeating in the loop cannot flood the journal. */
void ttd_admin_route_libevent_log(void);

/* The TCP port it listens on: the kernel's choice when address asked for port 0. */
int ttd_admin_port(const ttd_admin *admin);

/* /readyz answers 200 only while ready (serving, not draining). */
void ttd_admin_set_ready(ttd_admin *admin, bool ready);

void ttd_admin_stop(ttd_admin *admin); /* accepts NULL */

/* The /metrics text into a new evbuffer-free string (malloc'd, NUL-terminated). */
char *ttd_admin_render_metrics(ttd_core *core);

#endif
