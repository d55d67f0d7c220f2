/* Connections against hostile peers, on a real ttd with a plain-text TCP listener beside its
 * Unix socket: one peer's connections past --max-peer-connections are closed while a tenant
 * is still served; a connection that never sends the HTTP/2 preface is closed after
 * --handshake-timeout; after descriptors run out, both listeners (the gate's) still accept
 * and /healthz stays up; a peer that resets calls as fast as it can (HTTP/2 rapid reset) is
 * disconnected. */
#define _GNU_SOURCE /* prlimit */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
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
static int tcp_port, admin_port;

static void start(const char *handshake_timeout) {
  char listen[32], admin[32];
  tcp_port = harness_free_tcp_port();
  admin_port = harness_free_tcp_port();
  snprintf(listen, sizeof(listen), "127.0.0.1:%d", tcp_port);
  snprintf(admin, sizeof(admin), "127.0.0.1:%d", admin_port);
  const char *args[] = {"--listen", listen, "--insecure", "--admin", admin, "--max-peer-connections", "8",
                        "--handshake-timeout", handshake_timeout, NULL};
  ttd_proc_start(&proc, args);
}

static void setup(void) { start("10"); }
static void teardown(void) { ck_assert_int_eq(ttd_proc_stop(&proc), 0); }

static int connect_tcp(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)tcp_port),
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
    close(fd);
    return -1;
  }
  struct timeval tv = {0, 300 * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

/* Whether the daemon closed fd within ms (a read returns 0 or an error other than a timeout). */
static int closed_within(int fd, int ms) {
  char buf[4096];
  for (int waited = 0; waited < ms; waited += 300) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) return 1;
  }
  return 0;
}

static void tenant_served(const char *target) {
  tt_connect_options o;
  tt_connect_options_init(&o);
  o.insecure = 1; /* the TCP listener is plain text */
  tt_client *c = NULL;
  ck_assert_msg(tt_connect(target, &o, &c) == TT_OK, "tt_connect %s: %s", target, tt_last_error(c));
  tt_device_info *devices = NULL;
  size_t count = 0;
  ck_assert_int_eq(tt_list_devices(c, &devices, &count), TT_OK);
  tt_device_list_free(devices);
  tt_disconnect(c);
}

/* 20 idle connections from 127.0.0.1: 8 stay, 12 are closed at once; a tenant on the Unix
 * socket is served meanwhile, and one on TCP once the idle ones are gone. */
START_TEST(test_peer_bound) {
  int fds[20], closed = 0;
  for (int i = 0; i < 20; i++) ck_assert_int_ge(fds[i] = connect_tcp(), 0);
  for (int i = 0; i < 20; i++) closed += closed_within(fds[i], 600);
  ck_assert_int_eq(closed, 12);
  tenant_served(proc.target);
  for (int i = 0; i < 20; i++) close(fds[i]);
  char target[32];
  snprintf(target, sizeof(target), "127.0.0.1:%d", tcp_port);
  usleep(200 * 1000);
  tenant_served(target);
  ck_assert_int_ge(harness_log_count(&proc, "--max-peer-connections reached"), 1);
}
END_TEST

/* With --handshake-timeout 500ms, a connection that sends nothing is closed after it, not
 * before; one that sends only part of the preface too. */
START_TEST(test_handshake_timeout) {
  ck_assert_int_eq(ttd_proc_stop(&proc), 0);
  start("500ms");
  int idle = connect_tcp(), partial = connect_tcp();
  ck_assert_int_ge(idle, 0);
  ck_assert_int_ge(partial, 0);
  ck_assert_int_eq(send(partial, "PRI * HTTP", 10, MSG_NOSIGNAL), 10);
  ck_assert_int_eq(closed_within(idle, 300), 0);
  ck_assert_int_eq(closed_within(idle, 3000), 1);
  ck_assert_int_eq(closed_within(partial, 3000), 1);
  close(idle);
  close(partial);
  char *m = harness_http(admin_port, "GET", "/metrics");
  ck_assert_double_ge(harness_metric(m, "ttd_connections_handshake_timeouts_total"), 2);
  free(m);
}
END_TEST

/* Descriptors run out while peers flood both listeners: the gate refuses what it cannot
 * hold, and once descriptors are back both the Unix socket file and the TCP listener serve
 * a tenant and /healthz answers 200. */
