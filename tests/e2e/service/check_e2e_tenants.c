/* Tenants through a real ttd started with --tokens and --quota: tokens right, wrong and
 * missing; one tenant trying another's session and handles; the admin RPCs; quota edges
 * (uploads, allocations and program activations all count); and a SIGHUP reload of tokens
 * and quotas that keeps sessions. */
#include <check.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "wire/shm_protocol.h"
#include "wire/tokens.h"
#include "raw_rpc.h"
#include "suites.h"
#include "ttd/v1/ttd.pb-c.h"
#include "ttd_harness.h"

static ttd_proc proc;
static char tokens_path[128];
static char alice[64], bob[64], ops[64], carol[64];
static char alice_auth[80], bob_auth[80], ops_auth[80];

static void setup(void) {
  snprintf(tokens_path, sizeof(tokens_path), "/tmp/ttd-tokens-%d", (int)getpid());
  harness_token(alice, sizeof(alice), alice_auth, sizeof(alice_auth));
  harness_token(bob, sizeof(bob), bob_auth, sizeof(bob_auth));
  harness_token(ops, sizeof(ops), ops_auth, sizeof(ops_auth));
  ttd_token_generate(carol, sizeof(carol));
  const char *names[] = {"alice", "bob", "ops"};
  const char *toks[] = {alice, bob, ops};
  const char *opts[] = {"quota=512K", "max_sessions=3", "admin"};
  harness_write_tokens(tokens_path, names, toks, opts, 3);
  const char *args[] = {"--tokens", tokens_path, "--quota", "1M", "--dram", "8M", "--max-sessions", "5", NULL};
  ttd_proc_start(&proc, args);
  setenv("TTD_TOKEN", ops, 1); /* the harness's own sessions (memory checks) are the admin's */
}

static void teardown(void) {
  ck_assert_msg(ttd_proc_alive(&proc), "ttd died; see %s", proc.log_path);
  ck_assert_uint_eq(harness_wait_used_bytes(&proc, 0, 0, 0, 2000), 0);
  ck_assert_int_eq(ttd_proc_stop(&proc), 0);
  unsetenv("TTD_TOKEN");
  unlink(tokens_path);
}

static tt_status connect_as(const char *token, uint64_t quota, tt_client **out) {
  tt_connect_options o;
  tt_connect_options_init(&o);
  o.token = token;
  o.quota_bytes = quota;
  o.disable_keepalive = 1;
  return tt_connect(proc.target, &o, out);
}

static tt_client *must_connect(const char *token, uint64_t quota) {
  tt_client *c = NULL;
  tt_status st = connect_as(token, quota, &c);
  ck_assert_msg(st == TT_OK, "%s: %s", tt_status_name(st), tt_last_error(c));
  return c;
}

static tt_tensor *upload_bytes(tt_client *c, int64_t floats) {
  float *data = calloc((size_t)floats, sizeof(float));
  for (int64_t i = 0; i < floats; i++) data[i] = (float)i;
  tt_tensor *h = tt_tensor_from_host(c, data, TT_FLOAT32, &floats, 1);
  free(data);
  tt_tensor *d = tt_to(h, "tt");
  tt_tensor_free(h);
  return d;
}

/* Downloads t, which upload_bytes made of `floats` floats, and checks its last one. */
static void expect_uploaded(tt_tensor *t, int64_t floats) {
  tt_tensor *back = tt_to(t, "cpu");
  ck_assert_ptr_nonnull(back);
  ck_assert_float_eq(((float *)tt_tensor_data(back))[floats - 1], (float)(floats - 1));
  tt_tensor_free(back);
}

