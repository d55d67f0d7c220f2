#define _GNU_SOURCE /* accept4, SO_PEERCRED, pthread_setname_np */
#include "rpc/conn_gate.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "rpc/conn_relay.h"
#include "rpc/h2_read_guard.h"
#include "rpc/listener_probe.h"
#include "rpc/tls_server.h"
#include "telemetry/log.h"

#define GATE_MAX_LISTENERS 32
#define GATE_ACCEPT_RETRY_MS 100
/* Threads that relay TLS connections. */
#define GATE_RELAY_THREADS 2
/* The send buffer of each end of a relayed connection's socketpair. */
#define GATE_PAIR_BUFFER (1024 * 1024)

#define PREFACE_LEN TTD_H2_PREFACE_LEN

enum { TAG_WAKE, TAG_LISTENER, TAG_CONN };

typedef struct gate_listener {
  int tag;
  int fd;
  int index;                /* in config->listen */
  ttd_conn_peer_kind kind;  /* of its connections: a socket file, an abstract socket, TCP */
  SSL_CTX *tls;             /* TCP with TLS: ended here; NULL: plain text */
  int64_t paused_until;     /* 0: accepting */
} gate_listener;

/* Who is at the other end, as read at accept; the name is made when asked for. */
typedef struct gate_who {
  uint8_t kind;   /* ttd_conn_peer_kind */
  uint8_t family; /* TCP: AF_INET or AF_INET6 */
  uint16_t port;
  uint32_t uid, gid;
  int32_t pid;
  uint8_t addr[16];
} gate_who;

/* One descriptor number gRPC may name "fd:N". */
typedef struct gate_slot {
  struct gate_conn *conn; /* the handed connection while it lasts, else NULL */
  gate_who who;           /* of the last connection handed over as N */
} gate_slot;

typedef struct gate_peer {
  char key[64]; /* "ip ADDRESS" or "uid N" */
  int count;
} gate_peer;

typedef struct gate_conn {
  int tag;
  int fd;           /* accepted; after the handoff, gRPC's "fd:N" (for TCP its socketpair end) */
  int watch;        /* after a plain-text handoff: our duplicate, watched for its end */
  int peer;         /* index in peers; -1 for the prober's own connections */
  gate_who who;
  bool handed;
  bool tcp;         /* from a TCP listener */
  bool relayed;     /* TLS, handed over: the relay holds the socket until it calls relay_ended */
  bool tls_done;    /* the handshake is over and its bytes sent */
  uint32_t events;  /* before the handoff: what the gate's epoll watches for */
  SSL *ssl;         /* a TLS listener's connection before the handoff */
  uint8_t first[PREFACE_LEN]; /* TCP: the client preface, read before the handoff */
  size_t preface_seen;
  int64_t deadline; /* no preface (TLS: handshake and preface) by then: closed; after a
                     * plain-text handoff, no call by then: shut down */
  bool called;      /* a plain-text connection, handed over, has made a call */
  struct gate_conn *next, *prev; /* every connection */
} gate_conn;

struct ttd_conn_gate {
  ttd_core *core;
  const ttd_config *config;
  ttd_conn_gate_handoff_fn handoff;
  void *handoff_arg;
  ttd_conn_relay *relay; /* TCP connections after their handoff */
  gate_listener listeners[GATE_MAX_LISTENERS];
  int listener_count;
  int epoll_fd, wake_fd, wake_tag;
  int reserve_fd; /* given up to accept and close a connection when descriptors run out */
  pthread_t thread;
  bool thread_started, stopped;
  ttd_listener_probe *probe; /* checks every listener each second */
  atomic_bool stopping;
  pthread_mutex_t lock; /* conns, by_fd, peers: taken by the gate thread, the relay, the guard and peer */
  gate_conn *conns;
  gate_slot *by_fd; /* by gRPC's descriptor: the handed connection, who was at its end */
  int by_fd_size;
  gate_peer *peers;
  int peer_count, peer_cap;
  int total;
  int64_t log_second;
  uint64_t log_left_out;
  int64_t relay_log_second; /* the same for the relay's ends, under lock */
  uint64_t relay_log_left_out;
};

/* At most one line a second for refusals and failed accepts, then the count left out. */
static bool log_allowed(ttd_conn_gate *g, uint64_t *out_left_out) {
  int64_t second = ttd_now_ms() / 1000;
  if (second == g->log_second) {
    g->log_left_out++;
    return false;
  }
  g->log_second = second;
  *out_left_out = g->log_left_out;
  g->log_left_out = 0;
  return true;
}

/* ---- listening ---- */

