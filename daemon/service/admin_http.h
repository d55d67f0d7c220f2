/* The admin HTTP listener on the libevent loop: /healthz, /readyz and /metrics (Prometheus
 * text format 0.0.4). Runs on the main thread; reads the core's counters and gauges. */
#ifndef TTD_ADMIN_HTTP_H
#define TTD_ADMIN_HTTP_H

#include <event2/event.h>
#include <stdbool.h>

#include "core/core.h"

typedef struct ttd_admin ttd_admin;

/* Listens on address ("host:port"). UNAVAILABLE naming the address if it cannot bind. */
ttd_status_t ttd_admin_start(struct event_base *base, ttd_core *core, const char *address, ttd_admin **out_admin);

/* /readyz answers 200 only while ready (serving, not draining). */
void ttd_admin_set_ready(ttd_admin *admin, bool ready);

void ttd_admin_stop(ttd_admin *admin); /* accepts NULL */

/* The /metrics text into a new evbuffer-free string (malloc'd, NUL-terminated). */
char *ttd_admin_render_metrics(ttd_core *core);

#endif
