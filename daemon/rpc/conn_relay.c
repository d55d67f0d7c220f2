#define _GNU_SOURCE /* pthread_setname_np */
#include "rpc/conn_relay.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/err.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"

/* Reads one side may take in a turn before the relay looks at other connections. */
#define RELAY_READS_PER_TURN 4
/* How often a worker with connections looks for those past their first call's deadline. */
#define RELAY_SWEEP_MS 100

enum { SIDE_WAKE, SIDE_PEER, SIDE_LOCAL };
enum { IO_OK, IO_AGAIN, IO_EOF, IO_ERROR };

typedef struct relay_tag {
  int side;
  struct relay_conn *conn;
} relay_tag;

/* One direction: bytes read from its source that its destination has not taken yet. */
typedef struct relay_dir {
  uint8_t *held;
  size_t held_off, held_len;
  bool eof; /* its source ended */
} relay_dir;

typedef struct relay_conn {
  relay_tag peer_tag, local_tag;
  int peer_fd, local_fd;
  SSL *ssl;
  uint32_t peer_events, local_events; /* as registered with epoll */
  relay_dir up, down;                 /* up: peer to gRPC; down: gRPC to peer */
  bool read_wants_write, write_wants_read; /* what the TLS session asked for in this turn */
  bool local_shut;                    /* gRPC was told the peer ended (SHUT_WR) */
  bool again;                         /* on the worker's again list */
  bool dead;                          /* ended; freed after the current batch of events */
  ttd_h2_frames frames;
  int64_t first_call_by; /* 0, or when it ends unless it has opened a stream */
  void *cookie;
  struct relay_conn *next, *prev, *again_next;
} relay_conn;

typedef struct relay_worker {
  ttd_conn_relay *relay;
  pthread_t thread;
  bool started;
  int epoll_fd, wake_fd;
  relay_tag wake_tag;
  pthread_mutex_t lock;
  relay_conn *incoming; /* added, not yet taken by the thread (under lock) */
  relay_conn *conns;    /* the thread's */
  relay_conn *again;    /* TLS sessions holding decrypted bytes that epoll cannot announce */
  relay_conn *dead;     /* ended in this batch */
  uint8_t *scratch;     /* TTD_RELAY_CHUNK: every read lands here */
} relay_worker;

struct ttd_conn_relay {
  relay_worker *workers;
  int worker_count;
  atomic_uint next_worker;
  atomic_bool stopping;
  int max_resets;
  int64_t first_call_ms;
  ttd_conn_relay_end_fn end;
  void *end_arg;
};

/* ---- the two sides' I/O: IO_OK with *out_n > 0, or why not ---- */

static int peer_read(relay_conn *c, uint8_t *buf, size_t cap, size_t *out_n) {
  *out_n = 0;
  /* A record is at most 16 KiB: gather several into one write to gRPC. */
  int status = IO_OK;
  size_t got = 0;
  while (got < cap) {
    ERR_clear_error();
    int n = SSL_read(c->ssl, buf + got, (int)(cap - got < INT_MAX ? cap - got : INT_MAX));
    if (n > 0) {
      got += (size_t)n;
      continue;
    }
    int err = SSL_get_error(c->ssl, n);
    if (err == SSL_ERROR_WANT_READ) {
      status = IO_AGAIN;
    } else if (err == SSL_ERROR_WANT_WRITE) {
      c->read_wants_write = true;
      status = IO_AGAIN;
    } else {
      status = err == SSL_ERROR_ZERO_RETURN ? IO_EOF : IO_ERROR;
    }
    break;
  }
  *out_n = got;
  return got ? IO_OK : status; /* an end after bytes shows again at the next read */
}

static int peer_write(relay_conn *c, const uint8_t *buf, size_t len, size_t *out_n) {
  *out_n = 0;
  ERR_clear_error();
  int n = SSL_write(c->ssl, buf, (int)(len < INT_MAX ? len : INT_MAX)); /* partial writes are on */
  if (n > 0) {
    *out_n = (size_t)n;
    return IO_OK;
  }
  int err = SSL_get_error(c->ssl, n);
  if (err == SSL_ERROR_WANT_WRITE) return IO_AGAIN;
  if (err == SSL_ERROR_WANT_READ) {
    c->write_wants_read = true;
    return IO_AGAIN;
  }
  return IO_ERROR;
}

static int local_read(relay_conn *c, uint8_t *buf, size_t cap, size_t *out_n) {
  *out_n = 0;
  ssize_t n = recv(c->local_fd, buf, cap, 0);
  if (n > 0) {
    *out_n = (size_t)n;
    return IO_OK;
  }
  if (n == 0) return IO_EOF;
  return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? IO_AGAIN : IO_ERROR;
}

