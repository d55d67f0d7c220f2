/* The same-host fast path of libttclient: host tensors of TT_SHM_MIN_BYTES or more live in
 * memfd segments that the daemon has mapped too, so Upload and Download name a segment
 * instead of streaming bytes, and the daemon makes the one copy between the tensor and
 * the card. Segments are handed over once on the daemon's side socket (SCM_RIGHTS) and
 * reused: a freed tensor's segment serves the next tensor of a similar size, so pages are
 * already faulted in. The pool lives until the client's last reference goes. */
#define _GNU_SOURCE /* memfd_create */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdbool.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "wire/fd_passing.h"
#include "wire/shm_protocol.h"
#include "conn/conn.h"

#define SEGMENT_ALIGN (1u << 20)
#define POOL_KEEP_FREE_BYTES (512ull << 20) /* free segments kept for reuse, at most */

int tt_shm_request(tt_client *c, const ttd_shm_request *req, int fd, ttd_shm_reply *reply, int out_fds[2]) {
  if (ttd_send_fds(c->shm_fd, req, sizeof(*req), &fd, fd >= 0 ? 1 : 0) != (ssize_t)sizeof(*req)) return -1;
  int got[2], count = 0;
  bool truncated;
  ssize_t n = ttd_recv_fds(c->shm_fd, reply, sizeof(*reply), 0, got, 2, &count, &truncated);
  bool ok = n == (ssize_t)sizeof(*reply) && reply->code == 0 && (!out_fds || count == 2);
  for (int i = 0; i < count; i++) {
    if (ok && out_fds) out_fds[i] = got[i];
    else close(got[i]);
  }
  if (n != (ssize_t)sizeof(*reply)) {
    /* Sent, but no whole reply read: one may still come, and the next request would take it
     * for its own (a segment id of another memfd). The side socket goes; later transfers
     * take gRPC. */
    close(c->shm_fd);
    c->shm_fd = -1;
    return -1;
  }
  return ok ? 0 : -1;
}

/* Connects the side socket at path; the fast path stays off (shm_fd -1) if it cannot. */
static void connect_side_socket(tt_client *c, const char *path) {
  c->shm_fd = -1;
  if (!c->shm_wanted || !path || !*path) return;
  if (strncmp(c->target, "unix:", 5) != 0) return; /* the side socket is only for same-host clients */
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof(sa.sun_path)) return;
  strcpy(sa.sun_path, path);
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
    close(fd);
    return; /* no fast path: everything goes over gRPC */
  }
  c->shm_fd = fd;
}

void tt_shm_connect(tt_client *c, const char *path, const tt_connect_options *options) {
  const char *env = getenv("TTD_SHM");
  c->shm_wanted = !options->disable_shm && !(env && strcmp(env, "0") == 0);
  connect_side_socket(c, path);
}

static void unmap(tt_shm_segment *s) {
  munmap(s->addr, (size_t)s->size);
  close(s->fd);
}

/* Gives a free segment back to the daemon and unmaps it; lock held. */
static void release_segment(tt_client *c, size_t i) {
  tt_shm_segment *s = &c->segments[i];
  ttd_shm_request req = {.magic = TTD_SHM_MAGIC, .op = TTD_SHM_RELEASE, .session_id = c->session_id, .segment_id = s->id,
                         .key = {c->shm_key[0], c->shm_key[1]}};
  ttd_shm_reply reply;
  tt_shm_request(c, &req, -1, &reply, NULL); /* a closed session has dropped it already */
  unmap(s);
  c->segments[i] = c->segments[--c->n_segments];
}

