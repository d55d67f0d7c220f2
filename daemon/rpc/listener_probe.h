/* The listener prober: each second a thread connects to every listener of --listen, as a
 * client would (a plain-text one must answer the HTTP/2 preface with its SETTINGS, a TLS one
 * a ClientHello), and sets core->metrics.listeners_down, a bit per listener, for /healthz;
 * a listener going down or coming back is logged once. Its own connections come from the
 * TCP source port ttd_listener_probe_port names, which the connection gate exempts from its
 * bounds. */
#ifndef TTD_RPC_LISTENER_PROBE_H
#define TTD_RPC_LISTENER_PROBE_H

#include "core/core.h"

/* How often the prober checks every listener, and how long one answer may take. */
#define TTD_PROBE_MS 1000
#define TTD_PROBE_TIMEOUT_MS 2000

typedef struct ttd_listener_probe ttd_listener_probe;

/* Starts the prober's thread; RESOURCE_EXHAUSTED when it cannot. */
ttd_status_t ttd_listener_probe_start(ttd_core *core, ttd_listener_probe **out_probe);

/* The TCP source port of the prober's current connection (0 before the first; NULL ok).
 * Any thread. */
int ttd_listener_probe_port(const ttd_listener_probe *probe);

/* Stops and joins the thread and frees the prober. NULL ok. */
void ttd_listener_probe_stop(ttd_listener_probe *probe);

#endif
