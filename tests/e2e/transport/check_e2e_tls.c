/* Remote access through a real ttd: TCP listeners need TLS (or an explicit --insecure),
 * mutual TLS checks client certificates against --tls-client-ca, and Unix sockets are
 * mode 0660 with a configurable group. Certificates are made for each run with the
 * openssl command: a CA, a server certificate for 127.0.0.1 and localhost, a client
 * certificate from the CA, and a client certificate from an unrelated CA. ttd ends TLS
 * itself: a flood of HTTP/2 resets over TLS is closed before gRPC reads it, and TLS peers
 * meet the handshake timeout and the per-peer connection bound. */
#include <check.h>
#include <errno.h>
#include <grp.h>
#include <signal.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "wire/tokens.h"
#include "h2_flood.h"
#include "suites.h"
#include "ttd_harness.h"

static char dir[64];
static ttd_proc proc;
static char tcp[32];
static int tcp_port;
static char token[64], tokens_file[96]; /* tenant "remote" */

static void path(char *out, size_t size, const char *name) { snprintf(out, size, "%s/%s", dir, name); }

static void run(const char *fmt, const char *a) {
  char cmd[2048];
  snprintf(cmd, sizeof(cmd), fmt, a, a, a, a, a, a, a, a, a, a);
  int rc = system(cmd);
  ck_assert_msg(rc == 0, "command failed (%d): %s", rc, cmd);
}

/* Makes ca, server, client (signed by ca) and rogue-ca, rogue-client. */
static void make_certs(void) {
  snprintf(dir, sizeof(dir), "/tmp/ttd-tls-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(dir));
  run("cd %s && printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > server.ext && "
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=ttd-test-ca "
      "-keyout ca.key -out ca.pem 2>/dev/null && "
      "openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=localhost -keyout server.key "
      "-out server.csr 2>/dev/null && "
      "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile server.ext "
      "-out server.pem 2>/dev/null && "
      "openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=alice -keyout client.key "
      "-out client.csr 2>/dev/null && "
      "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -out client.pem 2>/dev/null && "
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=rogue-ca "
      "-keyout rogue-ca.key -out rogue-ca.pem 2>/dev/null && "
      "openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=mallory -keyout rogue-client.key "
      "-out rogue-client.csr 2>/dev/null && "
      "openssl x509 -req -in rogue-client.csr -CA rogue-ca.pem -CAkey rogue-ca.key -CAcreateserial -days 2 "
      "-out rogue-client.pem 2>/dev/null",
      dir);
}

static void setup(void) {
  make_certs();
  tcp_port = harness_free_tcp_port();
  snprintf(tcp, sizeof(tcp), "127.0.0.1:%d", tcp_port);
  ttd_token_generate(token, sizeof(token));
  char digest[80];
  ttd_token_digest_text(token, strlen(token), digest, sizeof(digest));
  path(tokens_file, sizeof(tokens_file), "tokens");
  FILE *f = fopen(tokens_file, "w");
  fprintf(f, "remote %s admin\n", digest);
  fclose(f);
}

static void teardown(void) {
  unsetenv("TTD_TOKEN");
  if (proc.pid) ck_assert_int_eq(ttd_proc_stop(&proc), 0);
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  ck_assert_int_eq(system(cmd), 0);
}

/* TLS needs tokens to say who may call; mutual TLS alone is enough (only clients with
 * certificates from the CA get in). extra: more arguments (NULL-terminated), or NULL. */
static void start_tls_with(int mutual, const char *const *extra) {
  char cert[96], key[96], ca[96];
  path(cert, sizeof(cert), "server.pem");
  path(key, sizeof(key), "server.key");
  path(ca, sizeof(ca), "ca.pem");
  const char *args[24] = {"--listen", tcp, "--tls-cert", cert, "--tls-key", key,
                          mutual ? "--tls-client-ca" : "--tokens", mutual ? ca : tokens_file};
  for (int i = 0, n = 8; extra && extra[i] && n < 23; i++) args[n++] = extra[i];
  ttd_proc_start(&proc, args);
  if (!mutual) setenv("TTD_TOKEN", token, 1);
}

static void start_tls(int mutual) { start_tls_with(mutual, NULL); }

/* Connects over TCP with the given files (names in dir, NULL for none); returns the status
 * and, when it worked, checks a round trip of data. */
static char last_error[2048]; /* connect_tcp's client's last error */
static int64_t transfer_floats = 1000; /* the tensor connect_tcp moves there and back */

/* Connects to tcp with the given files of dir (NULL: none), moves a tensor there and back;
 * the status of the connection, and its error text in last_error. */
static tt_status connect_tcp(const char *ca, const char *cert, const char *key, int insecure) {
  char ca_path[96], cert_path[96], key_path[96];
  tt_connect_options o;
  tt_connect_options_init(&o);
  o.disable_keepalive = 1;
  o.call_timeout_ms = 5000;
  o.insecure = insecure;
  if (ca) path(ca_path, sizeof(ca_path), ca), o.tls_ca_file = ca_path;
  if (cert) path(cert_path, sizeof(cert_path), cert), o.tls_cert_file = cert_path;
  if (key) path(key_path, sizeof(key_path), key), o.tls_key_file = key_path;
  tt_client *c = NULL;
  tt_status st = tt_connect(tcp, &o, &c);
  /* A loaded machine can fail the very first TCP connection attempt; gRPC then fails the
   * call fast with UNAVAILABLE. One retry tells that apart from a refused handshake, which
   * fails again. */
  if (st == TT_UNAVAILABLE) {
    tt_disconnect(c);
    struct timespec pause = {0, 200000000};
    nanosleep(&pause, NULL);
    c = NULL;
    st = tt_connect(tcp, &o, &c);
  }
  if (st == TT_OK) {
    int64_t n = transfer_floats;
    float *data = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) data[i] = (float)i * 0.5f;
    tt_tensor *h = tt_tensor_from_host(c, data, TT_FLOAT32, &n, 1);
    tt_tensor *d = tt_to(h, "tt");
    ck_assert_ptr_nonnull(d);
    tt_tensor *back = tt_to(d, "cpu");
    ck_assert_ptr_nonnull(back);
    ck_assert_int_eq(memcmp(tt_tensor_data(back), data, (size_t)n * sizeof(float)), 0);
    tt_tensor_free(back);
    tt_tensor_free(d);
    tt_tensor_free(h);
    free(data);
  }
  snprintf(last_error, sizeof(last_error), "%s", c ? tt_last_error(c) : "");
  tt_disconnect(c);
  return st;
}

