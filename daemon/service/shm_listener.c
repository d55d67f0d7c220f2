#define _GNU_SOURCE /* SO_PEERCRED, struct ucred */
#include "service/shm_listener.h"

#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "telemetry/log.h"
#include "wire/shm_protocol.h"

typedef struct connection {
  struct connection *next;
  ttd_shm_listener *owner;
  int fd;
  struct event *event;
  struct ucred peer;
} connection;

struct ttd_shm_listener {
  ttd_core *core;
  struct event_base *base;
  int fd;
  struct event *accept_event;
  char path[108];
  connection *connections;
};

static void close_connection(connection *c) {
  ttd_shm_listener *l = c->owner;
  for (connection **p = &l->connections; *p; p = &(*p)->next) {
    if (*p == c) {
      *p = c->next;
      break;
    }
  }
  event_free(c->event);
  close(c->fd);
  free(c);
}

/* Answers one request; fd is the attached descriptor or -1 (closed here either way). */
static void handle_request(connection *c, const ttd_shm_request *req, int fd, ttd_shm_reply *reply) {
  ttd_status_t status = TTD_OK;
  ttd_session *session = NULL;
  if (req->magic != TTD_SHM_MAGIC) {
    status = ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "not a ttd shared-memory request (bad magic)");
  } else {
    int64_t now = ttd_now_ms();
    status = ttd_session_table_peek(&c->owner->core->sessions, req->session_id, NULL, now, &session);
    if (!status && ttd_session_shm_key_matches(session, req->key)) {
      ttd_session_touch(session, now); /* the key holder's request renews the lease, no one else's */
    } else if (!status) {
      ttd_session_release(session);
      session = NULL;
      /* the same answer as an unknown session: the id alone reveals nothing */
      status = ttd_make_status(GRPC_STATUS_NOT_FOUND, "session %016" PRIx64 " is not open, or the key is not its "
                               "shm_key from OpenSession", req->session_id);
    }
  }
  if (!status && req->op == TTD_SHM_REGISTER) {
    ttd_shm_segment *segment = NULL;
    if (fd < 0) status = ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "REGISTER needs the memfd attached (SCM_RIGHTS)");
    if (!status) status = ttd_shm_segment_map(fd, req->size, &segment);
    if (!status) {
      status = ttd_session_segment_add_as(session, segment, c->peer.uid, req->segment_id, &reply->segment_id);
      if (status) ttd_shm_segment_release(segment);
    }
    if (!status) {
      TTD_LOG(TTD_LOG_DEBUG, "session=%016" PRIx64 " event=shm-register segment=%016" PRIx64 " bytes=%" PRIu64
              " uid=%u pid=%d", session->id, reply->segment_id, req->size, (unsigned)c->peer.uid, (int)c->peer.pid);
    }
  } else if (!status && req->op == TTD_SHM_RELEASE) {
    status = ttd_session_segment_remove(session, req->segment_id, c->peer.uid);
  } else if (!status) {
    status = ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "unknown shared-memory request %u", req->op);
  }
  if (fd >= 0) close(fd);
  ttd_session_release(session);
  reply->code = ttd_status_code(status);
  snprintf(reply->message, sizeof(reply->message), "%s", status ? ttd_status_message(status) : "");
  ttd_status_free(status);
}

/* The first descriptor a received message carried, or -1; the others are closed (one
 * descriptor per request). */
static int take_passed_fd(struct msghdr *msg) {
  int passed = -1;
  for (struct cmsghdr *cm = CMSG_FIRSTHDR(msg); cm; cm = CMSG_NXTHDR(msg, cm)) {
    if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
    int count = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
    int fds[4];
    memcpy(fds, CMSG_DATA(cm), (size_t)count * sizeof(int));
    for (int i = 0; i < count; i++) {
      if (passed < 0) passed = fds[i];
      else close(fds[i]);
    }
  }
  return passed;
}