static int local_write(relay_conn *c, const uint8_t *buf, size_t len, size_t *out_n) {
  *out_n = 0;
  ssize_t n = send(c->local_fd, buf, len, MSG_NOSIGNAL);
  if (n >= 0) {
    *out_n = (size_t)n;
    return IO_OK;
  }
  return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? IO_AGAIN : IO_ERROR;
}

/* ---- moving bytes ---- */

/* Writes buf to the destination (the peer, or gRPC) as far as it takes it and holds the
 * rest in d; -1 when the destination failed or memory ran out. */
static int pass(relay_conn *c, relay_dir *d, bool to_peer, const uint8_t *buf, size_t len) {
  size_t done = 0;
  while (done < len) {
    size_t n;
    int status = to_peer ? peer_write(c, buf + done, len - done, &n) : local_write(c, buf + done, len - done, &n);
    if (status == IO_AGAIN) break;
    if (status != IO_OK) return -1;
    done += n;
  }
  if (done == len) return 0;
  d->held = malloc(len - done);
  if (!d->held) return -1;
  memcpy(d->held, buf + done, len - done);
  d->held_off = 0;
  d->held_len = len - done;
  return 0;
}

/* Writes what d holds; 1 when all of it is gone, 0 when the destination is full, -1 when it
 * failed. A TLS write retried after WANT_WRITE gets the same bytes, as OpenSSL requires. */
static int flush(relay_conn *c, relay_dir *d, bool to_peer) {
  while (d->held_off < d->held_len) {
    size_t n, left = d->held_len - d->held_off;
    int status = to_peer ? peer_write(c, d->held + d->held_off, left, &n) : local_write(c, d->held + d->held_off, left, &n);
    if (status == IO_AGAIN) return 0;
    if (status != IO_OK) return -1;
    d->held_off += n;
  }
  free(d->held);
  d->held = NULL;
  d->held_off = d->held_len = 0;
  return 1;
}

/* The peer's decrypted bytes to gRPC, each read parsed first. -1: end the connection
 * (c->frames says whether for what the peer sent). */
static int pump_up(relay_worker *w, relay_conn *c) {
  if (c->up.held) {
    int flushed = flush(c, &c->up, false);
    if (flushed <= 0) return flushed;
  }
  for (int turn = 0; turn < RELAY_READS_PER_TURN && !c->up.eof; turn++) {
    size_t n;
    int status = peer_read(c, w->scratch, TTD_RELAY_CHUNK, &n);
    if (status == IO_AGAIN) return 0;
    if (status == IO_ERROR) return -1;
    if (status == IO_EOF) {
      c->up.eof = true;
      break;
    }
    if (ttd_h2_frames_feed(&c->frames, w->scratch, n, ttd_now_ms()) != TTD_H2_PASS) return -1;
    if (pass(c, &c->up, false, w->scratch, n) != 0) return -1;
    if (c->up.held) return 0;
  }
  if (c->up.eof && !c->local_shut) { /* the peer is done sending: so is gRPC's client */
    shutdown(c->local_fd, SHUT_WR);
    c->local_shut = true;
  }
  return 0;
}

/* gRPC's bytes to the peer, encrypted. -1: end the connection (gRPC closed it, or a side failed). */
static int pump_down(relay_worker *w, relay_conn *c) {
  if (c->down.held) {
    int flushed = flush(c, &c->down, true);
    if (flushed <= 0) return flushed;
  }
  for (int turn = 0; turn < RELAY_READS_PER_TURN; turn++) {
    size_t n;
    int status = local_read(c, w->scratch, TTD_RELAY_CHUNK, &n);
    if (status == IO_AGAIN) return 0;
    if (status != IO_OK) { /* gRPC closed the connection: so does the relay */
      c->down.eof = true;
      return -1;
    }
    ttd_h2_frames_server_spoke(&c->frames); /* gRPC's SETTINGS, which it writes first, are out */
    if (pass(c, &c->down, true, w->scratch, n) != 0) return -1;
    if (c->down.held) return 0;
  }
  return 0;
}

/* ---- connections ---- */

static void conn_close(relay_conn *c, bool graceful) {
  if (c->ssl) {
    if (graceful) {
      ERR_clear_error();
      SSL_shutdown(c->ssl); /* close_notify, if the socket takes it */
    }
    SSL_free(c->ssl);
    ERR_clear_error();
  }
  if (c->peer_fd >= 0) close(c->peer_fd);
  if (c->local_fd >= 0) close(c->local_fd);
  relay_dir *dirs[2] = {&c->up, &c->down};
  for (int i = 0; i < 2; i++) {
    free(dirs[i]->held);
  }
}

/* Ends c: closes both sides now, calls the end callback, frees c after the batch. */
static void conn_end(relay_worker *w, relay_conn *c) {
  if (c->dead) return;
  c->dead = true;
  ttd_h2_verdict why = c->frames.verdict;
  conn_close(c, why == TTD_H2_PASS && c->down.eof);
  if (c->prev) c->prev->next = c->next;
  else w->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  c->next = w->dead;
  w->dead = c;
  w->relay->end(w->relay->end_arg, c->cookie, why);
}

