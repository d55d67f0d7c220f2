/* ttctl, the operator's tool, run as a program (popen) against a real ttd: status with its
 * memory bars and sessions, sessions, kill, ping, --json of each, exit codes for RPC
 * failures and bad usage, token new / token hash, and a daemon with --tokens. The binary
 * sits next to TTD_BIN. */
#include <check.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "wire/tokens.h"
#include "suites.h"
#include "ttd_harness.h"

#define MIB (1024 * 1024)

static ttd_proc proc;
static char ttctl_bin[512];

/* TTD_BIN with its trailing "ttd" replaced by "ttctl". */
static void find_ttctl(void) {
  const char *bin = getenv("TTD_BIN");
  if (!bin) bin = "build/bin/ttd";
  size_t len = strlen(bin);
  ck_assert_msg(len >= 3 && strcmp(bin + len - 3, "ttd") == 0, "TTD_BIN %s does not end in ttd", bin);
  snprintf(ttctl_bin, sizeof(ttctl_bin), "%.*sttctl", (int)(len - 3), bin);
  ck_assert_msg(access(ttctl_bin, X_OK) == 0, "no ttctl at %s", ttctl_bin);
}

/* Everything left in f, as a new string. */
static char *read_all(FILE *f) {
  size_t cap = 4096, len = 0;
  char *text = malloc(cap);
  for (size_t n; (n = fread(text + len, 1, cap - len - 1, f)) > 0;) {
    len += n;
    if (cap - len < 1024) text = realloc(text, cap *= 2);
  }
  text[len] = '\0';
  return text;
}

/* Runs ttctl with the formatted (shell) arguments, input on its stdin (NULL: empty).
 * Returns the exit status; *out_stdout and *out_stderr get its output (free them). */
