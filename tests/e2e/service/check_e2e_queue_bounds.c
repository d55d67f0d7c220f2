/* What a session makes the daemon hold besides tensors, against a real ttd: at most
 * TTD_SESSION_MAX_QUEUED device calls waiting (one more is RESOURCE_EXHAUSTED, the others
 * run), the bytes of waiting requests and the host memory of compiled programs counted
 * against the session's quota. */
#include <check.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "graph_builder.h"
#include "raw_rpc.h"
#include "session/session.h"
#include "suites.h"
#include "ttd_harness.h"
#include "ttd/v1/ttd.pb-c.h"

static ttd_proc proc;

static void setup(void) { ttd_proc_start(&proc, NULL); }

static void teardown(void) { ck_assert_int_eq(ttd_proc_stop(&proc), 0); }

enum { LIGHT_CALLS = TTD_SESSION_MAX_QUEUED + 16, HEAVY = 2048 };

typedef struct execute_job {
  char session[17];
  uint64_t program, input;
  raw_result result;
} execute_job;

static void *execute(void *arg) {
  execute_job *j = arg;
  Ttd__V1__ExecuteRequest req = TTD__V1__EXECUTE_REQUEST__INIT;
  req.program = j->program;
  req.n_inputs = 1;
  req.inputs = &j->input;
  unsigned char buf[128];
  size_t len = ttd__v1__execute_request__pack(&req, buf);
  raw_call(proc.target, "/ttd.v1.Device/Execute", (raw_md){.session = j->session}, buf, len, &j->result);
  return NULL;
}

/* A second of matmuls holds the card while LIGHT_CALLS relus of the same session arrive:
 * TTD_SESSION_MAX_QUEUED of them wait and run, the rest are refused at once, naming the bound. */
START_TEST(test_queued_calls_bounded_per_session) {
  char session[17], instance[40];
  raw_open_session(proc.target, session, instance);
  graph_builder b;
  gb_init(&b);
  gb_value(&b, 0, "a", TTD__V1__DTYPE__DTYPE_FLOAT32, 2, HEAVY, HEAVY, 0, 0);
  gb_node(&b, "m1", "matmul", "a", "a", NULL);
  gb_node(&b, "m2", "matmul", "m1", "a", NULL);
  gb_node(&b, "m3", "matmul", "m2", "a", NULL);
  gb_node(&b, "m4", "matmul", "m3", "a", NULL);
  gb_output(&b, "m4");
  Ttd__V1__CompileResponse *heavy = gb_compile(&b, proc.target, session, 0, NULL);
  int64_t shape[2] = {HEAVY, HEAVY};
  execute_job first = {.program = heavy->program, .input = raw_allocate_shape(proc.target, session, shape, 2)};
  ttd__v1__compile_response__free_unpacked(heavy, NULL);
  memcpy(first.session, session, sizeof(session));
  uint64_t light = gb_compile_relu(proc.target, session, 1, 4, 0);
  uint64_t small = raw_allocate(proc.target, session, 4);
  pthread_t heavy_thread, threads[LIGHT_CALLS];
  execute_job *jobs = calloc(LIGHT_CALLS, sizeof(*jobs));
  ck_assert_int_eq(pthread_create(&heavy_thread, NULL, execute, &first), 0);
  usleep(100 * 1000); /* the matmuls are on the card */
  for (int i = 0; i < LIGHT_CALLS; i++) {
    jobs[i] = (execute_job){.program = light, .input = small};
    memcpy(jobs[i].session, session, sizeof(session));
    ck_assert_int_eq(pthread_create(&threads[i], NULL, execute, &jobs[i]), 0);
  }
  int ok = 0, refused = 0;
  for (int i = 0; i < LIGHT_CALLS; i++) {
    pthread_join(threads[i], NULL);
    if (jobs[i].result.code == 0) {
      ok++;
    } else {
      ck_assert_msg(jobs[i].result.code == 8 && strstr(jobs[i].result.details, "calls waiting for the card already"),
                    "%d: %s", jobs[i].result.code, jobs[i].result.details);
      refused++;
    }
    raw_result_free(&jobs[i].result);
  }
  pthread_join(heavy_thread, NULL);
  ck_assert_msg(first.result.code == 0, "%s", first.result.details);
  raw_result_free(&first.result);
  ck_assert_int_ge(ok, TTD_SESSION_MAX_QUEUED - 1); /* the one running when they arrived may not count */
  ck_assert_int_gt(refused, 0);
  free(jobs);
}
END_TEST