ttd_status_t ttd_conn_gate_resolve(const char *address, struct addrinfo **out) {
  char host[256];
  const char *colon = strrchr(address, ':');
  if (!colon || colon == address || strlen(address) >= sizeof(host)) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "cannot listen on '%s': use unix:/path or host:port", address);
  }
  size_t hlen = (size_t)(colon - address);
  memcpy(host, address, hlen);
  host[hlen] = '\0';
  char *h = host;
  if (h[0] == '[' && hlen > 1 && h[hlen - 1] == ']') {
    h[hlen - 1] = '\0';
    h++;
  }
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
  int rc = getaddrinfo(h[0] ? h : NULL, colon + 1, &hints, out);
  if (rc != 0) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "cannot listen on '%s': %s (use host:port)", address,
                           gai_strerror(rc));
  }
  return TTD_OK;
}

/* A socket file is mode 0660, owned by --socket-group when given. */
static ttd_status_t secure_socket_file(const ttd_config *config, const char *path) {
  if (chmod(path, 0660) != 0) {
    return ttd_make_status(GRPC_STATUS_UNAVAILABLE, "cannot set mode 0660 on %s: %s", path, strerror(errno));
  }
  if (config->socket_group) {
    struct group *g = getgrnam(config->socket_group);
    if (!g) return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "--socket-group %s: no such group", config->socket_group);
    if (chown(path, (uid_t)-1, g->gr_gid) != 0) {
      return ttd_make_status(GRPC_STATUS_UNAVAILABLE, "cannot give %s to group %s: %s", path, config->socket_group,
                             strerror(errno));
    }
  }
  return TTD_OK;
}

/* A listening Unix socket on address (unix:PATH or unix-abstract:NAME); -1 with *out_err set,
 * or with *out_status for a name that cannot be one. */
static int listen_unix(const ttd_config *config, const char *address, bool abstract, int *out_err,
                       ttd_status_t *out_status) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  const char *name = abstract ? address + 14 : address + 5;
  size_t len = strlen(name);
  if (len == 0 || len + (abstract ? 1 : 0) >= sizeof(sa.sun_path)) {
    *out_status = ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "--listen %s: the %s must be 1 to %zu bytes", address,
                                  abstract ? "abstract name" : "socket path", sizeof(sa.sun_path) - (abstract ? 2 : 1));
    return -1;
  }
  memcpy(sa.sun_path + (abstract ? 1 : 0), name, len);
  socklen_t sl = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + len); /* a file's with its NUL */
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *out_err = errno;
    return -1;
  }
  mode_t old_mask = abstract ? 0 : umask(0117); /* the file is born 0660: no window where others may connect */
  int bound = bind(fd, (struct sockaddr *)&sa, sl);
  if (!abstract) umask(old_mask);
  if (bound != 0 || listen(fd, SOMAXCONN) != 0) {
    *out_err = errno;
    close(fd);
    return -1;
  }
  if (!abstract) {
    *out_status = secure_socket_file(config, name);
    if (*out_status) {
      close(fd);
      return -1;
    }
  }
  return fd;
}

ttd_status_t ttd_conn_gate_listen(ttd_conn_gate *g, const char *address, SSL_CTX *tls) {
  if (g->listener_count == GATE_MAX_LISTENERS) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "at most %d listeners: pass fewer --listen", GATE_MAX_LISTENERS);
  }
  int fd = -1, err = 0;
  ttd_conn_peer_kind kind = strncmp(address, "unix-abstract:", 14) == 0 ? TTD_CONN_PEER_UNIX_ABSTRACT
                            : strncmp(address, "unix:", 5) == 0        ? TTD_CONN_PEER_UNIX_FILE
                                                                       : TTD_CONN_PEER_TCP;
  if (kind != TTD_CONN_PEER_TCP) {
    ttd_status_t status = TTD_OK;
    fd = listen_unix(g->config, address, kind == TTD_CONN_PEER_UNIX_ABSTRACT, &err, &status);
    TTD_RETURN_IF_ERROR(status);
  } else {
    struct addrinfo *ai = NULL;
    TTD_RETURN_IF_ERROR(ttd_conn_gate_resolve(address, &ai));
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) err = errno;
    freeaddrinfo(ai);
  }
  if (err) {
    if (fd >= 0) close(fd);
    if (err == EADDRINUSE) {
      return ttd_make_status(GRPC_STATUS_UNAVAILABLE, "cannot listen on '%s': %s", address,
                             kind == TTD_CONN_PEER_UNIX_FILE ? "the socket file is in the way"
                                                             : "address in use (is another ttd running?)");
    }
    if (kind == TTD_CONN_PEER_UNIX_FILE && (err == EACCES || err == EPERM)) {
      return ttd_make_status(GRPC_STATUS_UNAVAILABLE, "cannot listen on '%s': no permission on its folder", address);
    }
    return ttd_make_status(GRPC_STATUS_UNAVAILABLE, "cannot listen on '%s': %s", address, strerror(err));
  }
  int index = 0;
  while (index < g->config->listen_count && strcmp(g->config->listen[index], address) != 0) index++;
  if (kind != TTD_CONN_PEER_TCP) tls = NULL;
  if (tls) SSL_CTX_up_ref(tls);
  g->listeners[g->listener_count++] =
      (gate_listener){.tag = TAG_LISTENER, .fd = fd, .index = index, .kind = kind, .tls = tls};
  TTD_LOG(TTD_LOG_INFO, "event=listening address=%s tls=%s relay=%s max_connections=%d max_peer_connections=%d "
          "handshake_timeout_ms=%lld", address, !tls ? "no" : g->config->tls_client_ca ? "mutual" : "yes",
          tls ? "yes" : "no", g->config->max_connections, g->config->max_peer_connections,
          (long long)g->config->handshake_timeout_ms);
  return TTD_OK;
}

