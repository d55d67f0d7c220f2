/* A running program stops soon after its call's deadline passes or its session is killed
 * (finding 9, "one program holds the card"): an avg_pool2d whose cost is well under
 * --max-program-cost but whose single window loop runs for many seconds is stopped within a
 * bound, and the card's memory comes back. How soon: a small program of another session on
 * the same card, sent once the slow one is to stop, answers within the bound (it waits for
 * the card until the slow one has stopped). The bound (1 s) is generous for a loaded 2-core
 * machine and a sanitizer build; the measured latency is printed. */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "graph_builder.h"
#include "raw_rpc.h"
#include "suites.h"
#include "ttd/v1/ttd.pb-c.h"
#include "ttd_harness.h"

/* The slow program: avg_pool2d of a 768x768 plane with a 384x384 window, stride 1: 2.2e10
 * operations (--max-program-cost is 1.1e12), in one chunk: seconds to minutes. */
#define SLOW_SIDE 768
#define SLOW_WINDOW 384
#define STOP_BOUND_MS 1000.0

static ttd_proc proc;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

typedef struct sess {
  char id[17], instance[40];
  uint64_t program, input;
} sess;

static void open_slow(sess *s) {
  raw_open_session(proc.target, s->id, s->instance);
  graph_builder b;
  gb_init(&b);
  gb_value(&b, 0, "x", TTD__V1__DTYPE__DTYPE_FLOAT32, 4, 1, 1, SLOW_SIDE, SLOW_SIDE);
  Ttd__V1__Node *n = gb_node(&b, "y", "avg_pool2d", "x", NULL, NULL);
  gb_int(&b, n, "kernel", SLOW_WINDOW);
  gb_int(&b, n, "stride", 1);
  gb_output(&b, "y");
  Ttd__V1__CompileResponse *resp = gb_compile(&b, proc.target, s->id, 0, NULL);
  s->program = resp->program;
  ttd__v1__compile_response__free_unpacked(resp, NULL);
  int64_t shape[4] = {1, 1, SLOW_SIDE, SLOW_SIDE};
  s->input = raw_allocate_shape(proc.target, s->id, shape, 4);
}

static void open_light(sess *s) {
  raw_open_session(proc.target, s->id, s->instance);
  s->program = gb_compile_relu(proc.target, s->id, 1, 16, 0);
  s->input = raw_allocate(proc.target, s->id, 16);
}

/* Executes s's program with a deadline of timeout_ms (0: 30 s); its output, if any, is freed. */
static void execute(const sess *s, int timeout_ms, raw_result *out) {
  Ttd__V1__ExecuteRequest req = TTD__V1__EXECUTE_REQUEST__INIT;
  req.program = s->program;
  req.inputs = (uint64_t *)&s->input;
  req.n_inputs = 1;
  unsigned char buf[128];
  size_t len = ttd__v1__execute_request__pack(&req, buf);
  raw_call(proc.target, "/ttd.v1.Device/Execute", (raw_md){.session = s->id, .timeout_ms = timeout_ms}, buf, len, out);
  if (out->code != 0) return;
  Ttd__V1__ExecuteResponse *resp = ttd__v1__execute_response__unpack(NULL, out->body_len, out->body);
  Ttd__V1__FreeRequest fr = TTD__V1__FREE_REQUEST__INIT;
  uint64_t handle = resp->outputs[0]->handle;
  fr.n_handles = 1;
  fr.handles = &handle;
  raw_expect(proc.target, "/ttd.v1.Device/Free", &fr.base, (raw_md){.session = s->id}, 0, NULL);
  ttd__v1__execute_response__free_unpacked(resp, NULL);
}

/* Milliseconds from `since` until a small program of s answers, i.e. until the card is free. */
static double card_free_after(const sess *s, double since) {
  raw_result r = {0};
  execute(s, 0, &r);
  double at = now_ms();
  ck_assert_msg(r.code == 0, "the small program failed: %d %s", r.code, r.details);
  raw_result_free(&r);
  return at - since;
}

/* An Execute whose 100 ms deadline passes while its program runs: the client gets
 * DEADLINE_EXCEEDED, the card is free within the bound and its memory is back. */
START_TEST(test_deadline_stops_a_running_program) {
  ttd_proc_start(&proc, NULL);
  sess slow, light;
  open_light(&light);
  open_slow(&slow);
  uint64_t base = harness_used_bytes(&proc, 0, 0);
  card_free_after(&light, now_ms()); /* warm: the light session's first call */
  double start = now_ms();
  raw_result r = {0};
  execute(&slow, 100, &r);
  ck_assert_msg(r.code == 4, "want DEADLINE_EXCEEDED, got %d %s", r.code, r.details);
  raw_result_free(&r);
  double stop_ms = card_free_after(&light, start + 100);
  printf("e2e_cancel: the card was free %.1f ms after the 100 ms deadline passed\n", stop_ms);
  ck_assert_msg(stop_ms < STOP_BOUND_MS, "the program ran on %.0f ms past its deadline", stop_ms);
  ck_assert_uint_eq(harness_wait_used_bytes(&proc, 0, 0, base, 2000), base);
  raw_allocate(proc.target, slow.id, 16); /* the stopped call's session goes on */
  ck_assert_int_eq(ttd_proc_stop(&proc), 0);
}
END_TEST

