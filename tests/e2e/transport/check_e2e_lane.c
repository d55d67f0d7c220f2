/* The same-host call lane (wire/call_lane.h) against a real ttd: a local client's device
 * calls go over it and give the bits gRPC gives; a lane spoken by hand gets a precise
 * answer for every bad post, one lane per session, and goes with its session; a client
 * whose ttd dies during a lane call gets UNAVAILABLE at once. */
#define _GNU_SOURCE /* memfd_create */
#include <check.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "conn/conn.h"
#include "raw_rpc.h"
#include "side_socket.h"
#include "suites.h"
#include "ttd/v1/ttd.pb-c.h"
#include "ttd_harness.h"
#include "wire/call_lane.h"

static ttd_proc proc;
static int admin_port;

static void setup(void) { admin_port = ttd_proc_start_admin(&proc); }

static void teardown(void) {
  if (ttd_proc_alive(&proc)) ck_assert_int_eq(ttd_proc_stop(&proc), 0);
  unsetenv("TTD_LANE");
}

static double metric(const char *series) {
  char *r = harness_http(admin_port, "GET", "/metrics");
  double v = harness_metric(r, series);
  free(r);
  return v;
}

#define STEPS 6

/* A linear + relu trained STEPS steps (an L1 loss on the host, SGD on the card): its
 * parameters after, as bytes, into w (6 floats) and b (2 floats). */
static void train(float w[6], float b[2]) {
  tt_client *c = harness_connect(&proc, 0);
  harness_tiny_net net;
  harness_tiny_net_make(c, &net);
  tt_optimizer *opt = tt_sgd(net.m, 0.1f, 0.9f, 0, 0);
  ck_assert_ptr_nonnull(opt);
  for (int i = 0; i < STEPS; i++) {
    tt_tensor *out = NULL;
    ck_assert_msg(tt_forward(net.m, &net.in, 1, &out) == TT_OK, "%s", tt_last_error(c));
    tt_tensor *y = tt_to(out, "cpu"), *loss = tt_l1_loss(y, net.target);
    ck_assert_ptr_nonnull(loss);
    ck_assert_int_eq(tt_zero_grad(opt), TT_OK);
    ck_assert_int_eq(tt_backward(loss), TT_OK);
    ck_assert_int_eq(tt_step(opt), TT_OK);
    tt_tensor_free(loss);
    tt_tensor_free(y);
    tt_tensor_free(out);
  }
  tt_tensor *pw = tt_module_param(net.m, "linear1.weight"), *pb = tt_module_param(net.m, "linear1.bias");
  ck_assert_ptr_nonnull(pw);
  ck_assert_ptr_nonnull(pb);
  ck_assert_int_eq(tt_read(pw, w, 6 * sizeof(float)), TT_OK);
  ck_assert_int_eq(tt_read(pb, b, 2 * sizeof(float)), TT_OK);
  tt_tensor_free(pw);
  tt_tensor_free(pb);
  tt_optimizer_free(opt);
  harness_tiny_net_free(&net);
  tt_disconnect(c);
}

/* A local client's device calls take the lane and give gRPC's bits; TTD_LANE=0 keeps them
 * on gRPC; the lane goes with the session. */
START_TEST(test_same_bits_as_grpc) {
  float w_lane[6], b_lane[2], w_grpc[6], b_grpc[2];
  train(w_lane, b_lane);
  double lane_calls = metric("ttd_lane_calls_total");
  /* per step: Execute (with the last backward), Backward, ZeroGrad and OptimizerStep calls,
   * some of them folded into others by libttclient: at least one a step */
  ck_assert_msg(lane_calls >= STEPS, "%g lane calls for %d steps", lane_calls, STEPS);
  ck_assert_double_eq(metric("ttd_lanes"), 0); /* the client closed its session */
  setenv("TTD_LANE", "0", 1);
  train(w_grpc, b_grpc);
  ck_assert_double_eq(metric("ttd_lane_calls_total"), lane_calls);
  ck_assert_mem_eq(w_lane, w_grpc, sizeof(w_lane));
  ck_assert_mem_eq(b_lane, b_grpc, sizeof(b_lane));
  float w0[6] = {0};
  ck_assert(memcmp(w_lane, w0, sizeof(w0)) != 0);
}
END_TEST