START_TEST(test_tokens_right_wrong_missing) {
  tt_client *c = must_connect(alice, 0);
  ck_assert_str_eq(tt_session_tenant(c), "alice");
  tt_disconnect(c);

  unsetenv("TTD_TOKEN");
  c = NULL;
  ck_assert_int_eq(connect_as(NULL, 0, &c), TT_UNAUTHENTICATED);
  ck_assert_ptr_nonnull(strstr(tt_last_error(c), "needs a token"));
  ck_assert_ptr_nonnull(strstr(tt_last_error(c), "TTD_TOKEN"));
  tt_disconnect(c);

  char forged[64];
  ttd_token_generate(forged, sizeof(forged));
  ck_assert_int_eq(connect_as(forged, 0, &c), TT_UNAUTHENTICATED);
  ck_assert_ptr_nonnull(strstr(tt_last_error(c), "not valid"));
  tt_disconnect(c);
  /* A token one character short of alice's is just as wrong. */
  char cut[64];
  snprintf(cut, sizeof(cut), "%.*s", (int)strlen(alice) - 1, alice);
  ck_assert_int_eq(connect_as(cut, 0, &c), TT_UNAUTHENTICATED);
  tt_disconnect(c);

  /* TTD_TOKEN is read when no token is given. */
  setenv("TTD_TOKEN", bob, 1);
  c = must_connect(NULL, 0);
  ck_assert_str_eq(tt_session_tenant(c), "bob");
  tt_disconnect(c);
  setenv("TTD_TOKEN", ops, 1);

  /* On the wire: every method needs it, sessionless ones included, and only Bearer counts. */
  Ttd__V1__ListDevicesRequest req = TTD__V1__LIST_DEVICES_REQUEST__INIT;
  raw_expect(proc.target, "/ttd.v1.Device/ListDevices", &req.base, (raw_md){0}, 16, "needs a token");
  raw_expect(proc.target, "/ttd.v1.Device/ListDevices", &req.base, (raw_md){.authorization = "Basic YWxpY2U6eA=="}, 16,
             "Bearer");
  raw_expect(proc.target, "/ttd.v1.Device/ListDevices", &req.base, (raw_md){.authorization = "Bearer "}, 16,
             "not valid");
  raw_expect(proc.target, "/ttd.v1.Device/ListDevices", &req.base, (raw_md){.authorization = alice_auth}, 0, NULL);
  /* The scheme is case-insensitive, as HTTP's is. */
  char lower[80];
  snprintf(lower, sizeof(lower), "bearer %s", alice);
  raw_expect(proc.target, "/ttd.v1.Device/ListDevices", &req.base, (raw_md){.authorization = lower}, 0, NULL);
}
END_TEST

/* bob cannot see alice's session or tensors: her session id and her handles get the very
 * answers a never-issued id and handle get. */
START_TEST(test_tenant_isolation) {
  tt_client *a = must_connect(alice, 0);
  tt_tensor *t = upload_bytes(a, 1000);
  ck_assert_ptr_nonnull(t);
  char alice_session[17];
  snprintf(alice_session, sizeof(alice_session), "%016llx", (unsigned long long)tt_session_id(a));

  Ttd__V1__KeepAliveRequest ka = TTD__V1__KEEP_ALIVE_REQUEST__INIT;
  raw_result theirs, nobody;
  uint8_t buf[16];
  size_t len = protobuf_c_message_pack(&ka.base, buf);
  raw_call(proc.target, "/ttd.v1.Device/KeepAlive", (raw_md){.session = alice_session, .authorization = bob_auth}, buf,
           len, &theirs);
  raw_call(proc.target, "/ttd.v1.Device/KeepAlive", (raw_md){.session = "00000000000000aa", .authorization = bob_auth},
           buf, len, &nobody);
  ck_assert_int_eq(theirs.code, 5);
  ck_assert_int_eq(nobody.code, 5);
  /* Same text apart from the id itself. */
  ck_assert_str_eq(strstr(theirs.details, " is not open"), strstr(nobody.details, " is not open"));
  raw_result_free(&theirs);
  raw_result_free(&nobody);
  /* alice herself, on the wire, reaches her session. */
  raw_expect(proc.target, "/ttd.v1.Device/KeepAlive", &ka.base,
             (raw_md){.session = alice_session, .authorization = alice_auth}, 0, NULL);

  /* bob's own session, alice's tensor handle: NOT_FOUND like any unknown handle. */
  tt_client *b = must_connect(bob, 0);
  char bob_session[17];
  snprintf(bob_session, sizeof(bob_session), "%016llx", (unsigned long long)tt_session_id(b));
  uint64_t handle = tt_tensor_handle(t);
  Ttd__V1__FreeRequest fr = TTD__V1__FREE_REQUEST__INIT;
  fr.n_handles = 1;
  fr.handles = &handle;
  raw_expect(proc.target, "/ttd.v1.Device/Free", &fr.base, (raw_md){.session = bob_session, .authorization = bob_auth},
             5, "not found in this session");
  /* ... and bob cannot list or kill sessions. */
  Ttd__V1__ListSessionsRequest ls = TTD__V1__LIST_SESSIONS_REQUEST__INIT;
  raw_expect(proc.target, "/ttd.v1.Device/ListSessions", &ls.base, (raw_md){.authorization = bob_auth}, 7,
             "tenant bob is not one");
  Ttd__V1__KillSessionRequest ks = TTD__V1__KILL_SESSION_REQUEST__INIT;
  ks.session_id = tt_session_id(a);
  raw_expect(proc.target, "/ttd.v1.Device/KillSession", &ks.base, (raw_md){.authorization = bob_auth}, 7,
             "for administrators");

  /* alice's tensor is untouched. */
  expect_uploaded(t, 1000);
  tt_tensor_free(t);
  tt_disconnect(b);
  tt_disconnect(a);
}
END_TEST

