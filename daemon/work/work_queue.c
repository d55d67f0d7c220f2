#define _GNU_SOURCE /* pthread_setname_np */
#include "work/work_queue.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

struct ttd_work_queue {
  pthread_mutex_t lock;
  pthread_cond_t ready;
  ttd_work *head, *tail;
  bool stopping;
  int thread_count;
  pthread_t threads[];
};

static void *work_main(void *arg) {
  ttd_work_queue *q = arg;
  pthread_setname_np(pthread_self(), "ttd-rpc");
  pthread_mutex_lock(&q->lock);
  for (;;) {
    while (!q->head && !q->stopping) pthread_cond_wait(&q->ready, &q->lock);
    ttd_work *work = q->head;
    if (!work) break; /* stopping and drained */
    q->head = work->next;
    if (!q->head) q->tail = NULL;
    pthread_mutex_unlock(&q->lock);
    work->next = NULL;
    work->run(work);
    pthread_mutex_lock(&q->lock);
  }
  pthread_mutex_unlock(&q->lock);
  return NULL;
}

ttd_status_t ttd_work_queue_start(int threads, ttd_work_queue **out_queue) {
  *out_queue = NULL;
  if (threads < 1) threads = 1;
  ttd_work_queue *q = calloc(1, sizeof(*q) + (size_t)threads * sizeof(pthread_t));
  if (!q) return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory for the work queue");
  pthread_mutex_init(&q->lock, NULL);
  pthread_cond_init(&q->ready, NULL);
  for (int i = 0; i < threads; i++) {
    if (pthread_create(&q->threads[i], NULL, work_main, q) != 0) break;
    q->thread_count++;
  }
  if (q->thread_count == 0) {
    ttd_work_queue_stop(q);
    return ttd_make_status(GRPC_STATUS_INTERNAL, "could not start the work queue's threads");
  }
  *out_queue = q;
  return TTD_OK;
}

void ttd_work_queue_submit(ttd_work_queue *q, ttd_work *work) {
  work->next = NULL;
  pthread_mutex_lock(&q->lock);
  if (q->tail) q->tail->next = work;
  else q->head = work;
  q->tail = work;
  pthread_cond_signal(&q->ready);
  pthread_mutex_unlock(&q->lock);
}

void ttd_work_queue_stop(ttd_work_queue *q) {
  if (!q) return;
  pthread_mutex_lock(&q->lock);
  q->stopping = true;
  pthread_cond_broadcast(&q->ready);
  pthread_mutex_unlock(&q->lock);
  for (int i = 0; i < q->thread_count; i++) pthread_join(q->threads[i], NULL);
  pthread_mutex_destroy(&q->lock);
  pthread_cond_destroy(&q->ready);
  free(q);
}
