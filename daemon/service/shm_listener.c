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
#include "wire/fd_passing.h"
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
  ttd_lanes *lanes; /* NULL until the server runs */
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

/* Answers one request; fd is the attached descriptor or -1 (closed here either way).
 * out_fds: descriptors the reply carries (a lane's eventfds), -1 when none. */
static void handle_request(connection *c, const ttd_shm_request *req, int fd, ttd_shm_reply *reply,
                           int out_fds[2]) {
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
  } else if (!status && req->op == TTD_SHM_LANE) {
    if (fd < 0) {
      status = ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "LANE needs the lane's memfd attached (SCM_RIGHTS)");
    } else if (!c->owner->lanes) {
      status = ttd_make_status(GRPC_STATUS_UNAVAILABLE, "ttd serves no call lanes yet; make calls over gRPC");
    } else {
      status = ttd_lanes_add(c->owner->lanes, session, fd, out_fds);
    }
    if (!status) {
      TTD_LOG(TTD_LOG_DEBUG, "session=%016" PRIx64 " event=lane-register uid=%u pid=%d", session->id,
              (unsigned)c->peer.uid, (int)c->peer.pid);
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

static void on_readable(evutil_socket_t fd, short what, void *arg) {
  (void)what;
  connection *c = arg;
  ttd_shm_request req;
  int passed = -1, count = 0;
  bool truncated = false;
  /* n: the message's whole length; the first descriptor is the request's, others are closed */
  ssize_t n = ttd_recv_fds(fd, &req, sizeof(req), MSG_TRUNC, &passed, 1, &count, &truncated);
  if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return;
  if (count == 0) passed = -1;
  if (n <= 0) { /* the client went away, or sent an empty message, which reads the same */
    if (passed >= 0) close(passed);
    close_connection(c);
    return;
  }
  ttd_shm_reply reply = {0};
  int out_fds[2] = {-1, -1};
  if (n != (ssize_t)sizeof(req) || truncated) {
    if (passed >= 0) close(passed);
    reply.code = GRPC_STATUS_INVALID_ARGUMENT;
    if (n != (ssize_t)sizeof(req)) {
      snprintf(reply.message, sizeof(reply.message), "a request is exactly %zu bytes, got %zd", sizeof(req), n);
    } else {
      snprintf(reply.message, sizeof(reply.message), "a request carries one descriptor (SCM_RIGHTS), this one more "
               "than %d", TTD_FD_PASSING_MAX);
    }
  } else {
    handle_request(c, &req, passed, &reply, out_fds);
  }
  ssize_t sent = ttd_send_fds(fd, &reply, sizeof(reply), out_fds, out_fds[0] >= 0 ? 2 : 0);
  for (int i = 0; i < 2; i++) {
    if (out_fds[i] >= 0) close(out_fds[i]); /* the client has its own now */
  }
  if (sent != (ssize_t)sizeof(reply)) close_connection(c);
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

void ttd_shm_listener_set_lanes(ttd_shm_listener *listener, ttd_lanes *lanes) {
  if (listener) listener->lanes = lanes;
}

void ttd_shm_listener_stop(ttd_shm_listener *listener) {
  if (!listener) return;
  while (listener->connections) close_connection(listener->connections);
  event_free(listener->accept_event);
  close(listener->fd);
  unlink(listener->path);
  free(listener);
}