static Ttd__V1__ListSessionsResponse *list_sessions(void) {
  Ttd__V1__ListSessionsRequest ls = TTD__V1__LIST_SESSIONS_REQUEST__INIT;
  uint8_t buf[8];
  raw_result r;
  raw_call(proc.target, "/ttd.v1.Device/ListSessions", (raw_md){.authorization = ops_auth}, buf,
           protobuf_c_message_pack(&ls.base, buf), &r);
  ck_assert_msg(r.code == 0, "ListSessions: %d %s", r.code, r.details);
  Ttd__V1__ListSessionsResponse *resp = ttd__v1__list_sessions_response__unpack(NULL, r.body_len, r.body);
  raw_result_free(&r);
  ck_assert_ptr_nonnull(resp);
  return resp;
}

static const Ttd__V1__SessionInfo *find_session(const Ttd__V1__ListSessionsResponse *l, uint64_t id) {
  for (size_t i = 0; i < l->n_sessions; i++) {
    if (l->sessions[i]->session_id == id) return l->sessions[i];
  }
  return NULL;
}

/* The admin tenant lists every tenant's sessions with their memory, and kills one: its
 * memory returns at once and its owner's next call is told it was killed, and by whom;
 * another tenant naming it learns nothing of that. */
START_TEST(test_admin_list_and_kill) {
  tt_client *a = must_connect(alice, 0);
  tt_client *b = must_connect(bob, 0);
  tt_tensor *t = upload_bytes(a, 25000); /* 100000 bytes */
  ck_assert_ptr_nonnull(t);
  Ttd__V1__ListSessionsResponse *l = list_sessions();
  const Ttd__V1__SessionInfo *sa = find_session(l, tt_session_id(a));
  const Ttd__V1__SessionInfo *sb = find_session(l, tt_session_id(b));
  ck_assert_ptr_nonnull(sa);
  ck_assert_ptr_nonnull(sb);
  ck_assert_str_eq(sa->tenant, "alice");
  ck_assert_str_eq(sb->tenant, "bob");
  ck_assert_uint_eq(sa->tensors, 1);
  ck_assert_uint_eq(sa->used_bytes, 100000);
  ck_assert_uint_eq(sa->quota_bytes, 512 * 1024);
  ck_assert_uint_eq(sb->used_bytes, 0);
  ck_assert_uint_eq(sb->quota_bytes, 1024 * 1024);
  char peer[64]; /* the gate read this process's credentials at accept */
  snprintf(peer, sizeof(peer), "unix:uid=%u,pid=%d", (unsigned)geteuid(), (int)getpid());
  ck_assert_str_eq(sa->peer, peer);
  ttd__v1__list_sessions_response__free_unpacked(l, NULL);

  Ttd__V1__KillSessionRequest ks = TTD__V1__KILL_SESSION_REQUEST__INIT;
  ks.session_id = tt_session_id(a);
  uint8_t buf[16];
  raw_result r;
  raw_call(proc.target, "/ttd.v1.Device/KillSession", (raw_md){.authorization = ops_auth}, buf,
           protobuf_c_message_pack(&ks.base, buf), &r);
  ck_assert_int_eq(r.code, 0);
  Ttd__V1__KillSessionResponse *kr = ttd__v1__kill_session_response__unpack(NULL, r.body_len, r.body);
  ck_assert_uint_eq(kr->tensors_freed, 1);
  ck_assert_uint_eq(kr->bytes_freed, 100000);
  ttd__v1__kill_session_response__free_unpacked(kr, NULL);
  raw_result_free(&r);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 0);
  /* Killing it again, or a session that never was: NOT_FOUND. */
  raw_expect(proc.target, "/ttd.v1.Device/KillSession", &ks.base, (raw_md){.authorization = ops_auth}, 5, "is not open");

  tt_tensor *back = tt_to(t, "cpu");
  ck_assert_ptr_null(back);
  ck_assert_int_eq(tt_errcode(a), TT_NOT_FOUND);
  ck_assert_msg(strstr(tt_last_error(a), "was killed by admin tenant 'ops' (ttctl kill)"), "%s", tt_last_error(a));
  char victim[17];
  snprintf(victim, sizeof(victim), "%016" PRIx64, tt_session_id(a));
  Ttd__V1__KeepAliveRequest ka = TTD__V1__KEEP_ALIVE_REQUEST__INIT;
  raw_result as_bob;
  raw_call(proc.target, "/ttd.v1.Device/KeepAlive", (raw_md){.session = victim, .authorization = bob_auth}, buf,
           protobuf_c_message_pack(&ka.base, buf), &as_bob);
  ck_assert_int_eq(as_bob.code, 5);
  ck_assert_msg(!strstr(as_bob.details, "killed"), "%s", as_bob.details);
  raw_result_free(&as_bob);
  l = list_sessions();
  ck_assert_ptr_null(find_session(l, tt_session_id(a)));
  ck_assert_ptr_nonnull(find_session(l, tt_session_id(b)));
  ttd__v1__list_sessions_response__free_unpacked(l, NULL);
  tt_tensor_free(t);
  tt_disconnect(a);
  tt_disconnect(b);
}
END_TEST