/* ---- connections ---- */

/* The name ttd_conn_peer gives who (fd: the descriptor gRPC names, for an unknown peer). */
static void who_name(const gate_who *who, int fd, char *out, size_t size) {
  switch ((ttd_conn_peer_kind)who->kind) {
    case TTD_CONN_PEER_UNIX_FILE:
    case TTD_CONN_PEER_UNIX_ABSTRACT:
      snprintf(out, size, "%s:uid=%u,pid=%d", who->kind == TTD_CONN_PEER_UNIX_FILE ? "unix" : "unix-abstract",
               (unsigned)who->uid, (int)who->pid);
      return;
    case TTD_CONN_PEER_TCP: {
      char ip[INET6_ADDRSTRLEN] = "?";
      inet_ntop(who->family == AF_INET6 ? AF_INET6 : AF_INET, who->addr, ip, sizeof(ip));
      if (who->family == AF_INET6) snprintf(out, size, "ipv6:[%s]:%u", ip, (unsigned)who->port);
      else snprintf(out, size, "ipv4:%s:%u", ip, (unsigned)who->port);
      return;
    }
    case TTD_CONN_PEER_PROBER:
      snprintf(out, size, "ttd-prober");
      return;
    case TTD_CONN_PEER_UNKNOWN:
      break;
  }
  snprintf(out, size, "fd:%d", fd);
}

/* Who is at fd's other end (a Unix peer's credentials, a TCP peer's address) and its key
 * for the per-peer bound ("ip ADDRESS", "uid N"); -1 for ttd's own prober (and a peer that
 * cannot be read, which stays UNKNOWN: never an admin). */
static int peer_identify(ttd_conn_gate *g, int fd, ttd_conn_peer_kind kind, gate_who *who, char *key, size_t size) {
  *who = (gate_who){.kind = (uint8_t)kind};
  if (kind == TTD_CONN_PEER_TCP) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    if (getpeername(fd, (struct sockaddr *)&ss, &len) != 0) {
      who->kind = TTD_CONN_PEER_UNKNOWN;
      return -1;
    }
    char ip[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (ss.ss_family == AF_INET) {
      struct sockaddr_in *in = (struct sockaddr_in *)&ss;
      inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip));
      port = ntohs(in->sin_port);
      if (port == ttd_listener_probe_port(g->probe) && ntohl(in->sin_addr.s_addr) == INADDR_LOOPBACK) {
        who->kind = TTD_CONN_PEER_PROBER;
        return -1;
      }
      memcpy(who->addr, &in->sin_addr, 4);
    } else if (ss.ss_family == AF_INET6) {
      struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
      inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof(ip));
      port = ntohs(in6->sin6_port);
      if (port == ttd_listener_probe_port(g->probe) && IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr)) {
        who->kind = TTD_CONN_PEER_PROBER;
        return -1;
      }
      memcpy(who->addr, &in6->sin6_addr, 16);
    }
    who->family = (uint8_t)ss.ss_family;
    who->port = (uint16_t)port;
    snprintf(key, size, "ip %s", ip);
    return 0;
  }
  struct ucred cred;
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    who->kind = TTD_CONN_PEER_UNKNOWN;
    return -1;
  }
  who->uid = cred.uid;
  who->gid = cred.gid;
  who->pid = cred.pid;
  if (cred.pid == getpid()) {
    who->kind = TTD_CONN_PEER_PROBER;
    return -1;
  }
  snprintf(key, size, "uid %u", (unsigned)cred.uid);
  return 0;
}

static int peer_find_or_add(ttd_conn_gate *g, const char *key) {
  int free_slot = -1;
  for (int i = 0; i < g->peer_count; i++) {
    if (g->peers[i].count && strcmp(g->peers[i].key, key) == 0) return i;
    if (!g->peers[i].count && free_slot < 0) free_slot = i;
  }
  if (free_slot < 0) {
    if (g->peer_count == g->peer_cap) {
      int cap = g->peer_cap ? g->peer_cap * 2 : 64;
      gate_peer *grown = realloc(g->peers, (size_t)cap * sizeof(*grown));
      if (!grown) return -1;
      g->peers = grown;
      g->peer_cap = cap;
    }
    free_slot = g->peer_count++;
  }
  snprintf(g->peers[free_slot].key, sizeof(g->peers[free_slot].key), "%s", key);
  g->peers[free_slot].count = 0;
  return free_slot;
}