static void on_readable(evutil_socket_t fd, short what, void *arg) {
  (void)what;
  connection *c = arg;
  ttd_shm_request req;
  char control[CMSG_SPACE(sizeof(int) * 4)];
  struct iovec iov = {&req, sizeof(req)};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control, .msg_controllen = sizeof(control)};
  ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | MSG_TRUNC); /* n: the message's whole length */
  if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return;
  /* An empty message carries descriptors as well as a full one does. */
  int passed = n >= 0 ? take_passed_fd(&msg) : -1;
  if (n <= 0) { /* the client went away, or sent an empty message, which reads the same */
    if (passed >= 0) close(passed);
    close_connection(c);
    return;
  }
  ttd_shm_reply reply = {0};
  if (n != (ssize_t)sizeof(req) || (msg.msg_flags & MSG_CTRUNC)) {
    if (passed >= 0) close(passed);
    reply.code = GRPC_STATUS_INVALID_ARGUMENT;
    if (n != (ssize_t)sizeof(req)) {
      snprintf(reply.message, sizeof(reply.message), "a request is exactly %zu bytes, got %zd", sizeof(req), n);
    } else {
      snprintf(reply.message, sizeof(reply.message), "a request carries one descriptor (SCM_RIGHTS), this one more than 4");
    }
  } else {
    handle_request(c, &req, passed, &reply);
  }
  if (send(fd, &reply, sizeof(reply), MSG_NOSIGNAL) != (ssize_t)sizeof(reply)) close_connection(c);
}

static void on_accept(evutil_socket_t fd, short what, void *arg) {
  (void)what;
  ttd_shm_listener *l = arg;
  int cfd = accept4(fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (cfd < 0) return;
  int open = 0;
  for (connection *k = l->connections; k; k = k->next) open++;
  if (open >= TTD_SHM_MAX_CONNECTIONS) { /* descriptors are finite: later clients use gRPC */
    close(cfd);
    return;
  }
  connection *c = calloc(1, sizeof(*c));
  socklen_t len = sizeof(struct ucred);
  if (!c || getsockopt(cfd, SOL_SOCKET, SO_PEERCRED, &c->peer, &len) != 0 ||
      !(c->event = event_new(l->base, cfd, EV_READ | EV_PERSIST, on_readable, c))) {
    free(c);
    close(cfd);
    return;
  }
  c->owner = l;
  c->fd = cfd;
  c->next = l->connections;
  l->connections = c;
  event_add(c->event, NULL);
}

ttd_status_t ttd_shm_listener_start(struct event_base *base, ttd_core *core, const char *path, const char *group,
                                    ttd_shm_listener **out_listener) {
  *out_listener = NULL;
  ttd_shm_listener *l = calloc(1, sizeof(*l));
  if (!l) return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
  l->core = core;
  l->base = base;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof(sa.sun_path)) {
    free(l);
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "shared-memory socket path %s is too long", path);
  }
  snprintf(l->path, sizeof(l->path), "%s", path);
  strcpy(sa.sun_path, path);
  unlink(path); /* a stale one of ours: the main socket next to it was checked already */
  l->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  mode_t old_mask = umask(0117);
  int bound = l->fd >= 0 && bind(l->fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
  umask(old_mask);
  if (!bound || listen(l->fd, 64) != 0) {
    ttd_status_t s = ttd_make_status(GRPC_STATUS_UNAVAILABLE, "cannot listen on %s: %s", path, strerror(errno));
    if (l->fd >= 0) close(l->fd);
    free(l);
    return s;
  }
  if (group) {
    struct group *g = getgrnam(group);
    if (g && chown(path, (uid_t)-1, g->gr_gid) != 0) {
      TTD_LOG(TTD_LOG_WARN, "event=shm-socket-group path=%s group=%s reason=\"%s\"", path, group, strerror(errno));
    }
  }
  l->accept_event = event_new(base, l->fd, EV_READ | EV_PERSIST, on_accept, l);
  event_add(l->accept_event, NULL);
  TTD_LOG(TTD_LOG_INFO, "event=listening address=unix:%s purpose=shared-memory", path);
  *out_listener = l;
  return TTD_OK;
}

void ttd_shm_listener_stop(ttd_shm_listener *listener) {
  if (!listener) return;
  while (listener->connections) close_connection(listener->connections);
  event_free(listener->accept_event);
  close(listener->fd);
  unlink(listener->path);
  free(listener);
}
