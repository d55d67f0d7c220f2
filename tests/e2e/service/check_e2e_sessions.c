/* Sessions through a real ttd: lease expiry frees memory, keep-alive holds a session,
 * CloseSession frees at once, a client killed mid-upload leaves nothing, a dead client's
 * tensors return within its lease, a restarted daemon is detected, concurrent clients do
 * not disturb each other, and without tokens only ttd's own user and root are admins (over
 * the socket file), each session naming its peer's uid and pid or address. */
#include <check.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "raw_rpc.h"
#include "suites.h"
#include "ttd/v1/ttd.pb-c.h"
#include "ttd_harness.h"

static ttd_proc proc;

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static void start_with_lease(const char *lease) {
  const char *args[] = {"--lease", lease, NULL};
  ttd_proc_start(&proc, args);
}

static void stop(void) { ck_assert_int_eq(ttd_proc_stop(&proc), 0); }

static tt_tensor *upload_floats(tt_client *c, int64_t n) {
  float *v = calloc((size_t)n, sizeof(float));
  for (int64_t i = 0; i < n; i++) v[i] = (float)i;
  tt_tensor *h = tt_tensor_from_host(c, v, TT_FLOAT32, &n, 1);
  tt_tensor *d = tt_to(h, "tt");
  ck_assert_msg(d != NULL, "%s", tt_last_error(c));
  tt_tensor_free(h);
  free(v);
  return d;
}

/* A session with no call within its lease is closed and all its tensors freed; its next
 * call is NOT_FOUND naming the lease. */
START_TEST(test_lease_expiry_frees_memory) {
  start_with_lease("300ms");
  tt_client *c = harness_connect(&proc, 0);
  tt_tensor *d = upload_floats(c, 1 << 16);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 1 << 18);
  ck_assert_uint_eq(harness_wait_used_bytes(&proc, 0, 0, 0, 3000), 0);
  ck_assert_ptr_null(tt_to(d, "cpu"));
  ck_assert_int_eq(tt_errcode(c), TT_NOT_FOUND);
  ck_assert_ptr_nonnull(strstr(tt_last_error(c), "expired after 300 ms"));
  tt_tensor_free(d);
  tt_disconnect(c);
  stop();
}
END_TEST

/* The library's background keep-alive holds a session open across many leases. */
START_TEST(test_keepalive_holds_session) {
  start_with_lease("1s");
  tt_client *c = harness_connect(&proc, 1);
  tt_tensor *d = upload_floats(c, 1024);
  sleep_ms(3500);
  tt_tensor *back = tt_to(d, "cpu");
  ck_assert_msg(back != NULL, "%s", tt_last_error(c));
  ck_assert_float_eq(((float *)tt_tensor_data(back))[1023], 1023.0f);
  tt_tensor_free(back);
  tt_tensor_free(d);
  tt_disconnect(c);
  stop();
}
END_TEST

/* CloseSession frees the session's tensors at once (not after the lease), reports what it
 * freed, and the session is gone afterwards. */
START_TEST(test_close_session_frees_at_once) {
  start_with_lease("60");
  char session[17], instance[40];
  raw_open_session(proc.target, session, instance);
  raw_allocate(proc.target, session, 1000);
  raw_allocate(proc.target, session, 3000);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 16000);
  raw_result r;
  raw_call(proc.target, "/ttd.v1.Device/CloseSession", (raw_md){.session = session, .instance = instance}, "", 0, &r);
  ck_assert_int_eq(r.code, 0);
  Ttd__V1__CloseSessionResponse *resp = ttd__v1__close_session_response__unpack(NULL, r.body_len, r.body);
  ck_assert_ptr_nonnull(resp);
  ck_assert_uint_eq(resp->tensors_freed, 2);
  ck_assert_uint_eq(resp->bytes_freed, 16000);
  ttd__v1__close_session_response__free_unpacked(resp, NULL);
  raw_result_free(&r);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 0);
  raw_call(proc.target, "/ttd.v1.Device/KeepAlive", (raw_md){.session = session, .instance = instance}, "", 0, &r);
  ck_assert_int_eq(r.code, 5);
  raw_result_free(&r);
  stop();
}
END_TEST

/* A client process killed in the middle of an Upload stream leaves nothing allocated, at
 * once (the lease here is a minute). */