static void refuse_log(ttd_conn_gate *g, const char *why, const char *key) {
  uint64_t left_out;
  if (!log_allowed(g, &left_out)) return;
  TTD_LOG(TTD_LOG_WARN, "event=connection-refused reason=\"%s\" peer=\"%s\" connections=%d left_out=%llu", why, key,
          g->total, (unsigned long long)left_out);
}

/* Under lock. Closes a connection the gate holds (before or after the handoff; a relayed
 * one's sockets are the relay's, which has closed them or closes them at its end). */
static void conn_free(ttd_conn_gate *g, gate_conn *c) {
  if (c->handed) {
    if (c->fd >= 0 && c->fd < g->by_fd_size && g->by_fd[c->fd].conn == c) g->by_fd[c->fd].conn = NULL;
    if (c->watch >= 0) {
      epoll_ctl(g->epoll_fd, EPOLL_CTL_DEL, c->watch, NULL);
      close(c->watch);
    }
  } else {
    epoll_ctl(g->epoll_fd, EPOLL_CTL_DEL, c->fd, NULL);
    SSL_free(c->ssl);
    close(c->fd);
  }
  if (c->peer >= 0) g->peers[c->peer].count--;
  g->total--;
  if (c->prev) c->prev->next = c->next;
  else g->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  free(c);
}

static void admit(ttd_conn_gate *g, gate_listener *l, int fd) {
  char key[64] = "prober";
  gate_who who;
  int own = peer_identify(g, fd, l->kind, &who, key, sizeof(key));
  pthread_mutex_lock(&g->lock);
  int peer = -1;
  const char *refused = NULL;
  if (own == 0) {
    peer = peer_find_or_add(g, key);
    if (peer < 0) refused = "out of memory";
    else if (g->total >= g->config->max_connections) refused = "--max-connections reached";
    else if (g->peers[peer].count >= g->config->max_peer_connections) refused = "--max-peer-connections reached";
  }
  gate_conn *c = refused ? NULL : calloc(1, sizeof(*c));
  SSL *ssl = c && l->tls ? ttd_tls_server_session(l->tls, fd) : NULL;
  if (c && l->tls && !ssl) {
    free(c);
    c = NULL;
  }
  if (!c) {
    if (!refused) refused = "out of memory";
    atomic_fetch_add(&g->core->metrics.connections_refused, 1);
    refuse_log(g, refused, key);
    pthread_mutex_unlock(&g->lock);
    close(fd);
    return;
  }
  *c = (gate_conn){.tag = TAG_CONN, .fd = fd, .watch = -1, .peer = peer, .who = who,
                   .deadline = ttd_now_ms() + g->config->handshake_timeout_ms,
                   .tcp = l->kind == TTD_CONN_PEER_TCP, .ssl = ssl, .events = EPOLLIN | EPOLLRDHUP};
  if (c->tcp) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)); /* as gRPC sets its own */
  }
  if (c->ssl) c->events = EPOLLIN;
  if (peer >= 0) g->peers[peer].count++;
  g->total++;
  c->next = g->conns;
  if (c->next) c->next->prev = c;
  g->conns = c;
  struct epoll_event ev = {.events = c->events, .data.ptr = c};
  if (epoll_ctl(g->epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) conn_free(g, c);
  pthread_mutex_unlock(&g->lock);
}

/* The connection's bytes so far: once the whole client preface is there (peeked, so gRPC
 * reads it), gRPC gets the connection; anything else is closed. */
static void check_preface(ttd_conn_gate *g, gate_conn *c) {
  char buf[PREFACE_LEN];
  ssize_t n = recv(c->fd, buf, sizeof(buf), MSG_PEEK | MSG_DONTWAIT);
  pthread_mutex_lock(&g->lock);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
    pthread_mutex_unlock(&g->lock);
    return;
  }
  if (n <= 0 || memcmp(buf, ttd_h2_preface, (size_t)n) != 0) {
    conn_free(g, c); /* closed, or not HTTP/2 */
    pthread_mutex_unlock(&g->lock);
    return;
  }
  if (n < PREFACE_LEN) { /* wait for the rest; EPOLLIN is level-triggered: back off to a poll */
    c->preface_seen = (size_t)n;
    struct epoll_event ev = {.events = EPOLLRDHUP, .data.ptr = c};
    epoll_ctl(g->epoll_fd, EPOLL_CTL_MOD, c->fd, &ev);
    pthread_mutex_unlock(&g->lock);
    return;
  }
  epoll_ctl(g->epoll_fd, EPOLL_CTL_DEL, c->fd, NULL);
  c->watch = fcntl(c->fd, F_DUPFD_CLOEXEC, 0);
  const char *refused = c->watch < 0 || c->fd >= g->by_fd_size ? "no descriptor left to watch it"
                        : ttd_h2_read_guard_watch(c->fd, TTD_GATE_MAX_RESETS) != 0 /* gRPC's reads, counted */
                            ? "descriptor past the read guard's range"
                            : NULL;
  if (refused) {
    if (c->watch >= 0) close(c->watch);
    c->watch = -1;
    refuse_log(g, refused, "-");
    atomic_fetch_add(&g->core->metrics.connections_refused, 1);
    epoll_ctl(g->epoll_fd, EPOLL_CTL_ADD, c->fd, &(struct epoll_event){.events = 0, .data.ptr = c});
    conn_free(g, c);
    pthread_mutex_unlock(&g->lock);
    return;
  }
  c->handed = true;
  c->deadline = ttd_now_ms() + g->config->handshake_timeout_ms; /* its first call, by then */
  g->by_fd[c->fd] = (gate_slot){.conn = c, .who = c->who};
  /* gRPC shuts the socket down before it closes it: the duplicate then reads the end. */
  struct epoll_event ev = {.events = EPOLLRDHUP, .data.ptr = c};
  epoll_ctl(g->epoll_fd, EPOLL_CTL_ADD, c->watch, &ev);
  int fd = c->fd;
  pthread_mutex_unlock(&g->lock);
  g->handoff(g->handoff_arg, fd);
}

