/* The bad-input table: a real ttd, started with a tokens file, two devices and its
 * admin listener, gets a table of bad requests to every RPC of ttd.v1.Device: wrong types,
 * zero, negative and overflowing dims, mismatched dtypes, empty and duplicated handle lists,
 * handles of another session, tenant and daemon instance, streams cut mid-message, chunks
 * past a tensor's end, graphs with cycles, self-references and 10^6 nodes, and garbage bytes
 * on its sockets. Each row names the request, the gRPC code it must get and a part of the
 * message that says what to fix; each must be answered within 10 s and leave the device
 * memory as it was. After the whole table the daemon's memory accounting (ListDevices and
 * /metrics) is back to zero, it answered nothing INTERNAL, and it still serves.
 *
 * The count of bad inputs tried is printed as one line ("e2e_bad_inputs: N bad inputs ...");
 * with TTD_BAD_INPUTS_REPORT=FILE every row is listed there too. */
#include <check.h>
#include <grpc/grpc.h>
#include <grpc/status.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/status.h"
#include "graph_builder.h"
#include "raw_rpc.h"
#include "suites.h"
#include "ttd/v1/ttd.pb-c.h"
#include "ttd_harness.h"
#include "bad_inputs.h" /* last: its short macros name requests */

/* The table itself lives in bad_inputs_rows_*.c, its types and macros in bad_inputs.h; here
 * are the daemons it runs against, the runners of its rows and the checks after it. */

uint8_t bad_inputs_zeros[1 << 16];

static const char *const category_names[N_CATEGORIES] = {
    "wrong types", "dims", "dtypes", "handle lists", "foreign handles", "metadata", "streams", "graphs", "options",
    "socket garbage"};

/* Whose handles bad_inputs_foreign_rows use: FX_T, FX_P, FX_RUN for each. */
static const struct {
  const char *whose;
  int t, p, run;
} foreign_owners[] = {
    {"another session's", SIB_T, SIB_P, SIB_RUN},
    {"tenant bob's", BOB_T, BOB_P, BOB_RUN},
    {"daemon B's", DB_T, DB_P, DB_T},
    {"a never-issued", 0, 0, 0}, /* the reference: forged handles */
};
enum { N_OWNERS = sizeof(foreign_owners) / sizeof(foreign_owners[0]) };
#define FORGED 0x0123456789abcdefull

/* The methods of ttd.v1.Device, for the metadata rows every method gets. */
static const struct {
  const char *name;
  int session; /* runs in a session: needs ttd-session */
  int admin;   /* admin tenants only */
} methods[] = {
    {"OpenSession", 0, 0}, {"KeepAlive", 1, 0},  {"CloseSession", 1, 0}, {"ListDevices", 0, 0},    {"Allocate", 1, 0},
    {"Upload", 1, 0},      {"Download", 1, 0},   {"Move", 1, 0},         {"Free", 1, 0},           {"Compile", 1, 0},
    {"Execute", 1, 0},     {"Backward", 1, 0},   {"ReleaseRun", 1, 0},   {"ZeroGrad", 1, 0},       {"OptimizerStep", 1, 0},
    {"ListSessions", 0, 1}, {"KillSession", 0, 1},
    {"OptimizerState", 1, 0},
};
enum { N_METHODS = sizeof(methods) / sizeof(methods[0]) };

/* ---- the fixture: daemon A (tokens, 2 devices, admin) and daemon B (another instance) ---- */

static ttd_proc proc, proc_b;
static int admin_port;
static char tokens_path[128];
static char alice_auth[80], bob_auth[80], ops_auth[80], carol_auth[80], forged_auth[80];
static char session[17], instance[40];             /* alice's */
static char b_session[17], b_instance[40];         /* on daemon B */
static uint64_t slots[N_SLOTS];
static int owner;            /* foreign_owners entry FX_* stand for */
static uint64_t row_run;     /* the RUN made for the current row, 0 if none */
static uint64_t baseline;    /* device bytes the fixture holds */

static raw_md md_for(caller as) {
  switch (as) {
    case AS_ALICE: return (raw_md){.session = session, .instance = instance, .authorization = alice_auth};
    case AS_ALICE_BARE: return (raw_md){.authorization = alice_auth};
    case AS_ADMIN: return (raw_md){.authorization = ops_auth};
    case AS_CAROL_BARE: return (raw_md){.authorization = carol_auth};
    case AS_NOBODY: return (raw_md){0};
    case AS_FORGED_TOKEN: return (raw_md){.session = session, .instance = instance, .authorization = forged_auth};
    case AS_BOB_ON_ALICE: return (raw_md){.session = session, .authorization = bob_auth};
    case AS_OTHER_INSTANCE: return (raw_md){.session = session, .instance = b_instance, .authorization = alice_auth};
    case AS_DAEMON_B_SESSION: return (raw_md){.session = b_session, .authorization = alice_auth};
    case AS_GIVEN: break;
  }
  return (raw_md){0};
}

static void path_of(const char *method, char *out, size_t size) { snprintf(out, size, "/ttd.v1.Device/%s", method); }