static int ttctl_run(const char *input, char **out_stdout, char **out_stderr, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int ttctl_run(const char *input, char **out_stdout, char **out_stderr, const char *fmt, ...) {
  char args[1024], in_path[64], err_path[64], cmd[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(args, sizeof(args), fmt, ap);
  va_end(ap);
  snprintf(in_path, sizeof(in_path), "/tmp/ttctl-in-%d", (int)getpid());
  snprintf(err_path, sizeof(err_path), "/tmp/ttctl-err-%d", (int)getpid());
  FILE *in = fopen(in_path, "w");
  ck_assert_ptr_nonnull(in);
  if (input) fputs(input, in);
  fclose(in);
  snprintf(cmd, sizeof(cmd), "'%s' %s <'%s' 2>'%s'", ttctl_bin, args, in_path, err_path);
  FILE *p = popen(cmd, "r");
  ck_assert_ptr_nonnull(p);
  *out_stdout = read_all(p);
  int status = pclose(p);
  FILE *err = fopen(err_path, "r");
  ck_assert_ptr_nonnull(err);
  *out_stderr = read_all(err);
  fclose(err);
  unlink(in_path);
  unlink(err_path);
  ck_assert_msg(status != -1 && WIFEXITED(status), "ttctl %s did not exit normally (%d): %s", args, status,
                *out_stderr);
  return WEXITSTATUS(status);
}

/* Runs ttctl expecting exit status want; returns its stdout (free it). */
static char *ttctl_expect(int want, const char *input, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static char *ttctl_expect(int want, const char *input, const char *fmt, ...) {
  char args[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(args, sizeof(args), fmt, ap);
  va_end(ap);
  char *out, *err;
  int rc = ttctl_run(input, &out, &err, "%s", args);
  ck_assert_msg(rc == want, "ttctl %s: exit %d, want %d; stdout:\n%s\nstderr:\n%s", args, rc, want, out, err);
  free(err);
  return out;
}

/* A copy of the first line of text that starts with prefix, or NULL. */
static char *line_starting(const char *text, const char *prefix) {
  for (const char *line = text; line && *line;) {
    const char *end = strchr(line, '\n');
    size_t len = end ? (size_t)(end - line) : strlen(line);
    if (strncmp(line, prefix, strlen(prefix)) == 0) return strndup(line, len);
    line = end ? end + 1 : NULL;
  }
  return NULL;
}

static json_t *parse_json(const char *text) {
  json_error_t error;
  json_t *root = json_loads(text, 0, &error);
  ck_assert_msg(root != NULL, "not JSON (%s at line %d): %s", error.text, error.line, text);
  return root;
}

/* The session of id in a JSON "sessions" array, or NULL. */
static json_t *json_session(json_t *sessions, const char *id) {
  size_t i;
  json_t *s;
  json_array_foreach(sessions, i, s) {
    if (strcmp(json_string_value(json_object_get(s, "session")), id) == 0) return s;
  }
  return NULL;
}

static tt_client *connect_named(const char *name, const char *token) {
  tt_connect_options o;
  tt_connect_options_init(&o);
  o.client_name = name;
  o.token = token;
  o.disable_keepalive = 1;
  tt_client *c = NULL;
  tt_status st = tt_connect(proc.target, &o, &c);
  ck_assert_msg(st == TT_OK, "connect: %s %s", tt_status_name(st), tt_last_error(c));
  return c;
}

/* A 1 MiB float32 tensor on tt:0 DRAM. */
static tt_tensor *upload_mib(tt_client *c) {
  int64_t n = MIB / 4;
  tt_tensor *h = tt_tensor_from_host(c, NULL, TT_FLOAT32, &n, 1);
  tt_tensor *d = tt_to(h, "tt");
  tt_tensor_free(h);
  ck_assert_msg(d != NULL, "upload: %s", tt_last_error(c));
  return d;
}

static void session_hex(const tt_client *c, char out[17]) {
  snprintf(out, 17, "%016llx", (unsigned long long)tt_session_id(c));
}

static void setup(void) {
  unsetenv("TTD_TOKEN");
  unsetenv("TTD_ADDRESS");
  find_ttctl();
  const char *args[] = {"--dram", "8M", NULL};
  ttd_proc_start(&proc, args);
}

static void teardown(void) {
  ck_assert_msg(ttd_proc_alive(&proc), "ttd died; see %s", proc.log_path);
  ck_assert_uint_eq(harness_wait_used_bytes(&proc, 0, 0, 0, 2000), 0);
  ck_assert_int_eq(ttd_proc_stop(&proc), 0);
}

/* status: the header names target and instance; tt:0's row shows 1.00 MiB of 8.00 MiB DRAM
 * with its bar; the client's session row shows its name and memory; ttctl's own session is
 * left out. */
START_TEST(test_status_table) {
  tt_client *c = connect_named("trainer-7", NULL);
  tt_tensor *t = upload_mib(c);
  char id[17];
  session_hex(c, id);
  char *out = ttctl_expect(0, NULL, "--target %s status", proc.target);
  char *header = line_starting(out, "ttd ");
  ck_assert_msg(header && strstr(header, proc.target) && strstr(header, tt_instance_id(c)), "%s", out);
  ck_assert_msg(strstr(header, "1 device, 1 session"), "%s", header);
  char *dev = line_starting(out, "tt:0 ");
  ck_assert_msg(dev != NULL, "no tt:0 row in:\n%s", out);
  ck_assert_msg(strstr(dev, "1.00 MiB / 8.00 MiB") && strstr(dev, "[###.................]  12.5%") &&
                    strstr(dev, "0 B / 108.00 MiB") && strstr(dev, "sim-wormhole-n150"),
                "%s", dev);
  char *row = line_starting(out, id);
  ck_assert_msg(row != NULL, "no row for session %s in:\n%s", id, out);
  ck_assert_msg(strstr(row, "trainer-7") && strstr(row, "local") && strstr(row, "unix:") && strstr(row, " 1.00 MiB"),
                "%s", row);
  ck_assert_msg(row[strlen(row) - 1] == '-', "quota of a session without one: %s", row);
  ck_assert_msg(strstr(out, "SESSION") && strstr(out, "IDLE") && strstr(out, "QUOTA"), "%s", out);
  ck_assert_msg(strstr(out, "ttctl") == NULL, "ttctl's own session is listed:\n%s", out);
  /* the tenants' lines: local, with one session (ttctl's own left out) holding 1 MiB */
  ck_assert_msg(strstr(out, "TENANT  SESSIONS") != NULL, "%s", out);
  char *tenant = line_starting(out, "local ");
  ck_assert_msg(tenant && strstr(tenant, " 1 ") && strstr(tenant, "1.00 MiB"), "%s", out);
  free(tenant);
  free(row);
  free(dev);
  free(header);
  free(out);
  tt_tensor_free(t);
  tt_disconnect(c);
}
END_TEST

/* --json status: exact bytes for tt:0 DRAM, capacity 8 MiB, and the session with its memory. */
START_TEST(test_status_json) {
  tt_client *c = connect_named("trainer-7", NULL);
  tt_tensor *t = upload_mib(c);
  char id[17];
  session_hex(c, id);
  char *out = ttctl_expect(0, NULL, "--json --target=%s status", proc.target);
  json_t *root = parse_json(out);
  ck_assert_str_eq(json_string_value(json_object_get(root, "target")), proc.target);
  ck_assert_str_eq(json_string_value(json_object_get(root, "instance")), tt_instance_id(c));
  json_t *dev = json_array_get(json_object_get(root, "devices"), 0);
  ck_assert_str_eq(json_string_value(json_object_get(dev, "name")), "tt:0");
  ck_assert_int_eq(json_integer_value(json_object_get(dev, "cores")), 72);
  json_t *dram = json_object_get(dev, "dram");
  ck_assert_int_eq(json_integer_value(json_object_get(dram, "used_bytes")), MIB);
  ck_assert_int_eq(json_integer_value(json_object_get(dram, "capacity_bytes")), 8 * MIB);
  ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(dev, "l1"), "used_bytes")), 0);
  json_t *sessions = json_object_get(root, "sessions");
  ck_assert_uint_eq(json_array_size(sessions), 1); /* ttctl's own is left out */
  json_t *s = json_session(sessions, id);
  ck_assert_ptr_nonnull(s);
  ck_assert_str_eq(json_string_value(json_object_get(s, "client")), "trainer-7");
  ck_assert_str_eq(json_string_value(json_object_get(s, "tenant")), "local");
  ck_assert_int_eq(json_integer_value(json_object_get(s, "used_bytes")), MIB);
  ck_assert_int_eq(json_integer_value(json_object_get(s, "tensors")), 1);
  ck_assert_int_eq(json_integer_value(json_object_get(s, "quota_bytes")), 0);
  ck_assert(json_is_integer(json_object_get(s, "age_ms")) && json_is_integer(json_object_get(s, "idle_ms")));
  json_decref(root);
  free(out);
  tt_tensor_free(t);
  tt_disconnect(c);
}
END_TEST

/* sessions: the table, and --json (an option after the command works too). */
START_TEST(test_sessions) {
  tt_client *c = connect_named("trainer-7", NULL);
  tt_tensor *t = upload_mib(c);
  char id[17];
  session_hex(c, id);
  char *out = ttctl_expect(0, NULL, "--target %s sessions", proc.target);
  ck_assert_msg(strncmp(out, "SESSION", 7) == 0, "%s", out);
  char *row = line_starting(out, id);
  ck_assert_msg(row && strstr(row, "trainer-7") && strstr(row, "1.00 MiB"), "%s", out);
  free(row);
  free(out);
  out = ttctl_expect(0, NULL, "sessions --target %s --json", proc.target);
  json_t *root = parse_json(out);
  json_t *s = json_session(json_object_get(root, "sessions"), id);
  ck_assert_ptr_nonnull(s);
  ck_assert_int_eq(json_integer_value(json_object_get(s, "used_bytes")), MIB);
  char peer[64]; /* the gate read this process's credentials at accept */
  snprintf(peer, sizeof(peer), "unix:uid=%u,pid=%d", (unsigned)geteuid(), (int)getpid());
  ck_assert_str_eq(json_string_value(json_object_get(s, "peer")), peer);
  json_decref(root);
  free(out);
  tt_tensor_free(t);
  tt_disconnect(c);
  /* With no session but ttctl's own, it says so. */
  out = ttctl_expect(0, NULL, "--target %s sessions", proc.target);
  ck_assert_str_eq(out, "no sessions open\n");
  free(out);
}
END_TEST

/* kill frees the session's memory at once, and its owner's next call is NOT_FOUND; killing
 * it again is an RPC failure (1), and a malformed id bad usage (2). */
START_TEST(test_kill) {
  tt_client *c = connect_named("trainer-7", NULL);
  tt_tensor *t = upload_mib(c);
  char id[17];
  session_hex(c, id);
  char *out = ttctl_expect(0, NULL, "--target %s kill %s", proc.target, id);
  char want[128];
  snprintf(want, sizeof(want), "killed session %s: 1 tensor, 1.00 MiB freed\n", id);
  ck_assert_str_eq(out, want);
  free(out);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 0);
  ck_assert_ptr_null(tt_to(t, "cpu"));
  ck_assert_int_eq(tt_errcode(c), TT_NOT_FOUND);

  char *err;
  ck_assert_int_eq(ttctl_run(NULL, &out, &err, "--target %s kill %s", proc.target, id), 1);
  ck_assert_msg(strncmp(err, "ttctl: NOT_FOUND: ", 18) == 0 && strstr(err, id), "%s", err);
  ck_assert_str_eq(out, "");
  free(out);
  free(err);
  const char *bad[] = {"zz", "0123", "0123456789abcdeg", "0123456789abcdef0", "-1"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    ck_assert_int_eq(ttctl_run(NULL, &out, &err, "--target %s kill -- %s", proc.target, bad[i]), 2);
    ck_assert_msg(strstr(err, "is not a session id") && strstr(err, "see ttctl --help"), "%s", err);
    free(out);
    free(err);
  }
  free(ttctl_expect(2, NULL, "--target %s kill", proc.target));
  tt_tensor_free(t);
  tt_disconnect(c);
}
END_TEST