/* Under lock, or on the gate thread before the handoff. */
static void set_events(ttd_conn_gate *g, gate_conn *c, uint32_t events) {
  if (c->events == events) return;
  c->events = events;
  struct epoll_event ev = {.events = events, .data.ptr = c};
  epoll_ctl(g->epoll_fd, EPOLL_CTL_MOD, c->fd, &ev);
}

static void close_unhanded(ttd_conn_gate *g, gate_conn *c) {
  pthread_mutex_lock(&g->lock);
  conn_free(g, c);
  pthread_mutex_unlock(&g->lock);
}

/* A TLS handshake that failed, or ended without ALPN "h2": one line a second, naming the
 * peer (not for the prober, whose handshakes fail against mutual TLS by design). The
 * session sent no alert (tls_server.h). */
static void tls_failed(ttd_conn_gate *g, gate_conn *c, const char *why) {
  if (c->who.kind == TTD_CONN_PEER_PROBER) return;
  char name[64];
  who_name(&c->who, c->fd, name, sizeof(name));
  pthread_mutex_lock(&g->lock);
  uint64_t left_out;
  if (log_allowed(g, &left_out)) {
    TTD_LOG(TTD_LOG_INFO, "event=tls-handshake-failed peer=\"%s\" reason=\"%s\" left_out=%llu", name, why,
            (unsigned long long)left_out);
  }
  pthread_mutex_unlock(&g->lock);
  /* What the client sent after its last handshake message (TLS 1.3 lets it send at once) is
   * read off, so that the close is an end of stream rather than a reset where it can be. */
  char drop[4096];
  for (int i = 0; i < 16 && recv(c->fd, drop, sizeof(drop), MSG_DONTWAIT) > 0; i++) {
  }
}

/* What a connection that opened no stream within the handshake timeout of its preface missed. */
#define FIRST_CALL_MISSED "call after the HTTP/2 preface"

/* Counts and logs a connection whose handshake timeout passed without what it names. */
static void timed_out(ttd_conn_gate *g, const char *what) {
  atomic_fetch_add(&g->core->metrics.connections_timed_out, 1);
  uint64_t left_out;
  if (log_allowed(g, &left_out)) {
    TTD_LOG(TTD_LOG_INFO, "event=handshake-timeout reason=\"no %s within %lld ms\" left_out=%llu", what,
            (long long)g->config->handshake_timeout_ms, (unsigned long long)left_out);
  }
}

/* Under lock. A peer closed for the frames it sent (by the relay or the read guard): counted,
 * and logged one line a second. */
static void closed_for_frames(ttd_conn_gate *g, const gate_who *who, int fd, ttd_h2_verdict why) {
  bool reset = why == TTD_H2_RESET_FLOOD;
  atomic_fetch_add(reset ? &g->core->metrics.connections_reset_closed : &g->core->metrics.connections_protocol_closed,
                   1);
  int64_t second = ttd_now_ms() / 1000;
  if (second == g->relay_log_second) {
    g->relay_log_left_out++;
    return;
  }
  char name[64];
  who_name(who, fd, name, sizeof(name));
  if (reset) {
    TTD_LOG(TTD_LOG_WARN, "event=rapid-reset action=closed peer=\"%s\" reason=\"the client reset streams faster "
            "than %d a second (HTTP/2 rapid reset)\" left_out=%llu", name, TTD_GATE_MAX_RESETS,
            (unsigned long long)g->relay_log_left_out);
  } else {
    TTD_LOG(TTD_LOG_WARN, "event=protocol-error action=closed peer=\"%s\" reason=\"%s\" left_out=%llu", name,
            ttd_h2_verdict_text(why), (unsigned long long)g->relay_log_left_out);
  }
  g->relay_log_second = second;
  g->relay_log_left_out = 0;
}

