/* Fuzz harness: the shared-memory side socket (daemon/service/shm_listener.c) as a local
 * client meets it. One listener, started by ttd_shm_listener_start on a socket in a
 * temporary folder, serves every input on the harness's libevent loop over the in-process
 * daemon core (fuzz_core.h). Each input connects and sends its messages one at a time,
 * each a SOCK_SEQPACKET message with the descriptors it asks for attached (SCM_RIGHTS),
 * and runs the loop until the reply comes or the daemon closes the connection (the next
 * message then connects again). So the listener's receive (sizes, truncation, control
 * data), the request's checks (magic, session and key) and REGISTER and RELEASE on a real
 * open session see the bytes.
 *
 * Input, up to 16 messages, each:
 *   u8  flags: bits 0-2 how many descriptors are attached (0-7; the daemon takes up to 4
 *       per message, the kernel cuts off the rest: MSG_CTRUNC); bit 3 the first is a
 *       pipe's read end rather than a memfd; bit 4 the memfd is not sealed against
 *       shrinking; bits 5-6 the memfd's size: 0 the request's size field, 1 that plus
 *       4096, 2 half of it, 3 zero; bit 7 the message speaks for the input's session:
 *       TTD_SHM_MAGIC, the session's id and its shm_key are written over the message's
 *       bytes at their offsets (as far as it reaches), the rest stays as given
 *   u16 length (little-endian) and that many bytes: the message as sent (a request is
 *       sizeof(ttd_shm_request), 48 bytes; shorter and longer ones go as they are).
 * The input's session is 0x13 with segment 0x14 registered (fuzz_random.h), so RELEASE of
 * 0x14, REGISTER of a sealed memfd (new segments count up from 0x15) and RELEASE of those
 * succeed.
 *
 * Each message gets one reply, exactly sizeof(ttd_shm_reply) bytes, with a status code a
 * client's input may get (fuzz_check_status) and a NUL-terminated message, or (only for an
 * empty message, which reads as the end of the connection) the connection is closed.
 * After the input the process holds the descriptors it held before (the daemon closes
 * every one a message carried, and its side of the connection) and the core is empty. */
#define _GNU_SOURCE /* memfd_create, F_ADD_SEALS */
#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "service/shm_listener.h"
#include "wire/shm_protocol.h"
#include "fuzz_core.h"
#include "fuzz_input.h"

#define MAX_MESSAGES 16
#define MAX_FDS 7
#define STUCK_SECONDS 10

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct event_base *base;
static ttd_shm_listener *listener;
static char dir[32], path[sizeof(((struct sockaddr_un *)0)->sun_path)];

static void stop_listener(void) {
  ttd_shm_listener_stop(listener); /* removes the socket */
  rmdir(dir);
}

static void start_listener(ttd_core *core) {
  snprintf(dir, sizeof(dir), "/tmp/ttd-fuzz-shm-XXXXXX");
  base = event_base_new();
  if (!base || !mkdtemp(dir)) {
    perror("fuzz: cannot make the event base or the socket's folder");
    abort();
  }
  snprintf(path, sizeof(path), "%s/ttd.sock.shm", dir);
  ttd_status_t status = ttd_shm_listener_start(base, core, path, NULL, &listener);
  if (status) {
    fprintf(stderr, "fuzz: cannot start the shared-memory listener: %s\n", ttd_status_message(status));
    abort();
  }
  atexit(stop_listener);
}

static int connect_listener(void) {
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
  if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
    perror("fuzz: cannot connect to the shared-memory listener");
    abort();
  }
  return fd;
}

/* What came back for one message. */
typedef struct answer {
  ssize_t len; /* bytes of the reply; 0: the daemon closed the connection */
  bool stuck;
  union {
    ttd_shm_reply reply;
    char bytes[sizeof(ttd_shm_reply) + 64]; /* room to see a reply of the wrong size */
  } u;
} answer;

static void on_readable(evutil_socket_t fd, short what, void *arg) {
  answer *a = arg;
  if (what & EV_TIMEOUT) {
    a->stuck = true;
    event_base_loopbreak(base);
    return;
  }
  a->len = recv(fd, a->u.bytes, sizeof(a->u.bytes), 0);
  if (a->len < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (a->len < 0) a->len = 0; /* reset: as closed */
  event_base_loopbreak(base);
}

/* A descriptor for a message: a memfd of bytes (sealed unless told), or a pipe's read end. */
static int make_fd(bool pipe_end, bool unsealed, uint64_t bytes) {
  if (pipe_end) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) abort();
    close(p[1]);
    return p[0];
  }
  int fd = memfd_create("ttd-fuzz-segment", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) abort();
  if (bytes <= (uint64_t)INT64_MAX) (void)!ftruncate(fd, (off_t)bytes); /* too large for the kernel: stays empty */
  if (!unsealed && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) abort();
  return fd;
}

/* The memfd size bits 5-6 of the flags ask for, given the request's size field. */
static uint64_t memfd_bytes(uint8_t flags, uint64_t size) {
  switch ((flags >> 5) & 3) {
  case 0: return size;
  case 1: return size + 4096;
  case 2: return size / 2;
  default: return 0;
  }
}