typedef struct lane {
  ttd_lane_header *h;
  int ring, answer;
  uint64_t seq;
} lane;

static int lane_memfd(uint64_t bytes, int seal) {
  int fd = memfd_create("lane", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(ftruncate(fd, (off_t)bytes), 0);
  if (seal) ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  return fd;
}

static ttd_shm_reply register_lane(int sock, uint64_t sid, const uint64_t key[2], int fd, lane *out) {
  int fds[2];
  ttd_shm_request req = {.magic = TTD_SHM_MAGIC, .op = TTD_SHM_LANE, .session_id = sid, .key = {key[0], key[1]}};
  ttd_shm_reply r = harness_side_request(sock, req, fd, fds);
  if (r.code == 0) {
    ck_assert(fds[0] >= 0 && fds[1] >= 0);
    out->h = mmap(NULL, TTD_LANE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ck_assert_ptr_ne(out->h, MAP_FAILED);
    out->ring = fds[0];
    out->answer = fds[1];
    out->seq = 0;
  } else {
    ck_assert(fds[0] < 0 && fds[1] < 0);
  }
  return r;
}

/* Posts a call as a client would (fields, then the state, then the ring) and waits up to
 * wait_ms for its answer: the answer's code, or -1 when none came. claimed_len is the
 * request_len posted (len bytes are written); timeout_ms goes as it is; auth (or none:
 * NULL) is the authorization written, auth_len the length posted for it. */
static int post_as(lane *l, const char *method, const void *bytes, uint32_t len, uint32_t claimed_len,
                   int64_t timeout_ms, const char *auth, uint32_t auth_len, int wait_ms) {
  ttd_lane_header *h = l->h;
  if (auth) memcpy(h->authorization, auth, strlen(auth));
  memcpy((char *)h + TTD_LANE_REQUEST_OFFSET, bytes, len);
  h->request_len = claimed_len;
  h->seq = ++l->seq;
  h->timeout_ms = timeout_ms;
  snprintf(h->method, sizeof(h->method), "%s", method);
  h->authorization_len = auth_len;
  atomic_store(&h->client_waiting, 1);
  atomic_store(&h->state, TTD_LANE_POSTED);
  uint64_t one = 1;
  ck_assert_int_eq(write(l->ring, &one, sizeof(one)), sizeof(one));
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  while (atomic_load(&h->state) != TTD_LANE_ANSWERED) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    int left = wait_ms - (int)((now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000);
    if (left <= 0) return -1;
    struct pollfd p = {.fd = l->answer, .events = POLLIN};
    if (poll(&p, 1, left) > 0) {
      uint64_t n;
      ck_assert_int_eq(read(l->answer, &n, sizeof(n)), sizeof(n));
    }
  }
  ck_assert_uint_eq(h->answer_seq, l->seq);
  atomic_store(&h->state, TTD_LANE_IDLE);
  return h->code;
}

static int post(lane *l, const char *method, const void *bytes, uint32_t len, uint32_t claimed_len, int wait_ms) {
  return post_as(l, method, bytes, len, claimed_len, 10000, NULL, 0, wait_ms);
}

/* Registration refuses what is wrong, precisely; every bad post gets its own answer and the
 * lane keeps serving; a closed session's lane takes nothing more and goes. */
START_TEST(test_bad_lanes_and_posts) {
  char session[17];
  uint64_t key[2];
  harness_open_session_with_key(&proc, session, key);
  uint64_t sid = strtoull(session, NULL, 16);
  int sock = harness_side_socket(&proc);
  lane l = {0}, other = {0};

  int small = lane_memfd(4096, 1), loose = lane_memfd(TTD_LANE_BYTES, 0), good = lane_memfd(TTD_LANE_BYTES, 1);
  int huge = memfd_create("huge", MFD_CLOEXEC | MFD_HUGETLB); /* where the kernel has huge pages */
  if (huge >= 0) {
    ttd_shm_reply hr = register_lane(sock, sid, key, huge, &other);
    ck_assert_int_eq(hr.code, 3);
    ck_assert_ptr_nonnull(strstr(hr.message, "huge pages"));
    close(huge);
  }
  ttd_shm_reply r = register_lane(sock, sid, key, small, &other);
  ck_assert_int_eq(r.code, 3 /* INVALID_ARGUMENT */);
  ck_assert_ptr_nonnull(strstr(r.message, "ftruncate"));
  r = register_lane(sock, sid, key, loose, &other);
  ck_assert_int_eq(r.code, 3);
  ck_assert_ptr_nonnull(strstr(r.message, "F_SEAL_SHRINK"));
  r = register_lane(sock, sid, key, -1, &other);
  ck_assert_int_eq(r.code, 3);
  ck_assert_ptr_nonnull(strstr(r.message, "memfd attached"));
  uint64_t wrong[2] = {key[0], key[1] ^ 1};
  ck_assert_int_eq(register_lane(sock, sid, wrong, good, &other).code, 5 /* NOT_FOUND */);
  ck_assert_double_eq(metric("ttd_lanes"), 0);
  r = register_lane(sock, sid, key, good, &l);
  ck_assert_msg(r.code == 0, "%s", r.message);
  ck_assert_double_eq(metric("ttd_lanes"), 1);
  r = register_lane(sock, sid, key, good, &other);
  ck_assert_int_eq(r.code, 6 /* ALREADY_EXISTS */);
  ck_assert_ptr_nonnull(strstr(r.message, "one lane per session"));

  ck_assert_int_eq(post(&l, "/ttd.v1.Device/ListDevices", "", 0, 0, 5000), 12 /* UNIMPLEMENTED */);
  ck_assert_ptr_nonnull(strstr(l.h->message, "device methods"));
  ck_assert_int_eq(post(&l, "/ttd.v1.Device/Nope", "", 0, 0, 5000), 12);
  ck_assert_int_eq(post(&l, "/ttd.v1.Device/Execute", "", 0, (uint32_t)TTD_LANE_REQUEST_BYTES + 1, 5000), 3);
  ck_assert_ptr_nonnull(strstr(l.h->message, "request_len"));
  unsigned char garbage[64];
  memset(garbage, 0xff, sizeof(garbage));
  ck_assert_int_eq(post(&l, "/ttd.v1.Device/Execute", garbage, sizeof(garbage), sizeof(garbage), 5000), 3);
  ck_assert_ptr_nonnull(strstr(l.h->message, "not a valid ttd.v1.ExecuteRequest"));
  Ttd__V1__ExecuteRequest ex = TTD__V1__EXECUTE_REQUEST__INIT;
  ex.program = 0x1234;
  uint8_t buf[64];
  size_t n = ttd__v1__execute_request__pack(&ex, buf);
  ck_assert_int_eq(post(&l, "/ttd.v1.Device/Execute", buf, (uint32_t)n, (uint32_t)n, 5000), 5 /* NOT_FOUND */);
  ck_assert_ptr_nonnull(strstr(l.h->message, "1234"));
  ck_assert_int_eq(post_as(&l, "/ttd.v1.Device/Execute", buf, (uint32_t)n, (uint32_t)n, 10000, NULL,
                           TTD_LANE_AUTHORIZATION_BYTES + 1, 5000), 3);
  ck_assert_ptr_nonnull(strstr(l.h->message, "authorization_len"));
  ck_assert_int_eq(post_as(&l, "/ttd.v1.Device/Execute", buf, (uint32_t)n, (uint32_t)n, -5, NULL, 0, 5000), 3);
  ck_assert_ptr_nonnull(strstr(l.h->message, "timeout_ms"));
  uint64_t one = 1;
  /* a ring with nothing posted, and a state scribbled to TAKEN, take nothing */
  ck_assert_int_eq(write(l.ring, &one, sizeof(one)), sizeof(one));
  atomic_store(&l.h->state, TTD_LANE_TAKEN);
  ck_assert_int_eq(write(l.ring, &one, sizeof(one)), sizeof(one));
  usleep(100000);
  ck_assert_int_eq(atomic_load(&l.h->state), TTD_LANE_TAKEN);
  ck_assert_int_eq(post(&l, "/ttd.v1.Device/Execute", buf, (uint32_t)n, (uint32_t)n, 5000), 5);
  double answered = metric("ttd_lane_calls_total");
  ck_assert_double_eq(answered, 8);

  Ttd__V1__CloseSessionRequest close_req = TTD__V1__CLOSE_SESSION_REQUEST__INIT;
  raw_unary(proc.target, "/ttd.v1.Device/CloseSession", &close_req.base, (raw_md){.session = session}, NULL, 0, NULL);
  for (int i = 0; i < 200 && metric("ttd_lanes") != 0; i++) usleep(10000);
  ck_assert_double_eq(metric("ttd_lanes"), 0);
  ck_assert_int_eq(atomic_load(&l.h->lane_closed), 1);
  ck_assert_int_eq(post(&l, "/ttd.v1.Device/Execute", buf, (uint32_t)n, (uint32_t)n, 300), -1); /* not taken */
  ck_assert_int_eq(atomic_load(&l.h->state), TTD_LANE_POSTED);
  ck_assert_double_eq(metric("ttd_lane_calls_total"), answered);
  Ttd__V1__ListDevicesRequest list = TTD__V1__LIST_DEVICES_REQUEST__INIT;
  raw_unary(proc.target, "/ttd.v1.Device/ListDevices", &list.base, (raw_md){0}, NULL, 0, NULL);
  munmap(l.h, TTD_LANE_BYTES);
  close(l.ring);
  close(l.answer);
  close(small);
  close(loose);
  close(good);
  close(sock);
}
END_TEST

/* A lane call is authenticated as a gRPC one is, by the token it carries: the session's
 * tenant's token runs it; none, a made-up one, or another tenant's (for whom the lane's
 * session does not exist) do not. */
START_TEST(test_lane_tokens) {
  char tokens_path[128], alice[64], alice_auth[80], bob[64], bob_auth[80];
  snprintf(tokens_path, sizeof(tokens_path), "/tmp/ttd-lane-tokens-%d", (int)getpid());
  harness_token(alice, sizeof(alice), alice_auth, sizeof(alice_auth));
  harness_token(bob, sizeof(bob), bob_auth, sizeof(bob_auth));
  const char *names[] = {"alice", "bob"}, *toks[] = {alice, bob}, *opts[] = {"", ""};
  harness_write_tokens(tokens_path, names, toks, opts, 2);
  ttd_proc tp;
  const char *args[] = {"--tokens", tokens_path, NULL};
  ttd_proc_start(&tp, args);
  char session[17];
  uint64_t key[2];
  harness_open_session_with_key_as(&tp, alice_auth, session, key);
  int sock = harness_side_socket(&tp), fd = lane_memfd(TTD_LANE_BYTES, 1);
  lane l = {0};
  ttd_shm_reply r = register_lane(sock, strtoull(session, NULL, 16), key, fd, &l);
  ck_assert_msg(r.code == 0, "%s", r.message);
  Ttd__V1__ExecuteRequest ex = TTD__V1__EXECUTE_REQUEST__INIT;
  ex.program = 0x1234;
  uint8_t buf[64];
  uint32_t n = (uint32_t)ttd__v1__execute_request__pack(&ex, buf);
  const char *method = "/ttd.v1.Device/Execute";
  ck_assert_int_eq(post_as(&l, method, buf, n, n, 10000, alice_auth, (uint32_t)strlen(alice_auth), 5000), 5);
  ck_assert_ptr_nonnull(strstr(l.h->message, "1234")); /* the method ran: its program is not found */
  ck_assert_int_eq(post_as(&l, method, buf, n, n, 10000, NULL, 0, 5000), 16 /* UNAUTHENTICATED */);
  const char *made_up = "Bearer ttd_0000000000000000000000000000000000000000000000";
  ck_assert_int_eq(post_as(&l, method, buf, n, n, 10000, made_up, (uint32_t)strlen(made_up), 5000), 16);
  ck_assert_int_eq(post_as(&l, method, buf, n, n, 10000, bob_auth, (uint32_t)strlen(bob_auth), 5000), 5);
  ck_assert_ptr_nonnull(strstr(l.h->message, session)); /* bob has no such session */
  munmap(l.h, TTD_LANE_BYTES);
  close(l.ring);
  close(l.answer);
  close(fd);
  close(sock);
  ck_assert_int_eq(ttd_proc_stop(&tp), 0);
  unlink(tokens_path);
}
END_TEST

/* A client whose session an admin kills learns it from its next call at once, as over
 * gRPC: its lane says the session closed, the call goes over gRPC, and the lane goes. */
START_TEST(test_session_killed) {
  tt_client *c = harness_connect(&proc, 0);
  harness_tiny_net net;
  harness_tiny_net_make(c, &net);
  tt_module_train(net.m, 0);
  tt_tensor *out = NULL;
  ck_assert_int_eq(tt_forward(net.m, &net.in, 1, &out), TT_OK);
  tt_tensor_free(out);
  double lane_calls = metric("ttd_lane_calls_total");
  ck_assert_double_ge(lane_calls, 1);
  ck_assert_double_eq(metric("ttd_lanes"), 1);
  Ttd__V1__KillSessionRequest ks = TTD__V1__KILL_SESSION_REQUEST__INIT;
  ks.session_id = c->session_id;
  raw_expect(proc.target, "/ttd.v1.Device/KillSession", &ks.base, (raw_md){0}, 0, NULL);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  tt_status st = tt_forward(net.m, &net.in, 1, &out);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
  ck_assert_msg(st != TT_OK && st != TT_DEADLINE_EXCEEDED, "%s: %s", tt_status_name(st), tt_last_error(c));
  ck_assert_msg(s < 5, "the call took %.1f s to fail", s);
  ck_assert_double_eq(metric("ttd_lane_calls_total"), lane_calls); /* not answered on the lane */
  ck_assert_double_eq(metric("ttd_lanes"), 0);
  harness_tiny_net_free(&net);
  tt_disconnect(c);
}
END_TEST

/* A client whose ttd is killed gets UNAVAILABLE from its next lane call at once (the side
 * socket's hang-up), not after the call's timeout. */
START_TEST(test_ttd_gone) {
  tt_client *c = harness_connect(&proc, 0);
  harness_tiny_net net;
  harness_tiny_net_make(c, &net);
  tt_module_train(net.m, 0);
  tt_tensor *out = NULL;
  ck_assert_int_eq(tt_forward(net.m, &net.in, 1, &out), TT_OK);
  tt_tensor_free(out);
  double before = metric("ttd_lane_calls_total");
  ck_assert_double_ge(before, 1);
  ck_assert_int_eq(ttd_proc_kill(&proc, SIGKILL), 128 + SIGKILL);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  ck_assert_int_eq(tt_forward(net.m, &net.in, 1, &out), TT_UNAVAILABLE);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
  ck_assert_msg(s < 5, "the call took %.1f s to fail", s);
  harness_tiny_net_free(&net);
  tt_disconnect(c);
}
END_TEST

Suite *e2e_lane_suite(void) {
  Suite *s = suite_create("e2e_lane");
  TCase *tc = tcase_create("lane");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_same_bits_as_grpc);
  tcase_add_test(tc, test_bad_lanes_and_posts);
  tcase_add_test(tc, test_lane_tokens);
  tcase_add_test(tc, test_session_killed);
  tcase_add_test(tc, test_ttd_gone);
  suite_add_tcase(s, tc);
  return s;
}
