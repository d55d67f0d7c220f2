/* The daemon's figures from its admin endpoint (GET /metrics on 127.0.0.1:PORT, Prometheus
 * text): device memory in use, sessions, tensors, calls in flight. Not thread-safe (static
 * buffers). */
#ifndef TTD_FT_METRICS_H
#define TTD_FT_METRICS_H

#include <stddef.h>
#include <stdint.h>

typedef struct ft_metrics {
  uint64_t used_bytes; /* ttd_device_memory_used_bytes summed over devices and locations */
  uint64_t in_flight_bytes; /* ttd_device_memory_in_flight_bytes, summed the same way */
  uint64_t sessions;   /* ttd_sessions */
  uint64_t tensors;    /* ttd_tensors */
  uint64_t in_flight;  /* ttd_rpc_in_flight */
} ft_metrics;

/* GET path from 127.0.0.1:port into body (NUL-terminated, truncated to len - 1); the HTTP
 * status, or -1 when the endpoint cannot be reached. */
int ft_http_get(int port, const char *path, char *body, size_t len);

/* Reads /metrics; 0, or -1 when unreachable or a gauge is missing. */
int ft_metrics_read(int port, ft_metrics *out);

#endif