START_TEST(test_killed_mid_upload) {
  start_with_lease("60");
  char session[17], instance[40];
  raw_open_session(proc.target, session, instance);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    /* Header for a 64 MiB tensor, then two 1 MiB chunks, then SIGKILL. */
    Ttd__V1__TensorSpec spec = TTD__V1__TENSOR_SPEC__INIT;
    int64_t shape[1] = {16 << 20};
    spec.dtype = TTD__V1__DTYPE__DTYPE_FLOAT32;
    spec.n_shape = 1;
    spec.shape = shape;
    Ttd__V1__UploadHeader header = TTD__V1__UPLOAD_HEADER__INIT;
    header.target_case = TTD__V1__UPLOAD_HEADER__TARGET_SPEC;
    header.spec = &spec;
    static unsigned char chunk[1 << 20];
    unsigned char *msgs[2];
    size_t lens[2];
    for (int i = 0; i < 2; i++) {
      Ttd__V1__UploadRequest req = TTD__V1__UPLOAD_REQUEST__INIT;
      req.header = i == 0 ? &header : NULL;
      req.data.data = chunk;
      req.data.len = sizeof(chunk);
      msgs[i] = malloc(ttd__v1__upload_request__get_packed_size(&req));
      lens[i] = ttd__v1__upload_request__pack(&req, msgs[i]);
    }
    raw_result r;
    raw_stream(proc.target, "/ttd.v1.Device/Upload", (raw_md){.session = session, .instance = NULL}, (const void *const *)msgs, lens, 2, 1, &r);
    _exit(3); /* not reached: raw_stream killed the process */
  }
  int status;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  ck_assert_uint_eq(harness_wait_used_bytes(&proc, 0, 0, 0, 2000), 0);
  stop();
}
END_TEST

/* A client process that dies holding tensors (no CloseSession) has them freed within one lease. */
START_TEST(test_dead_client_memory_returns_within_lease) {
  start_with_lease("1s");
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    tt_client *c = harness_connect(&proc, 1);
    upload_floats(c, 1 << 18);
    raise(SIGKILL);
  }
  int status;
  waitpid(pid, &status, 0);
  ck_assert(WIFSIGNALED(status));
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 1 << 20);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  ck_assert_uint_eq(harness_wait_used_bytes(&proc, 0, 0, 0, 5000), 0);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double waited = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
  /* lease 1 s plus one sweep period (0.25 s), with slack for a loaded CI machine */
  ck_assert_msg(waited < 2.5, "memory came back after %.2f s; the lease is 1 s", waited);
  stop();
}
END_TEST

/* A client holding handles from before a daemon restart gets FAILED_PRECONDITION
 * "daemon restarted" rather than NOT_FOUND or wrong data. */
START_TEST(test_restart_detected) {
  start_with_lease("60");
  tt_client *c = harness_connect(&proc, 0);
  tt_tensor *d = upload_floats(c, 16);
  char dir[sizeof(proc.dir)];
  memcpy(dir, proc.dir, sizeof(dir));
  /* Restart on the same socket path. */
  kill(proc.pid, SIGTERM);
  int status;
  waitpid(proc.pid, &status, 0);
  ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  pid_t pid = fork();
  if (pid == 0) {
    if (!freopen(proc.log_path, "a", stderr)) _exit(126);
    execl(getenv("TTD_BIN") ? getenv("TTD_BIN") : "build/bin/ttd", "ttd", "--listen", proc.target, "--admin", "off",
          (char *)NULL);
    _exit(127);
  }
  proc.pid = pid;
  for (int i = 0; i < 500 && !ttd_proc_alive(&proc); i++) sleep_ms(10);
  tt_tensor *back = NULL;
  for (int i = 0; i < 500; i++) { /* until the new daemon listens */
    back = tt_to(d, "cpu");
    if (back || tt_errcode(c) != TT_UNAVAILABLE) break;
    sleep_ms(10);
  }
  ck_assert_ptr_null(back);
  ck_assert_int_eq(tt_errcode(c), TT_FAILED_PRECONDITION);
  ck_assert_ptr_nonnull(strstr(tt_last_error(c), "daemon restarted, tensors are gone"));
  tt_tensor_free(d);
  tt_disconnect(c);
  stop();
}
END_TEST

/* A plain TCP listener (--listen host:port --insecure, repeatable beside the Unix socket)
 * serves the same daemon, and a NULL target means the TTD_ADDRESS environment variable
 * (TTD_INSECURE=1: plain text); without tokens its callers get no admin rights. */
