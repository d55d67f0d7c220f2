/* Client processes of the fault and soak drivers. A client is this same program started
 * again (/proc/self/exe) with "--child ROLE ...": a fresh process with a fresh gRPC, since a
 * forked copy of a process that has used gRPC cannot use it. The child writes fixed-size
 * records (ft_msg, smaller than PIPE_BUF, so each write is atomic) to fd 3 and reads
 * one-byte commands from fd 4. A child dies with its driver (PR_SET_PDEATHSIG) and stays in
 * the driver's process group, so `timeout` ends them all.
 * Not thread-safe: one driver thread owns its ft_proc values. */
#ifndef TTD_FT_PROC_H
#define TTD_FT_PROC_H

#include <stdint.h>
#include <sys/types.h>

#define FT_REPORT_FD 3
#define FT_CONTROL_FD 4

typedef enum ft_msg_kind {
  FT_MSG_SESSION = 1, /* connected: session, value[0] = device bytes it holds */
  FT_MSG_READY,       /* set up; the fault may come */
  FT_MSG_BEGIN,       /* entering the call the fault aims at */
  FT_MSG_END,         /* left it; value[0] = its duration in s */
  FT_MSG_PAUSED,      /* stopped at a step boundary on command 'p' */
  FT_MSG_EVENT,       /* something to tell the driver: code and text */
  FT_MSG_RESULT,      /* the child's final figures; it exits next */
} ft_msg_kind;

typedef struct ft_msg {
  int32_t kind;    /* ft_msg_kind */
  int32_t code;    /* a tt_status */
  uint64_t session;
  double value[6];
  char text[240];
} ft_msg;

typedef struct ft_proc {
  pid_t pid;       /* 0 once reaped */
  int report_fd;   /* the driver reads ft_msg records here */
  int control_fd;  /* and writes commands here */
  int status;      /* waitpid status, once reaped */
} ft_proc;

/* Starts this program with argv (argv[0] is replaced by /proc/self/exe) and the extra
 * environment variables env ("NAME=VALUE", NULL-terminated; may be NULL). Returns 0, or -1
 * with errno set. */
int ft_proc_start(ft_proc *p, char *const argv[], char *const env[]);

/* The next record within timeout_s: 1, 0 on timeout, -1 when the child closed fd 3. */
int ft_proc_recv(ft_proc *p, ft_msg *out, double timeout_s);

/* The next record of kind within timeout_s: 1, 0 on timeout, -1 on end of file. Records of
 * other kinds are skipped; an EVENT's text is printed to stdout on the way. */
int ft_proc_expect(ft_proc *p, int kind, ft_msg *out, double timeout_s);

/* Sends a one-byte command; 0 or -1. */
int ft_proc_send(ft_proc *p, char command);

/* Sends sig (nothing once reaped). */
void ft_proc_signal(ft_proc *p, int sig);

/* Reaps the child within timeout_s: 0 (p->status holds its status), -1 on timeout. */
int ft_proc_wait(ft_proc *p, double timeout_s);

/* SIGKILLs (if running), reaps and closes the pipes. Accepts a zeroed ft_proc. */
void ft_proc_destroy(ft_proc *p);

/* In a child: writes one record to fd 3 (text printf-style, may be NULL). */
void ft_report(int kind, int code, uint64_t session, const double values[6], const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* In a child: the next command byte within timeout_s (0: just look), 0 when none came, -1
 * when the driver closed fd 4. */
int ft_command(double timeout_s);

/* Sleeps s seconds (driver or child). */
void ft_sleep(double s);

#endif
