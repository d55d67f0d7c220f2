/* ttd as a systemd service: the Type=notify protocol of a real ttd (READY=1 with STATUS=,
 * WATCHDOG=1 pings, STOPPING=1), the unit file accepted by systemd-analyze, `make install`
 * into a DESTDIR with a program built against the installed ttclient.pc, and the sample
 * config loaded and kept in step with `ttd --help`. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "telemetry/log.h"
#include "service/service_notify.h"
#include "suites.h"
#include "ttd_harness.h"

#ifdef __SANITIZE_ADDRESS__
#define SAN_MAKE "1"
#define SAN_CFLAGS "-fsanitize=address,undefined"
#else
#define SAN_MAKE "0"
#define SAN_CFLAGS ""
#endif

/* ---- helpers ---- */

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The repository root: the parent of TTD_TESTS_DIR (tests/), else the current folder. */
static void repo_root(char *out, size_t size) {
  const char *tests = getenv("TTD_TESTS_DIR");
  char resolved[PATH_MAX];
  ck_assert_ptr_nonnull(realpath(tests ? tests : "tests", resolved));
  char *slash = strrchr(resolved, '/');
  ck_assert_ptr_nonnull(slash);
  *slash = '\0';
  snprintf(out, size, "%s", resolved);
}

/* The ttd binary the tests run, absolute. */
static void ttd_bin(char *out, size_t size) {
  const char *bin = getenv("TTD_BIN");
  char resolved[PATH_MAX];
  ck_assert_msg(realpath(bin ? bin : "build/bin/ttd", resolved) != NULL, "ttd binary: %s", strerror(errno));
  snprintf(out, size, "%s", resolved);
}

/* The build folder holding TTD_BIN (…/bin/ttd), relative to root when inside it. */
static void build_dir(const char *root, char *out, size_t size) {
  char bin[PATH_MAX];
  ttd_bin(bin, sizeof(bin));
  size_t len = strlen(bin);
  ck_assert(len > 8 && strcmp(bin + len - 8, "/bin/ttd") == 0);
  bin[len - 8] = '\0';
  size_t root_len = strlen(root);
  if (strncmp(bin, root, root_len) == 0 && bin[root_len] == '/') snprintf(out, size, "%s", bin + root_len + 1);
  else snprintf(out, size, "%s", bin);
}

static void make_temp_dir(char *out, size_t size, const char *name) {
  snprintf(out, size, "/tmp/ttd-%s-XXXXXX", name);
  ck_assert_msg(mkdtemp(out) != NULL, "mkdtemp: %s", strerror(errno));
}

static void remove_tree(const char *dir) {
  char cmd[PATH_MAX + 32];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  if (system(cmd) != 0) { /* best effort */
  }
}

/* Runs cmd with sh, stdout and stderr together into a new string (*out, may be NULL);
 * returns the exit status, or -1 if it did not exit normally. */
static int run(const char *cmd, char **out) {
  char full[8192];
  snprintf(full, sizeof(full), "(%s) 2>&1", cmd);
  FILE *p = popen(full, "r");
  ck_assert_ptr_nonnull(p);
  size_t cap = 4096, len = 0;
  char *buf = malloc(cap);
  size_t got;
  while ((got = fread(buf + len, 1, cap - len - 1, p)) > 0) {
    len += got;
    if (len + 1 == cap) buf = realloc(buf, cap *= 2);
  }
  buf[len] = '\0';
  int status = pclose(p);
  if (out) *out = buf;
  else free(buf);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static char *read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "open %s: %s", path, strerror(errno));
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *text = malloc((size_t)size + 1);
  ck_assert_uint_eq(fread(text, 1, (size_t)size, f), (size_t)size);
  text[size] = '\0';
  fclose(f);
  return text;
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  ck_assert_msg(f != NULL, "create %s: %s", path, strerror(errno));
  fputs(text, f);
  fclose(f);
}

/* A datagram socket bound at dir/notify.sock, standing in for systemd's NOTIFY_SOCKET. */
static int notify_listen(const char *dir, char *out_path, size_t size) {
  snprintf(out_path, size, "%s/notify.sock", dir);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", out_path);
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ck_assert_int_ge(fd, 0);
  ck_assert_msg(bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0, "bind %s: %s", out_path, strerror(errno));
  return fd;
}

/* The next datagram within timeout_ms into buf (NUL-terminated); 0 on timeout. */
static int notify_recv(int fd, char *buf, size_t size, int timeout_ms) {
  struct pollfd pfd = {.fd = fd, .events = POLLIN};
  if (poll(&pfd, 1, timeout_ms) <= 0) return 0;
  ssize_t n = recv(fd, buf, size - 1, 0);
  ck_assert_int_gt(n, 0);
  buf[n] = '\0';
  return 1;
}

/* The default `ttd --help` shows for an option ("" when it has none); NULL when absent. */
static char *help_default(const char *help, const char *name, char *out, size_t size) {
  char needle[64];
  snprintf(needle, sizeof(needle), "\n  --%s ", name);
  const char *at = strstr(help, needle);
  if (!at) return NULL;
  const char *end = strchr(at + 1, '\n');
  size_t len = end ? (size_t)(end - at) : strlen(at);
  char line[1024];
  snprintf(line, sizeof(line), "%.*s", (int)len, at);
  out[0] = '\0';
  char *def = strstr(line, " (default ");
  if (def && line[strlen(line) - 1] == ')') {
    line[strlen(line) - 1] = '\0';
    snprintf(out, size, "%s", def + strlen(" (default "));
  }
  return out;
}

