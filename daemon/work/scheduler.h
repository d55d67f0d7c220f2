/* Layer daemon/work: the per-device scheduler, the work queue and the program cache. Calls
 * daemon/session, daemon/telemetry and the runtime.
 *
 * Fair scheduling of device work: one queue per device, served by that device's executor
 * thread, one job (a whole program: Execute, Backward, OptimizerStep) at a time.
 *
 * Jobs carry a key (the session) and a group (its tenant). Each key has its own FIFO lane;
 * groups take turns round-robin, and within a group's turn its lanes do: a group with
 * weight w is served w jobs a turn (one lane after another), then every other group with
 * work is served before it again. So tenants share the card by weight however many sessions
 * each opens (a tenant with 16 busy sessions and one with a single session get half each),
 * a session's job waits behind at most a turn of each other tenant and one job of each
 * other session of its own tenant, and one session's jobs still run in the order it sent
 * them.
 *
 * Jobs of different sessions at once: where the device can run n programs together (the
 * card's `at_once`, the simulated card's host threads), once n sessions have jobs waiting the
 * device has n places, each running one program on its own share of the card (the simulated
 * card: one thread, with no hand-offs between threads inside a program). A free place takes
 * the next job in turn, never a job of a session whose earlier job still runs (it waits for
 * it instead); once nothing runs and fewer than n sessions wait, jobs run alone on the whole
 * device again. Ordering and turns are as above either way.
 *
 * RPC threads only enqueue, so they stay free for transfers and other calls while
 * programs run. Thread-safe.
 *
 * Stopping a running job: each of a device's places for a running job has a cancellation
 * flag (kernels/thread_pool.h), cleared when a job starts there and lent to it as job->cancel; the job hands it to the kernels it runs,
 * which poll it. A watchdog thread sets it to DEADLINE_EXCEEDED when the running job's
 * deadline passes; anyone else who must stop the job (its session closing) stores its own
 * code in it while the job runs. */
#ifndef TTD_SCHEDULER_H
#define TTD_SCHEDULER_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "thread_pool.h"

typedef struct ttd_job ttd_job;
struct ttd_job {
  ttd_job *next;          /* the scheduler's */
  uint64_t key;           /* jobs of one key (a session) run in order; keys of a group take turns */
  uint64_t group;         /* the key's group (a tenant): groups take turns first */
  uint32_t weight;        /* the group's jobs in a row per turn (0 counts as 1) */
  void (*run)(ttd_job *job);
  int64_t deadline_ns;    /* CLOCK_MONOTONIC; past it the running job's flag is set; 0: none */
  int device;             /* set by ttd_scheduler_submit */
  ttd_cancel *cancel;     /* set when the job starts: its place's flag, clear; valid while it runs */
  int sharing;            /* set when the job starts: 1 when it has the whole device, else the n of
                           * the device's n places for jobs run together, one of which is its */
};

/* The most jobs one device runs at once. */
#define TTD_SCHEDULER_AT_ONCE_MAX 64

/* How a device runs jobs of different sessions together, where it can. */
typedef struct ttd_scheduler_card {
  /* The most jobs `device` runs at once (<= 1: one at a time). */
  int (*at_once)(void *ctx, int device);
  /* Calls run(arg, i) for every i < n, together as the device's cores allow, and returns when
   * all have returned. Each call's own parallel work stays on the thread it runs on. */
  void (*run_together)(void *ctx, int device, size_t n, void (*run)(void *arg, size_t i), void *arg);
  void *ctx;
} ttd_scheduler_card;

typedef struct ttd_scheduler ttd_scheduler;

/* A scheduler with one queue and one executor thread per device. card: how devices run
 * jobs together (copied); NULL: one job at a time on every device. */
ttd_status_t ttd_scheduler_create(int devices, const ttd_scheduler_card *card, ttd_scheduler **out_scheduler);

/* Queues job on device (0 <= device < devices). job->run is called on the device's
 * executor thread, or where its card runs jobs together; the job's memory must stay valid
 * until then. */
void ttd_scheduler_submit(ttd_scheduler *scheduler, int device, ttd_job *job);

/* Jobs waiting on device, the running ones not included. */
size_t ttd_scheduler_queued(ttd_scheduler *scheduler, int device);

/* Jobs device has run beside others (at one of its places), since the start. */
uint64_t ttd_scheduler_together(ttd_scheduler *scheduler, int device);

int ttd_scheduler_devices(const ttd_scheduler *scheduler);

/* Sets the flag of every job running now, on every device (a job run with no queue, for
 * want of memory for one, included), to code (unless already set), so that each stops at its
 * kernels' next check. Jobs starting later start clear: their caller refuses them itself (a
 * daemon stopping sets its own flag first, then calls this). */
void ttd_scheduler_stop_running(ttd_scheduler *scheduler, int code); /* NULL ok */

/* Runs every job still queued, stops the executors and frees the scheduler. NULL ok. */
void ttd_scheduler_destroy(ttd_scheduler *scheduler);

#endif