/* Sends one message of the input, with its descriptors; returns what came back. */
static answer send_message(int fd, uint8_t flags, const uint8_t *body, size_t len, const ttd_session *session) {
  uint8_t message[UINT16_MAX];
  memcpy(message, body, len);
  if (flags & 0x80) {
    ttd_shm_request fill = {.magic = TTD_SHM_MAGIC, .session_id = session->id};
    memcpy(fill.key, session->shm_key, sizeof(fill.key));
    static const struct { size_t at, len; } parts[] = {
        {offsetof(ttd_shm_request, magic), sizeof(uint32_t)},
        {offsetof(ttd_shm_request, session_id), sizeof(uint64_t)},
        {offsetof(ttd_shm_request, key), 2 * sizeof(uint64_t)},
    };
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) {
      if (parts[i].at < len) {
        size_t n = len - parts[i].at < parts[i].len ? len - parts[i].at : parts[i].len;
        memcpy(message + parts[i].at, (const char *)&fill + parts[i].at, n);
      }
    }
  }
  uint64_t size = 0;
  if (len >= offsetof(ttd_shm_request, size) + sizeof(size)) {
    memcpy(&size, message + offsetof(ttd_shm_request, size), sizeof(size));
  }

  int nfds = flags & 7;
  int fds[MAX_FDS];
  for (int i = 0; i < nfds; i++) fds[i] = i == 0 ? make_fd(flags & 8, flags & 16, memfd_bytes(flags, size)) : dup(fds[0]);
  union {
    char buf[CMSG_SPACE(sizeof(int) * MAX_FDS)];
    struct cmsghdr align;
  } control;
  struct iovec iov = {message, len};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
  if (nfds) {
    msg.msg_control = control.buf;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
    memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)nfds);
  }
  ssize_t sent = sendmsg(fd, &msg, MSG_NOSIGNAL);
  for (int i = 0; i < nfds; i++) close(fds[i]);

  answer a = {.len = 0};
  if (sent != (ssize_t)len) return a; /* the daemon closed the connection already */
  struct event *readable = event_new(base, fd, EV_READ | EV_PERSIST, on_readable, &a);
  struct timeval stuck = {STUCK_SECONDS, 0};
  if (!readable || event_add(readable, &stuck) != 0) abort();
  event_base_loop(base, 0);
  event_free(readable);
  if (a.stuck) {
    fprintf(stderr, "fuzz: the daemon neither replied to a %zu-byte message nor closed for %d s\n", len, STUCK_SECONDS);
    abort();
  }
  return a;
}

static void check_answer(const answer *a, size_t len) {
  if (a->len == 0) {
    if (len == 0) return; /* an empty message reads as the end of the connection */
    fprintf(stderr, "fuzz: the daemon closed the connection on a %zu-byte message without a reply\n", len);
    abort();
  }
  if (a->len != (ssize_t)sizeof(ttd_shm_reply) || !memchr(a->u.reply.message, '\0', sizeof(a->u.reply.message))) {
    fprintf(stderr, "fuzz: a reply of %zd bytes (a reply is %zu) or without its message's NUL\n", a->len,
            sizeof(ttd_shm_reply));
    abort();
  }
  const ttd_shm_reply *r = &a->u.reply;
  fuzz_check_status("the shared-memory socket",
                    r->code ? ttd_make_status((ttd_code)r->code, "%s (segment 0x%llx)", r->message,
                                              (unsigned long long)r->segment_id)
                            : TTD_OK);
  if (!r->code && getenv("FUZZ_VERBOSE")) fprintf(stderr, "fuzz:   segment 0x%llx\n", (unsigned long long)r->segment_id);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ttd_core *core = fuzz_core_begin_input();
  if (!listener) start_listener(core);
  int fds_before = fuzz_open_fds();
  uint64_t session_id = fuzz_core_open_session(core, 0);
  ttd_session *session = NULL;
  if (ttd_session_table_lookup(&core->sessions, session_id, NULL, ttd_now_ms(), &session) != TTD_OK) abort();

  int fd = -1;
  fuzz_input in = {data, size};
  fuzz_record r;
  for (int i = 0; i < MAX_MESSAGES && fuzz_next_record(&in, data, &r); i++) {
    if (fd < 0) fd = connect_listener();
    answer a = send_message(fd, r.tag, data + r.at, r.len, session);
    check_answer(&a, r.len);
    if (a.len == 0) {
      close(fd);
      fd = -1;
    }
  }
  ttd_session_release(session);
  if (fd >= 0) close(fd);
  for (int i = 0; i < 4; i++) event_base_loop(base, EVLOOP_NONBLOCK); /* the daemon sees the close */
  int fds_after = fuzz_open_fds();
  if (fds_after != fds_before) {
    fprintf(stderr, "fuzz: %d descriptors open after the input, %d before: the daemon kept %d\n", fds_after,
            fds_before, fds_after - fds_before);
    abort();
  }
  fuzz_core_end_input(core);
  return 0;
}