/* Calls method with msg as alice (or md) and returns the unpacked response (asserting OK). */
static ProtobufCMessage *call_ok(const char *target, raw_md md, const char *method, const ProtobufCMessage *msg,
                                 const ProtobufCMessageDescriptor *resp_type) {
  char path[64];
  path_of(method, path, sizeof(path));
  return raw_unary(target, path, msg, md, resp_type, 0, NULL);
}

static uint64_t allocate(raw_md md, int dtype, const char *device, int64_t d0, int ndim) {
  Ttd__V1__TensorSpec spec = TTD__V1__TENSOR_SPEC__INIT;
  spec.dtype = dtype;
  spec.n_shape = (size_t)ndim;
  spec.shape = &d0;
  spec.device = (char *)device;
  Ttd__V1__AllocateRequest req = TTD__V1__ALLOCATE_REQUEST__INIT;
  req.spec = &spec;
  Ttd__V1__AllocateResponse *r =
      (Ttd__V1__AllocateResponse *)call_ok(proc.target, md, "Allocate", &req.base, &ttd__v1__allocate_response__descriptor);
  uint64_t h = r->tensor->handle;
  ttd__v1__allocate_response__free_unpacked(r, NULL);
  return h;
}

static uint64_t compile(const char *target, raw_md md, const ProtobufCMessage *req) {
  Ttd__V1__CompileResponse *r =
      (Ttd__V1__CompileResponse *)call_ok(target, md, "Compile", req, &ttd__v1__compile_response__descriptor);
  uint64_t h = r->program;
  ttd__v1__compile_response__free_unpacked(r, NULL);
  return h;
}

/* Runs program on inputs and parameters, keeping the run for backward; outputs come back
 * inline, so the run alone holds device memory. */
static uint64_t kept_run(raw_md md, uint64_t program, uint64_t *inputs, size_t n_inputs, uint64_t *params, size_t n_params) {
  Ttd__V1__ExecuteRequest req = TTD__V1__EXECUTE_REQUEST__INIT;
  req.program = program;
  req.inputs = inputs;
  req.n_inputs = n_inputs;
  req.parameters = params;
  req.n_parameters = n_params;
  req.keep_for_backward = 1;
  req.output_mode = TTD__V1__OUTPUT_MODE__OUTPUT_MODE_INLINE;
  Ttd__V1__ExecuteResponse *r =
      (Ttd__V1__ExecuteResponse *)call_ok(proc.target, md, "Execute", &req.base, &ttd__v1__execute_response__descriptor);
  uint64_t run = r->run;
  ttd__v1__execute_response__free_unpacked(r, NULL);
  return run;
}

static const ProtobufCMessage *const relu_graph =
    COMPILE(INPUTS(VALUE("x", F32, SHAPE(4))), OUTPUTS("y"), NODES(NODE("y", "relu", INS("x"))));

static uint64_t session_id(const char *hex) { return strtoull(hex, NULL, 16); }