/* ---- the notify module in process ---- */

/* Without NOTIFY_SOCKET every call is a no-op (0) and no watchdog timer is made, even when
 * WATCHDOG_USEC asks for one. */
START_TEST(test_notify_noop_without_socket) {
  unsetenv("NOTIFY_SOCKET");
  setenv("WATCHDOG_USEC", "200000", 1);
  ck_assert_int_eq(ttd_notify_ready("serving %d devices", 1), 0);
  ck_assert_int_eq(ttd_notify_status("x"), 0);
  ck_assert_int_eq(ttd_notify_stopping("draining"), 0);
  ck_assert_int_eq(ttd_notify_watchdog(), 0);
  struct event_base *base = event_base_new();
  ck_assert_ptr_null(ttd_notify_watchdog_timer_create(base));
  event_base_free(base);
  unsetenv("WATCHDOG_USEC");
}
END_TEST

/* With NOTIFY_SOCKET set: exact messages, a STATUS= text kept to one line, a watchdog
 * timer at WATCHDOG_USEC / 2 that pings from the loop, and none when WATCHDOG_PID names
 * another process or WATCHDOG_USEC is absent. */
START_TEST(test_notify_messages_in_process) {
  char dir[64], path[128], buf[1024];
  make_temp_dir(dir, sizeof(dir), "notify");
  int fd = notify_listen(dir, path, sizeof(path));
  ttd_log_threshold = TTD_LOG_WARN;
  setenv("NOTIFY_SOCKET", path, 1);
  unsetenv("WATCHDOG_USEC");
  unsetenv("WATCHDOG_PID");
  ck_assert_int_eq(ttd_notify_ready("serving %d devices on %s", 2, "unix:/x"), 1);
  ck_assert(notify_recv(fd, buf, sizeof(buf), 1000));
  ck_assert_str_eq(buf, "READY=1\nSTATUS=serving 2 devices on unix:/x");
  ck_assert_int_eq(ttd_notify_status("two\nlines"), 1);
  ck_assert(notify_recv(fd, buf, sizeof(buf), 1000));
  ck_assert_str_eq(buf, "STATUS=two lines");
  ck_assert_int_eq(ttd_notify_stopping("draining"), 1);
  ck_assert(notify_recv(fd, buf, sizeof(buf), 1000));
  ck_assert_str_eq(buf, "STOPPING=1\nSTATUS=draining");

  struct event_base *base = event_base_new();
  ck_assert_ptr_null(ttd_notify_watchdog_timer_create(base)); /* no WATCHDOG_USEC */
  setenv("WATCHDOG_USEC", "200000", 1);
  char other_pid[32];
  snprintf(other_pid, sizeof(other_pid), "%d", (int)getppid());
  setenv("WATCHDOG_PID", other_pid, 1);
  ck_assert_ptr_null(ttd_notify_watchdog_timer_create(base)); /* meant for another process */
  unsetenv("WATCHDOG_PID");
  ttd_notify_watchdog_timer *timer = ttd_notify_watchdog_timer_create(base);
  ck_assert_ptr_nonnull(timer);
  ck_assert_uint_eq(ttd_notify_watchdog_timer_period_usec(timer), 100000);
  ck_assert(notify_recv(fd, buf, sizeof(buf), 0)); /* one ping at once */
  ck_assert_str_eq(buf, "WATCHDOG=1");
  struct timeval run_for = {.tv_sec = 0, .tv_usec = 350000};
  event_base_loopexit(base, &run_for);
  event_base_dispatch(base);
  int pings = 0;
  while (notify_recv(fd, buf, sizeof(buf), 0)) {
    ck_assert_str_eq(buf, "WATCHDOG=1");
    pings++;
  }
  ck_assert_msg(pings >= 2 && pings <= 4, "%d pings in 350 ms at a 100 ms period", pings); /* 3, give or take one */
  ttd_notify_watchdog_timer_free(timer);
  ttd_notify_watchdog_timer_free(NULL);
  event_base_free(base);
  unsetenv("WATCHDOG_USEC");
  unsetenv("NOTIFY_SOCKET");
  close(fd);
  remove_tree(dir);
}
END_TEST

/* ---- a real ttd ---- */

/* A real ttd under NOTIFY_SOCKET and WATCHDOG_USEC=200000: READY=1 first, with STATUS=
 * naming its device count and socket; then WATCHDOG=1 about every 100 ms; after SIGTERM,
 * STOPPING=1 with STATUS=draining as the last message, and exit status 0. */
