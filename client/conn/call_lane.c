/* The call lane of a same-host client (wire/call_lane.h): the session's device calls
 * (Execute, Backward, ZeroGrad, OptimizerStep, OptimizerState) written into a memfd the
 * daemon maps too, rather than sent over gRPC. The request and answer are the calls' own
 * protobuf messages; the daemon runs them as gRPC calls. The client polls the lane for the
 * answer for the device-work window (ttd_cq_spin's, adaptive), then sleeps on the lane's
 * answer eventfd and on its own descriptor of the side socket, whose hang-up means ttd has
 * gone (after answering every call it took: it closes side sockets once its calls are
 * drained).
 *
 * One call at a time: a thread that finds the lane held makes its call over gRPC, and so
 * do calls whose request does not fit. A call that outlives its timeout by
 * TTD_LANE_GRACE_MS, or whose answer makes no sense, breaks the lane: the client then makes
 * every call over gRPC until a resume registers a new one. */
#define _GNU_SOURCE /* memfd_create, POLLRDHUP */
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "conn/conn.h"

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Unmaps the lane and closes its eventfds; lane_lock held (or no other thread yet). */
static void discard(tt_client *c) {
  if (c->lane) munmap(c->lane, (size_t)TTD_LANE_BYTES);
  if (c->lane_ring_fd >= 0) close(c->lane_ring_fd);
  if (c->lane_answer_fd >= 0) close(c->lane_answer_fd);
  if (c->lane_watch_fd >= 0) close(c->lane_watch_fd);
  c->lane = NULL;
  c->lane_ring_fd = c->lane_answer_fd = c->lane_watch_fd = -1;
}

void tt_lane_close(tt_client *c) {
  pthread_mutex_lock(&c->lane_lock);
  discard(c);
  pthread_mutex_unlock(&c->lane_lock);
}