/* A client whose session asks for quota bytes. */
static tt_client *connect_with_quota(uint64_t quota) {
  tt_connect_options o;
  tt_connect_options_init(&o);
  o.quota_bytes = quota;
  o.disable_keepalive = 1;
  tt_client *c = NULL;
  ck_assert_int_eq(tt_connect(proc.target, &o, &c), TT_OK);
  return c;
}

static void session_hex(const tt_client *c, char out[17]) {
  snprintf(out, 17, "%016llx", (unsigned long long)tt_session_id(c));
}

/* A session with a 1 MiB quota: an Execute whose inline input is 1.5 MiB is refused while it
 * would wait, since waiting requests count against the quota, with a message that says so. */
START_TEST(test_queued_bytes_count_against_the_quota) {
  tt_client *c = connect_with_quota(1 << 20);
  char session[17];
  session_hex(c, session);
  enum { N = 3 << 17 }; /* 1.5 MiB of float32 */
  uint64_t program = gb_compile_relu(proc.target, session, 1, N, 0);
  float *data = calloc(N, sizeof(float));
  int64_t shape[1] = {N};
  Ttd__V1__TensorSpec spec = TTD__V1__TENSOR_SPEC__INIT;
  spec.dtype = TTD__V1__DTYPE__DTYPE_FLOAT32;
  spec.n_shape = 1;
  spec.shape = shape;
  Ttd__V1__InlineTensor in = TTD__V1__INLINE_TENSOR__INIT, *ins[1] = {&in};
  in.spec = &spec;
  in.data.data = (uint8_t *)data;
  in.data.len = sizeof(float) * N;
  Ttd__V1__ExecuteRequest req = TTD__V1__EXECUTE_REQUEST__INIT;
  req.program = program;
  req.n_inline_inputs = 1;
  req.inline_inputs = ins;
  raw_unary(proc.target, "/ttd.v1.Device/Execute", &req.base, (raw_md){.session = session}, NULL, 8,
            "bytes wait for the card with the session's other calls, and with them pass its quota");
  free(data);
  tt_disconnect(c);
}
END_TEST

/* The same quota against a request small on the wire that unpacks large: 256 KiB of empty
 * inline tensors (2 bytes each) become 128k structs in the daemon's memory, about 40 times the
 * wire's bytes. The unpacked size is what waits, and what is charged: the call is refused
 * naming more bytes than it was sent, before any check of the program looks at it. */
START_TEST(test_queued_bytes_are_the_unpacked_request) {
  tt_client *c = connect_with_quota(1 << 20);
  char session[17];
  session_hex(c, session);
  enum { N = 1 << 17 };
  Ttd__V1__InlineTensor empty = TTD__V1__INLINE_TENSOR__INIT;
  Ttd__V1__InlineTensor **ins = malloc(sizeof(*ins) * N);
  for (int i = 0; i < N; i++) ins[i] = &empty;
  Ttd__V1__ExecuteRequest req = TTD__V1__EXECUTE_REQUEST__INIT;
  req.program = gb_compile_relu(proc.target, session, 1, 4, 0);
  req.n_inline_inputs = N;
  req.inline_inputs = ins;
  size_t len = ttd__v1__execute_request__get_packed_size(&req);
  ck_assert_uint_lt(len, 1 << 19); /* well under the quota on the wire */
  unsigned char *buf = malloc(len);
  ttd__v1__execute_request__pack(&req, buf);
  raw_result r;
  raw_call(proc.target, "/ttd.v1.Device/Execute", (raw_md){.session = session}, buf, len, &r);
  ck_assert_msg(r.code == 8 && strstr(r.details, "bytes wait for the card with the session's other calls"), "%d %s",
                r.code, r.details);
  unsigned long long charged = strtoull(strstr(r.details, "this call's ") + strlen("this call's "), NULL, 10);
  ck_assert_msg(charged > (unsigned long long)len * 8, "charged %llu for %zu bytes on the wire", charged, len);
  raw_result_free(&r);
  free(buf);
  free(ins);
  ck_assert_uint_ne(raw_allocate(proc.target, session, 7 << 15), 0); /* 896 KiB: nothing stays charged */
  tt_disconnect(c);
}
END_TEST

/* Compiles a chain of n relus on a float32 [4] input in session with a raw call; returns
 * the code, the message in msg. */