static void setup(void) {
  /* One gRPC init for the test: raw calls then skip gRPC's teardown, which can take seconds
   * after a call the daemon cut short (a message past its limit). */
  grpc_init();
  char alice[64], bob[64], ops[64], carol[64], forged[64];
  harness_token(alice, sizeof(alice), alice_auth, sizeof(alice_auth));
  harness_token(bob, sizeof(bob), bob_auth, sizeof(bob_auth));
  harness_token(ops, sizeof(ops), ops_auth, sizeof(ops_auth));
  harness_token(carol, sizeof(carol), carol_auth, sizeof(carol_auth));
  harness_token(forged, sizeof(forged), forged_auth, sizeof(forged_auth)); /* not in the file */
  snprintf(tokens_path, sizeof(tokens_path), "/tmp/ttd-bad-tokens-%d", (int)getpid());
  const char *names[] = {"alice", "bob", "ops", "carol"}, *tokens[] = {alice, bob, ops, carol},
             *opts[] = {"", "", "admin", "quota=1M"};
  harness_write_tokens(tokens_path, names, tokens, opts, 4);
  char admin[32];
  admin_port = harness_free_tcp_port();
  snprintf(admin, sizeof(admin), "127.0.0.1:%d", admin_port);
  const char *args[] = {"--tokens", tokens_path, "--devices", "2", "--dram", "64M", "--l1", "1M", "--admin", admin, NULL};
  ttd_proc_start(&proc, args);
  unlink(tokens_path); /* read at start; nothing reloads it */
  setenv("TTD_TOKEN", ops, 1); /* harness_used_bytes: an admin's sessions */
  const char *args_b[] = {"--devices", "1", NULL};
  ttd_proc_start(&proc_b, args_b);

  memset(slots, 0, sizeof(slots));
  raw_open_session_as(proc.target, alice_auth, session, instance);
  raw_md me = md_for(AS_ALICE);
  slots[T_F32] = allocate(me, F32, NULL, 4, 1);
  slots[T_I32] = allocate(me, I32, NULL, 4, 1);
  slots[T_BF16] = allocate(me, BF16, NULL, 4, 1);
  slots[T_EMPTY] = allocate(me, F32, NULL, 0, 1);
  slots[T_BIG] = allocate(me, F32, NULL, 1 << 20, 1);
  slots[T_B] = allocate(me, F32, NULL, 4, 1);
  slots[T_FREED] = allocate(me, F32, NULL, 4, 1);
  Ttd__V1__FreeRequest fr = TTD__V1__FREE_REQUEST__INIT;
  fr.handles = &slots[T_FREED];
  fr.n_handles = 1;
  protobuf_c_message_free_unpacked(call_ok(proc.target, me, "Free", &fr.base, &ttd__v1__free_response__descriptor), NULL);
  Ttd__V1__TensorSpec spec = TTD__V1__TENSOR_SPEC__INIT;
  Ttd__V1__AllocateRequest ar = TTD__V1__ALLOCATE_REQUEST__INIT;
  ar.spec = &spec;
  spec.dtype = F32;
  spec.n_shape = 2;
  int64_t shapes[3][2] = {{2, 3}, {4, 3}, {2, 4}};
  int which[3] = {T_X, T_W, T_DY};
  for (int i = 0; i < 3; i++) {
    spec.shape = shapes[i];
    Ttd__V1__AllocateResponse *r =
        (Ttd__V1__AllocateResponse *)call_ok(proc.target, me, "Allocate", &ar.base, &ttd__v1__allocate_response__descriptor);
    slots[which[i]] = r->tensor->handle;
    ttd__v1__allocate_response__free_unpacked(r, NULL);
  }
  slots[P_RELU] = compile(proc.target, me, relu_graph);
  slots[P_LIN] = compile(proc.target, me,
                         COMPILE(INPUTS(VALUE("x", F32, SHAPE(2, 3))), PARAMS(VALUE("w", F32, SHAPE(4, 3)), VALUE("b", F32, SHAPE(4))),
                                 OUTPUTS("y"), NODES(NODE("y", "linear", INS("x", "w", "b")))));

  /* alice's other session and bob's: a tensor, a program and a run each. */
  struct { const char *auth; int t, p, run, s; } others[] = {{alice_auth, SIB_T, SIB_P, SIB_RUN, SIB_S},
                                                              {bob_auth, BOB_T, BOB_P, BOB_RUN, BOB_S}};
  for (int i = 0; i < 2; i++) {
    char sess[17], inst[40];
    raw_open_session_as(proc.target, others[i].auth, sess, inst);
    raw_md md = {.session = sess, .authorization = others[i].auth};
    slots[others[i].s] = session_id(sess);
    slots[others[i].t] = allocate(md, F32, NULL, 4, 1);
    slots[others[i].p] = compile(proc.target, md, relu_graph);
    slots[others[i].run] = kept_run(md, slots[others[i].p], &slots[others[i].t], 1, NULL, 0);
  }

  /* Daemon B: a session, a tensor and a program of another instance. */
  raw_open_session(proc_b.target, b_session, b_instance);
  slots[DB_S] = session_id(b_session);
  slots[DB_T] = raw_allocate(proc_b.target, b_session, 4);
  slots[DB_P] = gb_compile_relu(proc_b.target, b_session, 1, 4, 0);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void teardown(void) {
  ck_assert_msg(ttd_proc_alive(&proc), "ttd died; see %s", proc.log_path);
  ck_assert_int_eq(ttd_proc_stop(&proc), 0);
  ck_assert_int_eq(ttd_proc_stop(&proc_b), 0);
  unsetenv("TTD_TOKEN");
  grpc_shutdown();
}

/* ---- running the table ---- */

/* Failures are collected, so that one run shows every row the daemon answers wrongly. */
typedef struct tally {
  int tried, by_category[N_CATEGORIES];
  int failed;
  char failures[16384];
  size_t used;
  FILE *listing; /* TTD_BAD_INPUTS_REPORT */
} tally;

static void wrong(tally *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void wrong(tally *t, const char *fmt, ...) {
  t->failed++;
  size_t room = sizeof(t->failures) - t->used;
  if (room < 2) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(t->failures + t->used, room - 1, fmt, ap);
  va_end(ap);
  t->used += n < 0 ? 0 : (size_t)n < room - 2 ? (size_t)n : room - 2;
  t->failures[t->used++] = '\n';
  t->failures[t->used] = '\0';
}

static void count(tally *t, int category, const char *method, const char *what, int code) {
  t->tried++;
  t->by_category[category]++;
  if (t->listing) fprintf(t->listing, "%-14s %-20s %s\n", method, code < 0 ? "(no answer)" : ttd_code_name(code), what);
}

/* Device bytes in use on every device and location of daemon A: one ListDevices. */
static uint64_t used_total(void) {
  Ttd__V1__ListDevicesRequest req = TTD__V1__LIST_DEVICES_REQUEST__INIT;
  Ttd__V1__ListDevicesResponse *r = (Ttd__V1__ListDevicesResponse *)call_ok(
      proc.target, md_for(AS_ALICE_BARE), "ListDevices", &req.base, &ttd__v1__list_devices_response__descriptor);
  uint64_t used = 0;
  for (size_t d = 0; d < r->n_devices; d++) {
    for (size_t m = 0; m < r->devices[d]->n_memories; m++) used += r->devices[d]->memories[m]->used_bytes;
  }
  ttd__v1__list_devices_response__free_unpacked(r, NULL);
  return used;
}

/* After a row: the daemon lives and holds exactly the fixture's bytes (within wait_ms). */
static void expect_intact(tally *t, const char *label, int wait_ms) {
  if (!ttd_proc_alive(&proc)) {
    wrong(t, "%s: ttd died; see %s", label, proc.log_path);
    ck_abort_msg("%s", t->failures);
  }
  uint64_t used = used_total();
  for (int waited = 0; used != baseline && waited < wait_ms; waited += 20) {
    usleep(20000);
    used = used_total();
  }
  if (used != baseline) {
    wrong(t, "%s: device memory %llu bytes after it, %llu before", label, (unsigned long long)used,
         (unsigned long long)baseline);
    baseline = used; /* report each leak once */
  }
}

/* FX_* as the current owner's; RUN as a fresh run of P_LIN. */
static uint64_t resolve(uint64_t v) {
  if ((v >> 48) != 0x7ad0) return v;
  int slot = (int)(v & 0xffff);
  if (slot == FX_T || slot == FX_P || slot == FX_RUN) {
    int k = slot == FX_T ? foreign_owners[owner].t : slot == FX_P ? foreign_owners[owner].p : foreign_owners[owner].run;
    return k ? slots[k] : FORGED + (uint64_t)(slot - FX_T);
  }
  if (slot == RUN) {
    if (!row_run) {
      uint64_t params[2] = {slots[T_W], slots[T_B]};
      row_run = kept_run(md_for(AS_ALICE), slots[P_LIN], &slots[T_X], 1, params, 2);
    }
    return row_run;
  }
  return slots[slot];
}

/* Replaces placeholders in every fixed64 field of m, nested messages included. */
static void resolve_fields(ProtobufCMessage *m) {
  const ProtobufCMessageDescriptor *d = m->descriptor;
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    char *member = (char *)m + f->offset;
    size_t n = 1;
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
      n = *(size_t *)((char *)m + f->quantifier_offset);
      member = *(char **)member;
    } else if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) && *(uint32_t *)((char *)m + f->quantifier_offset) != f->id) {
      continue;
    }
    for (size_t k = 0; k < n; k++) {
      if (f->type == PROTOBUF_C_TYPE_FIXED64) ((uint64_t *)member)[k] = resolve(((uint64_t *)member)[k]);
      else if (f->type == PROTOBUF_C_TYPE_MESSAGE && ((ProtobufCMessage **)member)[k])
        resolve_fields(((ProtobufCMessage **)member)[k]);
    }
  }
}

