/* The device queue through a real ttd. Fair sharing: a heavy session keeps many programs
 * queued (more than there are RPC worker threads) while a light session runs small
 * programs and transfers. Round-robin bounds the light session's wait by about one heavy
 * program; with a FIFO it would wait for the heavy session's whole queue. Transfers do
 * not wait for programs at all. Bounds are ratios to the heavy program's time measured in
 * the same run, so a slow machine or a sanitizer build scales both sides.
 * Draining: SIGTERM with programs running and queued lets them finish within
 * --drain-timeout, cancels them past it, and exits 0 either way. */
#include <signal.h>
#include <sys/wait.h>
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "graph_builder.h"
#include "raw_rpc.h"
#include "suites.h"
#include "ttd/v1/ttd.pb-c.h"
#include "ttd_harness.h"

#define HEAVY_THREADS 6 /* more than ttd's 4 RPC worker threads */
#define HEAVY_N 1024

static ttd_proc proc;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof(double), cmp_double);
  return v[n / 2];
}

typedef struct sess {
  char id[17], instance[40];
  uint64_t program;
  uint64_t operands[2];
  int n_operands;
} sess;

static uint64_t compile(const sess *s, graph_builder *b) {
  Ttd__V1__CompileResponse *resp = gb_compile(b, proc.target, s->id, 0, NULL);
  uint64_t program = resp->program;
  ttd__v1__compile_response__free_unpacked(resp, NULL);
  return program;
}

/* Runs the session's program once and (with free_output) frees its output; returns the
 * gRPC code. */
/* Runs s's program; returns the gRPC code, and the status message into details when given. */
static int execute_program(const sess *s, int free_output, char details[1024]) {
  Ttd__V1__ExecuteRequest req = TTD__V1__EXECUTE_REQUEST__INIT;
  req.program = s->program;
  req.inputs = (uint64_t *)s->operands;
  req.n_inputs = (size_t)s->n_operands;
  unsigned char buf[128];
  size_t len = ttd__v1__execute_request__pack(&req, buf);
  raw_result r;
  raw_call(proc.target, "/ttd.v1.Device/Execute", (raw_md){.session = s->id}, buf, len, &r);
  int code = r.code;
  if (details) snprintf(details, 1024, "%s", r.details);
  if (code == 0 && free_output) {
    Ttd__V1__ExecuteResponse *resp = ttd__v1__execute_response__unpack(NULL, r.body_len, r.body);
    uint64_t out = resp->outputs[0]->handle;
    ttd__v1__execute_response__free_unpacked(resp, NULL);
    Ttd__V1__FreeRequest fr = TTD__V1__FREE_REQUEST__INIT;
    fr.n_handles = 1;
    fr.handles = &out;
    raw_result f;
    len = ttd__v1__free_request__pack(&fr, buf);
    raw_call(proc.target, "/ttd.v1.Device/Free", (raw_md){.session = s->id}, buf, len, &f);
    code = f.code;
    raw_result_free(&f);
  }
  raw_result_free(&r);
  return code;
}

static int execute(const sess *s) { return execute_program(s, 1, NULL); }

static sess heavy, light;

/* The heavy session's program: a chain of depth HEAVY_N-square matmuls, and its operands. */
static void make_heavy(int depth) {
  static const char *names[] = {"m1", "m2", "m3", "m4", "m5", "m6", "m7", "m8"};
  graph_builder b;
  gb_init(&b);
  gb_value(&b, 0, "a", TTD__V1__DTYPE__DTYPE_FLOAT32, 2, HEAVY_N, HEAVY_N, 0, 0);
  gb_value(&b, 0, "b", TTD__V1__DTYPE__DTYPE_FLOAT32, 2, HEAVY_N, HEAVY_N, 0, 0);
  for (int i = 0; i < depth; i++) gb_node(&b, names[i], "matmul", i ? names[i - 1] : "a", "b", NULL);
  gb_output(&b, names[depth - 1]);
  heavy.program = compile(&heavy, &b);
  int64_t square[2] = {HEAVY_N, HEAVY_N};
  heavy.operands[0] = raw_allocate_shape(proc.target, heavy.id, square, 2);
  heavy.operands[1] = raw_allocate_shape(proc.target, heavy.id, square, 2);
  heavy.n_operands = 2;
}
static atomic_int stop_heavy, heavy_done, heavy_errors;

static void *heavy_main(void *arg) {
  (void)arg;
  while (!atomic_load(&stop_heavy)) {
    if (execute(&heavy) != 0) atomic_fetch_add(&heavy_errors, 1);
    atomic_fetch_add(&heavy_done, 1);
  }
  return NULL;
}

