#include "telemetry/log.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

int ttd_log_threshold = TTD_LOG_INFO;

static _Thread_local uint64_t current_request, current_session;

void ttd_log_set_call(uint64_t request_id, uint64_t session_id) {
  current_request = request_id;
  current_session = session_id;
}

static const char *const level_names[] = {"debug", "info", "warn", "error"};

int ttd_log_level_parse(const char *name) {
  for (int i = 0; i < 4; i++) {
    if (strcmp(name, level_names[i]) == 0) return i;
  }
  return -1;
}

void ttd_log_write(ttd_log_level level, const char *fmt, ...) {
  char line[1024];
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  int n = snprintf(line, sizeof(line), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s ",
                   tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                   ts.tv_nsec / 1000000, level_names[level & 3]);
  if (current_request) {
    n += snprintf(line + n, sizeof(line) - (size_t)n, "req=%" PRIu64 " ", current_request);
    if (current_session && strncmp(fmt, "session=", 8) != 0) {
      n += snprintf(line + n, sizeof(line) - (size_t)n, "session=%016" PRIx64 " ", current_session);
    }
  }
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
  va_end(ap);
  size_t len = strlen(line);
  line[len++] = '\n';
  fwrite(line, 1, len, stderr); /* one write per line: lines from threads do not interleave */
}