/* msg packed with its placeholders resolved; malloc'd. */
static size_t pack_resolved(const ProtobufCMessage *msg, unsigned char **out) {
  size_t len = protobuf_c_message_get_packed_size(msg);
  unsigned char *buf = malloc(len + 1);
  protobuf_c_message_pack(msg, buf);
  ProtobufCMessage *copy = protobuf_c_message_unpack(msg->descriptor, NULL, len, buf);
  ck_assert_ptr_nonnull(copy);
  resolve_fields(copy);
  len = protobuf_c_message_get_packed_size(copy);
  *out = realloc(buf, len + 1);
  protobuf_c_message_pack(copy, *out);
  protobuf_c_message_free_unpacked(copy, NULL);
  return len;
}

/* The row's messages, resolved: msg[], then make()'s or the raw bytes. */
static int row_messages(const bad_row *row, unsigned char **msgs, size_t *lens) {
  int n = 0;
  for (; n < 4 && row->msg[n]; n++) lens[n] = pack_resolved(row->msg[n], &msgs[n]);
  if (row->make) {
    lens[n] = row->make(&msgs[n]);
    n++;
  } else if (row->bytes) {
    msgs[n] = malloc(row->len + 1);
    memcpy(msgs[n], row->bytes, row->len);
    lens[n++] = row->len;
  }
  return n;
}

/* Every 16-hex-digit run of s as X's: messages about different handles compared. */
static void mask_handles(char *s) {
  for (size_t i = 0, run = 0; s[i]; i++) {
    run = strchr("0123456789abcdef", s[i]) ? run + 1 : 0;
    if (run == 16) memset(s + i - 15, 'X', 16), run = 0;
  }
}

/* Sends one row and checks its answer, its time and what it left; fills answer with the
 * message the daemon gave. */