static double seconds_since(const struct timespec *t0) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

/* call_timeout_ms ends a call the daemon does not answer (SIGSTOPped) with
 * DEADLINE_EXCEEDED after that long: a light call (ListDevices), a heavy one (Allocate)
 * and device work (Execute); the client works again once the daemon does. */
START_TEST(test_call_timeout) {
  start_with_lease("60");
  tt_connect_options o;
  tt_connect_options_init(&o);
  o.disable_keepalive = 1;
  o.client_name = "check";
  o.call_timeout_ms = 300;
  tt_client *c = NULL;
  ck_assert_int_eq(tt_connect(proc.target, &o, &c), TT_OK);
  tt_graph *g = tt_graph_create(c, 1);
  int64_t shape[2] = {2, 4};
  tt_graph_output(g, tt_relu(g, tt_graph_input(g, "x", TT_FLOAT32, shape, 2)));
  tt_module *m = tt_compile(c, g);
  tt_graph_free(g);
  ck_assert_ptr_nonnull(m);
  ck_assert_int_eq(tt_module_to(m, "tt"), TT_OK);
  float xv[8] = {-1, 2, -3, 4, -5, 6, -7, 8};
  tt_tensor *h = tt_tensor_from_host(c, xv, TT_FLOAT32, shape, 2);
  tt_tensor *x = tt_to(h, "tt");
  ck_assert_ptr_nonnull(x);
  ck_assert_int_eq(ttd_proc_pause(&proc), 0);
  for (int call = 0; call < 3; call++) {
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    tt_status st = TT_OK;
    if (call == 0) {
      tt_device_info *devs = NULL;
      size_t n = 0;
      st = tt_list_devices(c, &devs, &n);
      tt_device_list_free(devs);
    } else if (call == 1) {
      ck_assert_ptr_null(tt_tensor_empty(c, TT_FLOAT32, shape, 2, "tt"));
      st = tt_errcode(c);
    } else {
      tt_tensor *y = NULL;
      st = tt_forward(m, &x, 1, &y);
      tt_tensor *back = st == TT_OK ? tt_to(y, "cpu") : NULL;
      if (st == TT_OK) st = back ? TT_OK : tt_errcode(c);
      tt_tensor_free(back);
      tt_tensor_free(y);
    }
    double took = seconds_since(&t0);
    ck_assert_msg(st == TT_DEADLINE_EXCEEDED, "call %d: %s: %s", call, tt_status_name(st), tt_last_error(c));
    ck_assert_msg(took >= 0.29 && took < 5, "call %d gave up after %.3f s (call_timeout_ms 300)", call, took);
  }
  ck_assert_int_eq(kill(proc.pid, SIGCONT), 0);
  tt_device_info *devs = NULL;
  size_t n = 0;
  ck_assert_int_eq(tt_list_devices(c, &devs, &n), TT_OK);
  ck_assert_uint_eq(n, 1);
  tt_device_list_free(devs);
  tt_tensor_free(x);
  tt_tensor_free(h);
  tt_module_free(m);
  tt_disconnect(c);
}
END_TEST

/* The session of the client with this id in list, or NULL. */
static const tt_session_info *find_session(const tt_session_info *list, size_t n, uint64_t id) {
  for (size_t i = 0; i < n; i++) {
    if (list[i].session_id == id) return &list[i];
  }
  return NULL;
}

/* Without tokens, a caller on an abstract socket (which every local user may reach) is never
 * an admin, root included, and is told why; the same user over the socket file is one. Each
 * session's peer names the door and the caller's uid and pid. */
