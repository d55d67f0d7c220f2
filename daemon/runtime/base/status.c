#include "base/status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ttd_status_s {
  ttd_code code;
  char message[];
};

/* Returned when a status itself cannot be allocated; never freed. */
static struct {
  ttd_code code;
  char message[48];
} out_of_memory = {GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory"};

static ttd_status_t oom_status(void) { return (ttd_status_t)(void *)&out_of_memory; }

ttd_status_t ttd_make_status(ttd_code code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int len = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (len < 0) len = 0;
  ttd_status_t s = malloc(sizeof(*s) + (size_t)len + 1);
  if (!s) return oom_status();
  s->code = code == GRPC_STATUS_OK ? GRPC_STATUS_INTERNAL : code;
  va_start(ap, fmt);
  vsnprintf(s->message, (size_t)len + 1, fmt, ap);
  va_end(ap);
  return s;
}

ttd_code ttd_status_code(ttd_status_t status) { return status ? status->code : GRPC_STATUS_OK; }

const char *ttd_status_message(ttd_status_t status) { return status ? status->message : ""; }

const char *ttd_code_name(ttd_code code) {
  static const char *const names[] = {
      "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
      "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
      "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
      "UNAUTHENTICATED"};
  if ((unsigned)code < sizeof(names) / sizeof(names[0])) return names[code];
  return "UNKNOWN";
}

void ttd_status_free(ttd_status_t status) {
  if (status && status != oom_status()) free(status);
}