static void watch(relay_worker *w, int fd, relay_tag *tag, uint32_t *registered, uint32_t want) {
  if (*registered == want) return;
  struct epoll_event ev = {.events = want, .data.ptr = tag};
  epoll_ctl(w->epoll_fd, EPOLL_CTL_MOD, fd, &ev);
  *registered = want;
}

/* Moves what it can both ways, then watches for what it waits on. */
static void service(relay_worker *w, relay_conn *c) {
  if (c->dead) return;
  c->read_wants_write = c->write_wants_read = false;
  if (pump_up(w, c) < 0 || pump_down(w, c) < 0) {
    conn_end(w, c);
    return;
  }
  bool up_full = c->up.held != NULL, down_full = c->down.held != NULL;
  uint32_t peer = 0, local = 0;
  if (!up_full && !c->up.eof) peer |= EPOLLIN;
  if (down_full || c->read_wants_write) peer |= EPOLLOUT;
  if (c->write_wants_read) peer |= EPOLLIN;
  if (!down_full) local |= EPOLLIN;
  if (up_full) local |= EPOLLOUT;
  watch(w, c->peer_fd, &c->peer_tag, &c->peer_events, peer);
  watch(w, c->local_fd, &c->local_tag, &c->local_events, local);
  if (!c->again && !up_full && !c->up.eof && SSL_has_pending(c->ssl)) {
    c->again = true; /* decrypted bytes wait in the session, and no event will say so */
    c->again_next = w->again;
    w->again = c;
  }
}

/* A connection handed to this worker: registered, its first bytes passed on. */
static void conn_start(relay_worker *w, relay_conn *c) {
  c->next = w->conns;
  if (c->next) c->next->prev = c;
  w->conns = c;
  c->peer_events = EPOLLIN;
  c->local_events = EPOLLIN;
  struct epoll_event pev = {.events = c->peer_events, .data.ptr = &c->peer_tag};
  struct epoll_event lev = {.events = c->local_events, .data.ptr = &c->local_tag};
  if (epoll_ctl(w->epoll_fd, EPOLL_CTL_ADD, c->peer_fd, &pev) != 0 ||
      epoll_ctl(w->epoll_fd, EPOLL_CTL_ADD, c->local_fd, &lev) != 0) {
    conn_end(w, c);
    return;
  }
  service(w, c); /* a TLS session may hold bytes already */
}

static void take_incoming(relay_worker *w) {
  uint64_t drained;
  (void)!read(w->wake_fd, &drained, sizeof(drained));
  pthread_mutex_lock(&w->lock);
  relay_conn *list = w->incoming;
  w->incoming = NULL;
  pthread_mutex_unlock(&w->lock);
  while (list) {
    relay_conn *c = list;
    list = c->next;
    c->next = c->prev = NULL;
    conn_start(w, c);
  }
}

/* Ends the connections that opened no stream by their deadline. */
static void sweep_first_calls(relay_worker *w) {
  int64_t now = ttd_now_ms();
  for (relay_conn *c = w->conns, *next; c; c = next) {
    next = c->next;
    if (!c->first_call_by || c->dead) continue;
    if (c->frames.last_stream) {
      c->first_call_by = 0;
    } else if (now >= c->first_call_by) {
      c->frames.verdict = TTD_H2_NO_CALL;
      conn_end(w, c);
    }
  }
}

static void *worker_main(void *arg) {
  relay_worker *w = arg;
  pthread_setname_np(pthread_self(), "ttd-relay");
  struct epoll_event events[64];
  int64_t next_sweep = 0;
  bool sweeps = w->relay->first_call_ms > 0;
  while (!atomic_load(&w->relay->stopping)) {
    int n = epoll_wait(w->epoll_fd, events, 64, w->again ? 0 : sweeps && w->conns ? RELAY_SWEEP_MS : -1);
    if (sweeps && ttd_now_ms() >= next_sweep) {
      sweep_first_calls(w);
      next_sweep = ttd_now_ms() + RELAY_SWEEP_MS;
    }
    for (int i = 0; i < n; i++) {
      relay_tag *tag = events[i].data.ptr;
      if (tag->side == SIDE_WAKE) {
        take_incoming(w);
        continue;
      }
      relay_conn *c = tag->conn;
      service(w, c);
      /* An error or hang-up shows on every wait: the pass above moved what was left. */
      if (events[i].events & (EPOLLERR | EPOLLHUP)) conn_end(w, c);
    }
    relay_conn *again = w->again;
    w->again = NULL;
    while (again) {
      relay_conn *c = again;
      again = c->again_next;
      c->again = false;
      service(w, c);
    }
    while (w->dead) {
      relay_conn *c = w->dead;
      w->dead = c->next;
      free(c);
    }
  }
  return NULL;
}

