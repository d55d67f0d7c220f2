#define _GNU_SOURCE /* SYS_recvmsg, MSG_PEEK */
#include "rpc/h2_read_guard.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"

/* Descriptors in chunks of GUARD_CHUNK slots, made at the first watch in their range and kept
 * until the process ends (a reader never sees a slot go away). */
#define GUARD_CHUNK 1024
#define GUARD_CHUNKS 1024

typedef struct guard_slot {
  atomic_bool watched; /* read without the lock first: an unwatched descriptor costs one load */
  atomic_bool spoke;   /* the parser knows gRPC has written (ttd_h2_frames_server_spoke) */
  bool reported;
  pthread_mutex_t lock;
  ttd_h2_frames frames;
} guard_slot;

static _Atomic(guard_slot *) chunks[GUARD_CHUNKS];
static pthread_mutex_t chunks_lock = PTHREAD_MUTEX_INITIALIZER;
static ttd_h2_guard_fn guard_fn;
static void *guard_arg;

/* fd's slot if its chunk exists (make: create it), else NULL. */
static guard_slot *slot_of(int fd, bool make) {
  if (fd < 0 || fd >= GUARD_CHUNK * GUARD_CHUNKS) return NULL;
  _Atomic(guard_slot *) *chunk = &chunks[fd / GUARD_CHUNK];
  guard_slot *slots = atomic_load_explicit(chunk, memory_order_acquire);
  if (!slots && make) {
    pthread_mutex_lock(&chunks_lock);
    slots = atomic_load_explicit(chunk, memory_order_relaxed);
    if (!slots && (slots = calloc(GUARD_CHUNK, sizeof(*slots))) != NULL) {
      for (int i = 0; i < GUARD_CHUNK; i++) pthread_mutex_init(&slots[i].lock, NULL);
      atomic_store_explicit(chunk, slots, memory_order_release);
    }
    pthread_mutex_unlock(&chunks_lock);
  }
  return slots ? &slots[fd % GUARD_CHUNK] : NULL;
}

void ttd_h2_read_guard_init(ttd_h2_guard_fn fn, void *arg) {
  guard_fn = fn;
  guard_arg = arg;
}

int ttd_h2_read_guard_watch(int fd, int max_resets) {
  guard_slot *s = slot_of(fd, true);
  if (!s) return -1;
  pthread_mutex_lock(&s->lock);
  ttd_h2_frames_init(&s->frames, max_resets, 1, ttd_now_ms());
  s->reported = false;
  atomic_store_explicit(&s->spoke, false, memory_order_relaxed);
  atomic_store_explicit(&s->watched, true, memory_order_release);
  pthread_mutex_unlock(&s->lock);
  return 0;
}

bool ttd_h2_read_guard_called(int fd) {
  guard_slot *s = slot_of(fd, false);
  if (!s) return false;
  pthread_mutex_lock(&s->lock);
  bool called = atomic_load_explicit(&s->watched, memory_order_relaxed) && s->frames.last_stream > 0;
  pthread_mutex_unlock(&s->lock);
  return called;
}

void ttd_h2_read_guard_counts(int fd, uint64_t *out_frames, uint64_t *out_resets) {
  *out_frames = *out_resets = 0;
  guard_slot *s = slot_of(fd, false);
  if (!s) return;
  pthread_mutex_lock(&s->lock);
  if (atomic_load_explicit(&s->watched, memory_order_relaxed)) {
    *out_frames = s->frames.frames;
    *out_resets = s->frames.resets;
  }
  pthread_mutex_unlock(&s->lock);
}

/* The n bytes recvmsg put into msg's buffers, through fd's parser: how many of them may go on. */
static ssize_t guard_read(guard_slot *s, int fd, const struct msghdr *msg, ssize_t n) {
  pthread_mutex_lock(&s->lock);
  if (!atomic_load_explicit(&s->watched, memory_order_relaxed)) {
    pthread_mutex_unlock(&s->lock);
    return n;
  }
  uint64_t before = s->frames.good;
  int64_t now = ttd_now_ms();
  size_t left = (size_t)n;
  for (size_t i = 0; i < (size_t)msg->msg_iovlen && left > 0; i++) {
    size_t len = msg->msg_iov[i].iov_len < left ? msg->msg_iov[i].iov_len : left;
    ttd_h2_frames_feed(&s->frames, msg->msg_iov[i].iov_base, len, now);
    left -= len;
  }
  ttd_h2_verdict verdict = s->frames.verdict;
  bool report = verdict != TTD_H2_PASS && !s->reported;
  if (report) s->reported = true;
  ssize_t pass = verdict == TTD_H2_PASS ? n : (ssize_t)(s->frames.good > before ? s->frames.good - before : 0);
  pthread_mutex_unlock(&s->lock);
  if (verdict != TTD_H2_PASS) {
    shutdown(fd, SHUT_RDWR); /* the peer is gone; gRPC reads the end of the stream next */
    if (report && guard_fn) guard_fn(guard_arg, fd, verdict);
  }
  return pass;
}

/* libgrpc's (and every other) recvmsg in ttd: the system call, then the guard on watched
 * descriptors. */
ssize_t recvmsg(int fd, struct msghdr *msg, int flags) {
  ssize_t n = syscall(SYS_recvmsg, fd, msg, flags);
  if (n <= 0 || (flags & MSG_PEEK)) return n;
  guard_slot *s = slot_of(fd, false);
  if (!s || !atomic_load_explicit(&s->watched, memory_order_acquire)) return n;
  int saved = errno;
  ssize_t pass = guard_read(s, fd, msg, n);
  errno = saved;
  return pass;
}

/* libgrpc's (and every other) sendmsg in ttd: the first time gRPC writes to a watched
 * descriptor (its SETTINGS, which it has marked sent by then), the parser learns the server
 * has spoken, before the bytes leave, so a client's acknowledgement of them never comes
 * first; then the system call. A connection's first write finds its socket buffer empty. */
ssize_t sendmsg(int fd, const struct msghdr *msg, int flags) {
  guard_slot *s = slot_of(fd, false);
  if (s && atomic_load_explicit(&s->watched, memory_order_acquire) &&
      !atomic_load_explicit(&s->spoke, memory_order_relaxed)) {
    pthread_mutex_lock(&s->lock);
    if (atomic_load_explicit(&s->watched, memory_order_relaxed)) {
      ttd_h2_frames_server_spoke(&s->frames);
      atomic_store_explicit(&s->spoke, true, memory_order_relaxed);
    }
    pthread_mutex_unlock(&s->lock);
  }
  return syscall(SYS_sendmsg, fd, msg, flags);
}

/* Every close in ttd: a watched descriptor's watch ends with it. */
int close(int fd) {
  guard_slot *s = slot_of(fd, false);
  if (s && atomic_load_explicit(&s->watched, memory_order_acquire)) {
    pthread_mutex_lock(&s->lock);
    atomic_store_explicit(&s->watched, false, memory_order_relaxed);
    pthread_mutex_unlock(&s->lock);
  }
  return (int)syscall(SYS_close, fd);
}
