#define _GNU_SOURCE /* pthread_setname_np */
#include "work/scheduler.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

/* The jobs of one key (a session) on one device, in arrival order. */
typedef struct lane {
  struct lane *next; /* the next lane of its group in turn */
  uint64_t key;
  ttd_job *head, *tail;
} lane;

/* The lanes of one group (a tenant) with work on one device, taking turns. */
typedef struct group {
  struct group *next; /* the next group in turn */
  uint64_t key;
  uint32_t weight; /* jobs it is served in a row before the next group's turn */
  uint32_t served; /* of them, so far */
  lane *first, *last;
} group;

typedef struct device_queue {
  pthread_t thread;
  bool started;
  pthread_mutex_t lock;
  pthread_cond_t wake;
  group *first, *last; /* groups with work, in turn order */
  size_t queued;
  bool served_any;
  uint64_t last_group, last_key; /* of the job served most recently */
  bool stopping;
  int device;         /* its index: tt:N */
} device_queue;

struct ttd_scheduler {
  int devices;
  device_queue queues[];
};

/* Takes the next job in turn; lock held, at least one group. The first group is served
 * (its first lane's first job, the lane then going behind its group's other lanes) until
 * it has had its weight of jobs or runs out, then goes behind every other group. */
static ttd_job *take_next(device_queue *q) {
  group *g = q->first;
  /* A group or lane just served, that went and came back with new work, still waits for
   * the others' turns. */
  if (q->served_any && g->key == q->last_group && g->served == 0 && g->next) {
    q->first = g->next;
    g->next = NULL;
    q->last->next = g;
    q->last = g;
    g = q->first;
  }
  lane *l = g->first;
  if (q->served_any && g->key == q->last_group && l->key == q->last_key && l->next) {
    g->first = l->next;
    l->next = NULL;
    g->last->next = l;
    g->last = l;
    l = g->first;
  }
  ttd_job *job = l->head;
  l->head = job->next;
  if (!l->head) l->tail = NULL;
  g->first = l->next;
  l->next = NULL;
  if (!g->first) g->last = NULL;
  if (l->head) { /* still has work: behind the group's other lanes */
    if (g->last) g->last->next = l;
    else g->first = l;
    g->last = l;
  } else {
    free(l);
  }
  g->served++;
  if (!g->first || g->served >= g->weight) { /* its turn ends */
    g->served = 0;
    q->first = g->next;
    g->next = NULL;
    if (!q->first) q->last = NULL;
    if (g->first) { /* still has work: to the back of the round */
      if (q->last) q->last->next = g;
      else q->first = g;
      q->last = g;
    } else {
      free(g);
    }
  }
  q->queued--;
  q->served_any = true;
  q->last_group = job->group;
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
  group *g = q->first;
  while (g && g->key != job->group) g = g->next;
  bool new_group = !g;
  if (new_group && !(g = calloc(1, sizeof(*g)))) {
    pthread_mutex_unlock(&q->lock);
    job->run(job); /* out of memory: run it here rather than lose the call */
    return;
  }
  lane *l = g->first;
  while (l && l->key != job->key) l = l->next;
  bool new_lane = !l;
  if (new_lane && !(l = calloc(1, sizeof(*l)))) {
    if (new_group) free(g);
    pthread_mutex_unlock(&q->lock);
    job->run(job);
    return;
  }
  if (new_group) {
    g->key = job->group;
    if (q->last) q->last->next = g;
    else q->first = g;
    q->last = g;
  }
  g->weight = job->weight ? job->weight : 1; /* the latest: a reload may change it */
  if (new_lane) { /* behind the group's other lanes */
    l->key = job->key;
    if (g->last) g->last->next = l;
    else g->first = l;
    g->last = l;
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