START_TEST(test_fd_exhaustion) {
  struct rlimit old, tight;
  ck_assert_int_eq(prlimit(proc.pid, RLIMIT_NOFILE, NULL, &old), 0);
  char *r = harness_http(admin_port, "GET", "/healthz");
  ck_assert_ptr_nonnull(strstr(r, "200 OK"));
  free(r);
  tight = old;
  tight.rlim_cur = 64; /* well under what the floods below want */
  ck_assert_int_eq(prlimit(proc.pid, RLIMIT_NOFILE, &tight, NULL), 0);
  int held[200], n = 0;
  const char *path = proc.target + 5;
  for (int i = 0; i < 100; i++) held[n++] = harness_unix_connect(path, SOCK_STREAM);
  for (int i = 0; i < 100; i++) {
    int fd = connect_tcp();
    if (fd >= 0) held[n++] = fd;
  }
  usleep(500 * 1000);
  for (int i = 0; i < n; i++) close(held[i]);
  ck_assert_int_eq(prlimit(proc.pid, RLIMIT_NOFILE, &old, NULL), 0);
  char target[32];
  snprintf(target, sizeof(target), "127.0.0.1:%d", tcp_port);
  usleep(500 * 1000);
  tenant_served(target);
  tenant_served(proc.target);
  int healthy = 0;
  for (int i = 0; i < 50 && !healthy; i++) { /* the prober looks again within a second */
    r = harness_http(admin_port, "GET", "/healthz");
    healthy = strstr(r, "200 OK") != NULL;
    free(r);
    if (!healthy) usleep(100 * 1000);
  }
  ck_assert_msg(healthy, "/healthz did not come back after descriptors did");
  ck_assert_int_ge(harness_log_count(&proc, "event=connection-refused"), 1);
}
END_TEST

/* HTTP/2 frames by hand: a HEADERS frame opening ListDevices and an RST_STREAM cancelling
 * it, 1024 times: the daemon closes the connection, logs it, and serves a tenant after. */
static size_t frame(unsigned char *out, int type, int flags, uint32_t stream, const void *payload, size_t len) {
  out[0] = (unsigned char)(len >> 16), out[1] = (unsigned char)(len >> 8), out[2] = (unsigned char)len;
  out[3] = (unsigned char)type, out[4] = (unsigned char)flags;
  out[5] = (unsigned char)(stream >> 24), out[6] = (unsigned char)(stream >> 16);
  out[7] = (unsigned char)(stream >> 8), out[8] = (unsigned char)stream;
  if (len) memcpy(out + 9, payload, len);
  return 9 + len;
}

static size_t literal(unsigned char *out, const char *name, const char *value) {
  size_t n = strlen(name), v = strlen(value);
  out[0] = 0, out[1] = (unsigned char)n;
  memcpy(out + 2, name, n);
  out[2 + n] = (unsigned char)v;
  memcpy(out + 3 + n, value, v);
  return 3 + n + v;
}

START_TEST(test_rapid_reset_disconnected) {
  unsigned char headers[256];
  size_t h = 0;
  headers[h++] = 0x83, headers[h++] = 0x86; /* :method POST, :scheme http */
  h += literal(headers + h, ":path", "/ttd.v1.Device/ListDevices");
  h += literal(headers + h, ":authority", "x");
  h += literal(headers + h, "content-type", "application/grpc");
  h += literal(headers + h, "te", "trailers");
  int fd = connect_tcp();
  ck_assert_int_ge(fd, 0);
  unsigned char buf[64 * 512];
  size_t n = 0;
  memcpy(buf, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 24);
  n = 24 + frame(buf + 24, 4, 0, 0, NULL, 0);
  ck_assert_int_eq(send(fd, buf, n, MSG_NOSIGNAL), (ssize_t)n);
  static const unsigned char cancel[4] = {0, 0, 0, 8};
  int sent = 0, broken = 0;
  while (sent < 1024 && !broken) {
    n = 0;
    for (int i = 0; i < 256; i++, sent++) {
      uint32_t id = 2 * (uint32_t)sent + 1;
      n += frame(buf + n, 1, 0x4, id, headers, h);
      n += frame(buf + n, 3, 0, id, cancel, sizeof(cancel));
    }
    if (send(fd, buf, n, MSG_NOSIGNAL) != (ssize_t)n) broken = 1;
  }
  ck_assert_int_eq(broken || closed_within(fd, 5000), 1);
  close(fd);
  for (int i = 0; i < 50 && harness_log_count(&proc, "event=rapid-reset action=closed") == 0; i++) usleep(100 * 1000);
  ck_assert_int_ge(harness_log_count(&proc, "event=rapid-reset action=closed"), 1);
  tenant_served(proc.target);
}
END_TEST

Suite *e2e_conn_bounds_suite(void) {
  Suite *s = suite_create("e2e_conn_bounds");
  TCase *tc = tcase_create("conn_bounds");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_peer_bound);
  tcase_add_test(tc, test_handshake_timeout);
  tcase_add_test(tc, test_fd_exhaustion);
  tcase_add_test(tc, test_rapid_reset_disconnected);
  suite_add_tcase(s, tc);
  return s;
}