typedef struct slow_call {
  const sess *s;
  int timeout_ms; /* the call's deadline (0: 30 s) */
  raw_result result;
  double ended_ms;
} slow_call;

static void *run_slow(void *arg) {
  slow_call *c = arg;
  execute(c->s, c->timeout_ms, &c->result);
  c->ended_ms = now_ms();
  return NULL;
}

/* KillSession from an admin while the session's program runs: the call answers
 * FAILED_PRECONDITION naming where the program was stopped, within the bound, and every
 * byte of the session is back. */
START_TEST(test_kill_stops_a_running_program) {
  ttd_proc_start(&proc, NULL);
  sess slow, light;
  open_light(&light);
  uint64_t base = harness_used_bytes(&proc, 0, 0);
  card_free_after(&light, now_ms());
  open_slow(&slow);
  slow_call c = {.s = &slow};
  pthread_t t;
  pthread_create(&t, NULL, run_slow, &c);
  usleep(300 * 1000); /* the program is on the card */
  Ttd__V1__KillSessionRequest ks = TTD__V1__KILL_SESSION_REQUEST__INIT;
  ks.session_id = strtoull(slow.id, NULL, 16);
  double killed = now_ms();
  raw_expect(proc.target, "/ttd.v1.Device/KillSession", &ks.base, (raw_md){0}, 0, NULL);
  pthread_join(t, NULL);
  double stop_ms = c.ended_ms - killed;
  printf("e2e_cancel: the killed session's Execute answered %.1f ms after KillSession: %s\n", stop_ms,
         c.result.details);
  ck_assert_msg(c.result.code == 9, "want FAILED_PRECONDITION, got %d %s", c.result.code, c.result.details);
  ck_assert_msg(strstr(c.result.details, "was closed") && strstr(c.result.details, "stopped in the forward at node 'y'"),
                "%s", c.result.details);
  ck_assert_msg(stop_ms < STOP_BOUND_MS, "the program ran on %.0f ms after KillSession", stop_ms);
  raw_result_free(&c.result);
  ck_assert_uint_eq(harness_wait_used_bytes(&proc, 0, 0, base, 2000), base);
  ck_assert_int_eq(ttd_proc_stop(&proc), 0);
}
END_TEST

/* With a 1 s lease, a session's Execute runs 2.5 s (stopped by its deadline) and another
 * session's Execute waits behind it: neither session expires while its call is in flight, so
 * the first gets DEADLINE_EXCEEDED (not FAILED_PRECONDITION) and the queued one OK; both
 * sessions serve the next call, and expire once a lease passes with no call. */
START_TEST(test_lease_waits_for_calls_in_flight) {
  const char *args[] = {"--lease", "1", NULL};
  ttd_proc_start(&proc, args);
  sess slow, light;
  open_light(&light);
  open_slow(&slow);
  slow_call c = {.s = &slow, .timeout_ms = 2500};
  pthread_t t;
  pthread_create(&t, NULL, run_slow, &c);
  usleep(300 * 1000); /* the slow program is on the card */
  raw_result r = {0};
  execute(&light, 0, &r); /* waits for the card past its session's lease */
  pthread_join(t, NULL);
  ck_assert_msg(c.result.code == 4, "want DEADLINE_EXCEEDED, got %d %s", c.result.code, c.result.details);
  ck_assert_msg(r.code == 0, "the queued call: want OK, got %d %s", r.code, r.details);
  raw_result_free(&c.result);
  raw_result_free(&r);
  ck_assert_int_eq(harness_log_count(&proc, "event=lease-expired"), 0);
  raw_allocate(proc.target, slow.id, 16);
  raw_allocate(proc.target, light.id, 16);
  for (int i = 0; i < 40 && harness_log_count(&proc, "event=lease-expired") < 2; i++) usleep(100 * 1000);
  ck_assert_int_eq(harness_log_count(&proc, "event=lease-expired"), 2);
  ck_assert_int_eq(ttd_proc_stop(&proc), 0);
}
END_TEST

Suite *e2e_cancel_suite(void) {
  Suite *s = suite_create("e2e_cancel");
  TCase *tc = tcase_create("cancel");
  tcase_set_timeout(tc, 180); /* unstopped, the program runs for many seconds: the bounds fail first */
  tcase_add_test(tc, test_deadline_stops_a_running_program);
  tcase_add_test(tc, test_kill_stops_a_running_program);
  tcase_add_test(tc, test_lease_waits_for_calls_in_flight);
  suite_add_tcase(s, tc);
  return s;
}
