#define _GNU_SOURCE /* pthread_setname_np */
#include "work/scheduler.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

/* The jobs of one key on one device, in arrival order. */
typedef struct lane {
  struct lane *next; /* the next lane in turn */
  uint64_t key;
  ttd_job *head, *tail;
} lane;

typedef struct device_queue {
  pthread_t thread;
  bool started;
  pthread_mutex_t lock;
  pthread_cond_t wake;
  lane *first, *last; /* lanes with work, in turn order */
  size_t queued;
  bool has_last_key;
  uint64_t last_key;  /* the key served most recently */
  bool stopping;
  int device;         /* its index: tt:N */
} device_queue;

struct ttd_scheduler {
  int devices;
  device_queue queues[];
};

/* Takes the next job in turn; lock held, at least one lane. */
static ttd_job *take_next(device_queue *q) {
  lane *l = q->first;
  if (q->has_last_key && l->key == q->last_key && l->next) {
    /* The key just served goes behind every other waiting key. */
    q->first = l->next;
    l->next = NULL;
    q->last->next = l;
    q->last = l;
    l = q->first;
  }
  ttd_job *job = l->head;
  l->head = job->next;
  q->first = l->next;
  l->next = NULL;
  if (!q->first) q->last = NULL;
  if (l->head) { /* still has work: to the back of the round */
    if (q->last) q->last->next = l;
    else q->first = l;
    q->last = l;
  } else {
    free(l);
  }
  q->queued--;
  q->has_last_key = true;
  q->last_key = job->key;
  job->next = NULL;
  return job;
}

static void *executor_main(void *arg) {
  device_queue *q = arg;
  char name[16];
  snprintf(name, sizeof(name), "ttd-exec-tt%d", q->device);
  pthread_setname_np(pthread_self(), name);
  pthread_mutex_lock(&q->lock);
  for (;;) {
    while (!q->first && !q->stopping) pthread_cond_wait(&q->wake, &q->lock);
    if (!q->first) break; /* stopping, and nothing left */
    ttd_job *job = take_next(q);
    pthread_mutex_unlock(&q->lock);
    job->run(job);
    pthread_mutex_lock(&q->lock);
  }
  pthread_mutex_unlock(&q->lock);
  return NULL;
}

ttd_status_t ttd_scheduler_create(int devices, ttd_scheduler **out_scheduler) {
  *out_scheduler = NULL;
  ttd_scheduler *s = calloc(1, sizeof(*s) + (size_t)devices * sizeof(device_queue));
  if (!s) return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
  s->devices = devices;
  for (int d = 0; d < devices; d++) {
    device_queue *q = &s->queues[d];
    pthread_mutex_init(&q->lock, NULL);
    pthread_cond_init(&q->wake, NULL);
    q->device = d;
  }
  for (int d = 0; d < devices; d++) {
    device_queue *q = &s->queues[d];
    if (pthread_create(&q->thread, NULL, executor_main, q) != 0) {
      ttd_scheduler_destroy(s);
      return ttd_make_status(GRPC_STATUS_INTERNAL, "cannot start the executor thread of device tt:%d", d);
    }
    q->started = true;
  }
  *out_scheduler = s;
  return TTD_OK;
}

void ttd_scheduler_submit(ttd_scheduler *scheduler, int device, ttd_job *job) {
  device_queue *q = &scheduler->queues[device];
  job->next = NULL;
  job->device = device;
  pthread_mutex_lock(&q->lock);
  lane *l = q->first;
  while (l && l->key != job->key) l = l->next;
  if (!l) {
    l = calloc(1, sizeof(*l));
    if (!l) { /* out of memory: run it here rather than lose the call */
      pthread_mutex_unlock(&q->lock);
      job->run(job);
      return;
    }
    l->key = job->key;
    if (q->last) q->last->next = l;
    else q->first = l;
    q->last = l;
  }
  if (l->tail) l->tail->next = job;
  else l->head = job;
  l->tail = job;
  q->queued++;
  pthread_cond_signal(&q->wake);
  pthread_mutex_unlock(&q->lock);
}

size_t ttd_scheduler_queued(ttd_scheduler *scheduler, int device) {
  device_queue *q = &scheduler->queues[device];
  pthread_mutex_lock(&q->lock);
  size_t n = q->queued;
  pthread_mutex_unlock(&q->lock);
  return n;
}

int ttd_scheduler_devices(const ttd_scheduler *scheduler) { return scheduler->devices; }

void ttd_scheduler_destroy(ttd_scheduler *scheduler) {
  if (!scheduler) return;
  for (int d = 0; d < scheduler->devices; d++) {
    device_queue *q = &scheduler->queues[d];
    pthread_mutex_lock(&q->lock);
    q->stopping = true;
    pthread_cond_signal(&q->wake);
    pthread_mutex_unlock(&q->lock);
  }
  for (int d = 0; d < scheduler->devices; d++) {
    device_queue *q = &scheduler->queues[d];
    if (q->started) pthread_join(q->thread, NULL);
    pthread_mutex_destroy(&q->lock);
    pthread_cond_destroy(&q->wake);
  }
  free(scheduler);
}