START_TEST(test_notify_protocol) {
  char dir[64], path[128], env_socket[160], buf[1024];
  make_temp_dir(dir, sizeof(dir), "notify");
  int fd = notify_listen(dir, path, sizeof(path));
  snprintf(env_socket, sizeof(env_socket), "NOTIFY_SOCKET=%s", path);
  const char *env[] = {env_socket, "WATCHDOG_USEC=200000", NULL};
  ttd_proc proc;
  ttd_proc_start_env(&proc, NULL, env);

  ck_assert_msg(notify_recv(fd, buf, sizeof(buf), 5000), "no READY=1 within 5 s");
  char want[256];
  snprintf(want, sizeof(want), "READY=1\nSTATUS=serving 1 device on %s", proc.target);
  ck_assert_str_eq(buf, want);

  int pings = 0;
  int64_t until = now_ms() + 1000;
  for (int64_t left; (left = until - now_ms()) > 0;) {
    if (!notify_recv(fd, buf, sizeof(buf), (int)left)) break;
    ck_assert_str_eq(buf, "WATCHDOG=1");
    pings++;
  }
  ck_assert_msg(pings >= 2 && pings <= 15, "%d WATCHDOG=1 in 1 s at a 100 ms period", pings);
  char *log = read_file(proc.log_path);
  ck_assert_msg(strstr(log, "event=watchdog-armed watchdog_usec=200000 ping_usec=100000") != NULL, "%s", log);
  free(log);

  ck_assert_int_eq(ttd_proc_stop(&proc), 0);
  char last[1024] = "";
  int stopping = 0;
  while (notify_recv(fd, buf, sizeof(buf), 200)) {
    stopping += strcmp(buf, "STOPPING=1\nSTATUS=draining") == 0;
    snprintf(last, sizeof(last), "%s", buf);
  }
  ck_assert_int_eq(stopping, 1);
  ck_assert_str_eq(last, "STOPPING=1\nSTATUS=draining");
  close(fd);
  remove_tree(dir);
}
END_TEST

/* systemd-analyze verify accepts scripts/ttd.service without a single warning (on a copy
 * whose ExecStart names the built ttd, since /usr/local/bin/ttd need not exist); the unit
 * is Type=notify with a watchdog, runs as user ttd in /run/ttd, and gives a draining ttd
 * longer than its default --drain-timeout before SIGKILL. */
START_TEST(test_unit_file_verifies) {
  char root[PATH_MAX], bin[PATH_MAX], unit_path[PATH_MAX + 32];
  repo_root(root, sizeof(root));
  ttd_bin(bin, sizeof(bin));
  snprintf(unit_path, sizeof(unit_path), "%s/scripts/ttd.service", root);
  char *unit = read_file(unit_path);
  ck_assert_ptr_nonnull(strstr(unit, "\nType=notify\n"));
  ck_assert_ptr_nonnull(strstr(unit, "\nExecStart=/usr/local/bin/ttd --config /etc/ttd/ttd.conf --state-dir /var/lib/ttd\n"));
  ck_assert_ptr_nonnull(strstr(unit, "\nExecReload=/bin/kill -HUP $MAINPID\n"));
  ck_assert_ptr_nonnull(strstr(unit, "\nWatchdogSec=30s\n"));
  ck_assert_ptr_nonnull(strstr(unit, "\nUser=ttd\n"));
  ck_assert_ptr_nonnull(strstr(unit, "\nGroup=ttd\n"));
  ck_assert_ptr_nonnull(strstr(unit, "\nRuntimeDirectory=ttd\n"));
  ck_assert_ptr_nonnull(strstr(unit, "\nCapabilityBoundingSet=\n"));
  ck_assert_ptr_null(strstr(unit, "\nDynamicUser=yes"));

  char *help = NULL;
  char cmd[PATH_MAX * 2 + 256];
  snprintf(cmd, sizeof(cmd), "'%s' --help", bin);
  ck_assert_int_eq(run(cmd, &help), 0);
  char drain[64];
  ck_assert_ptr_nonnull(help_default(help, "drain-timeout", drain, sizeof(drain)));
  const char *stop = strstr(unit, "\nTimeoutStopSec=");
  ck_assert_ptr_nonnull(stop);
  ck_assert_msg(atof(stop + strlen("\nTimeoutStopSec=")) > atof(drain), "TimeoutStopSec must exceed drain-timeout %s",
                drain);
  free(help);

  if (run("command -v systemd-analyze", NULL) != 0) {
    fprintf(stderr, "e2e_service: systemd-analyze is not installed (Debian package systemd): unit not verified\n");
    free(unit);
    return;
  }
  char dir[64], copy[128];
  make_temp_dir(dir, sizeof(dir), "unit");
  snprintf(copy, sizeof(copy), "%s/ttd.service", dir);
  snprintf(cmd, sizeof(cmd), "sed 's|^ExecStart=/usr/local/bin/ttd |ExecStart=%s |' '%s' > '%s'", bin, unit_path, copy);
  ck_assert_int_eq(run(cmd, NULL), 0);
  char *out = NULL;
  snprintf(cmd, sizeof(cmd), "systemd-analyze verify '%s'", copy);
  int rc = run(cmd, &out);
  ck_assert_msg(rc == 0 && out[0] == '\0', "systemd-analyze verify: exit %d:\n%s", rc, out);
  free(out);

  /* The same check fails on a unit with an unknown key: its silence above means something. */
  snprintf(cmd, sizeof(cmd), "printf 'BogusKey=1\\n' >> '%s' && systemd-analyze verify '%s'", copy, copy);
  run(cmd, &out);
  ck_assert_ptr_nonnull(strstr(out, "BogusKey"));
  free(out);
  free(unit);
  remove_tree(dir);
}
END_TEST