/* Starts ttd with args and expects it to refuse to start (exit 1) with needle in its log. */
static void expect_refused(const char *const *args, const char *needle) {
  char log[96];
  path(log, sizeof(log), "refused.log");
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    FILE *f = freopen(log, "w", stderr);
    (void)f;
    const char *argv[24] = {getenv("TTD_BIN") ? getenv("TTD_BIN") : "build/bin/ttd", "--admin", "off"};
    int n = 3;
    for (int i = 0; args[i] && n < 23; i++) argv[n++] = args[i];
    argv[n] = NULL;
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  int status;
  waitpid(pid, &status, 0);
  ck_assert(WIFEXITED(status));
  ck_assert_int_eq(WEXITSTATUS(status), 1);
  char text[4096] = "";
  FILE *f = fopen(log, "r");
  size_t n = fread(text, 1, sizeof(text) - 1, f);
  text[n] = '\0';
  fclose(f);
  ck_assert_msg(strstr(text, needle), "log lacks '%s':\n%s", needle, text);
}

START_TEST(test_tcp_needs_tls_or_insecure) {
  /* Without tokens (or client certificates) every caller would be the admin: refused. */
  const char *open_door[] = {"--listen", tcp, NULL};
  expect_refused(open_door, "without --tokens every caller would be the tenant 'local'");
  char cert[96], key[96], ca[96];
  path(cert, sizeof(cert), "server.pem");
  path(key, sizeof(key), "server.key");
  path(ca, sizeof(ca), "ca.pem");
  const char *tls_no_tokens[] = {"--listen", tcp, "--tls-cert", cert, "--tls-key", key, NULL};
  expect_refused(tls_no_tokens, "pass --tokens FILE");
  const char *abstract[] = {"--listen", "unix-abstract:ttd-test", NULL};
  expect_refused(abstract, "listener unix-abstract:ttd-test is not guarded");
  const char *ca_alone[] = {"--listen", tcp, "--tls-client-ca", ca, "--insecure", NULL};
  expect_refused(ca_alone, "--tls-client-ca needs --tls-cert and --tls-key");
  /* With tokens, TCP still needs TLS. */
  const char *plain[] = {"--listen", tcp, "--tokens", tokens_file, NULL};
  expect_refused(plain, "needs TLS: pass --tls-cert and --tls-key");
  const char *half[] = {"--listen", tcp, "--tokens", tokens_file, "--tls-cert", cert, NULL};
  expect_refused(half, "TLS needs both --tls-cert and --tls-key");
  const char *not_pem[] = {"--listen", tcp, "--tokens", tokens_file, "--tls-cert", cert, "--tls-key", "/etc/hostname", NULL};
  expect_refused(not_pem, "must be PEM files");
  const char *missing[] = {"--listen", tcp, "--tokens", tokens_file, "--tls-cert", "/nonexistent.pem", "--tls-key", cert, NULL};
  expect_refused(missing, "cannot open TLS certificate /nonexistent.pem");
  /* A key that is not the certificate's, or a PEM file of another kind, is named. */
  char client_key[96];
  path(client_key, sizeof(client_key), "client.key");
  const char *foreign_key[] = {"--listen", tcp, "--tokens", tokens_file, "--tls-cert", cert, "--tls-key", client_key, NULL};
  expect_refused(foreign_key, "is not the key of the certificate in --tls-cert");
  const char *cert_as_key[] = {"--listen", tcp, "--tokens", tokens_file, "--tls-cert", cert, "--tls-key", cert, NULL};
  expect_refused(cert_as_key, "holds no PEM private key");
  const char *key_as_cert[] = {"--listen", tcp, "--tokens", tokens_file, "--tls-cert", key, "--tls-key", key, NULL};
  expect_refused(key_as_cert, "holds no PEM certificate");
  /* A port in use is said to be in use. */
  const char *in_use_args[] = {"--listen", tcp, "--insecure", NULL};
  ttd_proc first;
  ttd_proc_start(&first, in_use_args);
  expect_refused(in_use_args, "address in use");
  ck_assert_int_eq(ttd_proc_stop(&first), 0);
  /* --insecure serves plain text and says so in the log. */
  const char *args[] = {"--listen", tcp, "--insecure", NULL};
  ttd_proc_start(&proc, args);
  ck_assert_int_eq(connect_tcp(NULL, NULL, NULL, 1), TT_OK);
  ck_assert_int_eq(ttd_proc_stop(&proc), 0);
}
END_TEST