START_TEST(test_light_session_waits_one_program) {
  ttd_proc_start(&proc, NULL);
  raw_open_session(proc.target, heavy.id, heavy.instance);
  raw_open_session(proc.target, light.id, light.instance);
  make_heavy(1);
  graph_builder b;
  gb_init(&b); /* light: a relu of 16 floats */
  gb_value(&b, 0, "x", TTD__V1__DTYPE__DTYPE_FLOAT32, 1, 16, 0, 0, 0);
  gb_node(&b, "y", "relu", "x", NULL, NULL);
  gb_output(&b, "y");
  light.program = compile(&light, &b);
  light.operands[0] = raw_allocate(proc.target, light.id, 16);
  light.n_operands = 1;

  /* The cost of one heavy program alone, and of one light one, call overhead included. */
  double alone[5], light_alone[5];
  for (int i = 0; i < 5; i++) {
    double t0 = now_ms();
    ck_assert_int_eq(execute(&heavy), 0);
    alone[i] = now_ms() - t0;
    t0 = now_ms();
    ck_assert_int_eq(execute(&light), 0);
    light_alone[i] = now_ms() - t0;
  }
  double t_heavy = median(alone, 5), t_light = median(light_alone, 5);

  pthread_t threads[HEAVY_THREADS];
  for (int i = 0; i < HEAVY_THREADS; i++) pthread_create(&threads[i], NULL, heavy_main, NULL);
  struct timespec settle = {0, (long)(2 * t_heavy * 1e6) % 1000000000L};
  nanosleep(&settle, NULL); /* let the heavy queue fill */

  double waits[9], transfers[9];
  for (int i = 0; i < 9; i++) {
    double t0 = now_ms();
    ck_assert_int_eq(execute(&light), 0);
    waits[i] = now_ms() - t0;
    /* A transfer of the light session meanwhile: an Allocate and a Free go through the RPC
     * workers, never behind programs. */
    t0 = now_ms();
    uint64_t h = raw_allocate(proc.target, light.id, 1 << 16);
    transfers[i] = now_ms() - t0;
    Ttd__V1__FreeRequest fr = TTD__V1__FREE_REQUEST__INIT;
    fr.n_handles = 1;
    fr.handles = &h;
    raw_expect(proc.target, "/ttd.v1.Device/Free", &fr.base, (raw_md){.session = light.id}, 0, NULL);
  }
  int during = atomic_load(&heavy_done);
  atomic_store(&stop_heavy, 1);
  for (int i = 0; i < HEAVY_THREADS; i++) pthread_join(threads[i], NULL);
  ck_assert_int_eq(atomic_load(&heavy_errors), 0);

  double light_wait = median(waits, 9), worst = waits[8], transfer = median(transfers, 9);
  fprintf(stderr,
          "fairness: heavy program %.1f ms alone, light %.2f ms alone; with %d heavy callers: light %.1f ms median, "
          "%.1f ms worst, transfer %.2f ms median; %d heavy programs ran\n",
          t_heavy, t_light, HEAVY_THREADS, light_wait, worst, transfer, during);
  /* Round-robin: the running heavy program, then the light one (about 1 x t_heavy); a FIFO
   * queue would put it behind all six (about 6 x). */
  ck_assert_msg(light_wait < 2.0 * t_heavy + 5 * t_light, "light median %.1f ms vs heavy %.1f ms", light_wait, t_heavy);
  ck_assert_msg(worst < 3.0 * t_heavy + 10 * t_light, "light worst %.1f ms vs heavy %.1f ms", worst, t_heavy);
  ck_assert_msg(transfer < 0.5 * t_heavy + 5 * t_light, "transfer median %.2f ms vs heavy %.1f ms", transfer, t_heavy);
  ck_assert_int_gt(during, HEAVY_THREADS); /* the heavy session did run meanwhile */
  ck_assert_int_eq(ttd_proc_stop(&proc), 0);
}
END_TEST

typedef struct drain_call {
  pthread_t thread;
  int code;
  char details[1024];
} drain_call;

static void *drain_call_main(void *arg) {
  drain_call *d = arg;
  d->code = execute_program(&heavy, 0, d->details); /* the daemon frees the output as it stops */
  return NULL;
}

static int log_has(const char *needle) {
  char cmd[512];
  snprintf(cmd, sizeof(cmd), "grep -q '%s' '%s'", needle, proc.log_path);
  return system(cmd) == 0;
}

/* Starts ttd with drain_timeout, queues n heavy programs, sends SIGTERM once they are in
 * flight and returns ttd's exit status; codes[i] gets each call's gRPC code. */
/* Execute calls that have reached ttd at port's /metrics: answered (all OK before SIGTERM)
 * or in flight (the test's raw clients make no other call meanwhile). */
static double executes_arrived(int port) {
  char *m = harness_http(port, "GET", "/metrics");
  double answered = harness_metric(m, "ttd_rpc_total{method=\"Execute\",code=\"OK\"}");
  double in_flight = harness_metric(m, "ttd_rpc_in_flight");
  free(m);
  return (answered > 0 ? answered : 0) + (in_flight > 0 ? in_flight : 0);
}