/* A new segment of size bytes, mapped here and registered with the daemon; lock held. */
static tt_shm_segment *new_segment(tt_client *c, uint64_t size) {
  if (c->n_segments == c->cap_segments) {
    size_t cap = c->cap_segments ? 2 * c->cap_segments : 8;
    tt_shm_segment *grown = realloc(c->segments, cap * sizeof(*grown));
    if (!grown) return NULL;
    c->segments = grown;
    c->cap_segments = cap;
  }
  int fd = memfd_create("ttd-tensor", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return NULL;
  void *addr = MAP_FAILED;
  /* Sealed against shrinking: the daemon maps it too and takes only what cannot shrink. */
  if (ftruncate(fd, (off_t)size) == 0 && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) == 0) {
    addr = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  ttd_shm_reply reply;
  ttd_shm_request req = {.magic = TTD_SHM_MAGIC, .op = TTD_SHM_REGISTER, .session_id = c->session_id, .size = size,
                         .key = {c->shm_key[0], c->shm_key[1]}};
  int ok = addr != MAP_FAILED && tt_shm_request(c, &req, fd, &reply, NULL) == 0;
  if (!ok) {
    if (addr != MAP_FAILED) munmap(addr, (size_t)size);
    close(fd);
    return NULL;
  }
  tt_shm_segment *s = &c->segments[c->n_segments++];
  *s = (tt_shm_segment){.id = reply.segment_id, .fd = fd, .addr = addr, .size = size};
  return s;
}

void *tt_shm_alloc(tt_client *c, uint64_t bytes, uint64_t min_bytes, uint64_t *out_segment) {
  *out_segment = 0;
  if (c->shm_fd < 0 || bytes < min_bytes || c->closed) return NULL;
  pthread_mutex_lock(&c->shm_lock);
  tt_shm_segment *best = NULL;
  for (size_t i = 0; i < c->n_segments; i++) { /* the smallest free one that fits, wasting at most half */
    tt_shm_segment *s = &c->segments[i];
    if (!s->in_use && s->size >= bytes && s->size <= 2 * bytes + SEGMENT_ALIGN && (!best || s->size < best->size)) {
      best = s;
    }
  }
  if (!best) best = new_segment(c, (bytes + SEGMENT_ALIGN - 1) / SEGMENT_ALIGN * SEGMENT_ALIGN);
  void *addr = NULL;
  if (best) {
    best->in_use = true;
    *out_segment = best->id;
    addr = best->addr;
  }
  pthread_mutex_unlock(&c->shm_lock);
  return addr;
}

void tt_shm_free(tt_client *c, void *addr) {
  pthread_mutex_lock(&c->shm_lock);
  uint64_t free_bytes = 0;
  for (size_t i = 0; i < c->n_segments; i++) {
    if (c->segments[i].addr == addr) c->segments[i].in_use = false;
    if (!c->segments[i].in_use) free_bytes += c->segments[i].size;
  }
  /* Keep a bounded amount for reuse: give back the largest free segments beyond it. */
  while (free_bytes > POOL_KEEP_FREE_BYTES) {
    size_t largest = c->n_segments;
    for (size_t i = 0; i < c->n_segments; i++) {
      if (!c->segments[i].in_use && (largest == c->n_segments || c->segments[i].size > c->segments[largest].size)) {
        largest = i;
      }
    }
    free_bytes -= c->segments[largest].size;
    release_segment(c, largest);
  }
  pthread_mutex_unlock(&c->shm_lock);
}

void tt_shm_destroy(tt_client *c) {
  for (size_t i = 0; i < c->n_segments; i++) unmap(&c->segments[i]);
  free(c->segments);
  c->segments = NULL;
  c->n_segments = 0;
  if (c->shm_fd >= 0) close(c->shm_fd);
  c->shm_fd = -1;
}

void tt_shm_reattach(tt_client *c, const char *path) {
  pthread_mutex_lock(&c->shm_lock);
  if (c->shm_fd >= 0) close(c->shm_fd);
  connect_side_socket(c, path);
  for (size_t i = 0; i < c->n_segments && c->shm_fd >= 0; i++) {
    tt_shm_segment *s = &c->segments[i];
    ttd_shm_request req = {.magic = TTD_SHM_MAGIC, .op = TTD_SHM_REGISTER, .session_id = c->session_id,
                           .segment_id = s->id, .size = s->size, .key = {c->shm_key[0], c->shm_key[1]}};
    ttd_shm_reply reply;
    if (tt_shm_request(c, &req, s->fd, &reply, NULL) != 0 || reply.segment_id != s->id) {
      close(c->shm_fd); /* tensors in segments the daemon lacks fail to move; new ones use gRPC */
      c->shm_fd = -1;
    }
  }
  pthread_mutex_unlock(&c->shm_lock);
}