static void assert_mode(const char *path, mode_t type, mode_t perm) {
  struct stat st;
  ck_assert_msg(lstat(path, &st) == 0, "%s: %s", path, strerror(errno));
  ck_assert_msg((st.st_mode & S_IFMT) == type, "%s has the wrong file type", path);
  if (perm) ck_assert_msg((st.st_mode & 07777) == perm, "%s has mode %o, want %o", path, st.st_mode & 07777, perm);
}

/* `make install DESTDIR PREFIX=/usr` puts the daemon, library (.a, .so.1 and the .so link),
 * header, the Python package ttd (importable), ttclient.pc, the unit with ExecStart in PREFIX
 * and the sample config in place, keeps an existing ttd.conf on a second install, and a program including <ttclient.h> builds with
 * `pkg-config --cflags --libs ttclient` against the installed .so and runs. */
START_TEST(test_make_install) {
  char root[PATH_MAX], build[PATH_MAX], dest[64], path[PATH_MAX + 64], cmd[4 * PATH_MAX];
  repo_root(root, sizeof(root));
  build_dir(root, build, sizeof(build));
  make_temp_dir(dest, sizeof(dest), "install");
  /* MAKEFLAGS and friends of a `make test` above us must not leak into this make. */
  snprintf(cmd, sizeof(cmd),
           "env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -C '%s' --no-print-directory install DESTDIR='%s' "
           "PREFIX=/usr BUILD='%s' SAN=" SAN_MAKE,
           root, dest, build);
  char *out = NULL;
  int rc = run(cmd, &out);
  ck_assert_msg(rc == 0, "%s: exit %d:\n%s", cmd, rc, out);
  free(out);

  snprintf(path, sizeof(path), "%s/usr/bin/ttd", dest);
  assert_mode(path, S_IFREG, 0755);
  snprintf(path, sizeof(path), "%s/usr/bin/ttctl", dest);
  assert_mode(path, S_IFREG, 0755); /* built for the install if it was not */
  snprintf(path, sizeof(path), "%s/usr/share/man/man8/ttd.8", dest);
  assert_mode(path, S_IFREG, 0644);
  snprintf(path, sizeof(path), "%s/usr/share/man/man8/ttctl.8", dest);
  assert_mode(path, S_IFREG, 0644);
  snprintf(path, sizeof(path), "%s/usr/lib/libttclient.a", dest);
  assert_mode(path, S_IFREG, 0644);
  snprintf(path, sizeof(path), "%s/usr/lib/libttclient.so.1", dest);
  assert_mode(path, S_IFREG, 0755);
  snprintf(path, sizeof(path), "%s/usr/lib/libttclient.so", dest);
  assert_mode(path, S_IFLNK, 0);
  char target[64] = "";
  ck_assert_int_gt(readlink(path, target, sizeof(target) - 1), 0);
  ck_assert_str_eq(target, "libttclient.so.1");

  char *text, *want;
  snprintf(path, sizeof(path), "%s/usr/include/ttclient.h", dest);
  assert_mode(path, S_IFREG, 0644);
  text = read_file(path);
  snprintf(path, sizeof(path), "%s/client/include/ttclient.h", root);
  want = read_file(path);
  ck_assert_str_eq(text, want);
  free(text);
  free(want);

  snprintf(path, sizeof(path), "%s/usr/lib/pkgconfig/ttclient.pc", dest);
  assert_mode(path, S_IFREG, 0644);
  text = read_file(path);
  ck_assert_ptr_nonnull(strstr(text, "\nprefix=/usr\n"));
  ck_assert_ptr_nonnull(strstr(text, "\nRequires.private: grpc libprotobuf-c zlib jansson\n"));
  ck_assert_ptr_null(strstr(text, "@"));
  free(text);

  snprintf(path, sizeof(path), "%s/lib/systemd/system/ttd.service", dest);
  assert_mode(path, S_IFREG, 0644);
  text = read_file(path);
  ck_assert_ptr_nonnull(strstr(text, "\nExecStart=/usr/bin/ttd --config /etc/ttd/ttd.conf --state-dir /var/lib/ttd\n"));
  ck_assert_ptr_null(strstr(text, "/usr/local"));
  free(text);

  snprintf(path, sizeof(path), "%s/usr/lib/sysusers.d/ttd.conf", dest);
  assert_mode(path, S_IFREG, 0644);
  text = read_file(path);
  ck_assert_ptr_nonnull(strstr(text, "\nu ttd - "));
  free(text);

  snprintf(path, sizeof(path), "%s/etc/ttd/ttd.conf", dest);
  assert_mode(path, S_IFREG, 0644);
  text = read_file(path);
  char sample[PATH_MAX + 32];
  snprintf(sample, sizeof(sample), "%s/scripts/ttd.conf", root);
  want = read_file(sample);
  ck_assert_str_eq(text, want);
  free(text);
  free(want);

  /* A second install keeps the admin's config. */
  write_file(path, "# the admin's own\n");
  rc = run(cmd, &out);
  ck_assert_msg(rc == 0, "second install: exit %d:\n%s", rc, out);
  free(out);
  text = read_file(path);
  ck_assert_str_eq(text, "# the admin's own\n");
  free(text);

  /* The Python package: every .py file of client/python/ttd at mode 0644, nothing else (no tests, no
   * __pycache__), and `import ttd.torch` works from there against the installed library. */
  char pkg[PATH_MAX + 64], src_dir[PATH_MAX + 32];
  snprintf(pkg, sizeof(pkg), "%s/usr/lib/python3/dist-packages/ttd", dest);
  snprintf(src_dir, sizeof(src_dir), "%s/client/python/ttd", root);
  DIR *dir = opendir(src_dir);
  ck_assert_msg(dir != NULL, "%s: %s", src_dir, strerror(errno));
  int n_py = 0;
  for (struct dirent *e; (e = readdir(dir)) != NULL;) {
    size_t len = strlen(e->d_name);
    if (len < 4 || strcmp(e->d_name + len - 3, ".py") != 0) continue;
    char file[sizeof(pkg) + 256];
    snprintf(file, sizeof(file), "%s/%s", pkg, e->d_name);
    assert_mode(file, S_IFREG, 0644);
    n_py++;
  }
  closedir(dir);
  ck_assert_int_gt(n_py, 0);
  dir = opendir(pkg);
  ck_assert_msg(dir != NULL, "%s: %s", pkg, strerror(errno));
  for (struct dirent *e; (e = readdir(dir)) != NULL;) {
    size_t len = strlen(e->d_name);
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    ck_assert_msg(len >= 4 && strcmp(e->d_name + len - 3, ".py") == 0, "%s/%s: not a .py file of the package",
                  pkg, e->d_name);
  }
  closedir(dir);
#ifndef __SANITIZE_ADDRESS__ /* an ASan-built libttclient cannot be loaded into an uninstrumented python */
  snprintf(cmd, sizeof(cmd),
           "cd '%s' && PYTHONPATH='%s/usr/lib/python3/dist-packages' TTD_LIB='%s/usr/lib/libttclient.so.1' "
           "PYTHONDONTWRITEBYTECODE=1 /usr/bin/python3 -c 'import ttd.torch, ttd; print(ttd.__file__)' 2>&1",
           dest, dest, dest);
  rc = run(cmd, &out);
  ck_assert_msg(rc == 0, "import ttd.torch from the install: exit %d:\n%s", rc, out);
  ck_assert_msg(strstr(out, pkg) != NULL, "ttd was imported from elsewhere than %s:\n%s", pkg, out);
  free(out);
#endif

  /* A program built the pkg-config way, against the installed .so (found through the link). */
  char prog[PATH_MAX];
  snprintf(prog, sizeof(prog), "%s/hello.c", dest);
  write_file(prog,
             "#include <stdio.h>\n#include <ttclient.h>\n"
             "int main(void) {\n  tt_connect_options o;\n  tt_connect_options_init(&o);\n"
             "  printf(\"%s\\n\", tt_status_name(TT_NOT_FOUND));\n  return 0;\n}\n");
  snprintf(cmd, sizeof(cmd),
           "cd '%s' && export PKG_CONFIG_PATH='%s/usr/lib/pkgconfig' && "
           "flags=$(pkg-config --define-variable=prefix='%s/usr' --cflags --libs ttclient) && "
           "echo \"$flags\" && cc " SAN_CFLAGS " hello.c -o hello $flags",
           dest, dest, dest);
  rc = run(cmd, &out);
  ck_assert_msg(rc == 0, "build against ttclient.pc: exit %d:\n%s", rc, out);
  char include_flag[PATH_MAX], lib_flag[PATH_MAX];
  snprintf(include_flag, sizeof(include_flag), "-I%s/usr/include", dest);
  snprintf(lib_flag, sizeof(lib_flag), "-L%s/usr/lib -lttclient", dest);
  ck_assert_msg(strstr(out, include_flag) && strstr(out, lib_flag), "pkg-config flags: %s", out);
  free(out);
  snprintf(cmd, sizeof(cmd), "readelf -d '%s/hello' | grep NEEDED", dest);
  rc = run(cmd, &out);
  ck_assert_msg(strstr(out, "[libttclient.so.1]") != NULL, "hello does not need libttclient.so.1:\n%s", out);
  free(out);
  snprintf(cmd, sizeof(cmd), "LD_LIBRARY_PATH='%s/usr/lib' ASAN_OPTIONS=detect_leaks=0 '%s/hello'", dest, dest);
  rc = run(cmd, &out);
  ck_assert_msg(rc == 0, "hello: exit %d:\n%s", rc, out);
  ck_assert_str_eq(out, "NOT_FOUND\n");
  free(out);
  remove_tree(dest);
}
END_TEST

