#define _GNU_SOURCE /* unshare */
#include "ttd_harness.h"

#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "wire/tokens.h"

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

int harness_unix_connect(const char *path, int type) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
  int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
  ck_assert_msg(fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0, "connect %s: %s", path, strerror(errno));
  return fd;
}

int harness_tcp_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  struct timeval tv = {0, 300 * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

int harness_closed_within(int fd, int ms) {
  char buf[4096];
  for (int waited = 0; waited < ms; waited += 300) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) return 1;
  }
  return 0;
}

void harness_token(char *token, size_t size, char *auth, size_t auth_size) {
  ttd_token_generate(token, size);
  snprintf(auth, auth_size, "Bearer %s", token);
}

void harness_write_tokens(const char *path, const char *const *names, const char *const *tokens,
                          const char *const *opts, int n) {
  FILE *f = fopen(path, "w");
  ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
  fprintf(f, "# test tenants\n\n");
  for (int i = 0; i < n; i++) {
    char digest[80];
    ttd_token_digest_text(tokens[i], strlen(tokens[i]), digest, sizeof(digest));
    fprintf(f, "%s  %s %s  # tenant %d\n", names[i], digest, opts[i], i);
  }
  fclose(f);
}

static int socket_answers(const char *path) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  int ok = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
  close(fd);
  return ok;
}

void ttd_proc_start(ttd_proc *proc, const char *const *extra_args) { ttd_proc_start_env(proc, extra_args, NULL); }

/* Starts ttd in proc's folder, its log truncated or appended to, and waits until it answers. */
static void spawn(ttd_proc *proc, const char *const *extra_args, const char *const *env, int append_log) {
  const char *bin = getenv("TTD_BIN");
  if (!bin) bin = "build/bin/ttd";
  const char *argv[64];
  int n = 0;
  argv[n++] = bin;
  argv[n++] = "--listen";
  argv[n++] = proc->target;
  argv[n++] = "--log-level";
  argv[n++] = "debug";
  int has_admin = 0;
  for (int i = 0; extra_args && extra_args[i]; i++) has_admin |= strcmp(extra_args[i], "--admin") == 0;
  if (!has_admin) { /* many daemons start during the tests: no fixed admin port unless asked */
    argv[n++] = "--admin";
    argv[n++] = "off";
  }
  for (int i = 0; extra_args && extra_args[i] && n < 62; i++) argv[n++] = extra_args[i];
  argv[n] = NULL;
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* a test that fails mid-way leaves no daemon behind */
    int fd = open(proc->log_path, O_WRONLY | O_CREAT | (append_log ? O_APPEND : O_TRUNC), 0644);
    if (fd >= 0) {
      dup2(fd, 2);
      dup2(fd, 1);
    }
    for (int i = 0; env && env[i]; i++) putenv((char *)env[i]);
    if (proc->own_netns && unshare(CLONE_NEWNET) != 0) _exit(126); /* the parent checked it may */
    execv(bin, (char *const *)argv);
    _exit(127);
  }
  proc->pid = pid;
  for (int waited = 0; waited < 10000; waited += 10) {
    /* Every listener is bound once the daemon logged event=ready (a TCP one may come
     * after the Unix socket already answers). */
    if (socket_answers(proc->target + 5) && harness_log_count(proc, "event=ready") > proc->starts) {
      proc->starts++;
      return;
    }
    int status;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      proc->pid = 0;
      ck_abort_msg("ttd (%s) exited during start with status %d; see %s", bin, status, proc->log_path);
    }
    sleep_ms(10);
  }
  ck_abort_msg("ttd did not answer on %s within 10 s", proc->target);
}

void ttd_proc_start_env(ttd_proc *proc, const char *const *extra_args, const char *const *env) {
  memset(proc, 0, sizeof(*proc));
  snprintf(proc->dir, sizeof(proc->dir), "/tmp/ttd-test-XXXXXX");
  ck_assert_msg(mkdtemp(proc->dir) != NULL, "mkdtemp: %s", strerror(errno));
  snprintf(proc->target, sizeof(proc->target), "unix:%s/ttd.sock", proc->dir);
  snprintf(proc->log_path, sizeof(proc->log_path), "%s/ttd.log", proc->dir);
  spawn(proc, extra_args, env, 0);
}

