/* A ttd for the fault and soak drivers: started from a build's binary on a Unix socket in
 * a temporary folder, with the admin endpoint on a free 127.0.0.1 port, its log appended to
 * DIR/ttd.log across restarts. Killed (any signal) and started again on the same socket
 * and port, as the daemon-restart fault needs. Not thread-safe. */
#ifndef TTD_FT_DAEMON_H
#define TTD_FT_DAEMON_H

#include <stdint.h>
#include <sys/types.h>

#define FT_DAEMON_MAX_ARGS 24

typedef struct ft_daemon {
  const char *bin;                          /* the ttd binary (lent) */
  const char *dir;                          /* an existing folder of the driver's (lent) */
  const char *args[FT_DAEMON_MAX_ARGS + 1]; /* more options, NULL-terminated (lent) */
  char target[300];                         /* "unix:DIR/ttd.sock" */
  char log[300];                            /* DIR/ttd.log */
  int admin_port;
  pid_t pid;                                /* 0 when not running */
  int status;                               /* waitpid status of the last one that ended */
  int starts;
} ft_daemon;

/* Fills target, log and a free admin port (the first call) and starts ttd; returns once it
 * answers /healthz, within timeout_s. 0, or -1 with the reason in err. */
int ft_daemon_start(ft_daemon *d, double timeout_s, char *err, size_t err_len);

/* Sends sig and reaps the daemon within timeout_s: 0, or -1 if it did not end (it is then
 * SIGKILLed). d->status holds how it ended. */
int ft_daemon_stop(ft_daemon *d, int sig, double timeout_s);

/* Whether it still runs (reaping it if it died). */
int ft_daemon_alive(ft_daemon *d);

/* A field of /proc/PID/status in KiB ("VmRSS", "RssAnon", ...); -1 if unreadable. */
long ft_daemon_status_kib(const ft_daemon *d, const char *field);

#endif