/* Quota edges: exactly the quota fits, one more element does not, and the message names
 * quota, used and requested; freeing makes room again; a session may ask for less but not
 * for more than its tenant's limit or --quota. */
START_TEST(test_quota_edges) {
  tt_client *a = must_connect(alice, 0);
  ck_assert_uint_eq(tt_session_quota(a), 512 * 1024); /* tenant limit below --quota 1M */
  int64_t half = 64 * 1024;                          /* 256 KiB of float32 */
  tt_tensor *t1 = tt_tensor_empty(a, TT_FLOAT32, &half, 1, "tt");
  tt_tensor *t2 = tt_tensor_empty(a, TT_FLOAT32, &half, 1, "tt");
  ck_assert_ptr_nonnull(t1);
  ck_assert_ptr_nonnull(t2);
  int64_t one = 1;
  tt_tensor *t3 = tt_tensor_empty(a, TT_FLOAT32, &one, 1, "tt");
  ck_assert_ptr_null(t3);
  ck_assert_int_eq(tt_errcode(a), TT_RESOURCE_EXHAUSTED);
  const char *msg = tt_last_error(a);
  ck_assert_msg(strstr(msg, "quota 512 KiB (524288 bytes)") && strstr(msg, "used 512 KiB (524288 bytes)") &&
                    strstr(msg, "requested 4 B (4 bytes)"),
                "%s", msg);
  /* An upload is refused the same way, before any byte is sent to the device. */
  ck_assert_ptr_null(upload_bytes(a, 10));
  ck_assert_int_eq(tt_errcode(a), TT_RESOURCE_EXHAUSTED);
  tt_tensor_free(t2);
  t3 = tt_tensor_empty(a, TT_FLOAT32, &one, 1, "tt");
  ck_assert_ptr_nonnull(t3);
  tt_tensor_free(t3);
  tt_tensor_free(t1);
  tt_disconnect(a);

  /* Asking: less is granted, more than the tenant's limit is refused naming it. */
  a = must_connect(alice, 100000);
  ck_assert_uint_eq(tt_session_quota(a), 100000);
  tt_disconnect(a);
  a = NULL;
  ck_assert_int_eq(connect_as(alice, 600 * 1024, &a), TT_RESOURCE_EXHAUSTED);
  ck_assert_msg(strstr(tt_last_error(a), "at most 512 KiB") && strstr(tt_last_error(a), "tenant's limit"), "%s",
                tt_last_error(a));
  tt_disconnect(a);
  /* bob has no limit of his own: --quota 1M caps him. */
  tt_client *b = must_connect(bob, 0);
  ck_assert_uint_eq(tt_session_quota(b), 1024 * 1024);
  tt_disconnect(b);
  b = NULL;
  ck_assert_int_eq(connect_as(bob, 2 * 1024 * 1024, &b), TT_RESOURCE_EXHAUSTED);
  ck_assert_ptr_nonnull(strstr(tt_last_error(b), "--quota"));
  tt_disconnect(b);
}
END_TEST

/* A program's activations count too: a forward whose intermediates overflow the quota
 * fails RESOURCE_EXHAUSTED and leaves exactly the parameters behind. */