/* Starts ttd with --config conf (the harness's --listen and --admin off win over the file),
 * lists its devices and stops it. */
static void serve_with_config(const char *conf) {
  ttd_proc proc;
  const char *args[] = {"--config", conf, NULL};
  ttd_proc_start(&proc, args);
  tt_client *c = harness_connect(&proc, 0);
  tt_device_info *devs = NULL;
  size_t n = 0;
  ck_assert_int_eq(tt_list_devices(c, &devs, &n), TT_OK);
  ck_assert_uint_eq(n, 1);
  ck_assert_uint_eq(devs[0].dram.capacity_bytes, 12ull << 30);
  ck_assert_uint_eq(devs[0].l1.capacity_bytes, 108ull << 20);
  tt_device_list_free(devs);
  tt_disconnect(c);
  ck_assert_int_eq(ttd_proc_stop(&proc), 0);
}

/* scripts/ttd.conf sets listen = unix:/run/ttd/ttd.sock and names every option of
 * `ttd --help`, each default as --help shows it; ttd serves with it (flags overriding
 * listen and admin), and again with every default line uncommented. */
START_TEST(test_sample_config) {
  char root[PATH_MAX], bin[PATH_MAX], conf[PATH_MAX + 32], cmd[2 * PATH_MAX];
  repo_root(root, sizeof(root));
  ttd_bin(bin, sizeof(bin));
  snprintf(conf, sizeof(conf), "%s/scripts/ttd.conf", root);
  char *text = read_file(conf);
  ck_assert_ptr_nonnull(strstr(text, "\nlisten = unix:/run/ttd/ttd.sock\n"));

  char *help = NULL;
  snprintf(cmd, sizeof(cmd), "'%s' --help", bin);
  ck_assert_int_eq(run(cmd, &help), 0);
  int options = 0;
  for (const char *at = strstr(help, "\n  --"); at; at = strstr(at + 1, "\n  --")) {
    char name[64];
    ck_assert_int_eq(sscanf(at + 5, "%63s", name), 1);
    if (strcmp(name, "help") == 0 || strcmp(name, "version") == 0 || strcmp(name, "config") == 0) continue;
    options++;
    char def[256], line[512];
    ck_assert_ptr_nonnull(help_default(help, name, def, sizeof(def)));
    if (def[0]) {
      snprintf(line, sizeof(line), "\n# %s = %s\n", name, def);
      ck_assert_msg(strstr(text, line) != NULL, "scripts/ttd.conf lacks the line '# %s = %s' (ttd --help)", name, def);
    } else {
      snprintf(line, sizeof(line), "\n# %s = ", name);
      char set[128];
      snprintf(set, sizeof(set), "\n%s = ", name);
      ck_assert_msg(strstr(text, line) || strstr(text, set), "scripts/ttd.conf does not mention option %s", name);
    }
  }
  ck_assert_int_ge(options, 10);

  serve_with_config(conf);

  /* Every "# name = default" line made live: the file's values parse as ttd reads them. */
  char dir[64], live[128];
  make_temp_dir(dir, sizeof(dir), "conf");
  snprintf(live, sizeof(live), "%s/ttd.conf", dir);
  FILE *f = fopen(live, "w");
  ck_assert_ptr_nonnull(f);
  int uncommented = 0;
  for (char *line = text, *next; line && *line; line = next) {
    next = strchr(line, '\n');
    if (next) *next++ = '\0';
    char name[64], value[256], def[256];
    if (sscanf(line, "# %63[a-z0-9-] = %255s", name, value) == 2 && help_default(help, name, def, sizeof(def)) &&
        strcmp(def, value) == 0) {
      fprintf(f, "%s = %s\n", name, value);
      uncommented++;
    } else {
      fprintf(f, "%s\n", line);
    }
  }
  fclose(f);
  ck_assert_int_ge(uncommented, 10);
  serve_with_config(live);
  free(help);
  free(text);
  remove_tree(dir);
}
END_TEST