START_TEST(test_tls) {
  start_tls(0);
  ck_assert_int_eq(connect_tcp("ca.pem", NULL, NULL, 0), TT_OK);
  /* A client that does not trust the CA, or speaks plain text, gets nowhere. */
  /* Each says what went wrong, not "is ttd running?". */
  ck_assert_int_eq(connect_tcp("rogue-ca.pem", NULL, NULL, 0), TT_UNAVAILABLE);
  ck_assert_msg(strstr(last_error, "TLS handshake with ttd at") && strstr(last_error, "not signed by a CA this client trusts"),
                "%s", last_error);
  ck_assert_int_eq(connect_tcp(NULL, NULL, NULL, 1), TT_UNAVAILABLE);
  ck_assert_msg(strstr(last_error, "closed the connection during setup: a TLS listener refuses plain text"), "%s",
                last_error);
  ck_assert(!strstr(last_error, "is ttd running"));
  /* The Unix socket beside it still serves (plain: its file mode guards it). */
  tt_client *c = harness_connect(&proc, 0);
  tt_disconnect(c);
  /* Bad client-side files are named. */
  tt_connect_options o;
  tt_connect_options_init(&o);
  o.tls_ca_file = "/nonexistent/ca.pem";
  c = NULL;
  ck_assert_int_eq(tt_connect(tcp, &o, &c), TT_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(tt_last_error(c), "/nonexistent/ca.pem"));
  tt_disconnect(c);
  char cert[96];
  path(cert, sizeof(cert), "client.pem");
  tt_connect_options_init(&o);
  o.tls_cert_file = cert;
  ck_assert_int_eq(tt_connect(tcp, &o, &c), TT_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(tt_last_error(c), "both a client certificate and its key"));
  tt_disconnect(c);
  char log[512];
  snprintf(log, sizeof(log), "grep -q 'event=listening address=%s tls=yes' %s", tcp, proc.log_path);
  ck_assert_int_eq(system(log), 0);
}
END_TEST

