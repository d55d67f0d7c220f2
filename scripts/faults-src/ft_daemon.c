/* Starting, killing and restarting a ttd for the drivers. */
#define _GNU_SOURCE
#include "ft_daemon.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ft_metrics.h"
#include "ft_proc.h"
#include "scripts/bench/bench_common.h"

/* A port the kernel says is free now (released at once, then handed to ttd). */
static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = fd >= 0 && !bind(fd, (struct sockaddr *)&a, sizeof(a)) && !getsockname(fd, (struct sockaddr *)&a, &len)
                 ? ntohs(a.sin_port)
                 : -1;
  if (fd >= 0) close(fd);
  return port;
}

int ft_daemon_start(ft_daemon *d, double timeout_s, char *err, size_t err_len) {
  if (!d->admin_port) {
    snprintf(d->target, sizeof(d->target), "unix:%s/ttd.sock", d->dir);
    snprintf(d->log, sizeof(d->log), "%s/ttd.log", d->dir);
    d->admin_port = free_port();
    if (d->admin_port < 0) {
      snprintf(err, err_len, "no free TCP port for the admin endpoint: %s", strerror(errno));
      return -1;
    }
  }
  char admin[32];
  snprintf(admin, sizeof(admin), "127.0.0.1:%d", d->admin_port);
  const char *argv[FT_DAEMON_MAX_ARGS + 8] = {d->bin, "--listen", d->target, "--admin", admin};
  int n = 5;
  for (int i = 0; d->args[i] && i < FT_DAEMON_MAX_ARGS; i++) argv[n++] = d->args[i];
  argv[n] = NULL;
  int log = open(d->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log < 0) {
    snprintf(err, err_len, "cannot open %s: %s", d->log, strerror(errno));
    return -1;
  }
  pid_t parent = getpid();
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    dup2(log, STDERR_FILENO);
    dup2(log, STDOUT_FILENO);
    execv(d->bin, (char *const *)argv);
    _exit(127);
  }
  close(log);
  if (pid < 0) {
    snprintf(err, err_len, "fork: %s", strerror(errno));
    return -1;
  }
  d->pid = pid;
  d->starts++;
  double until = bench_now() + timeout_s;
  char body[256];
  while (ft_http_get(d->admin_port, "/healthz", body, sizeof(body)) != 200) {
    if (!ft_daemon_alive(d)) {
      snprintf(err, err_len, "ttd exited at start (status 0x%x); see %s", d->status, d->log);
      return -1;
    }
    if (bench_now() > until) {
      snprintf(err, err_len, "ttd did not answer /healthz within %.0f s; see %s", timeout_s, d->log);
      ft_daemon_stop(d, SIGKILL, 5);
      return -1;
    }
    ft_sleep(0.01);
  }
  return 0;
}

int ft_daemon_alive(ft_daemon *d) {
  if (d->pid <= 0) return 0;
  if (waitpid(d->pid, &d->status, WNOHANG) == d->pid) d->pid = 0;
  return d->pid > 0;
}

int ft_daemon_stop(ft_daemon *d, int sig, double timeout_s) {
  if (d->pid <= 0) return 0;
  kill(d->pid, sig);
  double until = bench_now() + timeout_s;
  while (ft_daemon_alive(d)) {
    if (bench_now() > until) {
      kill(d->pid, SIGKILL);
      waitpid(d->pid, &d->status, 0);
      d->pid = 0;
      return -1;
    }
    ft_sleep(0.005);
  }
  return 0;
}

long ft_daemon_status_kib(const ft_daemon *d, const char *field) {
  char path[64], line[256];
  snprintf(path, sizeof(path), "/proc/%d/status", (int)d->pid);
  FILE *f = d->pid > 0 ? fopen(path, "r") : NULL;
  if (!f) return -1;
  long kib = -1;
  size_t n = strlen(field);
  while (fgets(line, sizeof(line), f)) {
    if (strncmp(line, field, n) == 0 && line[n] == ':') {
      kib = strtol(line + n + 1, NULL, 10);
      break;
    }
  }
  fclose(f);
  return kib;
}