/* A tenant's quota= bounds the sum over its sessions: alice (512K) holds 300000 bytes in one
 * session, so 300000 more in another is refused naming her quota, while 200000 fit; a
 * session's own smaller ask still bounds that session; freeing makes room. */
START_TEST(test_tenant_quota_sums_sessions) {
  tt_client *a1 = must_connect(alice, 0), *a2 = must_connect(alice, 0), *small = must_connect(alice, 64 * 1024);
  tt_tensor *held = upload_bytes(a1, 75000);
  ck_assert_ptr_nonnull(held);
  ck_assert_ptr_null(upload_bytes(a2, 75000));
  ck_assert_int_eq(tt_errcode(a2), TT_RESOURCE_EXHAUSTED);
  ck_assert_msg(strstr(tt_last_error(a2), "tenant alice's memory quota exceeded: quota 512 KiB (524288 bytes) over "
                                          "all its sessions, used 293 KiB (300000 bytes)"),
                "%s", tt_last_error(a2));
  tt_tensor *fits = upload_bytes(a2, 50000);
  ck_assert_ptr_nonnull(fits);
  ck_assert_ptr_null(upload_bytes(small, 20000)); /* 80000 bytes: past its own 64 KiB */
  ck_assert_ptr_nonnull(strstr(tt_last_error(small), "session memory quota exceeded: quota 64.0 KiB"));
  tt_tensor_free(held);
  tt_tensor *after = upload_bytes(a2, 75000); /* room again */
  ck_assert_ptr_nonnull(after);
  tt_tensor_free(after);
  tt_tensor_free(fits);
  tt_disconnect(a1);
  tt_disconnect(a2);
  tt_disconnect(small);
}
END_TEST

/* Sessions a tenant may hold at once: bob's max_sessions=3 from the tokens file, alice's the
 * daemon's --max-sessions 5; one more is RESOURCE_EXHAUSTED naming the limit, and closing
 * one makes room. */
START_TEST(test_sessions_per_tenant) {
  tt_client *b[3], *a[5], *extra = NULL;
  for (int i = 0; i < 3; i++) b[i] = must_connect(bob, 0);
  ck_assert_int_eq(connect_as(bob, 0, &extra), TT_RESOURCE_EXHAUSTED);
  ck_assert_ptr_nonnull(strstr(tt_last_error(extra), "tenant bob holds 3 open sessions, its limit"));
  tt_disconnect(extra);
  for (int i = 0; i < 5; i++) a[i] = must_connect(alice, 0); /* bob's sessions do not count */
  ck_assert_int_eq(connect_as(alice, 0, &extra), TT_RESOURCE_EXHAUSTED);
  tt_disconnect(extra);
  tt_disconnect(b[0]);
  b[0] = must_connect(bob, 0);
  for (int i = 0; i < 3; i++) tt_disconnect(b[i]);
  for (int i = 0; i < 5; i++) tt_disconnect(a[i]);
}
END_TEST

START_TEST(test_quota_counts_activations) {
  tt_client *a = must_connect(alice, 0);
  tt_graph *g = tt_graph_create(a, 1);
  int64_t shape[2] = {512, 64};
  tt_value x = tt_graph_input(g, "x", TT_FLOAT32, shape, 2);
  tt_value h = tt_nn_linear(g, x, 128, 1); /* 512x128 floats = 256 KiB */
  h = tt_relu(g, h);                        /* another 256 KiB */
  tt_graph_output(g, h);
  tt_module *m = tt_compile(a, g);
  tt_graph_free(g);
  ck_assert_ptr_nonnull(m);
  ck_assert_int_eq(tt_module_to(m, "tt"), TT_OK);
  uint64_t params = (64 * 128 + 128) * 4;
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), params);
  float *data = calloc(512 * 64, sizeof(float));
  tt_tensor *xh = tt_tensor_from_host(a, data, TT_FLOAT32, shape, 2);
  free(data);
  tt_tensor *xd = tt_to(xh, "tt");
  ck_assert_ptr_nonnull(xd);
  tt_tensor *out = NULL;
  ck_assert_int_eq(tt_forward(m, &xd, 1, &out), TT_RESOURCE_EXHAUSTED);
  ck_assert_ptr_nonnull(strstr(tt_last_error(a), "session memory quota exceeded"));
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), params + 512 * 64 * 4);
  tt_tensor_free(xd);
  tt_tensor_free(xh);
  tt_module_free(m);
  tt_disconnect(a);
}
END_TEST