START_TEST(test_abstract_listener_caller_is_no_admin) {
  char abstract[64];
  snprintf(abstract, sizeof(abstract), "unix-abstract:ttd-check-%d", (int)getpid());
  const char *args[] = {"--listen", abstract, "--insecure", NULL};
  ttd_proc_start(&proc, args);
  tt_client *over_abstract = NULL;
  ck_assert_int_eq(tt_connect(abstract, NULL, &over_abstract), TT_OK);
  tt_session_info *list = NULL;
  size_t n = 0;
  ck_assert_int_eq(tt_list_sessions(over_abstract, &list, &n), TT_PERMISSION_DENIED);
  const char *e = tt_last_error(over_abstract);
  ck_assert_msg(strstr(e, "came over an abstract socket") && strstr(e, "tokens file with an admin tenant"), "%s", e);
  ck_assert_int_eq(tt_kill_session(over_abstract, tt_session_id(over_abstract), NULL, NULL), TT_PERMISSION_DENIED);
  tt_client *over_file = harness_connect(&proc, 0);
  ck_assert_msg(tt_list_sessions(over_file, &list, &n) == TT_OK, "%s", tt_last_error(over_file));
  char want[64];
  snprintf(want, sizeof(want), "unix-abstract:uid=%u,pid=%d", (unsigned)geteuid(), (int)getpid());
  const tt_session_info *s = find_session(list, n, tt_session_id(over_abstract));
  ck_assert_msg(s && strcmp(s->peer, want) == 0, "peer %s, want %s", s ? s->peer : "(none)", want);
  snprintf(want, sizeof(want), "unix:uid=%u,pid=%d", (unsigned)geteuid(), (int)getpid());
  s = find_session(list, n, tt_session_id(over_file));
  ck_assert_msg(s && strcmp(s->peer, want) == 0, "peer %s, want %s", s ? s->peer : "(none)", want);
  tt_session_list_free(list);
  tt_disconnect(over_abstract);
  tt_disconnect(over_file);
  stop();
}
END_TEST

/* What the child running as another user saw: NULL when all was as expected. */
static const char *as_other_user(const char *target, uid_t uid, int ready_fd, int go_fd) {
  static char why[512];
  if (setgroups(0, NULL) != 0 || setgid(uid) != 0 || setuid(uid) != 0) return "cannot drop to the other uid";
  tt_client *c = NULL;
  if (tt_connect(target, NULL, &c) != TT_OK) {
    snprintf(why, sizeof(why), "connect as uid %u: %s", (unsigned)uid, tt_last_error(c));
    return why;
  }
  tt_session_info *list = NULL;
  size_t n = 0;
  char uid_text[64];
  snprintf(uid_text, sizeof(uid_text), "this caller is uid %u (tenant local)", (unsigned)uid);
  if (tt_list_sessions(c, &list, &n) != TT_PERMISSION_DENIED || !strstr(tt_last_error(c), uid_text) ||
      !strstr(tt_last_error(c), "or root, or give ttd a tokens file with an admin tenant")) {
    snprintf(why, sizeof(why), "ListSessions as uid %u: %s", (unsigned)uid, tt_last_error(c));
    return why;
  }
  if (tt_kill_session(c, tt_session_id(c), NULL, NULL) != TT_PERMISSION_DENIED || !strstr(tt_last_error(c), uid_text)) {
    snprintf(why, sizeof(why), "KillSession as uid %u: %s", (unsigned)uid, tt_last_error(c));
    return why;
  }
  /* ... but it works as the tenant local: a tensor there and back. */
  float v[256];
  for (int i = 0; i < 256; i++) v[i] = (float)i;
  int64_t shape = 256;
  tt_tensor *h = tt_tensor_from_host(c, v, TT_FLOAT32, &shape, 1);
  tt_tensor *d = tt_to(h, "tt");
  tt_tensor *back = d ? tt_to(d, "cpu") : NULL;
  if (!back || memcmp(tt_tensor_data(back), v, sizeof(v)) != 0) {
    snprintf(why, sizeof(why), "a tensor as uid %u: %s", (unsigned)uid, tt_last_error(c));
    return why;
  }
  char byte = 1;
  if (write(ready_fd, &byte, 1) != 1 || read(go_fd, &byte, 1) != 1) return "lost the parent";
  tt_tensor_free(back);
  tt_tensor_free(d);
  tt_tensor_free(h);
  tt_disconnect(c);
  return NULL;
}

/* Without tokens, another local user let in by the socket file's group is the tenant local
 * without admin rights (PERMISSION_DENIED on ListSessions and KillSession naming its uid and
 * what to do) and works as that tenant; ttd's own user (root here) is the admin, and sees
 * the other user's session with its uid and pid. Needs root to become uid 65534. */