void tt_lane_open(tt_client *c) {
  const char *env = getenv("TTD_LANE");
  pthread_mutex_lock(&c->lane_lock);
  discard(c);
  int fd = c->shm_fd >= 0 && !(env && strcmp(env, "0") == 0) ? memfd_create("ttd-lane", MFD_CLOEXEC | MFD_ALLOW_SEALING)
                                                               : -1;
  void *addr = MAP_FAILED;
  if (fd >= 0 && ftruncate(fd, (off_t)TTD_LANE_BYTES) == 0 && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0) {
    addr = mmap(NULL, (size_t)TTD_LANE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  if (addr != MAP_FAILED) {
    ttd_shm_request req = {.magic = TTD_SHM_MAGIC, .op = TTD_SHM_LANE, .session_id = c->session_id,
                           .key = {c->shm_key[0], c->shm_key[1]}};
    ttd_shm_reply reply;
    int fds[2] = {-1, -1};
    pthread_mutex_lock(&c->shm_lock);
    int ok = c->shm_fd >= 0 && tt_shm_request(c, &req, fd, &reply, fds) == 0;
    int watch = ok ? fcntl(c->shm_fd, F_DUPFD_CLOEXEC, 0) : -1; /* its own: a resume replaces shm_fd */
    pthread_mutex_unlock(&c->shm_lock);
    if (ok && watch < 0) {
      close(fds[0]);
      close(fds[1]);
      ok = 0;
    }
    if (ok) {
      c->lane = addr;
      c->lane_ring_fd = fds[0];
      c->lane_answer_fd = fds[1];
      c->lane_watch_fd = watch;
      c->lane_seq = 0;
    } else {
      munmap(addr, (size_t)TTD_LANE_BYTES); /* an older ttd, or one that refuses: calls go over gRPC */
    }
  }
  if (fd >= 0) close(fd); /* the mappings keep the memory */
  pthread_mutex_unlock(&c->lane_lock);
}

static void signal_fd(int fd) {
  uint64_t one = 1;
  ssize_t n = write(fd, &one, sizeof(one));
  (void)n;
}

/* Whether the lane's session has closed and the call posted was still untaken: then it is
 * taken back here (the daemon's take would have made it TAKEN), to go over gRPC. */
static bool taken_back(ttd_lane_header *h) {
  uint32_t posted = TTD_LANE_POSTED;
  return atomic_load(&h->lane_closed) && atomic_compare_exchange_strong(&h->state, &posted, TTD_LANE_IDLE);
}

#define TAKEN_BACK (-1)
#define TIMEOUT_MS_MAX (30LL * 24 * 3600 * 1000) /* longer: as good as none */

/* Waits for the answer of the call posted; 0 once it is there, TAKEN_BACK when the session
 * closed before the daemon took it, else a status with err filled (the lane is then broken). */
static int await_answer(tt_client *c, ttd_lane_header *h, int64_t timeout_ms, char *err, size_t err_len) {
  int64_t start = now_ns();
  int64_t give_up = timeout_ms > 0 && timeout_ms <= TIMEOUT_MS_MAX
                        ? start + (timeout_ms + TTD_LANE_GRACE_MS) * 1000000
                        : INT64_MAX;
  ttd_cq_spin *spin = &c->device_spin; /* polled as ttd_cq_spin_wait polls a queue */
  int64_t window = spin->max_ns > 0 ? atomic_load_explicit(&spin->window_ns, memory_order_relaxed) : 0;
  if (window > 0) {
    bool hit = false;
    for (;;) {
      if ((hit = atomic_load_explicit(&h->state, memory_order_acquire) == TTD_LANE_ANSWERED)) break;
      if (now_ns() - start >= window || atomic_load(&h->lane_closed)) break;
      sched_yield(); /* the daemon, on this same CPU, gets to answer */
    }
    atomic_fetch_add_explicit(hit ? &spin->hits : &spin->misses, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&spin->spin_ns, (unsigned long long)(now_ns() - start), memory_order_relaxed);
  }
  int st = TT_OK;
  if (atomic_load(&h->state) != TTD_LANE_ANSWERED) {
    atomic_store(&h->client_waiting, 1);
    while (atomic_load(&h->state) != TTD_LANE_ANSWERED) {
      if (taken_back(h)) {
        st = TAKEN_BACK;
        break;
      }
      int64_t left_ns = give_up - now_ns();
      if (left_ns <= 0) {
        snprintf(err, err_len, "ttd did not answer this call on its call lane within its timeout (%" PRId64 " ms) "
                 "and %d ms more; the client makes its calls over gRPC from now on", timeout_ms, TTD_LANE_GRACE_MS);
        st = TT_DEADLINE_EXCEEDED;
        break;
      }
      struct pollfd p[2] = {{.fd = c->lane_answer_fd, .events = POLLIN}, {.fd = c->lane_watch_fd, .events = POLLRDHUP}};
      int64_t ms = left_ns / 1000000 + 1;
      int r = poll(p, 2, give_up == INT64_MAX ? -1 : (int)(ms < 3600000 ? ms : 3600000));
      if (r > 0 && (p[0].revents & POLLIN)) {
        uint64_t count;
        ssize_t n = read(c->lane_answer_fd, &count, sizeof(count));
        (void)n;
      }
      if (atomic_load(&h->state) == TTD_LANE_ANSWERED) break;
      if (r > 0 && (p[1].revents & (POLLHUP | POLLRDHUP | POLLERR | POLLNVAL))) {
        snprintf(err, err_len, "ttd went away during this call (it stopped, restarted or crashed): its side socket "
                 "closed before the call lane had an answer");
        st = TT_UNAVAILABLE;
        break;
      }
    }
    atomic_store(&h->client_waiting, 0);
  }
  if (st == TT_OK && spin->max_ns > 0) {
    atomic_store_explicit(&spin->window_ns, ttd_cq_spin_next_window(window, spin->max_ns, now_ns() - start),
                          memory_order_relaxed);
  }
  return st;
}

int tt_lane_call(tt_client *c, const char *path, const ProtobufCMessage *request,
                 const ProtobufCMessageDescriptor *response_type, ProtobufCMessage **out_response,
                 int64_t timeout_ms, char *err, size_t err_len) {
  *out_response = NULL;
  if (pthread_mutex_trylock(&c->lane_lock) != 0) return -1;
  ttd_lane_header *h = c->lane;
  size_t len = h ? protobuf_c_message_get_packed_size(request) : 0;
  size_t auth_len = strlen(c->authorization);
  if (!h || len > TTD_LANE_REQUEST_BYTES || strlen(path) >= TTD_LANE_METHOD_BYTES ||
      auth_len > TTD_LANE_AUTHORIZATION_BYTES || atomic_load(&h->lane_closed)) {
    if (h && atomic_load(&h->lane_closed)) discard(c); /* the session closed: calls over gRPC say so */
    pthread_mutex_unlock(&c->lane_lock);
    return -1;
  }
  unsigned char *base = (unsigned char *)h;
  protobuf_c_message_pack(request, base + TTD_LANE_REQUEST_OFFSET);
  uint64_t seq = ++c->lane_seq;
  h->request_len = (uint32_t)len;
  h->seq = seq;
  h->timeout_ms = timeout_ms > 0 && timeout_ms <= TIMEOUT_MS_MAX ? timeout_ms : 0;
  snprintf(h->method, sizeof(h->method), "%s", path);
  memcpy(h->authorization, c->authorization, auth_len);
  h->authorization_len = (uint32_t)auth_len;
  atomic_store(&h->state, TTD_LANE_POSTED);
  if (!atomic_load(&h->daemon_watching)) signal_fd(c->lane_ring_fd);
  int waited = await_answer(c, h, timeout_ms, err, err_len);
  if (waited == TAKEN_BACK) { /* its session closed: gRPC says what that call gets */
    discard(c);
    pthread_mutex_unlock(&c->lane_lock);
    return -1;
  }
  tt_status st = (tt_status)waited;
  bool broken = st != TT_OK;
  if (st == TT_OK) {
    uint64_t answer_seq = h->answer_seq;
    int32_t code = h->code;
    uint32_t answer_len = h->answer_len;
    if (answer_seq != seq || (code == 0 && answer_len > TTD_LANE_ANSWER_BYTES)) {
      snprintf(err, err_len, "ttd's answer on the call lane is not this call's (call %" PRIu64 ", answer %" PRIu64
               ", %" PRIu32 " bytes); the client makes its calls over gRPC from now on", seq, answer_seq, answer_len);
      st = TT_INTERNAL;
      broken = true;
    } else if (code != 0) {
      snprintf(err, err_len, "%.*s", TTD_LANE_MESSAGE_BYTES - 1, h->message);
      st = (tt_status)code;
    } else if (!(*out_response = protobuf_c_message_unpack(response_type, NULL, answer_len,
                                                           base + TTD_LANE_ANSWER_OFFSET))) {
      snprintf(err, err_len, "ttd answered with a response that is not a %s", response_type->name);
      st = TT_INTERNAL;
    }
    if (!broken) atomic_store(&h->state, TTD_LANE_IDLE);
  }
  if (broken) discard(c);
  pthread_mutex_unlock(&c->lane_lock);
  return (int)st;
}
