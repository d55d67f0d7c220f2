#define _GNU_SOURCE /* pthread_setname_np */
#include "rpc/call_lane.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "session/shm_segment.h"
#include "telemetry/log.h"
#include "wire/cq_spin.h"

struct ttd_lane {
  atomic_int refs;
  ttd_lanes *owner;
  ttd_session *session;     /* one reference */
  ttd_shm_segment *segment; /* the mapping; one reference */
  ttd_lane_header *header;  /* in the client's memory */
  int ring_fd, answer_fd;
  atomic_bool busy;         /* a call of this lane is taken and not yet answered */
  atomic_bool closed;       /* its session closed, or ttd stops: take nothing more */
  ttd_cq_spin *spin;        /* --device-spin-us: the maximum, and the counters lingering adds to */
  atomic_llong window_ns;   /* ttd_lane_linger's window, adapted as ttd_cq_spin_wait adapts its own */
  atomic_llong answered_ns; /* when the last call was answered (0: none yet) */
  ttd_session_stream stream; /* closes the lane with its session */
  bool listed;              /* in owner->list (under owner->lock) */
  ttd_lane *next;
};

struct ttd_lanes {
  /* The registry's own reference and one per lane alive: a card's thread lingering over a
   * lane (ttd_lane_linger) may outlast ttd_lanes_destroy, and reads this struct meanwhile. */
  atomic_int refs;
  ttd_core *core;
  ttd_lane_run_fn run;
  void *arg;
  int epoll_fd;
  atomic_int control_fd; /* wakes the thread to sweep closed lanes, or to stop; -1 once closed */
  pthread_t thread;
  atomic_bool stopping; /* calls are answered UNAVAILABLE */
  atomic_int taking;    /* threads inside take() with a call of their own */
  atomic_bool ended;    /* the thread returns */
  pthread_mutex_t lock;
  ttd_lane *list;
  int open;
};

static void poke(int fd) {
  if (fd < 0) return;
  uint64_t one = 1;
  ssize_t n = write(fd, &one, sizeof(one)); /* nonblocking: a full counter already wakes */
  (void)n;
}

static void drain(int fd) {
  uint64_t count;
  ssize_t n = read(fd, &count, sizeof(count));
  (void)n;
}

ttd_lane *ttd_lane_retain(ttd_lane *lane) {
  atomic_fetch_add(&lane->refs, 1);
  return lane;
}

static void lanes_unref(ttd_lanes *lanes) {
  if (atomic_fetch_sub(&lanes->refs, 1) != 1) return;
  pthread_mutex_destroy(&lanes->lock);
  free(lanes);
}

void ttd_lane_release(ttd_lane *lane) {
  if (!lane || atomic_fetch_sub(&lane->refs, 1) != 1) return;
  ttd_lanes *owner = lane->owner;
  ttd_session_stream_remove(lane->session, &lane->stream);
  ttd_session_release(lane->session);
  ttd_shm_segment_release(lane->segment);
  if (lane->ring_fd >= 0) close(lane->ring_fd);
  if (lane->answer_fd >= 0) close(lane->answer_fd);
  free(lane);
  lanes_unref(owner);
}

/* The session closes (under its lock): the lane takes nothing more, and the thread drops it. */
static void on_session_closed(ttd_session_stream *stream) {
  ttd_lane *lane = (ttd_lane *)((char *)stream - offsetof(ttd_lane, stream));
  atomic_store(&lane->closed, true);
  /* The client takes back a call it posted and no one took, and makes it over gRPC, which
   * answers what a closed session's call gets; one it sleeps on wakes for that. */
  atomic_store(&lane->header->lane_closed, 1);
  poke(lane->answer_fd);
  poke(atomic_load(&lane->owner->control_fd));
}

/* Unlists and drops the registry's reference of every closed lane (all of them when
 * stopping). */
static void sweep(ttd_lanes *lanes, bool all) {
  ttd_lane *gone = NULL;
  pthread_mutex_lock(&lanes->lock);
  for (ttd_lane **p = &lanes->list; *p;) {
    ttd_lane *lane = *p;
    if (all || atomic_load(&lane->closed)) {
      *p = lane->next;
      lane->listed = false;
      lanes->open--;
      atomic_fetch_sub(&lanes->core->metrics.lanes_open, 1);
      epoll_ctl(lanes->epoll_fd, EPOLL_CTL_DEL, lane->ring_fd, NULL);
      atomic_store(&lane->closed, true);
      lane->next = gone;
      gone = lane;
    } else {
      p = &lane->next;
    }
  }
  pthread_mutex_unlock(&lanes->lock);
  while (gone) {
    ttd_lane *next = gone->next;
    ttd_lane_release(gone);
    gone = next;
  }
}