/* kill --json: the counts as numbers. */
START_TEST(test_kill_json) {
  tt_client *c = connect_named("trainer-7", NULL);
  tt_tensor *t = upload_mib(c);
  char id[17];
  session_hex(c, id);
  char *out = ttctl_expect(0, NULL, "--target %s --json kill %s", proc.target, id);
  json_t *root = parse_json(out);
  ck_assert_str_eq(json_string_value(json_object_get(root, "session")), id);
  ck_assert_int_eq(json_integer_value(json_object_get(root, "tensors_freed")), 1);
  ck_assert_int_eq(json_integer_value(json_object_get(root, "bytes_freed")), MIB);
  json_decref(root);
  free(out);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 0);
  tt_tensor_free(t);
  tt_disconnect(c);
}
END_TEST

/* ping: exit 0 with the instance id; --count and --json; TTD_ADDRESS stands in for --target. */
START_TEST(test_ping) {
  tt_client *c = connect_named("trainer-7", NULL);
  char *out = ttctl_expect(0, NULL, "--target %s ping", proc.target);
  ck_assert_msg(strstr(out, tt_instance_id(c)) && strstr(out, "5 round trips") && strstr(out, "median"), "%s", out);
  free(out);
  out = ttctl_expect(0, NULL, "--target %s ping --count 3 --json", proc.target);
  json_t *root = parse_json(out);
  ck_assert_str_eq(json_string_value(json_object_get(root, "instance")), tt_instance_id(c));
  ck_assert_int_eq(json_integer_value(json_object_get(root, "count")), 3);
  json_int_t lo = json_integer_value(json_object_get(root, "min_us"));
  json_int_t mid = json_integer_value(json_object_get(root, "median_us"));
  json_int_t hi = json_integer_value(json_object_get(root, "max_us"));
  ck_assert_msg(lo > 0 && lo <= mid && mid <= hi && hi < 10000000, "%lld %lld %lld", lo, mid, hi);
  json_decref(root);
  free(out);
  setenv("TTD_ADDRESS", proc.target, 1);
  out = ttctl_expect(0, NULL, "ping --count=1");
  ck_assert_msg(strstr(out, proc.target) && strstr(out, tt_instance_id(c)) && strstr(out, "1 round trip,"), "%s",
                out);
  free(out);
  unsetenv("TTD_ADDRESS");
  free(ttctl_expect(2, NULL, "--target %s ping --count 0", proc.target));
  free(ttctl_expect(2, NULL, "--target %s ping --count 5x", proc.target));
  tt_disconnect(c);
}
END_TEST