/* ---- life ---- */

ttd_status_t ttd_conn_relay_create(int threads, int max_resets, int64_t first_call_ms, ttd_conn_relay_end_fn end,
                                   void *end_arg, ttd_conn_relay **out_relay) {
  *out_relay = NULL;
  if (threads < 1) threads = 1;
  ttd_conn_relay *r = calloc(1, sizeof(*r));
  if (!r || !(r->workers = calloc((size_t)threads, sizeof(*r->workers)))) {
    free(r);
    return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory for the connection relay");
  }
  r->max_resets = max_resets;
  r->first_call_ms = first_call_ms;
  r->end = end;
  r->end_arg = end_arg;
  ttd_status_t status = TTD_OK;
  for (int i = 0; i < threads && !status; i++) {
    relay_worker *w = &r->workers[i];
    r->worker_count++;
    w->relay = r;
    w->wake_tag.side = SIDE_WAKE;
    pthread_mutex_init(&w->lock, NULL);
    w->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    w->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    w->scratch = malloc(TTD_RELAY_CHUNK);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &w->wake_tag};
    if (w->epoll_fd < 0 || w->wake_fd < 0 || !w->scratch || epoll_ctl(w->epoll_fd, EPOLL_CTL_ADD, w->wake_fd, &ev) != 0) {
      status = ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "cannot set up the connection relay: %s", strerror(errno));
    } else if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
      status = ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "cannot start the connection relay's thread");
    } else {
      w->started = true;
    }
  }
  if (status) {
    ttd_conn_relay_destroy(r);
    return status;
  }
  *out_relay = r;
  return TTD_OK;
}

ttd_status_t ttd_conn_relay_add(ttd_conn_relay *r, int peer_fd, SSL *ssl, int local_fd, const uint8_t *first,
                                size_t first_len, void *cookie) {
  relay_conn *c = calloc(1, sizeof(*c));
  if (!c) {
    relay_conn doomed = {.peer_fd = peer_fd, .local_fd = local_fd, .ssl = ssl};
    conn_close(&doomed, false);
    return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory for a relayed connection");
  }
  *c = (relay_conn){.peer_tag = {SIDE_PEER, c}, .local_tag = {SIDE_LOCAL, c}, .peer_fd = peer_fd, .ssl = ssl,
                    .local_fd = local_fd, .cookie = cookie,
                    .first_call_by = r->first_call_ms > 0 ? ttd_now_ms() + r->first_call_ms : 0};
  ttd_h2_frames_init(&c->frames, r->max_resets, 1, ttd_now_ms());
  if (first_len) {
    /* Checked by the gate already, and short: gRPC's end of a fresh socketpair takes it. */
    ttd_h2_frames_feed(&c->frames, first, first_len, ttd_now_ms());
    size_t n = 0;
    if (c->frames.verdict != TTD_H2_PASS || local_write(c, first, first_len, &n) != IO_OK || n != first_len) {
      conn_close(c, false);
      free(c);
      return ttd_make_status(GRPC_STATUS_INTERNAL, "the connection's preface could not be passed to gRPC");
    }
  }
  relay_worker *w = &r->workers[atomic_fetch_add(&r->next_worker, 1) % (unsigned)r->worker_count];
  pthread_mutex_lock(&w->lock);
  c->next = w->incoming;
  w->incoming = c;
  pthread_mutex_unlock(&w->lock);
  uint64_t one = 1;
  (void)!write(w->wake_fd, &one, sizeof(one));
  return TTD_OK;
}

static void free_list(relay_conn *c) {
  while (c) {
    relay_conn *next = c->next;
    conn_close(c, false);
    free(c);
    c = next;
  }
}

void ttd_conn_relay_destroy(ttd_conn_relay *r) {
  if (!r) return;
  atomic_store(&r->stopping, true);
  for (int i = 0; i < r->worker_count; i++) {
    relay_worker *w = &r->workers[i];
    if (!w->started) continue;
    uint64_t one = 1;
    (void)!write(w->wake_fd, &one, sizeof(one));
    pthread_join(w->thread, NULL);
  }
  for (int i = 0; i < r->worker_count; i++) {
    relay_worker *w = &r->workers[i];
    free_list(w->conns);
    free_list(w->incoming);
    while (w->dead) {
      relay_conn *c = w->dead;
      w->dead = c->next;
      free(c);
    }
    if (w->epoll_fd >= 0) close(w->epoll_fd);
    if (w->wake_fd >= 0) close(w->wake_fd);
    free(w->scratch);
    pthread_mutex_destroy(&w->lock);
  }
  free(r->workers);
  free(r);
}