static void run_row(tally *t, const bad_row *row, const char *what, char *answer, size_t answer_size) {
  unsigned char *msgs[5];
  size_t lens[5];
  row_run = 0;
  int n = row_messages(row, msgs, lens);
  char path[64], label[256];
  path_of(row->method, path, sizeof(path));
  snprintf(label, sizeof(label), "%s (%s)", row->method, what);
  raw_result r;
  raw_md md = row->as == AS_GIVEN ? row->md : md_for(row->as);
  double t0 = now_s();
  if (strcmp(row->method, "Upload") == 0) {
    raw_stream(proc.target, path, md, (const void *const *)msgs, lens, n, 0, &r);
  } else {
    raw_call(proc.target, path, md, msgs[0], lens[0], &r);
  }
  double secs = now_s() - t0;
  for (int i = 0; i < n; i++) free(msgs[i]);
  count(t, row->category, row->method, what, row->code);
  if (r.code != row->code) {
    wrong(t, "%s: expected %s, got %s: %s", label, ttd_code_name(row->code), ttd_code_name(r.code), r.details);
  } else if (row->needle && !strstr(r.details, row->needle)) {
    wrong(t, "%s: message '%s' lacks '%s'", label, r.details, row->needle);
  } else if (r.code != 0 && strlen(r.details) < 20) {
    wrong(t, "%s: message '%s' says too little", label, r.details);
  }
  if (secs > 10) wrong(t, "%s: answered after %.1f s", label, secs);
  if (answer) snprintf(answer, answer_size, "%s", r.details);
  raw_result_free(&r);
  if (row_run) { /* the run made for the row, unless the row consumed it */
    char release[64];
    path_of("ReleaseRun", release, sizeof(release));
    Ttd__V1__ReleaseRunRequest rr = TTD__V1__RELEASE_RUN_REQUEST__INIT;
    rr.run = row_run;
    unsigned char buf[32];
    raw_call(proc.target, release, md_for(AS_ALICE), buf, ttd__v1__release_run_request__pack(&rr, buf), &r);
    raw_result_free(&r);
  }
  expect_intact(t, label, 0);
}

/* The hand-written rows, in the order of bad_inputs.h. */
static void run_table(tally *t) {
  const struct {
    const bad_row *rows;
    size_t n;
  } tables[] = {
      {bad_inputs_session_rows, bad_inputs_session_rows_count},
      {bad_inputs_tensor_rows, bad_inputs_tensor_rows_count},
      {bad_inputs_program_rows, bad_inputs_program_rows_count},
      {bad_inputs_admin_rows, bad_inputs_admin_rows_count},
  };
  for (size_t k = 0; k < sizeof(tables) / sizeof(tables[0]); k++) {
    for (size_t i = 0; i < tables[k].n; i++) run_row(t, &tables[k].rows[i], tables[k].rows[i].what, NULL, 0);
  }
}

static void run_foreign(tally *t) {
  for (size_t i = 0; i < bad_inputs_foreign_rows_count; i++) {
    char answers[N_OWNERS][1024];
    for (owner = 0; owner < N_OWNERS; owner++) {
      char what[160];
      snprintf(what, sizeof(what), bad_inputs_foreign_rows[i].what, foreign_owners[owner].whose);
      run_row(t, &bad_inputs_foreign_rows[i], what, answers[owner], sizeof(answers[owner]));
      mask_handles(answers[owner]);
    }
    for (owner = 0; owner + 1 < N_OWNERS; owner++) {
      if (strcmp(answers[owner], answers[N_OWNERS - 1]) != 0) {
        wrong(t, "%s of %s: '%s' differs from a never-issued handle's '%s'", bad_inputs_foreign_rows[i].method,
             foreign_owners[owner].whose, answers[owner], answers[N_OWNERS - 1]);
      }
    }
  }
  owner = 0;
}