static int compile_chain(const char *session, int n, char *msg, size_t msg_len) {
  int64_t shape[1] = {4};
  Ttd__V1__ValueSpec x = TTD__V1__VALUE_SPEC__INIT, *inputs[1] = {&x};
  x.name = "v0";
  x.dtype = TTD__V1__DTYPE__DTYPE_FLOAT32;
  x.n_shape = 1;
  x.shape = shape;
  Ttd__V1__Node *nodes = calloc((size_t)n, sizeof(*nodes)), **node_ptrs = calloc((size_t)n, sizeof(*node_ptrs));
  char (*names)[16] = calloc((size_t)n + 1, sizeof(*names));
  char **ins = calloc((size_t)n, sizeof(*ins));
  snprintf(names[0], sizeof(names[0]), "v0");
  for (int i = 0; i < n; i++) {
    ttd__v1__node__init(&nodes[i]);
    snprintf(names[i + 1], sizeof(names[i + 1]), "v%d", i + 1);
    nodes[i].name = names[i + 1];
    nodes[i].op = "relu";
    ins[i] = names[i];
    nodes[i].n_inputs = 1;
    nodes[i].inputs = &ins[i];
    node_ptrs[i] = &nodes[i];
  }
  char *outputs[1] = {names[n]};
  Ttd__V1__Graph g = TTD__V1__GRAPH__INIT;
  g.n_inputs = 1;
  g.inputs = inputs;
  g.n_nodes = (size_t)n;
  g.nodes = node_ptrs;
  g.n_outputs = 1;
  g.outputs = outputs;
  Ttd__V1__CompileRequest req = TTD__V1__COMPILE_REQUEST__INIT;
  req.graph = &g;
  size_t len = ttd__v1__compile_request__get_packed_size(&req);
  unsigned char *buf = malloc(len);
  ttd__v1__compile_request__pack(&req, buf);
  raw_result r;
  raw_call(proc.target, "/ttd.v1.Device/Compile", (raw_md){.session = session}, buf, len, &r);
  snprintf(msg, msg_len, "%s", r.details);
  int code = r.code;
  raw_result_free(&r);
  free(buf);
  free(ins);
  free(names);
  free(node_ptrs);
  free(nodes);
  return code;
}

/* A program is host memory of the daemon, charged to the session's quota past the first
 * TTD_SESSION_PROGRAM_ALLOWANCE of its programs while the session holds them: a 4000-node
 * program does not fit a 64 KiB quota and leaves no charge behind; a small one is within the
 * allowance, so the whole quota is left for tensors; bytes_freed counts only tensors. */
START_TEST(test_programs_count_against_the_quota) {
  tt_client *c = connect_with_quota(64 << 10);
  char session[17], msg[1024];
  session_hex(c, session);
  ck_assert_int_eq(compile_chain(session, 4000, msg, sizeof(msg)), TT_RESOURCE_EXHAUSTED);
  ck_assert_msg(strstr(msg, "the program of this graph takes") && strstr(msg, "quota"), "%s", msg);
  ck_assert_int_eq(compile_chain(session, 8, msg, sizeof(msg)), TT_OK);
  int64_t all = (64 << 10) / 4;
  tt_tensor *fits = tt_tensor_empty(c, TT_FLOAT32, &all, 1, "tt");
  ck_assert_msg(fits != NULL, "%s", tt_last_error(c));
  Ttd__V1__CloseSessionRequest req = TTD__V1__CLOSE_SESSION_REQUEST__INIT;
  Ttd__V1__CloseSessionResponse *resp = (Ttd__V1__CloseSessionResponse *)raw_unary(
      proc.target, "/ttd.v1.Device/CloseSession", &req.base, (raw_md){.session = session},
      &ttd__v1__close_session_response__descriptor, 0, NULL);
  ck_assert_uint_eq(resp->bytes_freed, 64 << 10);
  protobuf_c_message_free_unpacked(&resp->base, NULL);
  tt_tensor_free(fits);
  tt_disconnect(c);
}
END_TEST

Suite *e2e_queue_bounds_suite(void) {
  Suite *s = suite_create("e2e_queue_bounds");
  TCase *tc = tcase_create("queue_bounds");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_queued_calls_bounded_per_session);
  tcase_add_test(tc, test_queued_bytes_count_against_the_quota);
  tcase_add_test(tc, test_queued_bytes_are_the_unpacked_request);
  tcase_add_test(tc, test_programs_count_against_the_quota);
  suite_add_tcase(s, tc);
  return s;
}
