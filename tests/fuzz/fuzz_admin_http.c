/* Fuzz harness: the admin HTTP server (daemon/service/admin_http.c) as a peer on the
 * network meets it. One admin listener, started by ttd_admin_start on 127.0.0.1 with a
 * port the kernel picks, serves every input on the harness's libevent loop over the
 * in-process daemon core (fuzz_core.h). Each input is one TCP connection: it sends the
 * input's bytes as they are, and once the loop has nothing else to run (the server waits
 * for more: every request it could read is answered) it ends its side (shutdown SHUT_WR)
 * and reads until the server closes. So evhttp's parser, the header and body caps
 * (ADMIN_MAX_HEADER_BYTES, ADMIN_MAX_BODY_BYTES), the method filter and every route
 * (/healthz, /readyz, /metrics, and the 404 and 405 answers) see the bytes.
 *
 * Input: the raw bytes of one or more HTTP requests, pipelined. One session of the local
 * tenant is open throughout, so /metrics lists a tenant; /readyz sees the daemon ready
 * when the input's length is even, draining when it is odd.
 *
 * What the server sends must be HTTP answers that a client on a kept-alive connection can
 * tell apart (check_response; the server may also close without answering a request it
 * cannot parse), and no answer may be 500 (the routes have no server error to give a
 * client's bytes). A connection that makes no progress for
 * STUCK_SECONDS aborts, and so does one the server keeps open past the input: the process
 * must hold the descriptors it held before. */
#include <errno.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "service/admin_http.h"
#include "fuzz_core.h"

#define STUCK_SECONDS 10
#define RESPONSE_KEPT (1u << 20) /* bytes of the answers kept for the checks; the rest is read and dropped */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct event_base *base;
static ttd_admin *admin;

/* The harness's side of one input's connection. */
typedef struct client {
  int fd;
  struct event *readable, *writable;
  struct event *idle; /* at the lowest priority: runs when no other callback is ready */
  const uint8_t *data;
  size_t left; /* input bytes not sent yet */
  char *response;
  size_t response_len;
  bool stuck;
} client;

static void on_writable(evutil_socket_t fd, short what, void *arg) {
  (void)what;
  client *c = arg;
  ssize_t n = c->left ? send(fd, c->data, c->left, MSG_NOSIGNAL) : 0;
  if (n > 0) {
    c->data += n;
    c->left -= (size_t)n;
  } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
    return;
  } else {
    c->left = 0; /* the server closed: nothing more to send */
  }
  if (c->left) return;
  event_del(c->writable);
  event_active(c->idle, EV_TIMEOUT, 0);
}

/* Every byte is sent and the server has run out of work: it answered what it could read
 * and waits for more (the end of a request that is not complete, or the next one). */
static void on_idle(evutil_socket_t fd, short what, void *arg) {
  (void)fd, (void)what;
  client *c = arg;
  shutdown(c->fd, SHUT_WR);
}

static void on_readable(evutil_socket_t fd, short what, void *arg) {
  client *c = arg;
  if (what & EV_TIMEOUT) {
    c->stuck = true;
    event_base_loopbreak(base);
    return;
  }
  char buf[16384];
  ssize_t n = recv(fd, buf, sizeof(buf), 0);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n <= 0) { /* closed, or reset */
    event_base_loopbreak(base);
    return;
  }
  size_t keep = c->response_len < RESPONSE_KEPT ? RESPONSE_KEPT - c->response_len : 0;
  keep = keep < (size_t)n ? keep : (size_t)n;
  memcpy(c->response + c->response_len, buf, keep);
  c->response_len += keep;
}

static void start_admin(ttd_core *core) {
  ttd_admin_route_libevent_log(); /* libevent's complaints about bad requests: quiet, as the daemon's log */
  base = event_base_new();
  if (base && event_base_priority_init(base, 3) != 0) abort(); /* the server's events at 1, the idle one at 2 */
  ttd_status_t status = base ? ttd_admin_start(base, core, "127.0.0.1:0", 2000, 64, &admin) : TTD_OK;
  if (!base || status) {
    fprintf(stderr, "fuzz: cannot start the admin listener: %s\n",
            status ? ttd_status_message(status) : "no event base");
    abort();
  }
}

static int connect_admin(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)ttd_admin_port(admin))};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 && errno != EINPROGRESS)) {
    perror("fuzz: cannot connect to the admin listener");
    abort();
  }
  return fd;
}