/* Who may call what, for every method: tokens, sessions and instances that are wrong. */
static void run_metadata(tally *t) {
  static const struct {
    caller as;
    int session_methods_only;
    int code;
    const char *what, *needle;
  } cases[] = {
      {AS_NOBODY, 0, C(UNAUTHENTICATED), "%s without a token", "needs a token"},
      {AS_FORGED_TOKEN, 0, C(UNAUTHENTICATED), "%s with a token the tokens file does not list", "not valid"},
      {AS_ALICE_BARE, 1, C(INVALID_ARGUMENT), "%s without ttd-session", "needs a session: call OpenSession"},
      {AS_BOB_ON_ALICE, 1, C(NOT_FOUND), "%s by tenant bob in alice's session", "is not open"},
      {AS_OTHER_INSTANCE, 1, C(FAILED_PRECONDITION), "%s naming daemon B's instance", "daemon restarted, tensors are gone"},
      {AS_DAEMON_B_SESSION, 1, C(NOT_FOUND), "%s in daemon B's session", "is not open"},
  };
  for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
    for (int m = 0; m < N_METHODS; m++) {
      if (cases[c].session_methods_only && !methods[m].session) continue;
      char what[160];
      snprintf(what, sizeof(what), cases[c].what, methods[m].name);
      bad_row row = {.category = METADATA, .method = methods[m].name, .as = cases[c].as, .code = cases[c].code,
                     .needle = cases[c].needle, RAW("")};
      run_row(t, &row, what, NULL, 0);
    }
  }
  /* Metadata values malformed rather than wrong. */
  static char long_auth[4200], spaced_auth[96];
  memset(long_auth, 'a', sizeof(long_auth) - 1);
  memcpy(long_auth, "Bearer ", 7);
  snprintf(spaced_auth, sizeof(spaced_auth), "%s ", alice_auth);
  const bad_row odd[] = {
      {METADATA, "KeepAlive", AS_GIVEN, "KeepAlive with an empty ttd-session", C(INVALID_ARGUMENT), "16 hex digits",
       .md = {.session = "", .authorization = alice_auth}},
      {METADATA, "KeepAlive", AS_GIVEN, "KeepAlive with ttd-session '0x00000000000000aa'", C(INVALID_ARGUMENT),
       "16 hex digits", .md = {.session = "0x00000000000000aa", .authorization = alice_auth}},
      {METADATA, "KeepAlive", AS_GIVEN, "KeepAlive with ttd-session ' 00000000000000aa' (a leading space)",
       C(INVALID_ARGUMENT), "16 hex digits", .md = {.session = " 00000000000000aa", .authorization = alice_auth}},
      {METADATA, "ListDevices", AS_GIVEN, "ListDevices with a 4 KiB bearer token", C(UNAUTHENTICATED), "not valid",
       .md = {.authorization = long_auth}},
      {METADATA, "ListDevices", AS_GIVEN, "ListDevices with alice's token and a trailing space", C(UNAUTHENTICATED),
       "not valid", .md = {.authorization = spaced_auth}},
      {METADATA, "ListDevices", AS_GIVEN, "ListDevices with 'Bearer' and no token", C(UNAUTHENTICATED), "Bearer",
       .md = {.authorization = "Bearer"}},
  };
  for (size_t i = 0; i < sizeof(odd) / sizeof(odd[0]); i++) {
    bad_row row = odd[i];
    row.bytes = "";
    run_row(t, &row, row.what, NULL, 0);
  }
  /* Garbage as the request of every method, from a caller it would otherwise serve. */
  for (int m = 0; m < N_METHODS; m++) {
    char what[160], needle[96];
    snprintf(what, sizeof(what), "%s with garbage bytes as its request", methods[m].name);
    snprintf(needle, sizeof(needle), "not a valid ttd.v1.%sRequest", methods[m].name);
    bad_row row = {.category = WRONG_TYPE, .method = methods[m].name,
                   .as = methods[m].admin ? AS_ADMIN : methods[m].session ? AS_ALICE : AS_ALICE_BARE,
                   .code = C(INVALID_ARGUMENT), .needle = needle, RAW("\xff\xff\xff\xff\x0f\x12\x99")};
    run_row(t, &row, what, NULL, 0);
  }
}

/* Calls of method the daemon ended, whatever their code, from /metrics. */
static double calls_ended(const char *method) {
  char *metrics = harness_http(admin_port, "GET", "/metrics"), series[128];
  snprintf(series, sizeof(series), "ttd_rpc_duration_seconds_count{method=\"%s\"}", method);
  double n = harness_metric(metrics, series);
  free(metrics);
  return n < 0 ? 0 : n;
}

/* Streams cut short: no answer comes, the daemon ends the call, and whatever the call began
 * is undone. */
static void run_cuts(tally *t) {
  for (size_t i = 0; i < bad_inputs_cut_rows_count; i++) {
    const cut_row *row = &bad_inputs_cut_rows[i];
    unsigned char *msgs[3];
    size_t lens[3];
    int n = 0;
    for (; n < 3 && row->msg[n]; n++) lens[n] = pack_resolved(row->msg[n], &msgs[n]);
    char path[64];
    path_of(row->method, path, sizeof(path));
    double ended = calls_ended(row->method);
    if (row->how == CUT_KILL) {
      pid_t pid = fork();
      ck_assert_int_ge(pid, 0);
      if (pid == 0) {
        raw_result r;
        raw_stream(proc.target, path, md_for(AS_ALICE), (const void *const *)msgs, lens, n, 1, &r);
        _exit(3); /* not reached: raw_stream killed the process */
      }
      int status;
      ck_assert_int_eq(waitpid(pid, &status, 0), pid);
      if (!WIFSIGNALED(status)) wrong(t, "%s: the client was not killed (status %d)", row->what, status);
    } else {
      raw_h2_cut(proc.target, path, md_for(AS_ALICE), (const void *const *)msgs, lens, n, row->keep);
    }
    for (int k = 0; k < n; k++) free(msgs[k]);
    count(t, STREAMS, row->method, row->what, -1);
    for (int waited = 0; row->seen && calls_ended(row->method) <= ended; waited += 20) {
      if (waited >= 3000) {
        wrong(t, "%s: the daemon did not end the call within 3 s", row->what);
        break;
      }
      usleep(20000);
    }
    expect_intact(t, row->what, 3000);
  }
}

