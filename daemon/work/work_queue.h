/* A FIFO of work items run by a few threads. The RPC server's one completion-queue poller
 * answers light calls itself and hands the calls that move tensor bytes or compile to this
 * queue, so a 64 MiB copy never holds up a small call, and small calls pay no hand-over
 * between threads (with several threads polling one queue, gRPC wakes another poller on
 * every event: about three more context switches per call, measured). */
#ifndef TTD_WORK_QUEUE_H
#define TTD_WORK_QUEUE_H

#include "base/status.h"

typedef struct ttd_work ttd_work;
struct ttd_work {
  void (*run)(ttd_work *work); /* called once on one of the queue's threads */
  ttd_work *next;              /* the queue's own link */
};

typedef struct ttd_work_queue ttd_work_queue;

/* Starts threads (>= 1) threads; RESOURCE_EXHAUSTED / INTERNAL if they cannot be made. */
ttd_status_t ttd_work_queue_start(int threads, ttd_work_queue **out_queue);

/* Queues work behind everything queued before it. */
void ttd_work_queue_submit(ttd_work_queue *queue, ttd_work *work);

/* Runs what is still queued, joins the threads and frees the queue. NULL ok. */
void ttd_work_queue_stop(ttd_work_queue *queue);

#endif