START_TEST(test_mutual_tls) {
  start_tls(1);
  ck_assert_int_eq(connect_tcp("ca.pem", "client.pem", "client.key", 0), TT_OK);
  /* No client certificate, or one from another CA: refused in the handshake. */
  ck_assert_int_eq(connect_tcp("ca.pem", NULL, NULL, 0), TT_UNAVAILABLE);
  ck_assert_msg(strstr(last_error, "client certificate"), "%s", last_error);
  ck_assert_int_eq(connect_tcp("ca.pem", "rogue-client.pem", "rogue-client.key", 0), TT_UNAVAILABLE);
  ck_assert_msg(strstr(last_error, "client certificate") || strstr(last_error, "tls_cert_file"), "%s", last_error);
  /* The environment variables work like the options. */
  char ca[96], cert[96], key[96];
  path(ca, sizeof(ca), "ca.pem");
  path(cert, sizeof(cert), "client.pem");
  path(key, sizeof(key), "client.key");
  setenv("TTD_TLS_CA", ca, 1);
  setenv("TTD_TLS_CERT", cert, 1);
  setenv("TTD_TLS_KEY", key, 1);
  ck_assert_int_eq(connect_tcp(NULL, NULL, NULL, 0), TT_OK);
  unsetenv("TTD_TLS_CA");
  unsetenv("TTD_TLS_CERT");
  unsetenv("TTD_TLS_KEY");
  char log[512];
  snprintf(log, sizeof(log), "grep -q 'event=listening address=%s tls=mutual' %s", tcp, proc.log_path);
  ck_assert_int_eq(system(log), 0);
}
END_TEST

/* A TLS session with the daemon over a fresh TCP connection (ALPN h2, the server checked
 * against ca.pem), its socket in *out_fd; NULL when the handshake failed. */
static SSL *tls_open(SSL_CTX **out_ctx, int *out_fd) {
  char ca[96];
  path(ca, sizeof(ca), "ca.pem");
  *out_ctx = SSL_CTX_new(TLS_client_method());
  ck_assert_ptr_nonnull(*out_ctx);
  ck_assert_int_eq(SSL_CTX_load_verify_locations(*out_ctx, ca, NULL), 1);
  SSL_CTX_set_verify(*out_ctx, SSL_VERIFY_PEER, NULL);
  static const unsigned char h2[] = {2, 'h', '2'};
  ck_assert_int_eq(SSL_CTX_set_alpn_protos(*out_ctx, h2, sizeof(h2)), 0);
  *out_fd = harness_tcp_connect(tcp_port);
  ck_assert_int_ge(*out_fd, 0);
  SSL *ssl = SSL_new(*out_ctx);
  SSL_set_fd(ssl, *out_fd);
  SSL_set_tlsext_host_name(ssl, "localhost");
  if (SSL_connect(ssl) != 1) {
    SSL_free(ssl);
    ERR_clear_error();
    return NULL;
  }
  return ssl;
}

static int write_tls(void *arg, const void *buf, size_t len) {
  return SSL_write(arg, buf, (int)len) == (int)len ? 0 : -1;
}

/* Whether the daemon ended the TLS session within ms (a read returns 0 or fails other than
 * by a timeout of the socket's 300 ms). */
static int tls_closed_within(SSL *ssl, int ms) {
  char buf[4096];
  for (int waited = 0; waited < ms;) {
    ERR_clear_error();
    int n = SSL_read(ssl, buf, sizeof(buf));
    if (n > 0) continue;
    int err = SSL_get_error(ssl, n);
    if (err != SSL_ERROR_WANT_READ && !(err == SSL_ERROR_SYSCALL && (errno == EAGAIN || errno == EWOULDBLOCK))) {
      ERR_clear_error();
      return 1;
    }
    waited += 300;
  }
  return 0;
}

/* HTTP/2 rapid reset over TLS: 200000 HEADERS+RST_STREAM pairs from an OpenSSL client. ttd
 * ends TLS itself and counts the frames before gRPC reads them: the session is closed, the
 * daemon's peak memory grows by less than 64 MiB, and a client on another connection is
 * served. */