/* Garbage on the sockets: the daemon drops the connection and goes on serving. */
static int run_sockets(tally *t) {
  int held = -1;
  for (size_t i = 0; i < bad_inputs_socket_rows_count; i++) {
    const socket_row *row = &bad_inputs_socket_rows[i];
    char path[sizeof(proc.target) + 8];
    snprintf(path, sizeof(path), "%.90s%s", proc.target + 5, row->side ? ".shm" : "");
    int fd = harness_unix_connect(path, row->side ? SOCK_SEQPACKET : SOCK_STREAM);
    size_t len = row->len + row->random;
    unsigned char *buf = malloc(len + 1);
    if (row->len) memcpy(buf, row->bytes, row->len);
    harness_fill_random(buf + row->len, row->random, i + 1);
    /* The daemon may close on the first bad byte: a short write is fine. */
    for (size_t at = 0; at < len;) {
      ssize_t w = send(fd, buf + at, len - at, MSG_NOSIGNAL);
      if (w <= 0) break;
      at += (size_t)w;
    }
    free(buf);
    if (row->keep_open) held = fd;
    else close(fd);
    count(t, SOCKETS, row->side ? "(shm socket)" : "(socket)", row->what, -1);
    expect_intact(t, row->what, 0); /* a ListDevices: still serving */
  }
  return held;
}

/* Inline tensors of zeros for specs (inputs of a compiled program, or its outputs as
 * gradients, float32); the arrays live in the caller and hold 4. */
static void zero_inlines(Ttd__V1__ValueSpec **specs, size_t n, int as_grads, Ttd__V1__InlineTensor *wire,
                         Ttd__V1__TensorSpec *spec, Ttd__V1__InlineTensor **list) {
  ck_assert_uint_le(n, 4);
  for (size_t i = 0; i < n; i++) {
    ttd__v1__inline_tensor__init(&wire[i]);
    ttd__v1__tensor_spec__init(&spec[i]);
    spec[i].dtype = as_grads ? F32 : specs[i]->dtype;
    spec[i].n_shape = specs[i]->n_shape;
    spec[i].shape = specs[i]->shape;
    uint64_t numel = 1;
    for (size_t d = 0; d < specs[i]->n_shape; d++) numel *= (uint64_t)specs[i]->shape[d];
    ck_assert_uint_le(numel * 4, sizeof(bad_inputs_zeros));
    wire[i].spec = &spec[i];
    wire[i].data.data = bad_inputs_zeros;
    wire[i].data.len = numel * 4;
    list[i] = &wire[i];
  }
}

/* Calls method with msg as alice; r holds the answer, and a code other than want is reported
 * as what answered wrongly. Returns the response unpacked as resp_type when OK, else NULL. */
static ProtobufCMessage *zero_call(tally *t, const char *what, const char *method, const ProtobufCMessage *msg,
                                  const ProtobufCMessageDescriptor *resp_type, int want, const char *needle) {
  char path[64];
  path_of(method, path, sizeof(path));
  unsigned char *buf;
  size_t len = pack_resolved(msg, &buf);
  raw_result r;
  raw_call(proc.target, path, md_for(AS_ALICE), buf, len, &r);
  free(buf);
  if (r.code != want || (needle && !strstr(r.details, needle))) {
    wrong(t, "zero dims, %s: %s answered %s '%s'", what, method, ttd_code_name(r.code), r.details);
  }
  ProtobufCMessage *resp = r.code == 0 && resp_type ? protobuf_c_message_unpack(resp_type, NULL, r.body_len, r.body) : NULL;
  raw_result_free(&r);
  return resp;
}

/* Zero dims through every op: compile, execute inline, and differentiate. */
static void run_zero_dims(tally *t) {
  for (size_t i = 0; i < bad_inputs_zero_rows_count; i++) {
    const zero_row *row = &bad_inputs_zero_rows[i];
    count(t, DIMS, "Compile+Execute", row->what, row->code);
    Ttd__V1__CompileResponse *c = (Ttd__V1__CompileResponse *)zero_call(
        t, row->what, "Compile", row->compile, &ttd__v1__compile_response__descriptor, row->code, row->needle);
    Ttd__V1__ExecuteResponse *er = NULL;
    Ttd__V1__InlineTensor wire[4], *list[4];
    Ttd__V1__TensorSpec spec[4];
    if (c) {
      zero_inlines(c->inputs, c->n_inputs, 0, wire, spec, list);
      Ttd__V1__ExecuteRequest ex = TTD__V1__EXECUTE_REQUEST__INIT;
      ex.program = c->program;
      ex.inline_inputs = list;
      ex.n_inline_inputs = c->n_inputs;
      ex.output_mode = TTD__V1__OUTPUT_MODE__OUTPUT_MODE_INLINE;
      ex.keep_for_backward = row->backward;
      er = (Ttd__V1__ExecuteResponse *)zero_call(t, row->what, "Execute", &ex.base,
                                                 &ttd__v1__execute_response__descriptor, 0, NULL);
    }
    if (er && row->backward) {
      zero_inlines(c->outputs, c->n_outputs, 1, wire, spec, list);
      Ttd__V1__BackwardRequest bw = TTD__V1__BACKWARD_REQUEST__INIT;
      bw.run = er->run;
      bw.inline_output_grads = list;
      bw.n_inline_output_grads = c->n_outputs;
      zero_call(t, row->what, "Backward", &bw.base, NULL, 0, NULL);
    }
    if (er) ttd__v1__execute_response__free_unpacked(er, NULL);
    if (c) ttd__v1__compile_response__free_unpacked(c, NULL);
    expect_intact(t, row->what, 0);
  }
}

/* ---- the test ---- */

