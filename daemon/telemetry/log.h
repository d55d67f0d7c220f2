/* Layer daemon/telemetry (the server's bottom): logging and metric counters. Calls libc only.
 *
 * Logging through one level-filtered macro. One line per event, to stderr (journald
 * picks it up under systemd). Thread-safe. A line written while a thread serves an RPC
 * starts with that call's req= id (sent to the client as ttd-request-id metadata) and its
 * session=, so every line of one request can be found with one grep. Per-call lines are
 * DEBUG: INFO stays quiet under load (start, stop, sessions opened, closed, expired). */
#ifndef TTD_LOG_H
#define TTD_LOG_H

#include <stdint.h>

typedef enum ttd_log_level {
  TTD_LOG_DEBUG = 0,
  TTD_LOG_INFO = 1,
  TTD_LOG_WARN = 2,
  TTD_LOG_ERROR = 3,
} ttd_log_level;

extern int ttd_log_threshold;

/* Parses "debug", "info", "warn", "error"; returns -1 for anything else. */
int ttd_log_level_parse(const char *name);

/* The call this thread now works on (request id 0: none). */
void ttd_log_set_call(uint64_t request_id, uint64_t session_id);

void ttd_log_write(ttd_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define TTD_LOG(level, ...)                                       \
  do {                                                            \
    if ((int)(level) >= ttd_log_threshold) ttd_log_write((level), __VA_ARGS__); \
  } while (0)

#endif