void ttd_proc_start_isolated(ttd_proc *proc, const char *const *extra_args) {
  memset(proc, 0, sizeof(*proc));
  snprintf(proc->dir, sizeof(proc->dir), "/tmp/ttd-test-XXXXXX");
  ck_assert_msg(mkdtemp(proc->dir) != NULL, "mkdtemp: %s", strerror(errno));
  snprintf(proc->target, sizeof(proc->target), "unix:%s/ttd.sock", proc->dir);
  snprintf(proc->log_path, sizeof(proc->log_path), "%s/ttd.log", proc->dir);
  /* Whether this process may make a network namespace: try it in a child. */
  pid_t probe = fork();
  ck_assert_int_ge(probe, 0);
  if (probe == 0) _exit(unshare(CLONE_NEWNET) == 0 ? 0 : 1);
  int status = 0;
  waitpid(probe, &status, 0);
  proc->own_netns = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  spawn(proc, extra_args, NULL, 0);
}

int ttd_proc_kill(ttd_proc *proc, int sig) {
  int status = -1;
  if (proc->pid) {
    kill(proc->pid, sig);
    waitpid(proc->pid, &status, 0);
    proc->pid = 0;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

void ttd_proc_respawn(ttd_proc *proc, const char *const *extra_args) { spawn(proc, extra_args, NULL, 1); }

int ttd_proc_start_admin(ttd_proc *proc) {
  char admin[32];
  int port = harness_free_tcp_port();
  snprintf(admin, sizeof(admin), "127.0.0.1:%d", port);
  const char *args[] = {"--admin", admin, "--devices", "2", NULL};
  ttd_proc_start(proc, args);
  return port;
}

/* A "Name:   N kB" line of the daemon's /proc/PID/status, or -1. */
static long status_kib(const ttd_proc *proc, const char *name) {
  char path[64], line[256];
  snprintf(path, sizeof(path), "/proc/%d/status", (int)proc->pid);
  FILE *f = fopen(path, "r");
  long kib = -1;
  size_t len = strlen(name);
  while (f && fgets(line, sizeof(line), f)) {
    if (strncmp(line, name, len) == 0) kib = atol(line + len);
  }
  if (f) fclose(f);
  return kib;
}

long harness_rss_kib(const ttd_proc *proc) { return status_kib(proc, "VmRSS:"); }

long harness_hwm_kib(const ttd_proc *proc) { return status_kib(proc, "VmHWM:"); }

int ttd_proc_alive(ttd_proc *proc) {
  if (!proc->pid) return 0;
  int status;
  return waitpid(proc->pid, &status, WNOHANG) == 0;
}

int ttd_proc_pause(ttd_proc *proc) {
  if (!proc->pid || kill(proc->pid, SIGSTOP) != 0) return -1;
  int status;
  /* The parent hears of the stop only once the whole thread group has stopped. */
  if (waitpid(proc->pid, &status, WUNTRACED) != proc->pid) return -1;
  return WIFSTOPPED(status) ? 0 : -1;
}

int ttd_proc_stop(ttd_proc *proc) {
  int status = -1;
  if (proc->pid) {
    kill(proc->pid, SIGTERM);
    for (int waited = 0; waited < 20000; waited += 10) {
      if (waitpid(proc->pid, &status, WNOHANG) == proc->pid) break;
      sleep_ms(10);
      if (waited + 10 >= 20000) {
        kill(proc->pid, SIGKILL);
        waitpid(proc->pid, &status, 0);
      }
    }
    proc->pid = 0;
  }
  char cmd[256];
  if (getenv("TTD_KEEP_LOGS") == NULL) {
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", proc->dir);
    if (system(cmd) != 0) { /* best effort */
    }
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

tt_client *harness_connect(const ttd_proc *proc, int keepalive) {
  tt_connect_options options;
  tt_connect_options_init(&options);
  options.disable_keepalive = !keepalive;
  options.client_name = "check";
  tt_client *c = NULL;
  tt_status st = tt_connect(proc->target, &options, &c);
  ck_assert_msg(st == TT_OK, "connect to %s: %s %s", proc->target, tt_status_name(st), tt_last_error(c));
  return c;
}

ttd_proc harness_proc;
tt_client *harness_client;

void harness_client_setup(void) {
  ttd_proc_start(&harness_proc, NULL);
  harness_client = harness_connect(&harness_proc, 1);
}

void harness_client_teardown(void) {
  tt_disconnect(harness_client);
  harness_client = NULL;
  ck_assert_int_eq(ttd_proc_stop(&harness_proc), 0);
}

void harness_tiny_net_make(tt_client *c, harness_tiny_net *net) {
  tt_graph *g = tt_graph_create(c, 7);
  int64_t xs[2] = {4, 3}, ys[2] = {4, 2};
  tt_value x = tt_graph_input(g, "x", TT_FLOAT32, xs, 2);
  ck_assert_int_eq(tt_graph_output(g, tt_relu(g, tt_nn_linear(g, x, 2, 1))), 0);
  net->m = tt_compile(c, g);
  tt_graph_free(g);
  ck_assert_ptr_nonnull(net->m);
  ck_assert_int_eq(tt_module_to(net->m, "tt"), TT_OK);
  net->h = tt_tensor_from_host(c, NULL, TT_FLOAT32, xs, 2);
  net->target = tt_tensor_from_host(c, NULL, TT_FLOAT32, ys, 2);
  for (int i = 0; i < 12; i++) ((float *)tt_tensor_data(net->h))[i] = (float)(i % 5) - 1.5f;
  for (int i = 0; i < 8; i++) ((float *)tt_tensor_data(net->target))[i] = 1.0f;
  net->in = tt_to(net->h, "tt");
  ck_assert_ptr_nonnull(net->in);
}

void harness_tiny_net_free(harness_tiny_net *net) {
  tt_tensor_free(net->in);
  tt_tensor_free(net->h);
  tt_tensor_free(net->target);
  tt_module_free(net->m);
}

uint64_t harness_used_bytes(const ttd_proc *proc, int device, int l1) {
  tt_client *c = harness_connect(proc, 0);
  tt_device_info *devs = NULL;
  size_t n = 0;
  ck_assert_int_eq(tt_list_devices(c, &devs, &n), TT_OK);
  ck_assert_uint_gt(n, (size_t)device);
  uint64_t used = l1 ? devs[device].l1.used_bytes : devs[device].dram.used_bytes;
  tt_device_list_free(devs);
  tt_disconnect(c);
  return used;
}

uint64_t harness_wait_used_bytes(const ttd_proc *proc, int device, int l1, uint64_t want, int timeout_ms) {
  uint64_t used = harness_used_bytes(proc, device, l1);
  for (int waited = 0; used != want && waited < timeout_ms; waited += 20) {
    sleep_ms(20);
    used = harness_used_bytes(proc, device, l1);
  }
  return used;
}

void harness_fill_random(void *buf, size_t n, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  unsigned char *p = buf;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    memcpy(p + i, &x, 8);
  }
  for (; i < n; i++) p[i] = (unsigned char)(x >> (8 * (i & 7)));
}

int harness_free_tcp_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
  socklen_t len = sizeof(sa);
  getsockname(fd, (struct sockaddr *)&sa, &len);
  close(fd);
  return ntohs(sa.sin_port);
}

char *harness_http(int port, const char *method, const char *path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  for (int i = 0; i < 100 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0; i++) usleep(10000);
  char req[256];
  int n = snprintf(req, sizeof(req), "%s %s HTTP/1.0\r\nHost: localhost\r\n\r\n", method, path);
  ck_assert_int_eq(write(fd, req, (size_t)n), n);
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap);
  ssize_t got;
  while ((got = read(fd, buf + len, cap - len - 1)) > 0) {
    len += (size_t)got;
    if (len + 1 == cap) buf = realloc(buf, cap *= 2);
  }
  buf[len] = '\0';
  close(fd);
  return buf;
}

int harness_log_count(const ttd_proc *proc, const char *needle) {
  FILE *f = fopen(proc->log_path, "r");
  if (!f) return 0;
  int n = 0;
  char line[4096];
  while (fgets(line, sizeof(line), f)) n += strstr(line, needle) != NULL;
  fclose(f);
  return n;
}

double harness_metric(const char *body, const char *series) {
  char needle[256];
  snprintf(needle, sizeof(needle), "\n%s ", series);
  const char *at = strstr(body, needle);
  return at ? atof(at + strlen(needle)) : -1;
}
