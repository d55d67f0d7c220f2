#include "service/idle_trim.h"

#include <malloc.h>
#include <stdbool.h>
#include <stdlib.h>

#include "telemetry/log.h"

struct ttd_idle_trim {
  struct event *timer;
  ttd_metrics *metrics;
  unsigned long long calls_seen; /* calls_total at the last check */
  bool dirty;                    /* calls finished since the last trim */
};

static void on_check(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  ttd_idle_trim *t = arg;
  unsigned long long calls = atomic_load_explicit(&t->metrics->calls_total, memory_order_relaxed);
  if (calls != t->calls_seen) { /* busy during this period: wait for a quiet one */
    t->calls_seen = calls;
    t->dirty = true;
    return;
  }
  if (!t->dirty || atomic_load_explicit(&t->metrics->in_flight, memory_order_relaxed) != 0) return;
  int released = malloc_trim(0);
  t->dirty = false;
  TTD_LOG(TTD_LOG_DEBUG, "event=idle-trim released=%d", released);
}

ttd_idle_trim *ttd_idle_trim_create(struct event_base *base, ttd_metrics *metrics) {
  ttd_idle_trim *t = calloc(1, sizeof(*t));
  if (!t) return NULL;
  t->metrics = metrics;
  t->timer = event_new(base, -1, EV_PERSIST, on_check, t);
  struct timeval every = {.tv_sec = TTD_IDLE_TRIM_MS / 1000, .tv_usec = (TTD_IDLE_TRIM_MS % 1000) * 1000};
  if (!t->timer || event_add(t->timer, &every) != 0) {
    ttd_idle_trim_free(t);
    return NULL;
  }
  return t;
}

void ttd_idle_trim_free(ttd_idle_trim *t) {
  if (!t) return;
  if (t->timer) event_free(t->timer);
  free(t);
}
