/* Client processes: this program started again with "--child ROLE", and its record pipe. */
#define _GNU_SOURCE
#include "ft_proc.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "scripts/bench/bench_common.h"

int ft_proc_start(ft_proc *p, char *const argv[], char *const env[]) {
  memset(p, 0, sizeof(*p));
  p->report_fd = p->control_fd = -1;
  int report[2], control[2];
  if (pipe2(report, O_CLOEXEC)) return -1;
  if (pipe2(control, O_CLOEXEC)) {
    close(report[0]), close(report[1]);
    return -1;
  }
  pid_t parent = getpid();
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) {
    close(report[0]), close(report[1]), close(control[0]), close(control[1]);
    return -1;
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    /* dup2 clears O_CLOEXEC on the copies; the originals close at exec. */
    if (dup2(report[1], FT_REPORT_FD) < 0 || dup2(control[0], FT_CONTROL_FD) < 0) _exit(127);
    for (int i = 0; env && env[i]; i++) putenv(env[i]);
    execv("/proc/self/exe", argv);
    _exit(127);
  }
  close(report[1]);
  close(control[0]);
  p->pid = pid;
  p->report_fd = report[0];
  p->control_fd = control[1];
  return 0;
}

/* Waits until fd is readable within timeout_s: 1, 0 on timeout. */
static int readable(int fd, double timeout_s) {
  double until = bench_now() + timeout_s;
  for (;;) {
    double left = until - bench_now();
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int rc = poll(&pfd, 1, left > 0 ? (int)(left * 1000) + 1 : 0);
    if (rc > 0) return 1;
    if (rc == 0 || (rc < 0 && errno != EINTR)) return 0;
  }
}

int ft_proc_recv(ft_proc *p, ft_msg *out, double timeout_s) {
  memset(out, 0, sizeof(*out));
  if (p->report_fd < 0) return -1;
  if (!readable(p->report_fd, timeout_s)) return 0;
  ssize_t n;
  do n = read(p->report_fd, out, sizeof(*out));
  while (n < 0 && errno == EINTR);
  return n == (ssize_t)sizeof(*out) ? 1 : -1; /* records are written whole (< PIPE_BUF) */
}

int ft_proc_expect(ft_proc *p, int kind, ft_msg *out, double timeout_s) {
  double until = bench_now() + timeout_s;
  for (;;) {
    double left = until - bench_now();
    int rc = ft_proc_recv(p, out, left > 0 ? left : 0);
    if (rc <= 0 || out->kind == kind) return rc;
    if (out->kind == FT_MSG_EVENT) printf("  client %d: %s (code %d)\n", (int)p->pid, out->text, out->code);
  }
}

int ft_proc_send(ft_proc *p, char command) {
  if (p->control_fd < 0) return -1;
  ssize_t n;
  do n = write(p->control_fd, &command, 1);
  while (n < 0 && errno == EINTR);
  return n == 1 ? 0 : -1;
}

void ft_proc_signal(ft_proc *p, int sig) {
  if (p->pid > 0) kill(p->pid, sig);
}

int ft_proc_wait(ft_proc *p, double timeout_s) {
  if (p->pid <= 0) return 0;
  double until = bench_now() + timeout_s;
  for (;;) {
    pid_t r = waitpid(p->pid, &p->status, WNOHANG);
    if (r == p->pid || (r < 0 && errno == ECHILD)) {
      p->pid = 0;
      return 0;
    }
    if (bench_now() >= until) return -1;
    ft_sleep(0.002);
  }
}

void ft_proc_destroy(ft_proc *p) {
  if (p->pid > 0) {
    kill(p->pid, SIGKILL);
    kill(p->pid, SIGCONT);
    ft_proc_wait(p, 30);
  }
  if (p->report_fd >= 0) close(p->report_fd);
  if (p->control_fd >= 0) close(p->control_fd);
  p->report_fd = p->control_fd = -1;
}

void ft_report(int kind, int code, uint64_t session, const double values[6], const char *fmt, ...) {
  ft_msg m;
  memset(&m, 0, sizeof(m));
  m.kind = kind;
  m.code = code;
  m.session = session;
  if (values) memcpy(m.value, values, sizeof(m.value));
  if (fmt) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m.text, sizeof(m.text), fmt, ap);
    va_end(ap);
  }
  ssize_t n;
  do n = write(FT_REPORT_FD, &m, sizeof(m));
  while (n < 0 && errno == EINTR);
}

int ft_command(double timeout_s) {
  if (!readable(FT_CONTROL_FD, timeout_s)) return 0;
  char c;
  ssize_t n;
  do n = read(FT_CONTROL_FD, &c, 1);
  while (n < 0 && errno == EINTR);
  return n == 1 ? (unsigned char)c : -1;
}

void ft_sleep(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}
