/* Fuzz harness: a session's call lane (daemon/rpc/call_lane.c) as a hostile local client
 * writes it. One registry of lanes, started by ttd_lanes_start over the in-process daemon
 * core (fuzz_core.h), serves every input with its own thread; each input registers a lane
 * for its session (a sealed memfd, as TTD_SHM_LANE does), writes its records over the
 * lane's header and request area one after another, and closes the session at the end.
 * The taken calls go to a stand-in for the server that checks what the lane made of the
 * bytes and answers with the request echoed. So the lane's reading of every header field
 * (once, bounds-checked), its refusals, its answers and its going with the session see the
 * bytes; the dispatch behind it is fuzz_rpc's.
 *
 * Input, up to 8 records, each:
 *   u8  flags: bits 0-1 the state word written last (0 IDLE, 1 POSTED, 2 TAKEN, 3 ANSWERED);
 *       bit 2 the ring is written after it; bit 3 the method field is overwritten with
 *       the method bits 4-6 pick (Execute, Backward, ZeroGrad, OptimizerStep,
 *       OptimizerState, ListDevices, Upload, or an unknown one); bit 7 the lengths are made
 *       to fit (request_len the record's request bytes, authorization_len at most its room)
 *   u16 length (little-endian) and that many bytes: the first sizeof(ttd_lane_header) of
 *       them over the header but its state word (the flags then override what they say),
 *       the rest at the request area.
 *
 * A record that posts and rings must be answered within 10 s (or the harness aborts): its
 * seq echoed, a status code a client's input may get, a NUL-terminated message, and for
 * the stand-in's OK, the request's bytes. After the input the lane is gone (ttd_lanes_open
 * back to 0) and the process holds the descriptors it held before. */
#define _GNU_SOURCE /* memfd_create */
#include <fcntl.h>
#include <grpc/slice.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "rpc/call_lane.h"
#include "session/session_table.h"
#include "fuzz_core.h"
#include "fuzz_input.h"

#define MAX_RECORDS 8
#define STUCK_NS (10 * 1000000000LL)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static ttd_lanes *lanes;
static atomic_int taken;       /* calls the stand-in ran in this input */
static char want_session[17];  /* the input's session, as the lane names it */