/* Bad usage exits 2 with the usage on stderr; --help exits 0 with it on stdout. */
START_TEST(test_usage) {
  const char *bad[] = {"",
                       "frobnicate",
                       "--bogus status",
                       "status --target",
                       "status extra",
                       "--json=1 status",
                       "--count 3 status",
                       "--admin sessions",
                       "-x status",
                       "token",
                       "token new",
                       "--json token new alice"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    char *out, *err;
    ck_assert_msg(ttctl_run(NULL, &out, &err, "--target %s %s", proc.target, bad[i]) == 2, "ttctl %s", bad[i]);
    /* One line naming the mistake and where help is, not the whole help. */
    ck_assert_msg(strncmp(err, "ttctl: ", 7) == 0 && strstr(err, "; see ttctl --help\n") && !strstr(err, "usage:") &&
                  strchr(err, '\n') == err + strlen(err) - 1, "ttctl %s: %s", bad[i], err);
    ck_assert_str_eq(out, "");
    free(out);
    free(err);
  }
  char *out = ttctl_expect(0, NULL, "--help");
  ck_assert_msg(strncmp(out, "usage: ttctl", 12) == 0 && strstr(out, "kill SESSION"), "%s", out);
  free(out);
  out = ttctl_expect(0, NULL, "--version");
  ck_assert_msg(strncmp(out, "ttctl 1.", 8) == 0 && strstr(out, "protocol ttd.v1") && strchr(out, '\n') == out + strlen(out) - 1,
                "%s", out);
  free(out);
}
END_TEST