/* The relay ended a connection: its place is free. */
static void relay_ended(void *arg, void *cookie, ttd_h2_verdict why) {
  ttd_conn_gate *g = arg;
  gate_conn *c = cookie;
  pthread_mutex_lock(&g->lock);
  if (why == TTD_H2_NO_CALL) timed_out(g, FIRST_CALL_MISSED);
  else if (why != TTD_H2_PASS) closed_for_frames(g, &c->who, c->fd, why);
  conn_free(g, c);
  pthread_mutex_unlock(&g->lock);
}

/* The read guard closed a plain-text connection gRPC holds as fd (on gRPC's reading thread);
 * the gate frees its place when the watch sees the end. */
static void guard_closed(void *arg, int fd, ttd_h2_verdict why) {
  ttd_conn_gate *g = arg;
  pthread_mutex_lock(&g->lock);
  gate_slot *slot = fd >= 0 && fd < g->by_fd_size ? &g->by_fd[fd] : NULL;
  gate_who who = slot ? slot->who : (gate_who){0};
  closed_for_frames(g, &who, fd, why);
  pthread_mutex_unlock(&g->lock);
}

/* A TCP connection whose preface (and TLS handshake) is done: gRPC gets one end of a
 * socketpair, the relay the other and the peer's socket. */
static void start_relay(ttd_conn_gate *g, gate_conn *c) {
  int pair[2] = {-1, -1};
  pthread_mutex_lock(&g->lock);
  epoll_ctl(g->epoll_fd, EPOLL_CTL_DEL, c->fd, NULL);
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, pair) != 0 || pair[0] >= g->by_fd_size) {
    if (pair[0] >= 0) close(pair[0]), close(pair[1]);
    refuse_log(g, "no descriptor left for its relay", "-");
    atomic_fetch_add(&g->core->metrics.connections_refused, 1);
    conn_free(g, c);
    pthread_mutex_unlock(&g->lock);
    return;
  }
  /* Room for a few of the relay's reads either way: fewer turns between gRPC and the relay
   * (the kernel caps it at net.core.wmem_max). */
  int bytes = GATE_PAIR_BUFFER;
  setsockopt(pair[0], SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  setsockopt(pair[1], SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  int peer_fd = c->fd;
  SSL *ssl = c->ssl;
  uint8_t first[PREFACE_LEN];
  memcpy(first, c->first, PREFACE_LEN);
  c->ssl = NULL;
  c->fd = pair[0];
  c->handed = c->relayed = true;
  g->by_fd[pair[0]] = (gate_slot){.conn = c, .who = c->who};
  pthread_mutex_unlock(&g->lock);
  /* From here the relay may end c (relay_ended) at any moment: c is not touched again. */
  ttd_status_t status = ttd_conn_relay_add(g->relay, peer_fd, ssl, pair[1], first, PREFACE_LEN, c);
  if (status) {
    pthread_mutex_lock(&g->lock);
    refuse_log(g, ttd_status_message(status), "-");
    atomic_fetch_add(&g->core->metrics.connections_refused, 1);
    conn_free(g, c);
    pthread_mutex_unlock(&g->lock);
    ttd_status_free(status);
    close(pair[0]);
    return;
  }
  g->handoff(g->handoff_arg, pair[0]);
}

/* A TLS connection before its handoff: the handshake, then the client preface, read here and
 * passed to gRPC by the relay. Anything else is closed. */
static void advance_tls(ttd_conn_gate *g, gate_conn *c) {
  if (!c->tls_done) {
    char why[160];
    switch (ttd_tls_server_handshake(c->ssl, c->fd, why, sizeof(why))) {
      case TTD_TLS_WANT_READ:
        set_events(g, c, EPOLLIN);
        return;
      case TTD_TLS_WANT_WRITE:
        set_events(g, c, EPOLLOUT);
        return;
      case TTD_TLS_FAILED:
        tls_failed(g, c, why);
        close_unhanded(g, c);
        return;
      case TTD_TLS_DONE:
        c->tls_done = true;
        break;
    }
  }
  set_events(g, c, EPOLLIN);
  while (c->preface_seen < PREFACE_LEN) {
    uint8_t *at = c->first + c->preface_seen;
    size_t want = PREFACE_LEN - c->preface_seen;
    ERR_clear_error();
    int n = SSL_read(c->ssl, at, (int)want);
    if (n <= 0) {
      int err = SSL_get_error(c->ssl, n);
      ERR_clear_error();
      if (err == SSL_ERROR_WANT_READ) return;
      if (err == SSL_ERROR_WANT_WRITE) {
        set_events(g, c, EPOLLOUT);
        return;
      }
    }
    if (n <= 0 || memcmp(at, ttd_h2_preface + c->preface_seen, (size_t)n) != 0) {
      close_unhanded(g, c); /* closed, or not HTTP/2 */
      return;
    }
    c->preface_seen += (size_t)n;
  }
  start_relay(g, c);
}

static void pause_listener(ttd_conn_gate *g, gate_listener *l) {
  epoll_ctl(g->epoll_fd, EPOLL_CTL_DEL, l->fd, NULL);
  l->paused_until = ttd_now_ms() + GATE_ACCEPT_RETRY_MS;
}

static void accept_all(ttd_conn_gate *g, gate_listener *l) {
  for (int i = 0; i < 256; i++) {
    int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      admit(g, l, fd);
      continue;
    }
    int err = errno;
    if (err == EAGAIN || err == EWOULDBLOCK) return;
    if (err == EINTR || err == ECONNABORTED || err == EPROTO) continue;
    uint64_t left_out = 0;
    bool log = log_allowed(g, &left_out);
    if ((err == EMFILE || err == ENFILE) && g->reserve_fd >= 0) {
      /* Out of descriptors: the reserve takes the connection off the queue and closes it,
       * so that the peer learns at once and the listener stays live. */
      close(g->reserve_fd);
      int dropped = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC);
      if (dropped >= 0) close(dropped);
      g->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
      atomic_fetch_add(&g->core->metrics.connections_refused, 1);
      if (log) {
        TTD_LOG(TTD_LOG_WARN, "event=connection-refused reason=\"out of file descriptors: %s\" left_out=%llu",
                strerror(err), (unsigned long long)left_out);
      }
      if (dropped >= 0 && g->reserve_fd >= 0) continue;
    } else if (log) {
      TTD_LOG(TTD_LOG_WARN, "event=accept-failed error=\"%s\" retry_ms=%d left_out=%llu", strerror(err),
              GATE_ACCEPT_RETRY_MS, (unsigned long long)left_out);
    }
    if (g->reserve_fd < 0) g->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    pause_listener(g, l);
    return;
  }
}