static void die(const char *what) {
  fprintf(stderr, "fuzz_call_lane: %s\n", what);
  abort();
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The server's stand-in: what the lane hands over is what it checked. */
static void run(void *arg, ttd_lane *lane, ttd_lane_call *cl) {
  (void)arg;
  atomic_fetch_add(&taken, 1);
  if (!cl->method || !cl->method->device_of) die("a call of a method the lane does not serve was taken");
  if (GRPC_SLICE_LENGTH(cl->request) > TTD_LANE_REQUEST_BYTES) die("a request past the lane's room was taken");
  if (cl->authorization_len > TTD_LANE_AUTHORIZATION_BYTES || cl->authorization[cl->authorization_len] != '\0') {
    die("the authorization was not bounded and terminated");
  }
  if (cl->timeout_ms < 0) die("a negative timeout was taken");
  if (strcmp(cl->session_hex, want_session) != 0) die("the call names another session than the lane's");
  ttd_lane_answer(lane, cl->seq, 0, "", GRPC_SLICE_START_PTR(cl->request), GRPC_SLICE_LENGTH(cl->request));
  grpc_slice_unref(cl->request);
}

static const char *const methods[8] = {"/ttd.v1.Device/Execute",        "/ttd.v1.Device/Backward",
                                       "/ttd.v1.Device/ZeroGrad",       "/ttd.v1.Device/OptimizerStep",
                                       "/ttd.v1.Device/OptimizerState", "/ttd.v1.Device/ListDevices",
                                       "/ttd.v1.Device/Upload",         "/ttd.v1.Device/Nope"};

/* One record written over the lane; waits for its answer when it posts and rings. */
static void record(ttd_lane_header *h, int ring_fd, uint8_t flags, const uint8_t *bytes, size_t len) {
  size_t head = len < sizeof(*h) ? len : sizeof(*h);
  unsigned char *base = (unsigned char *)h;
  size_t skip = sizeof(h->state); /* the state word is the flags' to write, last */
  if (head > skip) memcpy(base + skip, bytes + skip, head - skip);
  memcpy(base + TTD_LANE_REQUEST_OFFSET, bytes + head, len - head);
  if (flags & 8) snprintf(h->method, sizeof(h->method), "%s", methods[(flags >> 4) & 7]);
  if (flags & 0x80) {
    h->request_len = (uint32_t)(len - head);
    if (h->authorization_len > TTD_LANE_AUTHORIZATION_BYTES) h->authorization_len = TTD_LANE_AUTHORIZATION_BYTES;
  }
  uint64_t seq = h->seq;
  uint32_t request_len = h->request_len, state = flags & 3;
  atomic_store(&h->state, state);
  if (flags & 4) {
    uint64_t one = 1;
    if (write(ring_fd, &one, sizeof(one)) != sizeof(one)) die("cannot ring the lane");
  }
  if (state != TTD_LANE_POSTED || !(flags & 4)) return;
  int64_t start = now_ns();
  while (atomic_load(&h->state) != TTD_LANE_ANSWERED) {
    if (now_ns() - start > STUCK_NS) die("a posted and rung call was not answered within 10 s");
    struct timespec pause = {0, 50000};
    nanosleep(&pause, NULL);
  }
  if (h->answer_seq != seq) die("the answer does not echo the call's seq");
  if (memchr(h->message, '\0', sizeof(h->message)) == NULL) die("the answer's message is not terminated");
  int code = h->code;
  if (code == 0) {
    if (h->answer_len != request_len || memcmp(base + TTD_LANE_ANSWER_OFFSET, base + TTD_LANE_REQUEST_OFFSET,
                                               request_len) != 0) {
      die("the stand-in's answer is not the request's bytes");
    }
  } else if (code != 3 && code != 12) {
    fprintf(stderr, "fuzz_call_lane: code %d: %s\n", code, h->message);
    die("a refusal with a code a bad post does not get");
  }
  if (getenv("FUZZ_VERBOSE")) fprintf(stderr, "fuzz_call_lane: code %d %s\n", code, h->message);
  atomic_store(&h->state, TTD_LANE_IDLE);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ttd_core *core = fuzz_core_begin_input();
  if (!lanes) {
    ttd_status_t s = ttd_lanes_start(core, run, NULL, &lanes);
    if (s) die(ttd_status_message(s));
  }
  int fds_before = fuzz_open_fds();
  atomic_store(&taken, 0);
  uint64_t id = fuzz_core_open_session(core, 0);
  snprintf(want_session, sizeof(want_session), "%016" PRIx64, id);
  ttd_session *session = NULL;
  fuzz_check_status("the session", ttd_session_table_peek(&core->sessions, id, NULL, ttd_now_ms(), &session));
  int memfd = memfd_create("fuzz-lane", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (memfd < 0 || ftruncate(memfd, (off_t)TTD_LANE_BYTES) != 0 || fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
    die("cannot make the lane's memfd");
  }
  ttd_lane_header *h = mmap(NULL, TTD_LANE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  if (h == MAP_FAILED) die("cannot map the lane");
  int fds[2];
  ttd_status_t s = ttd_lanes_add(lanes, session, memfd, fds);
  if (s) die(ttd_status_message(s));
  close(memfd);
  ttd_session_release(session);
  fuzz_input in = {data, size};
  for (int r = 0; r < MAX_RECORDS && in.left; r++) {
    uint8_t flags = fuzz_u8(&in);
    size_t len;
    const uint8_t *bytes = fuzz_bytes(&in, fuzz_u16(&in), &len);
    record(h, fds[0], flags, bytes, len);
  }
  fuzz_core_end_input(core); /* closes the session: the lane goes */
  int64_t start = now_ns();
  while (ttd_lanes_open(lanes) != 0) {
    if (now_ns() - start > STUCK_NS) die("the lane outlived its session by 10 s");
    struct timespec pause = {0, 100000};
    nanosleep(&pause, NULL);
  }
  munmap(h, TTD_LANE_BYTES);
  close(fds[0]);
  close(fds[1]);
  start = now_ns(); /* the lanes' thread unlists a lane, then closes its eventfds */
  while (fuzz_open_fds() != fds_before) {
    if (now_ns() - start > STUCK_NS) die("the lane left a descriptor open");
    struct timespec pause = {0, 100000};
    nanosleep(&pause, NULL);
  }
  return 0;
}