/* Reads the request's fields once, into cl, checked. On an error, answers it and returns false. */
static bool read_request(ttd_lane *lane, ttd_lane_call *cl) {
  const volatile ttd_lane_header *h = lane->header;
  cl->seq = h->seq;
  int64_t timeout_ms = h->timeout_ms;
  uint32_t request_len = h->request_len, authorization_len = h->authorization_len;
  char method[TTD_LANE_METHOD_BYTES];
  memcpy(method, (const char *)h->method, sizeof(method));
  method[sizeof(method) - 1] = '\0';
  const char *why = NULL;
  int code = GRPC_STATUS_INVALID_ARGUMENT;
  cl->method = NULL;
  for (size_t i = 0; i < ttd_method_count; i++) {
    if (strcmp(ttd_methods[i].path, method) == 0) cl->method = &ttd_methods[i];
  }
  char text[TTD_LANE_MESSAGE_BYTES];
  if (!cl->method || !cl->method->device_of) {
    code = GRPC_STATUS_UNIMPLEMENTED;
    snprintf(text, sizeof(text),
             "the call lane serves the device methods (Execute, Backward, ZeroGrad, OptimizerStep, "
             "OptimizerState), not '%.64s': call it over gRPC", method);
    why = text;
  } else if (request_len > TTD_LANE_REQUEST_BYTES) {
    snprintf(text, sizeof(text), "the lane's request_len is %" PRIu32 " bytes, over its room of %" PRIu64
             "; send a larger request over gRPC", request_len, (uint64_t)TTD_LANE_REQUEST_BYTES);
    why = text;
  } else if (authorization_len > TTD_LANE_AUTHORIZATION_BYTES) {
    snprintf(text, sizeof(text), "the lane's authorization_len is %" PRIu32 " bytes, over its room of %d",
             authorization_len, TTD_LANE_AUTHORIZATION_BYTES);
    why = text;
  } else if (timeout_ms < 0) {
    snprintf(text, sizeof(text), "the lane's timeout_ms is %" PRId64 "; give 0 (none) or a positive number",
             timeout_ms);
    why = text;
  }
  if (why) {
    ttd_lane_answer(lane, cl->seq, code, why, NULL, 0);
    return false;
  }
  cl->timeout_ms = timeout_ms;
  cl->authorization_len = authorization_len;
  memcpy(cl->authorization, (const char *)h->authorization, authorization_len);
  cl->authorization[authorization_len] = '\0';
  snprintf(cl->session_hex, sizeof(cl->session_hex), "%016" PRIx64, lane->session->id);
  cl->request = grpc_slice_malloc(request_len);
  memcpy(GRPC_SLICE_START_PTR(cl->request), (const unsigned char *)lane->header + TTD_LANE_REQUEST_OFFSET,
         request_len);
  return true;
}

static void take_posted(ttd_lane *lane);

/* Takes the lane's posted call, if there is one, and runs it; once ttd stops, answers it
 * UNAVAILABLE, as gRPC refuses calls then. The compare-and-swap alone decides who takes a
 * post; a post made while the lane's call runs (a client scribbling) is dropped, so that
 * one call at a time runs whatever the state word says. Counted in lanes->taking, which
 * ttd_lanes_stop waits out: a call taken before the stop is handed to the server before
 * the server counts what it has left. */
static void take(ttd_lane *lane) {
  ttd_lanes *lanes = lane->owner;
  if (atomic_load(&lane->closed)) return; /* the client takes its post back (lane_closed) */
  uint32_t posted = TTD_LANE_POSTED;
  if (!atomic_compare_exchange_strong(&lane->header->state, &posted, TTD_LANE_TAKEN)) return;
  if (atomic_exchange(&lane->busy, true)) return;
  atomic_fetch_add(&lanes->taking, 1);
  take_posted(lane);
  atomic_fetch_sub(&lanes->taking, 1);
}

/* take's call, once it is this thread's. */
static void take_posted(ttd_lane *lane) {
  ttd_lanes *lanes = lane->owner;
  int64_t answered = atomic_load_explicit(&lane->answered_ns, memory_order_relaxed);
  if (answered) { /* how soon the client came back: the next linger's window */
    int64_t window = atomic_load_explicit(&lane->window_ns, memory_order_relaxed);
    atomic_store_explicit(&lane->window_ns, ttd_cq_spin_next_window(window, lane->spin->max_ns, ttd_now_ns() - answered),
                          memory_order_relaxed);
  }
  if (atomic_load(&lanes->stopping)) {
    ttd_lane_answer(lane, lane->header->seq, GRPC_STATUS_UNAVAILABLE,
                    "ttd is shutting down; reconnect when it is back", NULL, 0);
    return;
  }
  ttd_lane_call cl;
  if (!read_request(lane, &cl)) return;
  lanes->run(lanes->arg, lane, &cl);
}