/* The value of header name (with its ": ") in the head [at, end), or NULL. */
static const char *find_header(const char *at, const char *end, const char *name) {
  size_t n = strlen(name);
  for (const char *line = at; line && line < end; line = strstr(line, "\r\n"), line = line ? line + 2 : NULL) {
    if (line + n <= end && strncasecmp(line, name, n) == 0) return line + n;
  }
  return NULL;
}

/* Aborts unless what the server sent is a sequence of HTTP answers, each framed so that a
 * client on a kept-alive connection finds the next: its body as long as its Content-Length
 * says, or none at all (a HEAD answer, 100 Continue) unless the close ends it (any version
 * but HTTP/1.1 and later 1.x, which evhttp answers in kind, or Connection: close, as its own
 * error pages say). No answer may be a 500. With FUZZ_VERBOSE set, prints each status line
 * (to see what a seed does). */
static void check_response(const client *c) {
  const char *r = c->response, *end = r + c->response_len;
  bool verbose = getenv("FUZZ_VERBOSE") != NULL;
  if (verbose) fprintf(stderr, "fuzz: %zu bytes back\n", c->response_len);
  while (r < end) {
    const char *head_end = strstr(r, "\r\n\r\n");
    if (!head_end) return; /* cut off where the harness stopped keeping bytes */
    int major, minor, code, n = 0; /* signed, as evhttp holds them: "HTTP/1.99999999999" reads as 1.-1 */
    if (sscanf(r, "HTTP/%d.%d %3d %n", &major, &minor, &code, &n) != 3 || n == 0) {
      fprintf(stderr, "fuzz: the admin server sent no status line where an answer begins: %.60s\n", r);
      abort();
    }
    if (verbose) fprintf(stderr, "fuzz:   %.*s\n", (int)strcspn(r, "\r\n"), r);
    if (code == 500) {
      fprintf(stderr, "fuzz: the admin server answered 500 to a client's request:\n%.400s\n", r);
      abort();
    }
    const char *length = find_header(r, head_end, "Content-Length: ");
    const char *body = head_end + 4;
    if (length) {
      r = body + strtoull(length, NULL, 10);
    } else if (major != 1 || minor < 1 || find_header(r, head_end, "Connection: close")) {
      return; /* its body runs to the close */
    } else if (body < end && (end - body < 5 || memcmp(body, "HTTP/", 5) != 0)) {
      fprintf(stderr, "fuzz: an answer without Content-Length is followed by bytes that are not the next answer:\n"
              "%.*s\n", (int)(end - r < 400 ? end - r : 400), r);
      abort();
    } else {
      r = body;
    }
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ttd_core *core = fuzz_core_begin_input();
  if (!admin) start_admin(core);
  int fds_before = fuzz_open_fds();
  fuzz_core_open_session(core, 0);
  ttd_admin_set_ready(admin, size % 2 == 0);

  client c = {.data = data, .left = size, .response = malloc(RESPONSE_KEPT + 1)};
  c.fd = connect_admin();
  c.readable = event_new(base, c.fd, EV_READ | EV_PERSIST, on_readable, &c);
  c.writable = event_new(base, c.fd, EV_WRITE | EV_PERSIST, on_writable, &c);
  c.idle = event_new(base, -1, 0, on_idle, &c);
  struct timeval stuck = {STUCK_SECONDS, 0};
  if (!c.response || !c.readable || !c.writable || !c.idle || event_priority_set(c.idle, 2) ||
      event_add(c.readable, &stuck) || event_add(c.writable, NULL)) {
    abort();
  }
  event_base_loop(base, 0);
  if (c.stuck) {
    fprintf(stderr, "fuzz: the admin server neither answered nor closed for %d s\n", STUCK_SECONDS);
    abort();
  }
  c.response[c.response_len] = '\0';
  check_response(&c);

  event_free(c.readable);
  event_free(c.writable);
  event_free(c.idle);
  struct linger reset = {1, 0}; /* a reset rather than TIME_WAIT: a long run would use up the ports */
  setsockopt(c.fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
  close(c.fd);
  free(c.response);
  int fds_after = fuzz_open_fds();
  if (fds_after != fds_before) {
    fprintf(stderr, "fuzz: %d descriptors open after the input, %d before: the admin server kept a connection\n",
            fds_after, fds_before);
    abort();
  }
  fuzz_core_end_input(core);
  return 0;
}