static int log_contains(const char *needle) {
  FILE *f = fopen(proc.log_path, "r");
  if (!f) return 0;
  char line[1024];
  int found = 0;
  while (!found && fgets(line, sizeof(line), f)) found = strstr(line, needle) != NULL;
  fclose(f);
  return found;
}

static void hup_and_wait(const char *needle) {
  kill(proc.pid, SIGHUP);
  for (int i = 0; i < 500 && !log_contains(needle); i++) {
    struct timespec ts = {0, 10000000};
    nanosleep(&ts, NULL);
  }
  ck_assert_msg(log_contains(needle), "no '%s' in %s", needle, proc.log_path);
}

/* SIGHUP reloads tokens and quotas: a removed tenant is refused, a new one admitted, a
 * lowered limit applies to open sessions (what they hold stays), and a broken file, or one
 * others may write, keeps the previous settings. */
START_TEST(test_sighup_reload) {
  tt_client *a = must_connect(alice, 0);
  tt_client *b = must_connect(bob, 0);
  tt_tensor *kept = upload_bytes(a, 50000); /* 200000 bytes, within 512 KiB */
  ck_assert_ptr_nonnull(kept);

  const char *names[] = {"alice", "carol", "ops"};
  const char *toks[] = {alice, carol, ops};
  const char *opts[] = {"quota=128K", "", "admin"};
  tt_tensor *bobs = upload_bytes(b, 1000);
  ck_assert_ptr_nonnull(bobs);
  harness_write_tokens(tokens_path, names, toks, opts, 3);
  hup_and_wait("event=reloaded");

  /* bob's session ended at the reload, its memory freed (nothing renews it, the side socket
   * included); his calls are refused from now on; carol gets in. */
  ck_assert(log_contains("event=session-revoked tenant=bob tensors_freed=1 bytes_freed=4000"));
  tt_tensor_free(bobs);
  ck_assert_ptr_null(tt_tensor_empty(b, TT_FLOAT32, (int64_t[]){4}, 1, "tt"));
  ck_assert_int_eq(tt_errcode(b), TT_UNAUTHENTICATED);
  tt_client *c = must_connect(carol, 0);
  ck_assert_str_eq(tt_session_tenant(c), "carol");
  tt_disconnect(c);
  /* alice keeps her session and tensor, but her new limit (128K < 200000 used) refuses more. */
  expect_uploaded(kept, 50000);
  ck_assert_ptr_null(tt_tensor_empty(a, TT_FLOAT32, (int64_t[]){4}, 1, "tt"));
  ck_assert_int_eq(tt_errcode(a), TT_RESOURCE_EXHAUSTED);
  ck_assert_ptr_nonnull(strstr(tt_last_error(a), "quota 128 KiB"));

  /* A broken file: logged, previous settings kept. */
  FILE *f = fopen(tokens_path, "w");
  fprintf(f, "alice not-a-digest\n");
  fclose(f);
  hup_and_wait("event=reload-failed");
  ck_assert(log_contains(":1: tenant alice needs the token's digest"));
  tt_client *c2 = must_connect(carol, 0);
  tt_disconnect(c2);

  /* A tokens file others may write is refused (previous settings kept); one everyone may
   * read (the harness writes 0644) is read with a warning. */
  ck_assert(log_contains("event=unsafe-file"));
  ck_assert(log_contains("what=\"tokens file\" problem=\"readable by everyone: chmod o-r it\""));
  harness_write_tokens(tokens_path, names, toks, opts, 3);
  ck_assert_int_eq(chmod(tokens_path, 0666), 0);
  hup_and_wait("is writable by everyone (mode 0666)");
  tt_client *c3 = must_connect(carol, 0);
  tt_disconnect(c3);

  tt_tensor_free(kept);
  tt_disconnect(a);
  tt_disconnect(b);
}
END_TEST

/* A REGISTER without its memfd on the side socket, for session id with key: its answer's
 * code and message tell a session the socket still finds (INVALID_ARGUMENT, the fd missing)
 * from one it no longer does (NOT_FOUND). */
