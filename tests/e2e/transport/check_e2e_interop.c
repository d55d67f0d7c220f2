/* End-to-end interop: a client from a different gRPC implementation (Debian's python3-grpcio,
 * messages from `protoc --python_out`, no ttd code) drives a real ttd through the whole
 * contract in proto/ttd/v1/ttd.proto. The checks live in tests/interop/ttd_interop.py. */
#include <check.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "suites.h"
#include "ttd_harness.h"

#define PYTHON "/usr/bin/python3"
#define SCRIPT_DEADLINE_MS 45000 /* under the tcase timeout, so a hang fails with its output */
#define KEEP_HINT "; TTD_KEEP_LOGS=1 keeps it"

static ttd_proc proc;

static void setup(void) {
  const char *args[] = {"--devices", "2", NULL};
  ttd_proc_start(&proc, args);
}

static void teardown(void) { ck_assert_int_eq(ttd_proc_stop(&proc), 0); }

static const char *env_or(const char *name, const char *fallback) {
  const char *v = getenv(name);
  return v && *v ? v : fallback;
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Runs argv with PYTHONPATH=pythonpath, stdout and stderr into out (NUL-terminated, truncated
 * to cap). Returns the wait status, or -1 if it ran past SCRIPT_DEADLINE_MS (then killed). */
static int run_capture(const char *const *argv, const char *pythonpath, char *out, size_t cap) {
  int fds[2];
  ck_assert_msg(pipe(fds) == 0, "pipe: %s", strerror(errno));
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[1]);
    setenv("PYTHONPATH", pythonpath, 1);
    execv(argv[0], (char *const *)argv);
    fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  close(fds[1]);
  size_t len = 0;
  int64_t deadline = now_ms() + SCRIPT_DEADLINE_MS;
  int timed_out = 0;
  for (;;) {
    int64_t left = deadline - now_ms();
    if (left <= 0) {
      timed_out = 1;
      break;
    }
    struct pollfd pfd = {.fd = fds[0], .events = POLLIN};
    int r = poll(&pfd, 1, (int)left);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue; /* timeout: re-checked at the top */
    char chunk[4096];
    ssize_t n = read(fds[0], chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break; /* EOF: the script and anything it started closed the pipe */
    size_t keep = (size_t)n < cap - 1 - len ? (size_t)n : cap - 1 - len;
    memcpy(out + len, chunk, keep);
    len += keep;
  }
  out[len] = '\0';
  close(fds[0]);
  if (timed_out) kill(pid, SIGKILL);
  int status;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return timed_out ? -1 : status;
}

/* Python grpcio talks to ttd with only the .proto: ListDevices, OpenSession (version 1 and a
 * refused 99), missing/bad session metadata, chunked Upload and streamed Download (bytewise and
 * float32 -> bfloat16 rounding), Move to tt:1 L1, Free then NOT_FOUND, undecodable request bytes
 * (INVALID_ARGUMENT, daemon keeps serving) and CloseSession returning memory to 0. */
START_TEST(test_python_grpcio_client) {
  char script[512];
  snprintf(script, sizeof(script), "%s/interop/ttd_interop.py", env_or("TTD_TESTS_DIR", "tests"));
  ck_assert_msg(access(PYTHON, X_OK) == 0, "%s is needed (Debian python3-grpcio): %s", PYTHON, strerror(errno));
  ck_assert_msg(access(script, R_OK) == 0, "interop script %s: %s (set TTD_TESTS_DIR)", script, strerror(errno));
  const char *pythonpath = env_or("TTD_PY_GEN", "build/py");
  const char *argv[] = {PYTHON, script, proc.target, NULL};
  static char out[64 * 1024];
  int status = run_capture(argv, pythonpath, out, sizeof(out));
  ck_assert_msg(status != -1, "%s %s did not finish within %d ms; output so far:\n%s\n(daemon log: %s" KEEP_HINT ")",
                script, proc.target, SCRIPT_DEADLINE_MS, out, proc.log_path);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                "%s %s (PYTHONPATH=%s) exited with status %d; output:\n%s\n(daemon log: %s" KEEP_HINT ")", script,
                proc.target, pythonpath, WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out,
                proc.log_path);
  ck_assert_msg(strstr(out, "interop ok\n") != NULL, "exit 0 but no 'interop ok' line; output:\n%s", out);
  ck_assert_msg(ttd_proc_alive(&proc), "ttd exited during the interop run (daemon log: %s" KEEP_HINT ")",
                proc.log_path);
}
END_TEST

Suite *e2e_interop_suite(void) {
  Suite *s = suite_create("e2e_interop");
  TCase *tc = tcase_create("python_grpcio");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_python_grpcio_client);
  suite_add_tcase(s, tc);
  return s;
}