START_TEST(test_other_uid_is_tenant_without_admin) {
  if (geteuid() != 0) {
    fprintf(stderr, "test_other_uid_is_tenant_without_admin: skipped: run as root to test another uid\n");
    return;
  }
  const uid_t nobody = 65534;
  struct group *gr = getgrgid(nobody);
  ck_assert_msg(gr != NULL, "no group 65534");
  const char *args[] = {"--socket-group", gr->gr_name, NULL}; /* lets uid 65534 connect */
  ttd_proc_start(&proc, args);
  ck_assert_int_eq(chmod(proc.dir, 0711), 0); /* the socket's folder: reachable, not listable */
  int ready[2], go[2];
  ck_assert_int_eq(pipe(ready), 0);
  ck_assert_int_eq(pipe(go), 0);
  fflush(NULL);
  pid_t pid = fork(); /* before this process starts gRPC */
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    const char *why = as_other_user(proc.target, nobody, ready[1], go[0]);
    if (why) fprintf(stderr, "%s\n", why);
    _exit(why ? 1 : 0);
  }
  close(ready[1]);
  close(go[0]);
  char byte;
  ssize_t got = read(ready[0], &byte, 1);
  if (got != 1) {
    int st = 0;
    waitpid(pid, &st, 0);
    ck_abort_msg("the child as uid 65534 failed (exit %d): see its message above", WEXITSTATUS(st));
  }
  tt_client *admin = harness_connect(&proc, 0);
  tt_session_info *list = NULL;
  size_t n = 0;
  ck_assert_msg(tt_list_sessions(admin, &list, &n) == TT_OK, "%s", tt_last_error(admin));
  char want[64];
  snprintf(want, sizeof(want), "unix:uid=65534,pid=%d", (int)pid);
  uint64_t other = 0;
  for (size_t i = 0; i < n; i++) {
    if (strcmp(list[i].peer, want) == 0) other = list[i].session_id;
  }
  ck_assert_msg(other != 0, "no session with peer %s among %zu", want, n);
  ck_assert_str_eq(find_session(list, n, other)->tenant, "local");
  tt_session_list_free(list);
  ck_assert_msg(tt_kill_session(admin, other, NULL, NULL) == TT_OK, "%s", tt_last_error(admin));
  ck_assert_int_eq(write(go[1], &byte, 1), 1);
  int st = 0;
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child as uid 65534 failed: see its message above");
  close(ready[0]);
  close(go[1]);
  tt_disconnect(admin);
  stop();
}
END_TEST

START_TEST(test_tcp_listener_and_env_target) {
  char tcp[32];
  snprintf(tcp, sizeof(tcp), "127.0.0.1:%d", harness_free_tcp_port());
  const char *args[] = {"--listen", tcp, "--insecure", NULL};
  ttd_proc_start(&proc, args);
  setenv("TTD_ADDRESS", tcp, 1);
  setenv("TTD_INSECURE", "1", 1);
  tt_client *c = NULL;
  ck_assert_int_eq(tt_connect(NULL, NULL, &c), TT_OK);
  tt_tensor *d = upload_floats(c, 300000);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 1200000); /* seen through the Unix socket */
  tt_tensor *back = tt_to(d, "cpu");
  ck_assert_ptr_nonnull(back);
  ck_assert_float_eq(((float *)tt_tensor_data(back))[299999], 299999.0f);
  /* Without tokens, admin calls are only for the Unix socket file's callers: over TCP the
   * local tenant is refused them; over the socket file it may. */
  tt_session_info *list = NULL;
  size_t n = 0;
  ck_assert_int_eq(tt_list_sessions(c, &list, &n), TT_PERMISSION_DENIED);
  ck_assert_msg(strstr(tt_last_error(c), "came over a network listener") &&
                strstr(tt_last_error(c), "(peer ipv4:127.0.0.1:"), "%s", tt_last_error(c));
  tt_client *local = harness_connect(&proc, 0);
  ck_assert_int_eq(tt_list_sessions(local, &list, &n), TT_OK);
  ck_assert_uint_eq(n, 2);
  const tt_session_info *over_tcp = find_session(list, n, tt_session_id(c)); /* the gate read its address */
  ck_assert_msg(over_tcp && strncmp(over_tcp->peer, "ipv4:127.0.0.1:", 15) == 0, "%s", over_tcp ? over_tcp->peer : "-");
  tt_session_list_free(list);
  tt_disconnect(local);
  tt_tensor_free(back);
  tt_tensor_free(d);
  tt_disconnect(c);
  unsetenv("TTD_ADDRESS");
  unsetenv("TTD_INSECURE");
  stop();
}
END_TEST