void ttd_lane_answer(ttd_lane *lane, uint64_t seq, int code, const char *message, const void *bytes, uint64_t len) {
  volatile ttd_lane_header *h = lane->header;
  char text[TTD_LANE_MESSAGE_BYTES];
  if (code == 0 && len > TTD_LANE_ANSWER_BYTES) {
    code = GRPC_STATUS_RESOURCE_EXHAUSTED;
    snprintf(text, sizeof(text), "the answer is %" PRIu64 " bytes, over the lane's room (and a gRPC answer's limit) "
             "of %" PRIu64 ": ask for less at once", len, (uint64_t)TTD_LANE_ANSWER_BYTES);
    message = text;
  }
  if (code == 0 && len) memcpy((unsigned char *)lane->header + TTD_LANE_ANSWER_OFFSET, bytes, len);
  h->answer_seq = seq;
  h->code = code;
  h->answer_len = code == 0 ? (uint32_t)len : 0;
  snprintf((char *)h->message, TTD_LANE_MESSAGE_BYTES, "%s", message ? message : "");
  atomic_fetch_add_explicit(&lane->owner->core->metrics.lane_calls, 1, memory_order_relaxed);
  atomic_store_explicit(&lane->answered_ns, ttd_now_ns(), memory_order_relaxed);
  atomic_store(&lane->busy, false); /* before the state: the client's next call may come at once */
  atomic_store(&lane->header->state, TTD_LANE_ANSWERED);
  if (atomic_load(&lane->header->client_waiting)) poke(lane->answer_fd);
}

void ttd_lane_linger(ttd_lane *lane, bool (*still_idle)(void *arg), void *arg) {
  ttd_cq_spin *spin = lane->spin;
  int64_t window = atomic_load_explicit(&lane->window_ns, memory_order_relaxed);
  if (spin->max_ns <= 0 || window <= 0 || atomic_load(&lane->closed)) return;
  atomic_store(&lane->header->daemon_watching, 1);
  int64_t start = ttd_now_ns();
  bool came = false;
  for (;;) {
    if (atomic_load_explicit(&lane->header->state, memory_order_acquire) == TTD_LANE_POSTED) {
      came = true;
      break;
    }
    if (ttd_now_ns() - start > window || !still_idle(arg) || atomic_load(&lane->closed)) break;
    sched_yield(); /* the client, on this same CPU, gets to post */
  }
  atomic_store(&lane->header->daemon_watching, 0);
  /* The client loads daemon_watching after posting: a post that saw it still set comes now */
  came = came || atomic_load(&lane->header->state) == TTD_LANE_POSTED;
  atomic_fetch_add_explicit(came ? &spin->hits : &spin->misses, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&spin->spin_ns, (unsigned long long)(ttd_now_ns() - start), memory_order_relaxed);
  if (came) take(lane);
}

static void *lanes_main(void *arg) {
  ttd_lanes *lanes = arg;
  pthread_setname_np(pthread_self(), "ttd-lanes");
  struct epoll_event events[64];
  for (;;) {
    int n = epoll_wait(lanes->epoll_fd, events, 64, -1);
    if (n < 0 && errno != EINTR) {
      TTD_LOG(TTD_LOG_ERROR, "event=lanes-epoll-failed reason=\"%s\"", strerror(errno));
      return NULL;
    }
    bool sweep_wanted = false;
    for (int i = 0; i < n; i++) {
      ttd_lane *lane = events[i].data.ptr;
      if (!lane) {
        drain(atomic_load(&lanes->control_fd));
        sweep_wanted = true;
        continue;
      }
      drain(lane->ring_fd);
      /* listed lanes are alive: only this thread unlists them */
      take(lane);
    }
    if (atomic_load(&lanes->ended)) return NULL;
    if (sweep_wanted) sweep(lanes, false);
  }
}

ttd_status_t ttd_lanes_start(ttd_core *core, ttd_lane_run_fn run, void *arg, ttd_lanes **out_lanes) {
  *out_lanes = NULL;
  ttd_lanes *lanes = calloc(1, sizeof(*lanes));
  if (!lanes) return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
  atomic_init(&lanes->refs, 1);
  lanes->core = core;
  lanes->run = run;
  lanes->arg = arg;
  pthread_mutex_init(&lanes->lock, NULL);
  lanes->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  int control_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  atomic_init(&lanes->control_fd, control_fd);
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
  if (lanes->epoll_fd < 0 || control_fd < 0 || epoll_ctl(lanes->epoll_fd, EPOLL_CTL_ADD, control_fd, &ev) != 0 ||
      pthread_create(&lanes->thread, NULL, lanes_main, lanes) != 0) {
    ttd_status_t s = ttd_make_status(GRPC_STATUS_UNAVAILABLE, "cannot start the call lanes' thread: %s", strerror(errno));
    if (lanes->epoll_fd >= 0) close(lanes->epoll_fd);
    if (control_fd >= 0) close(control_fd);
    pthread_mutex_destroy(&lanes->lock);
    free(lanes);
    return s;
  }
  *out_lanes = lanes;
  return TTD_OK;
}