static int sigterm_with_queue(const char *drain_timeout, int depth, int n, int *codes, char (*details)[1024]) {
  int port = harness_free_tcp_port();
  char admin[32];
  snprintf(admin, sizeof(admin), "127.0.0.1:%d", port);
  const char *args[] = {"--drain-timeout", drain_timeout, "--admin", admin, NULL};
  ttd_proc_start(&proc, args);
  setenv("TTD_KEEP_LOGS", "1", 1);
  raw_open_session(proc.target, heavy.id, heavy.instance);
  make_heavy(depth);
  double before = executes_arrived(port);
  drain_call calls[8];
  for (int i = 0; i < n; i++) pthread_create(&calls[i].thread, NULL, drain_call_main, &calls[i]);
  /* SIGTERM once every call has reached ttd, however long a sanitizer build takes to send
   * them (after a fixed wait one may still be unsent, and the stopping daemon refuses it
   * with another error), and long before the n programs of 6 matmuls each can all have run. */
  struct timespec tick = {0, 1000000};
  for (int waited = 0; executes_arrived(port) - before < n && waited < 10000; waited++) nanosleep(&tick, NULL);
  ck_assert_double_ge(executes_arrived(port) - before, n);
  kill(proc.pid, SIGTERM);
  for (int i = 0; i < n; i++) {
    pthread_join(calls[i].thread, NULL);
    codes[i] = calls[i].code;
    if (details) snprintf(details[i], sizeof(details[i]), "%s", calls[i].details);
  }
  int status;
  waitpid(proc.pid, &status, 0);
  proc.pid = 0;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void remove_proc_dir(void) {
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", proc.dir);
  ck_assert_int_eq(system(cmd), 0);
  unsetenv("TTD_KEEP_LOGS");
}

START_TEST(test_sigterm_lets_queued_programs_finish) {
  int codes[6];
  ck_assert_int_eq(sigterm_with_queue("30", 6, 6, codes, NULL), 0);
  /* Every call in flight at SIGTERM was answered with its result. */
  for (int i = 0; i < 6; i++) ck_assert_msg(codes[i] == 0, "call %d: code %d", i, codes[i]);
  ck_assert(log_has("event=stopping"));
  ck_assert(!log_has("event=drain-timeout"));
  ck_assert(!log_has("event=calls-leaked"));
  remove_proc_dir();
}
END_TEST

START_TEST(test_sigterm_past_drain_timeout_cancels) {
  int codes[8];
  char details[8][1024];
  ck_assert_int_eq(sigterm_with_queue("1ms", 6, 8, codes, details), 0);
  ck_assert(log_has("event=drain-timeout"));
  ck_assert(!log_has("event=calls-leaked"));
  /* Programs still queued were dropped, not run after their callers were told so. */
  ck_assert(log_has("drain timeout passed before this call"));
  /* Each call cut short learns why, never a bare CANCELLED: UNAVAILABLE "ttd is shutting
   * down" when it had not started (sent again by a resuming client), ABORTED when it was
   * stopped running (not sent again: part of it may have taken effect). */
  int cut = 0;
  for (int i = 0; i < 8; i++) {
    ck_assert_msg(codes[i] == 0 || codes[i] == 14 || codes[i] == 10, "call %d: code %d (%s)", i, codes[i], details[i]);
    if (codes[i]) ck_assert_msg(strstr(details[i], "ttd is shutting down"), "call %d: '%s'", i, details[i]);
    cut += codes[i] != 0;
  }
  ck_assert_int_gt(cut, 0);
  remove_proc_dir();
}
END_TEST

START_TEST(test_sigterm_past_drain_timeout_stops_running_program) {
  /* One program of 8 matmuls of 1024 x 1024 (17 GFLOP), running when the drain timeout
   * passes: it stops at its kernels' next check and its caller is answered, not cut off,
   * ABORTED, which a resuming client does not send again. */
  int code;
  char details[1][1024];
  ck_assert_int_eq(sigterm_with_queue("1ms", 8, 1, &code, details), 0);
  ck_assert_msg(code == 10 /* ABORTED */, "code %d (%s)", code, details[0]);
  ck_assert_msg(strstr(details[0], "ttd is shutting down: its drain timeout passed while /ttd.v1.Device/Execute ran "
                                   "on the device, which was stopped after"),
                "'%s'", details[0]);
  ck_assert(log_has("event=drain-timeout"));
  ck_assert(!log_has("event=calls-leaked"));
  remove_proc_dir();
}
END_TEST

Suite *e2e_fairness_suite(void) {
  Suite *s = suite_create("e2e_fairness");
  TCase *tc = tcase_create("fairness");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_light_session_waits_one_program);
  tcase_add_test(tc, test_sigterm_lets_queued_programs_finish);
  tcase_add_test(tc, test_sigterm_past_drain_timeout_cancels);
  tcase_add_test(tc, test_sigterm_past_drain_timeout_stops_running_program);
  suite_add_tcase(s, tc);
  return s;
}
