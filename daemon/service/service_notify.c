#include "service/service_notify.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <systemd/sd-daemon.h>

#include "telemetry/log.h"

struct ttd_notify_watchdog_timer {
  struct event *event;
  unsigned long long period_usec;
};

static int notify_socket_set(void) {
  const char *socket = getenv("NOTIFY_SOCKET");
  return socket && *socket;
}

/* Sends head (e.g. "READY=1\n") followed by STATUS=<formatted text> when fmt is not NULL. */
static int send_state(const char *head, const char *fmt, va_list ap) {
  if (!notify_socket_set()) return 0;
  char message[768];
  size_t len = (size_t)snprintf(message, sizeof(message), "%s", head);
  if (fmt) {
    len += (size_t)snprintf(message + len, sizeof(message) - len, "STATUS=");
    size_t status_at = len;
    vsnprintf(message + len, sizeof(message) - len, fmt, ap);
    for (char *c = message + status_at; *c; c++) {
      if (*c == '\n') *c = ' '; /* one line: a newline would start a new assignment */
    }
  }
  int sent = sd_notify(0, message);
  if (sent < 0) {
    TTD_LOG(TTD_LOG_WARN, "event=notify-failed message=\"%.*s\" reason=\"%s\"", (int)strcspn(message, "\n"), message,
            strerror(-sent));
  }
  return sent;
}

int ttd_notify_ready(const char *status_fmt, ...) {
  va_list ap;
  va_start(ap, status_fmt);
  int sent = send_state("READY=1\n", status_fmt, ap);
  va_end(ap);
  return sent;
}

int ttd_notify_stopping(const char *status_fmt, ...) {
  va_list ap;
  va_start(ap, status_fmt);
  int sent = send_state("STOPPING=1\n", status_fmt, ap);
  va_end(ap);
  return sent;
}

int ttd_notify_status(const char *status_fmt, ...) {
  va_list ap;
  va_start(ap, status_fmt);
  int sent = send_state("", status_fmt, ap);
  va_end(ap);
  return sent;
}

int ttd_notify_watchdog(void) {
  if (!notify_socket_set()) return 0;
  int sent = sd_notify(0, "WATCHDOG=1");
  if (sent < 0) TTD_LOG(TTD_LOG_WARN, "event=notify-failed message=\"WATCHDOG=1\" reason=\"%s\"", strerror(-sent));
  return sent;
}

static void on_watchdog(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  (void)arg;
  ttd_notify_watchdog();
}

ttd_notify_watchdog_timer *ttd_notify_watchdog_timer_create(struct event_base *base) {
  if (!notify_socket_set()) return NULL;
  uint64_t usec = 0;
  int enabled = sd_watchdog_enabled(0, &usec);
  if (enabled < 0) {
    TTD_LOG(TTD_LOG_WARN, "event=watchdog-ignored reason=\"WATCHDOG_USEC or WATCHDOG_PID malformed: %s\"",
            strerror(-enabled));
    return NULL;
  }
  if (enabled == 0 || usec == 0) return NULL;
  ttd_notify_watchdog_timer *timer = calloc(1, sizeof(*timer));
  if (timer) timer->event = event_new(base, -1, EV_PERSIST, on_watchdog, NULL);
  if (!timer || !timer->event) {
    TTD_LOG(TTD_LOG_ERROR, "event=watchdog-failed reason=\"out of memory for the watchdog timer\"");
    free(timer);
    return NULL;
  }
  timer->period_usec = usec / 2 > 0 ? usec / 2 : 1;
  struct timeval every = {.tv_sec = (time_t)(timer->period_usec / 1000000),
                          .tv_usec = (suseconds_t)(timer->period_usec % 1000000)};
  event_add(timer->event, &every);
  ttd_notify_watchdog();
  TTD_LOG(TTD_LOG_INFO, "event=watchdog-armed watchdog_usec=%llu ping_usec=%llu", (unsigned long long)usec,
          timer->period_usec);
  return timer;
}

unsigned long long ttd_notify_watchdog_timer_period_usec(const ttd_notify_watchdog_timer *timer) {
  return timer ? timer->period_usec : 0;
}

void ttd_notify_watchdog_timer_free(ttd_notify_watchdog_timer *timer) {
  if (!timer) return;
  event_free(timer->event);
  free(timer);
}
