/* Layer daemon/work: the per-device scheduler, the work queue and the program cache. Calls
 * daemon/session, daemon/telemetry and the runtime.
 *
 * Fair scheduling of device work: one queue per device, served by that device's executor
 * thread, one job (a whole program: Execute, Backward, OptimizerStep) at a time.
 *
 * Jobs carry a key (the session). Each key has its own FIFO lane, and lanes take turns
 * round-robin: the executor never serves the same key twice in a row while another key
 * waits. So a session's job waits behind at most one job of each other session with work
 * queued (in particular, behind at most one program of a session with a long queue), and
 * one session's jobs still run in the order it sent them.
 *
 * RPC threads only enqueue, so they stay free for transfers and other calls while
 * programs run. Thread-safe. */
#ifndef TTD_SCHEDULER_H
#define TTD_SCHEDULER_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct ttd_job ttd_job;
struct ttd_job {
  ttd_job *next;          /* the scheduler's */
  uint64_t key;           /* jobs of one key run in order; keys take turns */
  void (*run)(ttd_job *job);
  int device;             /* set by ttd_scheduler_submit */
};

typedef struct ttd_scheduler ttd_scheduler;

/* A scheduler with one queue and one executor thread per device. */
ttd_status_t ttd_scheduler_create(int devices, ttd_scheduler **out_scheduler);

/* Queues job on device (0 <= device < devices). job->run is called on the device's
 * executor thread; the job's memory must stay valid until then. */
void ttd_scheduler_submit(ttd_scheduler *scheduler, int device, ttd_job *job);

/* Jobs waiting on device, the running one not included. */
size_t ttd_scheduler_queued(ttd_scheduler *scheduler, int device);

int ttd_scheduler_devices(const ttd_scheduler *scheduler);

/* Runs every job still queued, stops the executors and frees the scheduler. NULL ok. */
void ttd_scheduler_destroy(ttd_scheduler *scheduler);

#endif