/* make demo's script: with its admin listener on a port it picked, it runs the main job,
 * shows ttd's metrics and stops ttd cleanly; when ttd cannot start, it fails and prints
 * ttd's log instead of deleting it. */
START_TEST(test_demo_script) {
  char root[PATH_MAX], build[PATH_MAX], cmd[3 * PATH_MAX];
  repo_root(root, sizeof(root));
  build_dir(root, build, sizeof(build));
  char *out = NULL;
  /* One epoch; in batches of 256 under TTD_SKIP_HUGE (the sanitizer run), a quarter of the steps. */
  snprintf(cmd, sizeof(cmd), "cd '%s' && MLP_ARGS='--epochs 1%s' scripts/demo.sh '%s'", root,
           getenv("TTD_SKIP_HUGE") ? " --batch 256" : "", build);
  int rc = run(cmd, &out);
  ck_assert_msg(rc == 0 && strstr(out, "test accuracy: ") && strstr(out, "a few of ttd's metrics (http://127.0.0.1:") &&
                strstr(out, "ttd_rpc_total{method=\"Execute\"") && strstr(out, "== ttd stopped cleanly"),
                "demo: exit %d:\n%s", rc, out);
  free(out);
  snprintf(cmd, sizeof(cmd), "cd '%s' && DEMO_ADMIN=nohost scripts/demo.sh '%s'", root, build);
  rc = run(cmd, &out);
  ck_assert_msg(rc != 0 && strstr(out, "make demo failed; ttd's log") && strstr(out, "event=start-failed") &&
                strstr(out, "--admin must be host:port"), "demo with a bad admin address: exit %d:\n%s", rc, out);
  free(out);
}
END_TEST

/* The number of lines of text. */
static int count_lines(const char *text) {
  int n = 0;
  for (const char *p = text; *p; p++) n += *p == '\n';
  return n;
}

/* --version prints one line and exits 0; a usage error prints exactly one line naming the
 * bad option and "see ttd --help", and exits 2, without the whole help. */
