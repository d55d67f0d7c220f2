/* Logging through one level-filtered macro. One line per event, to stderr (journald
 * picks it up under systemd). Thread-safe. */
#ifndef TTD_LOG_H
#define TTD_LOG_H

typedef enum ttd_log_level {
  TTD_LOG_DEBUG = 0,
  TTD_LOG_INFO = 1,
  TTD_LOG_WARN = 2,
  TTD_LOG_ERROR = 3,
} ttd_log_level;

extern int ttd_log_threshold;

/* Parses "debug", "info", "warn", "error"; returns -1 for anything else. */
int ttd_log_level_parse(const char *name);

void ttd_log_write(ttd_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define TTD_LOG(level, ...)                                       \
  do {                                                            \
    if ((int)(level) >= ttd_log_threshold) ttd_log_write((level), __VA_ARGS__); \
  } while (0)

#endif