/* Under lock, at its deadline: a plain-text connection handed to gRPC that has not made a
 * call yet is shut down (gRPC then reads its end, closes it, and the watch frees its place):
 * a peer that sends the preface and SETTINGS, then nothing, holds no descriptor past the
 * handshake timeout. */
static void first_call_due(ttd_conn_gate *g, gate_conn *c) {
  if ((c->called = ttd_h2_read_guard_called(c->fd))) return;
  timed_out(g, FIRST_CALL_MISSED);
  shutdown(c->watch, SHUT_RDWR);
  c->called = true; /* shut down once; its end frees it */
}

/* Closes connections past their handshake deadline (and shuts down handed plain-text ones
 * that made no call by theirs); resumes paused listeners; returns the epoll timeout until the
 * next of those. */
static int timers(ttd_conn_gate *g) {
  int64_t now = ttd_now_ms(), next = now + 1000;
  pthread_mutex_lock(&g->lock);
  for (gate_conn *c = g->conns, *after; c; c = after) {
    after = c->next;
    if (c->handed) {
      if (c->relayed || c->called || c->watch < 0) continue;
      if (c->deadline <= now) first_call_due(g, c);
      else if (c->deadline < next) next = c->deadline;
      continue;
    }
    if (c->deadline <= now) {
      timed_out(g, c->ssl ? "TLS handshake and HTTP/2 preface" : "HTTP/2 preface");
      conn_free(g, c);
      continue;
    }
    if (c->preface_seen && !c->ssl) { /* a partial preface, peeked: look again soon */
      struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = c};
      epoll_ctl(g->epoll_fd, EPOLL_CTL_MOD, c->fd, &ev);
      if (now + 10 < next) next = now + 10;
    }
    if (c->deadline < next) next = c->deadline;
  }
  pthread_mutex_unlock(&g->lock);
  for (int i = 0; i < g->listener_count; i++) {
    gate_listener *l = &g->listeners[i];
    if (!l->paused_until) continue;
    if (l->paused_until <= now) {
      l->paused_until = 0;
      struct epoll_event ev = {.events = EPOLLIN, .data.ptr = l};
      epoll_ctl(g->epoll_fd, EPOLL_CTL_ADD, l->fd, &ev);
    } else if (l->paused_until < next) {
      next = l->paused_until;
    }
  }
  return (int)(next > now ? next - now : 0);
}

static void *gate_main(void *arg) {
  ttd_conn_gate *g = arg;
  pthread_setname_np(pthread_self(), "ttd-gate");
  struct epoll_event events[64];
  while (!atomic_load(&g->stopping)) {
    int n = epoll_wait(g->epoll_fd, events, 64, timers(g));
    for (int i = 0; i < n; i++) {
      int tag = *(int *)events[i].data.ptr;
      if (tag == TAG_WAKE) continue;
      if (tag == TAG_LISTENER) {
        accept_all(g, events[i].data.ptr);
        continue;
      }
      gate_conn *c = events[i].data.ptr;
      if (!c->handed) {
        if (c->ssl) advance_tls(g, c);
        else check_preface(g, c);
      } else { /* gRPC closed it (or the peer hung up): its place is free */
        pthread_mutex_lock(&g->lock);
        conn_free(g, c);
        pthread_mutex_unlock(&g->lock);
      }
    }
  }
  return NULL;
}