/* The default target follows XDG_RUNTIME_DIR (or /run/ttd as root), with the unix: prefix. */
START_TEST(test_default_target) {
  char buf[256];
  setenv("XDG_RUNTIME_DIR", "/run/user/4242", 1);
  ck_assert_int_eq(tt_default_target(buf, sizeof(buf)), 0);
  ck_assert_str_eq(buf, geteuid() == 0 ? "unix:/run/ttd/ttd.sock" : "unix:/run/user/4242/ttd.sock");
  ck_assert_int_eq(tt_default_target(buf, 8), -1);
}
END_TEST

/* Told no address and finding no ttd, a client names every default address it tried, what
 * each answered, and how to start ttd. A ttd on the user's own socket is found. */
START_TEST(test_no_default_daemon_says_where_it_looked) {
  if (access("/run/ttd/ttd.sock", F_OK) == 0) return; /* a real service answers here */
  char dir[] = "/tmp/ttd-xdg-XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  setenv("XDG_RUNTIME_DIR", dir, 1);
  unsetenv("TTD_ADDRESS");
  tt_client *c = NULL;
  ck_assert_int_eq(tt_connect(NULL, NULL, &c), TT_UNAVAILABLE);
  const char *e = tt_last_error(c);
  ck_assert_msg(strstr(e, "no ttd answers at the default addresses") && strstr(e, "unix:/run/ttd/ttd.sock (no such socket)") &&
                strstr(e, "systemctl start ttd") && strstr(e, "TTD_ADDRESS"), "%s", e);
  char own[300];
  snprintf(own, sizeof(own), "unix:%s/ttd.sock (no such socket)", dir);
  if (geteuid() != 0) ck_assert_msg(strstr(e, own), "%s", e);
  tt_disconnect(c);
  rmdir(dir);
}
END_TEST

typedef struct worker_arg {
  const ttd_proc *proc;
  int seed;
  int ok;
} worker_arg;

static void *worker(void *p) {
  worker_arg *a = p;
  tt_client *c = NULL;
  if (tt_connect(a->proc->target, NULL, &c) != TT_OK) return NULL;
  int64_t n = 300000 + a->seed;
  float *v = malloc(sizeof(float) * (size_t)n);
  int ok = 1;
  for (int round = 0; round < 5 && ok; round++) {
    for (int64_t i = 0; i < n; i++) v[i] = (float)(a->seed * 1000 + round) + (float)i * 0.5f;
    tt_tensor *h = tt_tensor_from_host(c, v, TT_FLOAT32, &n, 1);
    tt_tensor *d = tt_to(h, round % 2 ? "tt:0/l1" : "tt");
    tt_tensor *b = d ? tt_to(d, "cpu") : NULL;
    ok = b && memcmp(tt_tensor_data(b), v, sizeof(float) * (size_t)n) == 0;
    tt_tensor_free(b);
    tt_tensor_free(d);
    tt_tensor_free(h);
  }
  free(v);
  tt_disconnect(c);
  a->ok = ok;
  return NULL;
}

/* Four clients on four threads transfer at once; each gets its own bytes back. */
START_TEST(test_concurrent_clients) {
  start_with_lease("60");
  pthread_t t[4];
  worker_arg args[4];
  for (int i = 0; i < 4; i++) {
    args[i] = (worker_arg){&proc, i + 1, 0};
    pthread_create(&t[i], NULL, worker, &args[i]);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(t[i], NULL);
    ck_assert_msg(args[i].ok, "client %d got wrong bytes or an error", i);
  }
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 0);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 1), 0);
  stop();
}
END_TEST

Suite *e2e_sessions_suite(void) {
  Suite *s = suite_create("e2e_sessions");
  TCase *tc = tcase_create("sessions");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_lease_expiry_frees_memory);
  tcase_add_test(tc, test_keepalive_holds_session);
  tcase_add_test(tc, test_close_session_frees_at_once);
  tcase_add_test(tc, test_killed_mid_upload);
  tcase_add_test(tc, test_dead_client_memory_returns_within_lease);
  tcase_add_test(tc, test_restart_detected);
  tcase_add_test(tc, test_concurrent_clients);
  tcase_add_test(tc, test_call_timeout);
  tcase_add_test(tc, test_tcp_listener_and_env_target);
  tcase_add_test(tc, test_abstract_listener_caller_is_no_admin);
  tcase_add_test(tc, test_other_uid_is_tenant_without_admin);
  tcase_add_test(tc, test_default_target);
  tcase_add_test(tc, test_no_default_daemon_says_where_it_looked);
  suite_add_tcase(s, tc);
  return s;
}