/* No daemon at the target: an RPC failure, exit 1, UNAVAILABLE naming the target. */
START_TEST(test_unreachable) {
  char *out, *err;
  ck_assert_int_eq(ttctl_run(NULL, &out, &err, "--target unix:%s/nobody.sock status", proc.dir), 1);
  ck_assert_msg(strncmp(err, "ttctl: UNAVAILABLE: ", 20) == 0 && strstr(err, "nobody.sock"), "%s", err);
  ck_assert_str_eq(out, "");
  free(out);
  free(err);
}
END_TEST

/* The two lines of token new: a token, and its tokens-file line. */
static void token_new(const char *args, char *out_token, size_t token_size, char *out_line, size_t line_size) {
  char *out = ttctl_expect(0, NULL, "token new %s", args);
  char *nl = strchr(out, '\n');
  ck_assert_msg(nl && strchr(nl + 1, '\n') && strchr(nl + 1, '\n')[1] == '\0', "not two lines: %s", out);
  *nl = '\0';
  *strchr(nl + 1, '\n') = '\0';
  snprintf(out_token, token_size, "%s", out);
  snprintf(out_line, line_size, "%s", nl + 1);
  free(out);
}

/* token new prints a fresh token and a line whose digest is token hash's (and the daemon
 * helper's) of that token; bad names, sizes and empty input are usage errors. */
START_TEST(test_token_new_and_hash) {
  find_ttctl();
  char token[128], line[256], token2[128], line2[256];
  token_new("alice --quota 1G", token, sizeof(token), line, sizeof(line));
  ck_assert_uint_eq(strlen(token), 44);
  ck_assert_msg(strncmp(token, "ttd_", 4) == 0 && strspn(token + 4, "abcdefghijklmnopqrstuvwxyz234567") == 40, "%s",
                token);
  char name[64], digest[128], opt[64], extra[8];
  ck_assert_msg(sscanf(line, "%63s %127s %63s %7s", name, digest, opt, extra) == 3, "%s", line);
  ck_assert_str_eq(name, "alice");
  ck_assert_str_eq(opt, "quota=1G");
  char stdin_text[160];
  snprintf(stdin_text, sizeof(stdin_text), "%s\n", token);
  char *hashed = ttctl_expect(0, stdin_text, "token hash");
  char want[160];
  snprintf(want, sizeof(want), "%s\n", digest);
  ck_assert_str_eq(hashed, want);
  free(hashed);
  ttd_token_digest_text(token, strlen(token), want, sizeof(want));
  ck_assert_str_eq(digest, want);
  /* Without a trailing newline, the same. */
  hashed = ttctl_expect(0, token, "token hash");
  ck_assert_str_eq(hashed, strcat(want, "\n"));
  free(hashed);

  token_new("ops --admin", token2, sizeof(token2), line2, sizeof(line2));
  ck_assert_str_ne(token, token2);
  ck_assert_msg(strncmp(line2, "ops sha256:", 11) == 0 && strcmp(line2 + strlen(line2) - 6, " admin") == 0, "%s",
                line2);

  const char *bad[] = {"token new bad/name", "token new 'a b'", "token new ''", "token new alice --quota 12X",
                       "token new alice --quota 0", "token new alice bob", "token hash extra",
                       "token hash --admin"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) free(ttctl_expect(2, NULL, "%s", bad[i]));
  free(ttctl_expect(2, "", "token hash"));
  free(ttctl_expect(2, "one\ntwo\n", "token hash"));
}
END_TEST

/* A daemon with --tokens made by token new: the admin tenant lists sessions (by --token or
 * TTD_TOKEN), another tenant is PERMISSION_DENIED (but still sees devices in status), and
 * no token is UNAUTHENTICATED. */