bool ttd_conn_gate_listening(const ttd_conn_gate *g) { return g && g->listener_count > 0; }

void ttd_conn_gate_peer(ttd_conn_gate *g, int fd, ttd_conn_peer *out) {
  memset(out, 0, sizeof(*out));
  if (!g || fd < 0 || fd >= g->by_fd_size) return;
  pthread_mutex_lock(&g->lock);
  gate_who who = g->by_fd[fd].who;
  pthread_mutex_unlock(&g->lock);
  out->kind = (ttd_conn_peer_kind)who.kind;
  out->uid = who.uid;
  out->gid = who.gid;
  out->pid = who.pid;
  who_name(&who, fd, out->name, sizeof(out->name));
}

/* ---- life ---- */

ttd_status_t ttd_conn_gate_create(ttd_core *core, ttd_conn_gate_handoff_fn handoff, void *arg,
                                  ttd_conn_gate **out_gate) {
  *out_gate = NULL;
  ttd_conn_gate *g = calloc(1, sizeof(*g));
  if (!g) return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
  g->core = core;
  g->config = core->config;
  g->handoff = handoff;
  g->handoff_arg = arg;
  g->wake_tag = TAG_WAKE;
  pthread_mutex_init(&g->lock, NULL);
  ttd_h2_read_guard_init(guard_closed, g);
  struct rlimit rl;
  g->by_fd_size = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < (1u << 20) ? (int)rl.rlim_cur : 1 << 20;
  g->by_fd = calloc((size_t)g->by_fd_size, sizeof(*g->by_fd));
  g->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  g->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  g->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (!g->by_fd || g->epoll_fd < 0 || g->wake_fd < 0 || g->reserve_fd < 0) {
    ttd_conn_gate_destroy(g);
    return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "cannot set up the connection gate: %s", strerror(errno));
  }
  *out_gate = g;
  return TTD_OK;
}

ttd_status_t ttd_conn_gate_start(ttd_conn_gate *g) {
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &g->wake_tag};
  epoll_ctl(g->epoll_fd, EPOLL_CTL_ADD, g->wake_fd, &ev);
  for (int i = 0; i < g->listener_count; i++) {
    struct epoll_event lev = {.events = EPOLLIN, .data.ptr = &g->listeners[i]};
    epoll_ctl(g->epoll_fd, EPOLL_CTL_ADD, g->listeners[i].fd, &lev);
  }
  bool tls = false;
  for (int i = 0; i < g->listener_count; i++) tls |= g->listeners[i].tls != NULL;
  if (tls) {
    TTD_RETURN_IF_ERROR(ttd_conn_relay_create(GATE_RELAY_THREADS, TTD_GATE_MAX_RESETS, g->config->handshake_timeout_ms,
                                              relay_ended, g, &g->relay));
  }
  /* Before the gate's thread, which reads g->probe at every accept. */
  TTD_RETURN_IF_ERROR(ttd_listener_probe_start(g->core, &g->probe));
  if (g->listener_count) {
    if (pthread_create(&g->thread, NULL, gate_main, g) != 0) {
      return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "cannot start the connection gate's thread");
    }
    g->thread_started = true;
  }
  return TTD_OK;
}

void ttd_conn_gate_stop(ttd_conn_gate *g) {
  if (!g || g->stopped) return;
  g->stopped = true;
  atomic_store(&g->stopping, true);
  if (g->wake_fd >= 0) {
    uint64_t one = 1;
    (void)!write(g->wake_fd, &one, sizeof(one));
  }
  if (g->thread_started) pthread_join(g->thread, NULL);
  ttd_listener_probe_stop(g->probe);
  g->probe = NULL;
  for (int i = 0; i < g->listener_count; i++) close(g->listeners[i].fd);
  pthread_mutex_lock(&g->lock);
  for (gate_conn *c = g->conns, *after; c; c = after) { /* relayed ones serve until destroy */
    after = c->next;
    if (!c->relayed) conn_free(g, c);
  }
  pthread_mutex_unlock(&g->lock);
}

void ttd_conn_gate_destroy(ttd_conn_gate *g) {
  if (!g) return;
  ttd_conn_gate_stop(g);
  ttd_conn_relay_destroy(g->relay); /* closes what it still relays; no relay_ended after */
  pthread_mutex_lock(&g->lock);
  while (g->conns) conn_free(g, g->conns);
  pthread_mutex_unlock(&g->lock);
  for (int i = 0; i < g->listener_count; i++) SSL_CTX_free(g->listeners[i].tls);
  if (g->epoll_fd >= 0) close(g->epoll_fd);
  if (g->wake_fd >= 0) close(g->wake_fd);
  if (g->reserve_fd >= 0) close(g->reserve_fd);
  pthread_mutex_destroy(&g->lock);
  free(g->by_fd);
  free(g->peers);
  free(g);
}
