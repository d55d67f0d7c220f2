/* scripts/faults: the fault driver's shared state, its phases and its client roles.
 *
 * The driver (faults_main.c) starts a ttd with tenants (admin, bystander, victim, hog,
 * greedy), a bystander client that trains throughout and checks every loss bit for bit
 * against its own first run, then injects the faults phase by phase:
 *   faults_kill.c     victims SIGKILLed mid-upload, mid-download, mid-execute, mid-backward
 *   faults_stall.c    a Download nobody reads: session closed under it; a client stopped
 *   faults_exhaust.c  one tenant fills its quota and the card's L1, and asks for more DRAM
 *                     than the card has, while the bystander trains
 *   faults_graceful.c the daemon stopped gracefully (SIGTERM) under load and started
 *                     again on its saved state: every client resumes its session
 *   faults_restart.c  the daemon SIGKILLed and restarted under load
 * and after each checks that the victims' sessions closed within a lease of their last
 * call (faults_watch.c) and that the card holds exactly what the live sessions hold
 * (faults_check.c). Client processes are this
 * program run with --child ROLE (ft_proc.h); their bodies are the fc_*.c files. Prefixes:
 * faults_ the driver, fc_ its clients, ft_ the tools scripts/soak shares (ft_*.h). */
#ifndef TTD_FAULTS_H
#define TTD_FAULTS_H

#include <stdint.h>

#include "ft_daemon.h"
#include "ft_proc.h"
#include "ft_tenants.h"
#include "ttclient.h"

enum { FT_ADMIN, FT_BYSTANDER, FT_VICTIM, FT_HOG, FT_GREEDY, FT_TENANTS };

#define FAULTS_MAX_KINDS 12
#define FAULTS_MAX_REPS 16
#define FAULTS_HANG_S 30.0

/* Figures of one kind of fault. */
typedef struct faults_tally {
  char name[40];
  int injected;
  int in_call;           /* kills that landed inside the call aimed at */
  uint64_t bytes;        /* device bytes the dead clients held, all returned */
  double recover_max_s;  /* the longest fault -> memory back */
  double after_call_max_s; /* the longest last call the daemon saw -> session closed */
  char note[200];
} faults_tally;

typedef struct faults_ctx {
  const char *self;       /* argv[0], for children */
  ft_daemon daemon;
  ft_tenant tenants[FT_TENANTS];
  tt_client *admin;       /* the driver's own session (admin tenant) */
  ft_proc bystander;
  int reps;               /* victims per kind */
  int restart_clients;
  int resume_clients;     /* clients training across the graceful restart */
  const char *state_dir;  /* ttd's --state-dir */
  double lease_s;
  double recover_bound_s; /* lease + the sweep's period + slack, after the last call */
  faults_tally tally[FAULTS_MAX_KINDS];
  int kinds;
  int failures;
} faults_ctx;

/* ---- driver helpers (faults_check.c) ---- */

/* Counts a failed check when ok is 0 and prints "FAIL: ..."; returns ok. */
int faults_check(faults_ctx *ctx, int ok, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* A new tally row named name. */
faults_tally *faults_tally_add(faults_ctx *ctx, const char *name);

/* Starts a client process: ROLE with tenant's token, n and shm for its parameters. */
int faults_spawn(faults_ctx *ctx, ft_proc *p, const char *role, int tenant, int n, int shm);

/* The device bytes the session holds per ListSessions, or -1 when it is not open (-2 when
 * the listing failed). */
int64_t faults_session_bytes(faults_ctx *ctx, uint64_t session);

/* The faulted clients' sessions, watched going (faults_watch.c): a thread polls
 * ListSessions on an admin session of its own every 10 ms. */
typedef struct faults_watch faults_watch;

/* Starts a watch; NULL after a failed check. */
faults_watch *faults_watch_start(faults_ctx *ctx);

/* Watches session, whose client was hit at faulted_at (bench_now() time). */
void faults_watch_add(faults_watch *w, uint64_t session, double faulted_at);

/* Waits until every watched session is gone and ends the watch. Each must close within
 * ctx->recover_bound_s (its lease and the sweep's period) of the last call the daemon saw
 * from it: under load the daemon may still be taking in a dead client's last calls after
 * the kill. Adds to t the longest fault -> closed and last call -> closed. 0, or -1 after a
 * failed check (a session still open FAULTS_HANG_S after its fault is a hang). */
int faults_watch_finish(faults_ctx *ctx, faults_watch *w, faults_tally *t);

/* With the bystander paused at a step boundary: waits (up to timeout_s) until the card's
 * memory in use (/metrics) is what the open sessions hold, only admin and bystander
 * sessions are open, and at most allowed host bytes of freed tensors are still pinned by
 * sends to a slow client (ttd_device_memory_in_flight_bytes). The moment that held
 * (bench_now() time), or -1 after printing what differs; the in-flight bytes last seen
 * into *out_in_flight (may be NULL). */
double faults_check_memory(faults_ctx *ctx, const char *after, double timeout_s, uint64_t allowed,
                           uint64_t *out_in_flight);

/* faults_check_memory with nothing in flight: the card holds exactly what the sessions do. */
double faults_check_quiescent(faults_ctx *ctx, const char *after, double timeout_s);

/* Sends sig to victim p (a fc_victim.c client) a random 20-80% into its next call, timed by
 * the call before; the session's device bytes just before into *out_bytes, the moment of
 * the signal into *out_at. 1 if the signal caught it inside the call, 0 just outside, -1
 * if it never got going. A SIGKILLed victim is reaped. */
int faults_signal_in_call(faults_ctx *ctx, ft_proc *p, uint64_t session, int sig, unsigned long long *rng,
                          int64_t *out_bytes, double *out_at);

/* Opens a session of the admin tenant named name (tt_connect's contract). */
tt_status faults_admin_open(faults_ctx *ctx, const char *name, tt_client **out_client);

/* Reconnects the driver's admin session (after a daemon restart). */
int faults_admin_connect(faults_ctx *ctx);

/* ---- phases ---- */
void faults_phase_kill(faults_ctx *ctx);
void faults_phase_stall(faults_ctx *ctx);
void faults_phase_exhaust(faults_ctx *ctx);
void faults_phase_graceful(faults_ctx *ctx);
void faults_phase_restart(faults_ctx *ctx);

/* ---- client roles (run in child processes; return the exit status) ---- */
typedef struct fc_args {
  const char *role;
  const char *target;
  int n;    /* a role's count parameter */
  int shm;  /* 0: no shared-memory fast path */
} fc_args;

int fc_bystander_main(const fc_args *a);
int fc_victim_main(const fc_args *a); /* roles upload, download, execute, backward */
int fc_stall_main(const fc_args *a);
int fc_hog_main(const fc_args *a);    /* roles hog-quota, hog-l1 */
int fc_reconnect_main(const fc_args *a);
int fc_resume_main(const fc_args *a); /* roles resume-upload, resume-forward, resume-between, resume-backward */

/* The step at which a resume client stops before its call, for the graceful restart. */
#define FC_RESUME_PARK 4

/* In a child: connects with the token in $TTD_TOKEN; on failure reports an EVENT and exits 1. */
tt_client *fc_connect(const fc_args *a, int keepalive);

/* In a child: reports an EVENT naming what failed, with the client's last error, and exits 1. */
void fc_die(tt_client *c, const char *what) __attribute__((noreturn));

#endif