void ttd_lanes_stop(ttd_lanes *lanes) {
  if (!lanes) return;
  atomic_store(&lanes->stopping, true);
  /* A thread that took a call before it saw the flag hands it to the server first */
  while (atomic_load(&lanes->taking) > 0) {
    struct timespec pause = {0, 100000};
    nanosleep(&pause, NULL);
  }
}

void ttd_lanes_destroy(ttd_lanes *lanes) {
  if (!lanes) return;
  atomic_store(&lanes->stopping, true);
  atomic_store(&lanes->ended, true);
  poke(atomic_load(&lanes->control_fd));
  pthread_join(lanes->thread, NULL);
  sweep(lanes, true); /* every lane closed: one a card's thread still lingers over goes with it */
  close(lanes->epoll_fd);
  close(atomic_exchange(&lanes->control_fd, -1));
  lanes_unref(lanes);
}

int ttd_lanes_open(ttd_lanes *lanes) {
  pthread_mutex_lock(&lanes->lock);
  int n = lanes->open;
  pthread_mutex_unlock(&lanes->lock);
  return n;
}

ttd_status_t ttd_lanes_add(ttd_lanes *lanes, ttd_session *session, int memfd, int out_fds[2]) {
  out_fds[0] = out_fds[1] = -1;
  ttd_shm_segment *segment = NULL;
  TTD_RETURN_IF_ERROR(ttd_shm_segment_map(memfd, TTD_LANE_BYTES, &segment));
  ttd_lane *lane = calloc(1, sizeof(*lane));
  if (!lane) {
    ttd_shm_segment_release(segment);
    return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  }
  atomic_init(&lane->refs, 1);
  lane->owner = lanes;
  atomic_fetch_add(&lanes->refs, 1);
  lane->spin = &lanes->core->device_spin;
  atomic_init(&lane->window_ns, lane->spin->max_ns); /* the window starts full, as ttd_cq_spin's */
  lane->segment = segment;
  lane->header = (ttd_lane_header *)segment->addr;
  lane->session = ttd_session_retain(session);
  lane->ring_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  lane->answer_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ttd_status_t status = TTD_OK;
  if (lane->ring_fd < 0 || lane->answer_fd < 0 || (out_fds[0] = dup(lane->ring_fd)) < 0 ||
      (out_fds[1] = dup(lane->answer_fd)) < 0) {
    status = ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "cannot make the lane's eventfds: %s", strerror(errno));
  }
  pthread_mutex_lock(&lanes->lock);
  for (ttd_lane *other = lanes->list; !status && other; other = other->next) {
    if (other->session == session && !atomic_load(&other->closed)) {
      status = ttd_make_status(GRPC_STATUS_ALREADY_EXISTS,
                               "session %016" PRIx64 " has a call lane already: one lane per session", session->id);
    }
  }
  if (!status && atomic_load(&lanes->stopping)) {
    status = ttd_make_status(GRPC_STATUS_UNAVAILABLE, "ttd is shutting down; reconnect when it is back");
  }
  lane->stream.cancel = status ? NULL : on_session_closed;
  if (!status && !ttd_session_stream_add(session, &lane->stream)) {
    lane->stream.cancel = NULL; /* never listed */
    status = ttd_make_status(GRPC_STATUS_FAILED_PRECONDITION, "session %016" PRIx64 " was closed; open a new session",
                             session->id);
  }
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = lane};
  if (!status && epoll_ctl(lanes->epoll_fd, EPOLL_CTL_ADD, lane->ring_fd, &ev) != 0) {
    status = ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "cannot watch the lane's eventfd: %s", strerror(errno));
  }
  if (!status) {
    lane->listed = true;
    lane->next = lanes->list;
    lanes->list = lane;
    lanes->open++;
    atomic_fetch_add(&lanes->core->metrics.lanes_open, 1);
  }
  pthread_mutex_unlock(&lanes->lock);
  if (status) {
    for (int i = 0; i < 2; i++) {
      if (out_fds[i] >= 0) close(out_fds[i]);
      out_fds[i] = -1;
    }
    ttd_lane_release(lane);
  }
  return status;
}