static ttd_shm_reply side_register(uint64_t id, const uint64_t key[2]) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof(sa.sun_path), "%.90s.shm", proc.target + strlen("unix:"));
  int sock = socket(AF_UNIX, SOCK_SEQPACKET, 0);
  ck_assert_int_eq(connect(sock, (struct sockaddr *)&sa, sizeof(sa)), 0);
  ttd_shm_request req = {.magic = TTD_SHM_MAGIC, .op = TTD_SHM_REGISTER, .session_id = id, .size = 4096};
  memcpy(req.key, key, sizeof(req.key));
  ck_assert_int_eq(send(sock, &req, sizeof(req), 0), sizeof(req));
  ttd_shm_reply reply;
  ck_assert_int_eq(recv(sock, &reply, sizeof(reply), 0), sizeof(reply));
  close(sock);
  return reply;
}

/* A tenant given a new token under the same name at a reload: the sessions its old token
 * opened end at the reload (their memory freed, the side socket no longer finds them with
 * their key, a call naming one with the new token is told the token it was opened with was
 * revoked), while another tenant's session and the new token's new sessions go on. */
START_TEST(test_rotated_token_ends_its_sessions) {
  tt_client *a = must_connect(alice, 0);
  tt_client *b = must_connect(bob, 0);
  tt_tensor *alices = upload_bytes(a, 1000); /* 4000 bytes, freed with the session */
  ck_assert_ptr_nonnull(alices);
  tt_tensor *bobs = upload_bytes(b, 500);
  ck_assert_ptr_nonnull(bobs);
  Ttd__V1__OpenSessionRequest open = TTD__V1__OPEN_SESSION_REQUEST__INIT;
  open.protocol_version = 1;
  Ttd__V1__OpenSessionResponse *raw = (Ttd__V1__OpenSessionResponse *)raw_unary(
      proc.target, "/ttd.v1.Device/OpenSession", &open.base, (raw_md){.authorization = alice_auth},
      &ttd__v1__open_session_response__descriptor, 0, NULL);
  uint64_t key[2] = {raw->shm_key_hi, raw->shm_key_lo};
  char raw_session[17];
  snprintf(raw_session, sizeof(raw_session), "%016" PRIx64, raw->session_id);
  ttd_shm_reply r = side_register(raw->session_id, key);
  ck_assert_int_eq(r.code, 3);
  ck_assert_msg(strstr(r.message, "needs the memfd attached"), "%s", r.message);

  char rotated[64], rotated_auth[80];
  harness_token(rotated, sizeof(rotated), rotated_auth, sizeof(rotated_auth));
  const char *names[] = {"alice", "bob", "ops"};
  const char *toks[] = {rotated, bob, ops};
  const char *opts[] = {"quota=512K", "max_sessions=3", "admin"};
  harness_write_tokens(tokens_path, names, toks, opts, 3);
  hup_and_wait("event=reloaded");

  ck_assert(log_contains("event=session-revoked tenant=alice tensors_freed=1 bytes_freed=4000"));
  ck_assert(log_contains("event=session-revoked tenant=alice tensors_freed=0 bytes_freed=0"));
  ck_assert(!log_contains("event=session-revoked tenant=bob"));
  r = side_register(raw->session_id, key);
  ck_assert_int_eq(r.code, 5);
  ck_assert_msg(strstr(r.message, "is not open: the token it was opened with was revoked at a reload"), "%s",
                r.message);
  Ttd__V1__KeepAliveRequest ka = TTD__V1__KEEP_ALIVE_REQUEST__INIT;
  raw_expect(proc.target, "/ttd.v1.Device/KeepAlive", &ka.base,
             (raw_md){.session = raw_session, .authorization = rotated_auth}, 5,
             "the token it was opened with was revoked at a reload");
  ck_assert_ptr_null(tt_tensor_empty(a, TT_FLOAT32, (int64_t[]){4}, 1, "tt"));
  ck_assert_int_eq(tt_errcode(a), TT_UNAUTHENTICATED);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 2000); /* bob's tensor alone */

  tt_client *a2 = must_connect(rotated, 0);
  ck_assert_str_eq(tt_session_tenant(a2), "alice");
  expect_uploaded(bobs, 500);
  tt_tensor_free(bobs);
  tt_tensor_free(alices);
  ttd__v1__open_session_response__free_unpacked(raw, NULL);
  tt_disconnect(a2);
  tt_disconnect(a);
  tt_disconnect(b);
}
END_TEST

/* Every call gets a request id, sent back as ttd-request-id metadata; each log line of the
 * call carries it with the session and the tenant. At INFO, calls write nothing. */