START_TEST(test_tls_rapid_reset) {
  signal(SIGPIPE, SIG_IGN); /* SSL_write to the closed connection */
  start_tls(0);
  long hwm_before = harness_hwm_kib(&proc);
  SSL_CTX *ctx;
  int fd;
  SSL *ssl = tls_open(&ctx, &fd);
  ck_assert_msg(ssl != NULL, "TLS handshake with ALPN h2 failed");
  const unsigned char *alpn = NULL;
  unsigned alpn_len = 0;
  SSL_get0_alpn_selected(ssl, &alpn, &alpn_len);
  ck_assert_int_eq(alpn_len, 2);
  ck_assert_int_eq(memcmp(alpn, "h2", 2), 0);
  int sent = h2_flood_rapid_reset(write_tls, ssl, "/ttd.v1.Device/ListDevices", 200000);
  ck_assert_int_eq(sent < 200000 || tls_closed_within(ssl, 5000), 1);
  SSL_free(ssl);
  SSL_CTX_free(ctx);
  close(fd);
  for (int i = 0; i < 50 && harness_log_count(&proc, "event=rapid-reset action=closed") == 0; i++) usleep(100 * 1000);
  ck_assert_int_ge(harness_log_count(&proc, "event=rapid-reset action=closed peer=\"ipv4:127.0.0.1:"), 1);
  long grown = harness_hwm_kib(&proc) - hwm_before;
  ck_assert_msg(grown < 64 * 1024, "the flood (%d pairs sent) grew ttd's peak memory by %ld KiB", sent, grown);
  ck_assert_int_eq(connect_tcp("ca.pem", NULL, NULL, 0), TT_OK);
}
END_TEST

/* With --handshake-timeout 500ms, a TCP connection to a TLS listener that sends nothing is
 * closed after it, not before; so is one that finishes the handshake and sends no HTTP/2
 * preface, and one that sends the preface and SETTINGS (acknowledging ttd's) but no call;
 * one that made a call stays open past it. */
