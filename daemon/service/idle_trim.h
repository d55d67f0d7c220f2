/* Gives freed heap memory back to the system once the daemon goes idle. ttd raises glibc's
 * trim threshold so that big tensor buffers are reused rather than returned and faulted in
 * again while clients work; the price is a heap that stays at its high-water mark after a
 * burst (about 0.9 GiB after a 64-client soak, 0.1 GiB once trimmed). A libevent timer
 * checks every TTD_IDLE_TRIM_MS: when calls finished since the last trim but none during
 * the last period and none is in flight, it calls malloc_trim(0). */
#ifndef TTD_IDLE_TRIM_H
#define TTD_IDLE_TRIM_H

#include <event2/event.h>

#include "telemetry/metrics.h"

#define TTD_IDLE_TRIM_MS 2000

typedef struct ttd_idle_trim ttd_idle_trim;

/* Starts the timer on base; NULL if out of memory (the daemon then simply never trims). */
ttd_idle_trim *ttd_idle_trim_create(struct event_base *base, ttd_metrics *metrics);
void ttd_idle_trim_free(ttd_idle_trim *trim); /* NULL ok */

#endif