START_TEST(test_logs_carry_request_and_session) {
  tt_client *a = must_connect(alice, 0);
  char sess[17];
  snprintf(sess, sizeof(sess), "%016llx", (unsigned long long)tt_session_id(a));
  Ttd__V1__TensorSpec spec = TTD__V1__TENSOR_SPEC__INIT;
  int64_t shape[1] = {-3};
  spec.dtype = TTD__V1__DTYPE__DTYPE_FLOAT32;
  spec.n_shape = 1;
  spec.shape = shape;
  Ttd__V1__AllocateRequest req = TTD__V1__ALLOCATE_REQUEST__INIT;
  req.spec = &spec;
  uint8_t buf[64];
  raw_result r;
  raw_call(proc.target, "/ttd.v1.Device/Allocate", (raw_md){.session = sess, .authorization = alice_auth}, buf,
           ttd__v1__allocate_request__pack(&req, buf), &r);
  ck_assert_int_eq(r.code, 3);
  ck_assert_uint_gt(strlen(r.request_id), 0);
  char needle[256];
  snprintf(needle, sizeof(needle), "req=%s session=%s event=call method=/ttd.v1.Device/Allocate tenant=alice "
           "code=INVALID_ARGUMENT", r.request_id, sess);
  raw_result_free(&r);
  int found = 0;
  for (int i = 0; i < 200 && !found; i++) { /* the line is written as the answer goes out */
    found = log_contains(needle);
    if (!found) nanosleep(&(struct timespec){0, 5000000}, NULL);
  }
  ck_assert_msg(found, "no '%s' in %s", needle, proc.log_path);
  tt_disconnect(a);

  /* At INFO a busy daemon logs the session's open and close, and no call. */
  ttd_proc quiet;
  const char *args[] = {"--log-level", "info", NULL};
  ttd_proc_start(&quiet, args);
  unsetenv("TTD_TOKEN");
  tt_client *c = harness_connect(&quiet, 0);
  for (int i = 0; i < 50; i++) {
    tt_device_info *d = NULL;
    size_t n = 0;
    ck_assert_int_eq(tt_list_devices(c, &d, &n), TT_OK);
    tt_device_list_free(d);
  }
  tt_disconnect(c);
  setenv("TTD_TOKEN", ops, 1);
  char grep[256];
  snprintf(grep, sizeof(grep), "grep -c . '%s'", quiet.log_path);
  FILE *p = popen(grep, "r");
  int lines = 0;
  ck_assert_int_eq(fscanf(p, "%d", &lines), 1);
  pclose(p);
  snprintf(grep, sizeof(grep), "grep -q 'event=call' '%s'", quiet.log_path);
  ck_assert_int_ne(system(grep), 0);
  ck_assert_int_le(lines, 6); /* listening, ready, session open and close */
  ck_assert_int_eq(ttd_proc_stop(&quiet), 0);
}
END_TEST

/* Without a tokens file every client is the admin tenant "local", as before tokens. */
START_TEST(test_no_tokens_is_local_admin) {
  ttd_proc p2;
  ttd_proc_start(&p2, NULL);
  unsetenv("TTD_TOKEN");
  tt_client *c = harness_connect(&p2, 0);
  ck_assert_str_eq(tt_session_tenant(c), "local");
  ck_assert_uint_eq(tt_session_quota(c), 0);
  Ttd__V1__ListSessionsRequest ls = TTD__V1__LIST_SESSIONS_REQUEST__INIT;
  raw_expect(p2.target, "/ttd.v1.Device/ListSessions", &ls.base, (raw_md){0}, 0, NULL);
  tt_disconnect(c);
  ck_assert_int_eq(ttd_proc_stop(&p2), 0);
  setenv("TTD_TOKEN", ops, 1);
}
END_TEST

Suite *e2e_tenants_suite(void) {
  Suite *s = suite_create("e2e_tenants");
  TCase *tc = tcase_create("tenants");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_tokens_right_wrong_missing);
  tcase_add_test(tc, test_tenant_isolation);
  tcase_add_test(tc, test_admin_list_and_kill);
  tcase_add_test(tc, test_quota_edges);
  tcase_add_test(tc, test_tenant_quota_sums_sessions);
  tcase_add_test(tc, test_sessions_per_tenant);
  tcase_add_test(tc, test_quota_counts_activations);
  tcase_add_test(tc, test_sighup_reload);
  tcase_add_test(tc, test_rotated_token_ends_its_sessions);
  tcase_add_test(tc, test_no_tokens_is_local_admin);
  tcase_add_test(tc, test_logs_carry_request_and_session);
  suite_add_tcase(s, tc);
  return s;
}