START_TEST(test_tokens_daemon) {
  find_ttctl();
  unsetenv("TTD_TOKEN");
  char alice[128], alice_line[256], ops[128], ops_line[256];
  token_new("alice --quota 1G", alice, sizeof(alice), alice_line, sizeof(alice_line));
  token_new("ops --admin", ops, sizeof(ops), ops_line, sizeof(ops_line));
  char path[64];
  snprintf(path, sizeof(path), "/tmp/ttctl-tokens-%d", (int)getpid());
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fprintf(f, "%s\n%s\n", alice_line, ops_line);
  fclose(f);
  const char *args[] = {"--tokens", path, "--dram", "8M", NULL};
  ttd_proc_start(&proc, args);

  tt_client *c = connect_named("alice-job", alice);
  ck_assert_str_eq(tt_session_tenant(c), "alice");
  tt_tensor *t = upload_mib(c);
  char id[17];
  session_hex(c, id);
  char *out = ttctl_expect(0, NULL, "--target %s --token %s sessions", proc.target, ops);
  char *row = line_starting(out, id);
  ck_assert_msg(row && strstr(row, "alice") && strstr(row, "alice-job") && strstr(row, "1.00 GiB"), "%s", out);
  free(row);
  free(out);

  char *err;
  ck_assert_int_eq(ttctl_run(NULL, &out, &err, "--target %s --token %s sessions", proc.target, alice), 1);
  ck_assert_msg(strncmp(err, "ttctl: PERMISSION_DENIED: ", 26) == 0, "%s", err);
  free(out);
  free(err);
  ck_assert_int_eq(ttctl_run(NULL, &out, &err, "--target %s --token %s kill %s", proc.target, alice, id), 1);
  ck_assert_msg(strncmp(err, "ttctl: PERMISSION_DENIED: ", 26) == 0, "%s", err);
  free(out);
  free(err);
  ck_assert_int_eq(ttctl_run(NULL, &out, &err, "--target %s sessions", proc.target), 1);
  ck_assert_msg(strncmp(err, "ttctl: UNAUTHENTICATED: ", 24) == 0, "%s", err);
  free(out);
  free(err);

  /* status as alice: the devices, and a note instead of the sessions. */
  ck_assert_int_eq(ttctl_run(NULL, &out, &err, "--target %s --token %s status", proc.target, alice), 0);
  row = line_starting(out, "tt:0 ");
  ck_assert_msg(row && strstr(row, "1.00 MiB / 8.00 MiB"), "%s", out);
  ck_assert_msg(strstr(out, "SESSION") == NULL && strstr(err, "sessions not shown"), "%s\n%s", out, err);
  free(row);
  free(out);
  free(err);

  /* TTD_TOKEN is honoured. */
  setenv("TTD_TOKEN", ops, 1);
  out = ttctl_expect(0, NULL, "--target %s --json sessions", proc.target);
  json_t *root = parse_json(out);
  json_t *s = json_session(json_object_get(root, "sessions"), id);
  ck_assert_ptr_nonnull(s);
  ck_assert_str_eq(json_string_value(json_object_get(s, "tenant")), "alice");
  ck_assert_int_eq(json_integer_value(json_object_get(s, "quota_bytes")), 1024 * MIB);
  json_decref(root);
  free(out);

  tt_tensor_free(t);
  tt_disconnect(c);
  ck_assert_uint_eq(harness_wait_used_bytes(&proc, 0, 0, 0, 2000), 0);
  unsetenv("TTD_TOKEN");
  ck_assert_int_eq(ttd_proc_stop(&proc), 0);
  unlink(path);
}
END_TEST

Suite *e2e_ttctl_suite(void) {
  Suite *s = suite_create("e2e_ttctl");
  TCase *tc = tcase_create("daemon");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_status_table);
  tcase_add_test(tc, test_status_json);
  tcase_add_test(tc, test_sessions);
  tcase_add_test(tc, test_kill);
  tcase_add_test(tc, test_kill_json);
  tcase_add_test(tc, test_ping);
  tcase_add_test(tc, test_usage);
  tcase_add_test(tc, test_unreachable);
  suite_add_tcase(s, tc);
  TCase *tokens = tcase_create("tokens");
  tcase_set_timeout(tokens, 60);
  tcase_add_test(tokens, test_token_new_and_hash);
  tcase_add_test(tokens, test_tokens_daemon);
  suite_add_tcase(s, tokens);
  return s;
}