/* After the table: every session closed, every byte back, no call answered INTERNAL or
 * UNKNOWN, and the daemon still serves a round trip. */
static void expect_all_returned(void) {
  const char *sessions[] = {session, NULL, NULL};
  char sib[17], bob[17];
  snprintf(sib, sizeof(sib), "%016llx", (unsigned long long)slots[SIB_S]);
  snprintf(bob, sizeof(bob), "%016llx", (unsigned long long)slots[BOB_S]);
  sessions[1] = sib;
  sessions[2] = bob;
  const char *auths[] = {alice_auth, alice_auth, bob_auth};
  for (int i = 0; i < 3; i++) {
    Ttd__V1__CloseSessionRequest req = TTD__V1__CLOSE_SESSION_REQUEST__INIT;
    protobuf_c_message_free_unpacked(call_ok(proc.target, (raw_md){.session = sessions[i], .authorization = auths[i]},
                                             "CloseSession", &req.base, &ttd__v1__close_session_response__descriptor),
                                     NULL);
  }
  for (int device = 0; device < 2; device++) {
    for (int l1 = 0; l1 < 2; l1++) {
      ck_assert_msg(harness_wait_used_bytes(&proc, device, l1, 0, 2000) == 0, "tt:%d %s not back to 0", device,
                    l1 ? "l1" : "dram");
    }
  }
  char *metrics = harness_http(admin_port, "GET", "/metrics");
  const char *gauges[] = {
      "ttd_device_memory_used_bytes{device=\"tt:0\",location=\"dram\"}", "ttd_device_memory_used_bytes{device=\"tt:0\",location=\"l1\"}",
      "ttd_device_memory_used_bytes{device=\"tt:1\",location=\"dram\"}", "ttd_device_memory_used_bytes{device=\"tt:1\",location=\"l1\"}",
      "ttd_sessions", "ttd_tensors", "ttd_rpc_in_flight", "ttd_device_queue_depth{device=\"tt:0\"}"};
  for (size_t i = 0; i < sizeof(gauges) / sizeof(gauges[0]); i++) {
    ck_assert_msg(harness_metric(metrics, gauges[i]) == 0, "/metrics: %s is %g", gauges[i], harness_metric(metrics, gauges[i]));
  }
  ck_assert_msg(!strstr(metrics, "code=\"INTERNAL\"") && !strstr(metrics, "code=\"UNKNOWN\""),
                "some call was answered INTERNAL or UNKNOWN:\n%s", metrics);
  free(metrics);
  /* Still serves: a fresh session's round trip. */
  char s2[17], i2[40];
  raw_open_session_as(proc.target, alice_auth, s2, i2);
  raw_md md = {.session = s2, .instance = i2, .authorization = alice_auth};
  float v[4] = {1.5f, -2, 3, 4}, back[4];
  uint64_t h = raw_upload(proc.target, md, v, F32, 1, 4, 0, NULL);
  raw_download(proc.target, md, h, back, 4);
  ck_assert_int_eq(memcmp(v, back, sizeof(v)), 0);
  Ttd__V1__CloseSessionRequest req = TTD__V1__CLOSE_SESSION_REQUEST__INIT;
  protobuf_c_message_free_unpacked(call_ok(proc.target, md, "CloseSession", &req.base, &ttd__v1__close_session_response__descriptor),
                                   NULL);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 0);
}

/* Every row of the table gets its code and message in time and leaves the device memory as
 * it was; afterwards everything is returned and the daemon serves. */
START_TEST(test_bad_input_table) {
  static tally table;
  tally *t = &table;
  memset(t, 0, sizeof(*t));
  const char *listing = getenv("TTD_BAD_INPUTS_REPORT");
  if (listing) t->listing = fopen(listing, "w");
  baseline = used_total();
  run_table(t);
  run_foreign(t);
  run_metadata(t);
  run_zero_dims(t);
  run_cuts(t);
  int held = run_sockets(t);
  expect_intact(t, "the whole table", 0);
  if (held >= 0) close(held);
  char summary[512];
  int at = snprintf(summary, sizeof(summary), "e2e_bad_inputs: %d bad inputs tried on %d RPCs and 2 sockets (", t->tried,
                    (int)N_METHODS);
  for (int c = 0; c < N_CATEGORIES; c++) {
    at += snprintf(summary + at, sizeof(summary) - (size_t)at, "%s%s %d", c ? ", " : "", category_names[c], t->by_category[c]);
  }
  snprintf(summary + at, sizeof(summary) - (size_t)at, "); %d answered wrongly", t->failed);
  printf("%s\n", summary);
  fflush(stdout);
  if (t->listing) {
    fprintf(t->listing, "%s\n", summary);
    fclose(t->listing);
  }
  ck_assert_msg(t->failed == 0, "%d rows answered wrongly:\n%s", t->failed, t->failures);
  expect_all_returned();
}
END_TEST

Suite *e2e_bad_inputs_suite(void) {
  Suite *s = suite_create("e2e_bad_inputs");
  TCase *tc = tcase_create("bad_inputs");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_bad_input_table);
  suite_add_tcase(s, tc);
  return s;
}
