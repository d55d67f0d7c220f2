/* GET over a plain socket and the few gauges the drivers check. */
#include "ft_metrics.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

int ft_http_get(int port, const char *path, char *body, size_t len) {
  body[0] = '\0';
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct timeval tv = {5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  char req[256];
  int n = snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path);
  if (connect(fd, (struct sockaddr *)&a, sizeof(a)) || write(fd, req, (size_t)n) != n) {
    close(fd);
    return -1;
  }
  /* HTTP/1.0: the server closes after the answer. */
  static char buf[1 << 20];
  size_t have = 0;
  for (ssize_t r; have + 1 < sizeof(buf) && (r = read(fd, buf + have, sizeof(buf) - 1 - have)) != 0;) {
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) break;
    have += (size_t)r;
  }
  close(fd);
  buf[have] = '\0';
  int code = -1;
  if (sscanf(buf, "HTTP/%*d.%*d %d", &code) != 1) return -1;
  const char *start = strstr(buf, "\r\n\r\n");
  if (start) snprintf(body, len, "%s", start + 4);
  return code;
}

/* The sum of every sample of metric (any labels); -1 when there is none. */
static double gauge_sum(const char *text, const char *metric) {
  size_t n = strlen(metric);
  double sum = 0;
  int found = 0;
  for (const char *line = text; line && *line; line = strchr(line, '\n'), line = line ? line + 1 : NULL) {
    if (strncmp(line, metric, n) != 0 || (line[n] != ' ' && line[n] != '{')) continue;
    const char *value = line[n] == '{' ? strchr(line + n, '}') : line + n;
    if (!value) continue;
    sum += strtod(value + 1, NULL);
    found = 1;
  }
  return found ? sum : -1;
}

int ft_metrics_read(int port, ft_metrics *out) {
  memset(out, 0, sizeof(*out));
  static char body[1 << 20];
  if (ft_http_get(port, "/metrics", body, sizeof(body)) != 200) return -1;
  double used = gauge_sum(body, "ttd_device_memory_used_bytes"), sessions = gauge_sum(body, "ttd_sessions");
  double tensors = gauge_sum(body, "ttd_tensors"), in_flight = gauge_sum(body, "ttd_rpc_in_flight");
  double pinned = gauge_sum(body, "ttd_device_memory_in_flight_bytes");
  if (used < 0 || sessions < 0 || tensors < 0 || in_flight < 0 || pinned < 0) return -1;
  out->used_bytes = (uint64_t)used;
  out->in_flight_bytes = (uint64_t)pinned;
  out->sessions = (uint64_t)sessions;
  out->tensors = (uint64_t)tensors;
  out->in_flight = (uint64_t)in_flight;
  return 0;
}