START_TEST(test_version_and_usage_errors) {
  char bin[PATH_MAX], cmd[PATH_MAX + 64];
  ttd_bin(bin, sizeof(bin));
  char *out = NULL;
  snprintf(cmd, sizeof(cmd), "'%s' --version", bin);
  ck_assert_int_eq(run(cmd, &out), 0);
  ck_assert_msg(strncmp(out, "ttd 1.", 6) == 0 && strstr(out, "protocol ttd.v1") && count_lines(out) == 1, "%s", out);
  free(out);
  static const char *const bad[][2] = {
      {"--bogus", "unknown option '--bogus'"},
      {"--threads 0", "--threads must be an integer"},
      {"serve", "unexpected argument 'serve'"},
      {"--log-level loud", "--log-level must be"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    snprintf(cmd, sizeof(cmd), "'%s' %s", bin, bad[i][0]);
    ck_assert_int_eq(run(cmd, &out), 2);
    ck_assert_msg(strncmp(out, "ttd: ", 5) == 0 && strstr(out, bad[i][1]) && strstr(out, "see ttd --help") &&
                  count_lines(out) == 1, "ttd %s: %s", bad[i][0], out);
    free(out);
  }
}
END_TEST

/* When the admin listener cannot bind (its port is taken), ttd says so and exits 1: it
 * never logged "ready" (which comes only once every listener is bound), and it removed
 * its socket file. */
START_TEST(test_ready_only_after_every_listener) {
  char bin[PATH_MAX], dir[64], cmd[2 * PATH_MAX];
  ttd_bin(bin, sizeof(bin));
  make_temp_dir(dir, sizeof(dir), "ready");
  int taken = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  ck_assert_int_eq(bind(taken, (struct sockaddr *)&sa, sizeof(sa)), 0);
  ck_assert_int_eq(listen(taken, 1), 0);
  socklen_t len = sizeof(sa);
  ck_assert_int_eq(getsockname(taken, (struct sockaddr *)&sa, &len), 0);
  char *out = NULL;
  snprintf(cmd, sizeof(cmd), "'%s' --listen unix:%s/ttd.sock --admin 127.0.0.1:%d", bin, dir, ntohs(sa.sin_port));
  ck_assert_int_eq(run(cmd, &out), 1);
  ck_assert_msg(strstr(out, "event=start-failed") && !strstr(out, "event=ready"), "%s", out);
  char sock[128];
  snprintf(sock, sizeof(sock), "%s/ttd.sock", dir);
  ck_assert_int_ne(access(sock, F_OK), 0);
  free(out);
  close(taken);
  remove_tree(dir);
}
END_TEST

/* Sends proc a SIGHUP and waits until its log holds `count` lines with needle. */
static void hup_and_wait(ttd_proc *proc, const char *needle, int count) {
  kill(proc->pid, SIGHUP);
  for (int i = 0; i < 500 && harness_log_count(proc, needle) < count; i++) {
    struct timespec ts = {0, 10000000};
    nanosleep(&ts, NULL);
  }
  ck_assert_int_eq(harness_log_count(proc, needle), count);
}

/* Runs ttd with args, which must fail with exit code rc and print needle (within 10 s: a
 * ttd that starts instead is killed). */
static void expect_start_refused(const char *args, int rc, const char *needle) {
  char bin[PATH_MAX], cmd[2 * PATH_MAX];
  ttd_bin(bin, sizeof(bin));
  snprintf(cmd, sizeof(cmd), "timeout -s KILL 10 '%s' %s", bin, args);
  char *out = NULL;
  ck_assert_int_eq(run(cmd, &out), rc);
  ck_assert_msg(strstr(out, needle), "ttd %s: no '%s' in: %s", args, needle, out);
  free(out);
}

/* A tokens file in a folder others may write without the sticky bit is refused at start
 * and at a reload (which keeps the running tokens), naming the folder; made sticky, it is
 * read. As root: a tokens or config file owned by another user (uid 1001), mode 0600, is
 * refused the same way, naming the file, its owner and the chown to run. */
START_TEST(test_files_others_could_replace_refused) {
  char dir[64], open_dir[96], safe[128], unsafe[128], conf[128], sock[128], args[512], needle[512];
  make_temp_dir(dir, sizeof(dir), "owner");
  snprintf(open_dir, sizeof(open_dir), "%s/open", dir);
  ck_assert_int_eq(mkdir(open_dir, 0700), 0);
  ck_assert_int_eq(chmod(open_dir, 0777), 0);
  snprintf(safe, sizeof(safe), "%s/tokens", dir);
  snprintf(unsafe, sizeof(unsafe), "%s/tokens", open_dir);
  snprintf(conf, sizeof(conf), "%s/ttd.conf", dir);
  snprintf(sock, sizeof(sock), "%s/ttd.sock", dir);
  char alice[64], alice_auth[80], bob[64], bob_auth[80];
  harness_token(alice, sizeof(alice), alice_auth, sizeof(alice_auth));
  harness_token(bob, sizeof(bob), bob_auth, sizeof(bob_auth));
  harness_write_tokens(safe, (const char *[]){"alice"}, (const char *[]){alice}, (const char *[]){""}, 1);
  harness_write_tokens(unsafe, (const char *[]){"bob"}, (const char *[]){bob}, (const char *[]){""}, 1);
  ck_assert_int_eq(chmod(safe, 0600), 0);
  ck_assert_int_eq(chmod(unsafe, 0600), 0);

  snprintf(args, sizeof(args), "--listen unix:%s --tokens %s", sock, unsafe);
  snprintf(needle, sizeof(needle), "tokens file %s is in the folder %s, which everyone may write without the sticky "
           "bit (mode 0777): they can replace the file; run chmod go-w (or chmod +t) on the folder", unsafe, open_dir);
  expect_start_refused(args, 1, needle);

  char text[256];
  snprintf(text, sizeof(text), "tokens = %s\n", safe);
  write_file(conf, text);
  ttd_proc proc;
  ttd_proc_start(&proc, (const char *[]){"--config", conf, NULL});
  snprintf(text, sizeof(text), "tokens = %s\n", unsafe);
  write_file(conf, text);
  hup_and_wait(&proc, "event=reload-failed", 1);
  ck_assert_int_eq(harness_log_count(&proc, needle), 1);
  tt_connect_options o;
  tt_connect_options_init(&o);
  o.token = alice; /* the running tokens stay */
  tt_client *c = NULL;
  ck_assert_int_eq(tt_connect(proc.target, &o, &c), TT_OK);
  tt_disconnect(c);
  ck_assert_int_eq(chmod(open_dir, 01777), 0);
  hup_and_wait(&proc, "event=reloaded", 1);
  o.token = bob;
  c = NULL;
  ck_assert_int_eq(tt_connect(proc.target, &o, &c), TT_OK);
  tt_disconnect(c);

  if (geteuid() != 0) {
    fprintf(stderr, "test_files_others_could_replace_refused: files owned by another user not checked: chown needs "
            "root (uid %u here)\n", (unsigned)geteuid());
  } else {
    ck_assert_int_eq(chown(safe, 1001, (gid_t)-1), 0);
    snprintf(args, sizeof(args), "--listen unix:%s.2 --tokens %s", sock, safe);
    snprintf(needle, sizeof(needle), "tokens file %s is owned by uid 1001, neither ttd's user (uid 0) nor root: that "
             "user can rewrite it and so decides what ttd trusts; run chown 0 (or chown root) on it", safe);
    expect_start_refused(args, 1, needle);
    snprintf(text, sizeof(text), "tokens = %s\n", safe);
    write_file(conf, text);
    hup_and_wait(&proc, "event=reload-failed", 2);
    ck_assert_int_eq(harness_log_count(&proc, needle), 1);
    ck_assert_int_eq(chown(conf, 1001, (gid_t)-1), 0);
    ck_assert_int_eq(chmod(conf, 0600), 0);
    snprintf(needle, sizeof(needle), "config file %s is owned by uid 1001, neither ttd's user (uid 0) nor root", conf);
    hup_and_wait(&proc, "event=reload-failed", 3);
    ck_assert_int_eq(harness_log_count(&proc, needle), 1);
    snprintf(args, sizeof(args), "--listen unix:%s.2 --config %s", sock, conf);
    expect_start_refused(args, 2, needle);
    c = NULL; /* bob's tokens still run */
    ck_assert_int_eq(tt_connect(proc.target, &o, &c), TT_OK);
    tt_disconnect(c);
  }
  ck_assert_int_eq(ttd_proc_stop(&proc), 0);
  remove_tree(dir);
}
END_TEST

/* A SIGHUP that changes an option only a restart applies logs a warning naming it (and
 * keeps the running value); the options it does apply are not named. */
START_TEST(test_reload_names_restart_options) {
  char dir[64], conf[128];
  make_temp_dir(dir, sizeof(dir), "hup");
  snprintf(conf, sizeof(conf), "%s/ttd.conf", dir);
  write_file(conf, "threads = 2\nquota = 0\n");
  ttd_proc proc;
  const char *args[] = {"--config", conf, NULL};
  ttd_proc_start(&proc, args);
  write_file(conf, "threads = 3\nquota = 1G\nspin-us = 7\n");
  hup_and_wait(&proc, "event=reloaded", 1);
  ck_assert_int_eq(harness_log_count(&proc, "event=reload-ignored option=threads "), 1);
  ck_assert_int_eq(harness_log_count(&proc, "event=reload-ignored option=spin-us "), 1);
  ck_assert_int_eq(harness_log_count(&proc, "event=reload-ignored option=quota "), 0);
  ck_assert_int_eq(harness_log_count(&proc, "event=reload-ignored"), 2);
  ck_assert_int_eq(ttd_proc_stop(&proc), 0);
  remove_tree(dir);
}
END_TEST

Suite *e2e_service_suite(void) {
  Suite *s = suite_create("e2e_service");
  TCase *notify = tcase_create("notify");
  tcase_add_test(notify, test_notify_noop_without_socket);
  tcase_add_test(notify, test_notify_messages_in_process);
  tcase_add_test(notify, test_notify_protocol);
  tcase_set_timeout(notify, 30);
  suite_add_tcase(s, notify);
  TCase *cli = tcase_create("command_line");
  tcase_add_test(cli, test_version_and_usage_errors);
  tcase_add_test(cli, test_ready_only_after_every_listener);
  tcase_add_test(cli, test_reload_names_restart_options);
  tcase_add_test(cli, test_files_others_could_replace_refused);
  tcase_set_timeout(cli, 30);
  suite_add_tcase(s, cli);
  TCase *packaging = tcase_create("packaging");
  tcase_add_test(packaging, test_unit_file_verifies);
  tcase_add_test(packaging, test_make_install);
  tcase_add_test(packaging, test_sample_config);
  tcase_add_test(packaging, test_demo_script);
  tcase_set_timeout(packaging, 300);
  tcase_set_tags(packaging, "packaging"); /* builds and installs; valgrind-e2e skips it */
  suite_add_tcase(s, packaging);
  return s;
}
