/* The admin HTTP listener against hostile local peers, on a real ttd with --admin-timeout 1
 * and --admin-max-connections 8: oversized headers and bodies are refused without being
 * buffered, an idle or slow peer is closed after the timeout, connections past the bound are
 * closed at once, pipelined requests whose answers are not read are not buffered, and when
 * accept fails for lack of file descriptors the listener
 * pauses instead of spinning, logs at most a line a second, and serves again once
 * descriptors are free. */
#define _GNU_SOURCE /* prlimit */
#include <arpa/inet.h>
#include <check.h>
#include <stdbool.h>
#include <dirent.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "suites.h"
#include "ttd_harness.h"

static ttd_proc proc;
static int port;

static void setup(void) {
  char admin[32];
  port = harness_free_tcp_port();
  snprintf(admin, sizeof(admin), "127.0.0.1:%d", port);
  const char *args[] = {"--admin", admin, "--admin-timeout", "1", "--admin-max-connections", "8", NULL};
  ttd_proc_start(&proc, args);
  char *r = harness_http(port, "GET", "/healthz");
  ck_assert_ptr_nonnull(strstr(r, "200 OK"));
  free(r);
}

static void teardown(void) { ck_assert_int_eq(ttd_proc_stop(&proc), 0); }

static int connect_admin(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
  struct timeval tv = {5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

/* Sends what it can of n bytes (the peer may close first); returns the bytes sent. */
static size_t send_some(int fd, const char *data, size_t n) {
  size_t sent = 0;
  while (sent < n) {
    ssize_t k = send(fd, data + sent, n - sent, MSG_NOSIGNAL);
    if (k <= 0) break;
    sent += (size_t)k;
  }
  return sent;
}

/* Reads until the peer closes or 5 s pass; the text read (malloc'd). */
static char *read_all(int fd) {
  size_t cap = 4096, len = 0;
  char *buf = malloc(cap);
  ssize_t got;
  while ((got = recv(fd, buf + len, cap - len - 1, 0)) > 0) {
    len += (size_t)got;
    if (len + 1 == cap) buf = realloc(buf, cap *= 2);
  }
  buf[len] = '\0';
  return buf;
}

/* 64 KiB of headers: refused (not 200), and the listener answers the next request. */
START_TEST(test_oversized_headers_refused) {
  int fd = connect_admin();
  size_t n = 64 << 10;
  char *req = malloc(n + 64);
  int k = sprintf(req, "GET /healthz HTTP/1.1\r\nX-Pad: ");
  memset(req + k, 'a', n);
  memcpy(req + k + n, "\r\n\r\n", 4);
  send_some(fd, req, (size_t)k + n + 4);
  char *r = read_all(fd);
  ck_assert_msg(strstr(r, " 200 ") == NULL, "%s", r);
  free(r), free(req);
  close(fd);
  r = harness_http(port, "GET", "/healthz");
  ck_assert_ptr_nonnull(strstr(r, "200 OK"));
  free(r);
}
END_TEST

/* A POST announcing 100 MiB and sending 32 MiB: refused early; the daemon's resident
 * memory grows by less than 8 MiB. */
START_TEST(test_oversized_body_not_buffered) {
  long before = harness_rss_kib(&proc);
  int fd = connect_admin();
  const char *head = "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 104857600\r\n\r\n";
  send_some(fd, head, strlen(head));
  size_t chunk = 1 << 20, total = 0;
  char *junk = calloc(1, chunk);
  for (int i = 0; i < 32; i++) {
    size_t sent = send_some(fd, junk, chunk);
    total += sent;
    if (sent < chunk) break;
  }
  char *r = read_all(fd);
  ck_assert_msg(strstr(r, " 200 ") == NULL, "%s", r);
  long after = harness_rss_kib(&proc);
  ck_assert_msg(after - before < 8192, "RSS grew %ld KiB after %zu body bytes", after - before, total);
  free(r), free(junk);
  close(fd);
}
END_TEST

/* A peer that sends half a request line and waits is closed within the timeout (1 s) plus a
 * second's slack. */
START_TEST(test_idle_peer_closed) {
  int fd = connect_admin();
  send_some(fd, "GET /hea", 8);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  char *r = read_all(fd);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double waited = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
  ck_assert_msg(waited < 2.5, "closed after %.2f s", waited);
  ck_assert_msg(strstr(r, " 200 ") == NULL, "%s", r);
  free(r);
  close(fd);
}
END_TEST

/* Whether the peer has closed fd (without waiting). */
static bool closed_by_peer(int fd) {
  char c;
  return recv(fd, &c, 1, MSG_DONTWAIT) == 0;
}

/* 20 peers each holding half a request: 8 are kept, the 12 past --admin-max-connections are
 * closed at once (within 300 ms, well before the 1 s timeout) and counted; once the 8 close, the listener answers again and counts one
 * open connection (the one asking). */
START_TEST(test_connections_capped) {
  int fds[20], refused = 0;
  for (int i = 0; i < 20; i++) {
    fds[i] = connect_admin();
    send_some(fds[i], "GET /healthz HTTP/1.1\r\nX-a: ", 29);
  }
  usleep(300 * 1000);
  for (int i = 0; i < 20; i++) refused += closed_by_peer(fds[i]) ? 1 : 0;
  for (int i = 0; i < 20; i++) close(fds[i]);
  ck_assert_int_eq(refused, 12);
  char *r = NULL;
  for (int i = 0; i < 20; i++) { /* the daemon sees the closes within a turn of its loop */
    free(r);
    r = harness_http(port, "GET", "/metrics");
    if (harness_metric(r, "ttd_admin_connections") == 1) break;
    usleep(50 * 1000);
  }
  ck_assert_msg(strstr(r, "200 OK") != NULL, "%s", r);
  ck_assert_int_eq((int)harness_metric(r, "ttd_admin_connections"), 1);
  ck_assert_int_eq((int)harness_metric(r, "ttd_admin_connections_refused_total"), 12);
  free(r);
}
END_TEST

/* A peer pipelining 64 MiB of GET /metrics without reading an answer: the daemon stops
 * taking bytes after a bounded amount (under 16 MiB, the sockets' buffers included), its peak
 * RSS grows by less than 8 MiB, and the listener answers others. */
START_TEST(test_pipelined_requests_not_buffered) {
  long before = harness_hwm_kib(&proc);
  int fd = connect_admin();
  int small = 4096;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  struct timeval tv = {3, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  const char *one = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
  size_t len = strlen(one), chunk = 1 << 20, total = 0;
  char *reqs = malloc(chunk);
  for (size_t off = 0; off + len <= chunk; off += len) memcpy(reqs + off, one, len);
  chunk -= chunk % len;
  for (int i = 0; i < 64; i++) {
    size_t sent = send_some(fd, reqs, chunk);
    total += sent;
    if (sent < chunk) break;
  }
  long after = harness_hwm_kib(&proc);
  ck_assert_msg(total < (16u << 20), "the daemon took %zu bytes of pipelined requests", total);
  /* Under the sanitizer the answers' freed memory stays in ASan's quarantine. */
  ck_assert_msg(getenv("TTD_SKIP_HUGE") || after - before < 8192, "peak RSS grew %ld KiB after %zu bytes",
                after - before, total);
  free(reqs);
  close(fd);
  char *r = harness_http(port, "GET", "/healthz");
  ck_assert_ptr_nonnull(strstr(r, "200 OK"));
  free(r);
}
END_TEST

static int open_fds(pid_t pid) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
  DIR *d = opendir(path);
  int n = 0;
  while (d && readdir(d)) n++;
  if (d) closedir(d);
  return n - 2;
}

static double cpu_seconds(pid_t pid) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  unsigned long utime = 0, stime = 0;
  if (f) {
    ck_assert_int_eq(fscanf(f, "%*d %*s %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime, &stime), 2);
    fclose(f);
  }
  return (double)(utime + stime) / (double)sysconf(_SC_CLK_TCK);
}

/* With its descriptors nearly used up, 40 connections wait: accept fails; the listener
 * pauses (under a quarter of a core spent), logs at most one line a second, and answers
 * again once the limit is back. */
START_TEST(test_accept_failure_pauses_and_recovers) {
  struct rlimit old, tight;
  ck_assert_int_eq(prlimit(proc.pid, RLIMIT_NOFILE, NULL, &old), 0);
  tight = old;
  tight.rlim_cur = (rlim_t)open_fds(proc.pid) + 2;
  ck_assert_int_eq(prlimit(proc.pid, RLIMIT_NOFILE, &tight, NULL), 0);
  int fds[40];
  for (int i = 0; i < 40; i++) fds[i] = connect_admin(); /* the kernel queues them */
  double cpu0 = cpu_seconds(proc.pid);
  sleep(2);
  double spent = cpu_seconds(proc.pid) - cpu0;
  int lines = harness_log_count(&proc, "event=admin-accept-failed");
  for (int i = 0; i < 40; i++) close(fds[i]);
  ck_assert_int_eq(prlimit(proc.pid, RLIMIT_NOFILE, &old, NULL), 0);
  ck_assert_msg(lines >= 1 && lines <= 4, "%d accept-failure lines in 2 s", lines);
  ck_assert_msg(spent < 0.5, "the daemon spent %.2f s of CPU in 2 s", spent);
  /* The squeeze also kept the gRPC listeners from taking the prober's connection: /healthz
   * is 200 again from the prober's next look (TTD_PROBE_MS). */
  char *r = NULL;
  for (int i = 0; i < 30; i++) {
    free(r);
    r = harness_http(port, "GET", "/healthz");
    if (strstr(r, "200 OK")) break;
    usleep(100 * 1000);
  }
  ck_assert_msg(strstr(r, "200 OK") != NULL, "%s", r);
  free(r);
}
END_TEST

Suite *e2e_admin_bounds_suite(void) {
  Suite *s = suite_create("e2e_admin_bounds");
  TCase *tc = tcase_create("admin_bounds");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_oversized_headers_refused);
  tcase_add_test(tc, test_oversized_body_not_buffered);
  tcase_add_test(tc, test_idle_peer_closed);
  tcase_add_test(tc, test_connections_capped);
  tcase_add_test(tc, test_pipelined_requests_not_buffered);
  tcase_add_test(tc, test_accept_failure_pauses_and_recovers);
  suite_add_tcase(s, tc);
  return s;
}