START_TEST(test_tls_handshake_timeout) {
  signal(SIGPIPE, SIG_IGN);
  const char *extra[] = {"--handshake-timeout", "500ms", NULL};
  start_tls_with(0, extra);
  int idle = harness_tcp_connect(tcp_port);
  ck_assert_int_ge(idle, 0);
  SSL_CTX *ctx, *ctx_no_call, *ctx_called;
  int fd, fd_no_call, fd_called;
  SSL *mute = tls_open(&ctx, &fd), *no_call = tls_open(&ctx_no_call, &fd_no_call);
  SSL *called = tls_open(&ctx_called, &fd_called);
  ck_assert_ptr_nonnull(mute);
  ck_assert_ptr_nonnull(no_call);
  ck_assert_ptr_nonnull(called);
  static const char settings[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
                                 "\0\0\0\4\0\0\0\0\0"  /* SETTINGS */
                                 "\0\0\0\4\1\0\0\0\0"; /* SETTINGS ACK */
  ck_assert_int_eq(write_tls(no_call, settings, sizeof(settings) - 1), 0);
  ck_assert_int_eq(h2_flood_calls(write_tls, called, "/ttd.v1.Device/ListDevices", 1, 0), 1);
  ck_assert_int_eq(harness_closed_within(idle, 300), 0);
  ck_assert_int_eq(harness_closed_within(idle, 3000), 1);
  ck_assert_int_eq(tls_closed_within(mute, 3000), 1);
  ck_assert_int_eq(tls_closed_within(no_call, 3000), 1);
  ck_assert_int_eq(tls_closed_within(called, 1500), 0);
  SSL *ssls[] = {mute, no_call, called};
  SSL_CTX *ctxs[] = {ctx, ctx_no_call, ctx_called};
  int fds[] = {fd, fd_no_call, fd_called};
  for (int i = 0; i < 3; i++) {
    SSL_free(ssls[i]);
    SSL_CTX_free(ctxs[i]);
    close(fds[i]);
  }
  close(idle);
  ck_assert_int_ge(harness_log_count(&proc, "event=handshake-timeout"), 1);
  ck_assert_int_eq(connect_tcp("ca.pem", NULL, NULL, 0), TT_OK);
}
END_TEST

/* TLS connections count against --max-peer-connections: of 5 from 127.0.0.1 with a bound
 * of 2, 3 are closed at once; once they are gone a client is served. */
START_TEST(test_tls_peer_bound) {
  const char *extra[] = {"--max-peer-connections", "2", NULL};
  start_tls_with(0, extra);
  int fds[5], closed = 0;
  for (int i = 0; i < 5; i++) ck_assert_int_ge(fds[i] = harness_tcp_connect(tcp_port), 0);
  for (int i = 0; i < 5; i++) closed += harness_closed_within(fds[i], 600);
  ck_assert_int_eq(closed, 3);
  ck_assert_int_ge(harness_log_count(&proc, "--max-peer-connections reached"), 1);
  for (int i = 0; i < 5; i++) close(fds[i]);
  usleep(200 * 1000);
  ck_assert_int_eq(connect_tcp("ca.pem", NULL, NULL, 0), TT_OK);
}
END_TEST

/* 24 MiB there and back over TLS, and over --insecure plain TCP (where the relay splices
 * long frame payloads): every byte comes back. */
START_TEST(test_large_transfer_through_relay) {
  transfer_floats = 6 << 20;
  start_tls(0);
  ck_assert_int_eq(connect_tcp("ca.pem", NULL, NULL, 0), TT_OK);
  ck_assert_int_eq(ttd_proc_stop(&proc), 0);
  const char *args[] = {"--listen", tcp, "--insecure", NULL};
  ttd_proc_start(&proc, args);
  ck_assert_int_eq(connect_tcp(NULL, NULL, NULL, 1), TT_OK);
}
END_TEST

START_TEST(test_unix_socket_mode_and_group) {
  struct group *g = getgrgid(getegid());
  ck_assert_ptr_nonnull(g);
  char group[64];
  snprintf(group, sizeof(group), "%s", g->gr_name);
  const char *args[] = {"--socket-group", group, NULL};
  ttd_proc_start(&proc, args);
  struct stat st;
  ck_assert_int_eq(stat(proc.target + 5, &st), 0);
  ck_assert(S_ISSOCK(st.st_mode));
  ck_assert_int_eq(st.st_mode & 0777, 0660);
  ck_assert_int_eq(st.st_gid, getegid());
  ck_assert_int_eq(ttd_proc_stop(&proc), 0);
  char sock[96];
  path(sock, sizeof(sock), "x.sock");
  char listen[192];
  snprintf(listen, sizeof(listen), "unix:%s", sock);
  const char *bad[] = {"--listen", listen, "--socket-group", "no-such-group-ttd", NULL};
  expect_refused(bad, "--socket-group no-such-group-ttd: no such group");
  /* A socket folder others may write (no sticky bit) could let them replace the socket. */
  char open_dir[96], cmd[256];
  path(open_dir, sizeof(open_dir), "open");
  snprintf(cmd, sizeof(cmd), "mkdir -m 0777 '%s' && chmod 0777 '%s'", open_dir, open_dir);
  ck_assert_int_eq(system(cmd), 0);
  snprintf(listen, sizeof(listen), "unix:%s/ttd.sock", open_dir);
  const char *squatted[] = {"--listen", listen, NULL};
  expect_refused(squatted, "another user could replace the socket");
  /* Something that is not a socket at the path is not deleted. */
  snprintf(listen, sizeof(listen), "unix:%s/refused.log", dir);
  const char *not_socket[] = {"--listen", listen, NULL};
  expect_refused(not_socket, "exists and is not a socket");
}
END_TEST

Suite *e2e_tls_suite(void) {
  Suite *s = suite_create("e2e_tls");
  TCase *tc = tcase_create("tls");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_tcp_needs_tls_or_insecure);
  tcase_add_test(tc, test_tls);
  tcase_add_test(tc, test_mutual_tls);
  tcase_add_test(tc, test_unix_socket_mode_and_group);
  tcase_add_test(tc, test_tls_rapid_reset);
  tcase_add_test(tc, test_tls_handshake_timeout);
  tcase_add_test(tc, test_tls_peer_bound);
  tcase_add_test(tc, test_large_transfer_through_relay);
  suite_add_tcase(s, tc);
  return s;
}
