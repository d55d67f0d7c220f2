/* End-to-end test harness: starts a real ttd (TTD_BIN) on a temporary Unix socket and
 * stops it, asserting a clean exit. No mocks of gRPC. */
#ifndef TTD_TESTS_HARNESS_H
#define TTD_TESTS_HARNESS_H

#include <stdint.h>
#include <sys/types.h>

#include "ttclient.h"

typedef struct ttd_proc {
  pid_t pid;
  char dir[64];      /* temporary folder holding the socket and the log */
  char target[96];   /* "unix:/tmp/.../ttd.sock" */
  char log_path[192];
  int starts;        /* daemons started in this folder (each logs event=ready once) */
  int own_netns;     /* ttd_proc_start_isolated: started in a network namespace of its own */
} ttd_proc;

/* Starts ttd with the given extra arguments (NULL-terminated list, may be NULL) and waits
 * until it answers. Fails the test if it does not within 10 s. */
void ttd_proc_start(ttd_proc *proc, const char *const *extra_args);

/* The same with extra environment variables for the daemon: a NULL-terminated list of
 * "NAME=VALUE" (may be NULL), added to the test's own environment. */
void ttd_proc_start_env(ttd_proc *proc, const char *const *extra_args, const char *const *env);

/* The same in a network namespace of its own (unshare(CLONE_NEWNET) in the child), as a ttd
 * on another host: it reaches no TCP address of this one, and is reached through its Unix
 * socket alone. Without the privilege for that (not root) it starts as ttd_proc_start does;
 * proc->own_netns says which. */
void ttd_proc_start_isolated(ttd_proc *proc, const char *const *extra_args);

/* Starts ttd on 2 devices with its admin HTTP listener (--admin) on a free 127.0.0.1 port;
 * returns that port. */
int ttd_proc_start_admin(ttd_proc *proc);

/* Sends sig (SIGTERM: a graceful stop; SIGKILL: a crash) and waits; returns the exit
 * status as ttd_proc_stop does. The folder stays, for ttd_proc_respawn. */
int ttd_proc_kill(ttd_proc *proc, int sig);

/* Starts ttd again in proc's folder, on the same socket, appending to its log; waits until
 * it answers (fails the test if it exits or does not answer within 10 s). */
void ttd_proc_respawn(ttd_proc *proc, const char *const *extra_args);

/* SIGTERM, waits, and returns the exit status (0 expected); removes the folder. */
int ttd_proc_stop(ttd_proc *proc);

/* The daemon's resident memory in KiB (VmRSS), or -1. */
long harness_rss_kib(const ttd_proc *proc);

/* The most resident memory the daemon has had, in KiB (VmHWM), or -1. */
long harness_hwm_kib(const ttd_proc *proc);

/* Whether the daemon process is still running. */
int ttd_proc_alive(ttd_proc *proc);

/* SIGSTOPs the daemon and returns once every one of its threads has stopped (kill alone
 * returns before a running thread, such as a polling one, stops); 0 on success. */
int ttd_proc_pause(ttd_proc *proc);

/* A connected client with keep-alive as asked; fails the test if it cannot connect. */
tt_client *harness_connect(const ttd_proc *proc, int keepalive);

/* A ttd started with no extra arguments and a client of it (keepalive on), made by
 * harness_client_setup and gone after harness_client_teardown (which asserts the ttd stopped
 * cleanly): the checked fixture of a suite that needs no other. */
extern ttd_proc harness_proc;
extern tt_client *harness_client;
void harness_client_setup(void);
void harness_client_teardown(void);

/* A small training problem: m = relu(linear(x)), x [4,3] -> [4,2] (graph seed 7), on "tt";
 * h its input on the host (fixed values), in the same on the card, target ones [4,2] on
 * the host (an L1 loss's). */
typedef struct harness_tiny_net {
  tt_module *m;
  tt_tensor *h, *in, *target;
} harness_tiny_net;
void harness_tiny_net_make(tt_client *c, harness_tiny_net *net);
void harness_tiny_net_free(harness_tiny_net *net);

/* Bytes in use on a device's DRAM or L1, read through a fresh session. */
uint64_t harness_used_bytes(const ttd_proc *proc, int device, int l1);

/* Polls harness_used_bytes until it equals want or timeout_ms passes; returns the last value. */
uint64_t harness_wait_used_bytes(const ttd_proc *proc, int device, int l1, uint64_t want, int timeout_ms);

/* Fills buf with n deterministic pseudo-random bytes from seed. */
void harness_fill_random(void *buf, size_t n, uint64_t seed);

/* A TCP port on 127.0.0.1 that was free a moment ago (bound, read back and closed). */
int harness_free_tcp_port(void);

/* One HTTP/1.0 request to 127.0.0.1:port (retried while nothing listens yet, up to 1 s);
 * returns the whole response (status line, headers, body), malloc'd: the caller frees it. */
char *harness_http(int port, const char *method, const char *path);

/* The value of an exact Prometheus text line "series value" in body (series with its
 * labels, as printed); -1 if absent. */
double harness_metric(const char *body, const char *series);

/* Lines of proc's log that contain needle (a fixed string). */
int harness_log_count(const ttd_proc *proc, const char *needle);

/* A socket of type (SOCK_STREAM for a "unix:" target's path, SOCK_SEQPACKET for the
 * shared-memory side socket) connected to the Unix socket at path; fails the test if it
 * cannot connect. The caller closes it. */
int harness_unix_connect(const char *path, int type);

/* A TCP connection to 127.0.0.1:port whose reads time out after 300 ms, or -1. */
int harness_tcp_connect(int port);

/* Whether the daemon closed fd within ms (a read returns 0, or an error other than a
 * timeout); reads and drops what arrives meanwhile. fd: from harness_tcp_connect. */
int harness_closed_within(int fd, int ms);

/* A fresh random token into token, and its "Bearer TOKEN" authorization value into auth. */
void harness_token(char *token, size_t size, char *auth, size_t auth_size);

/* Writes a --tokens file at path: one tenant a line, NAME DIGEST-OF-TOKEN OPTIONS (opts[i]:
 * "", "admin", "quota=512K", ...), with a comment and a blank line as a real file has. */
void harness_write_tokens(const char *path, const char *const *names, const char *const *tokens,
                          const char *const *opts, int n);

#endif
