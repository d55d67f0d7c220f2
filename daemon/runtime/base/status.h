/* Layer runtime/base: status values, configuration tables, random ids, block caches, file I/O; the
 * first layer of the shared runtime. Calls only libc, gRPC's status codes and kernels/.
 *
 * ttd_status_t: the one error type of the daemon (IREE style).
 *
 * NULL is OK. Any other value owns a heap object with a gRPC canonical code and a
 * formatted message; whoever receives a status must pass it up, hand it to the RPC
 * layer (which frees it) or free it with ttd_status_free. Thread-safe: statuses are
 * plain values owned by one thread at a time. */
#ifndef TTD_STATUS_H
#define TTD_STATUS_H

#include <grpc/status.h>
#include <stdarg.h>

typedef struct ttd_status_s *ttd_status_t;

#define TTD_OK ((ttd_status_t)0)

/* Codes are gRPC's, so a handler's status maps 1:1 onto the RPC's. */
typedef grpc_status_code ttd_code;

/* Makes a status with a printf-style message. code must not be GRPC_STATUS_OK.
 * Never returns NULL: on allocation failure it returns a static RESOURCE_EXHAUSTED. */
ttd_status_t ttd_make_status(ttd_code code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* GRPC_STATUS_OK for NULL. */
ttd_code ttd_status_code(ttd_status_t status);

/* "" for NULL. The string lives as long as the status. */
const char *ttd_status_message(ttd_status_t status);

/* Canonical name: "OK", "INVALID_ARGUMENT", ... */
const char *ttd_code_name(ttd_code code);

/* Accepts NULL. */
void ttd_status_free(ttd_status_t status);

#define TTD_RETURN_IF_ERROR(expr)          \
  do {                                     \
    ttd_status_t ttd_status_tmp_ = (expr); \
    if (ttd_status_tmp_) return ttd_status_tmp_; \
  } while (0)

#endif
