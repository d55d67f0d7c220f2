#define _GNU_SOURCE /* pthread_setname_np */
#include "work/scheduler.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "base/clock.h"

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

/* Where a running job is: its flag, and its deadline until the watchdog fires it (0: none;
 * under watch_lock). */
typedef struct place {
  ttd_cancel cancel;
  int64_t deadline_ns;
  bool running;  /* a job of key runs here (under the queue's lock) */
  uint64_t key;
} place;

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
  size_t lanes;       /* keys with jobs waiting */
  int at_once;        /* the most jobs it runs together, 1..TTD_SCHEDULER_AT_ONCE_MAX */
  /* Jobs together (executor_main): places running a job, and the batch's end called. */
  int busy;
  bool closing;
  uint64_t together; /* jobs run at a place, since the start */
  struct ttd_scheduler *owner;
  place places[TTD_SCHEDULER_AT_ONCE_MAX];
} device_queue;

/* A job run with no queue (run_unqueued): its flag, listed while it runs. */
typedef struct unqueued {
  ttd_cancel flag;
  struct unqueued *next;
} unqueued;

struct ttd_scheduler {
  int devices;
  ttd_scheduler_card card;
  /* The watchdog: sleeps until the earliest deadline of a running job, then sets its flag. */
  pthread_t watchdog;
  bool watchdog_started, watchdog_stopping; /* stopping under watch_lock */
  pthread_mutex_t watch_lock;
  pthread_cond_t watch_wake;  /* on CLOCK_MONOTONIC */
  int64_t watch_until;        /* when the watchdog wakes by itself; INT64_MAX: not before a signal */
  unqueued *unqueued;         /* jobs running with no queue (under watch_lock) */
  device_queue queues[];
};

static void *watchdog_main(void *arg) {
  ttd_scheduler *s = arg;
  pthread_setname_np(pthread_self(), "ttd-deadlines");
  pthread_mutex_lock(&s->watch_lock);
  while (!s->watchdog_stopping) {
    int64_t now = ttd_now_ns(), next = INT64_MAX;
    for (int d = 0; d < s->devices; d++) {
      for (int i = 0; i < s->queues[d].at_once; i++) {
        place *p = &s->queues[d].places[i];
        if (!p->deadline_ns) continue;
        if (p->deadline_ns <= now) {
          int clear = 0;
          atomic_compare_exchange_strong(&p->cancel.code, &clear, (int)GRPC_STATUS_DEADLINE_EXCEEDED);
          p->deadline_ns = 0;
        } else if (p->deadline_ns < next) {
          next = p->deadline_ns;
        }
      }
    }
    s->watch_until = next;
    if (next == INT64_MAX) {
      pthread_cond_wait(&s->watch_wake, &s->watch_lock);
    } else {
      struct timespec until = {.tv_sec = next / 1000000000, .tv_nsec = next % 1000000000};
      pthread_cond_timedwait(&s->watch_wake, &s->watch_lock, &until);
    }
  }
  pthread_mutex_unlock(&s->watch_lock);
  return NULL;
}

/* The job starts at place p: its flag cleared, its deadline watched (the watchdog woken only
 * when it would sleep past it, so jobs with far deadlines cost no wake-up). */
static void job_begin(ttd_scheduler *s, place *p, ttd_job *job) {
  pthread_mutex_lock(&s->watch_lock);
  atomic_store_explicit(&p->cancel.code, 0, memory_order_relaxed);
  p->deadline_ns = job->deadline_ns;
  if (job->deadline_ns && job->deadline_ns < s->watch_until) {
    s->watch_until = job->deadline_ns;
    pthread_cond_signal(&s->watch_wake);
  }
  pthread_mutex_unlock(&s->watch_lock);
  job->cancel = &p->cancel;
}

void ttd_scheduler_stop_running(ttd_scheduler *s, int code) {
  if (!s) return;
  pthread_mutex_lock(&s->watch_lock); /* job_begin clears a flag under it: no set is lost */
  for (int d = 0; d < s->devices; d++) {
    for (int i = 0; i < s->queues[d].at_once; i++) {
      int clear = 0;
      atomic_compare_exchange_strong(&s->queues[d].places[i].cancel.code, &clear, code);
    }
  }
  for (unqueued *u = s->unqueued; u; u = u->next) {
    int clear = 0;
    atomic_compare_exchange_strong(&u->flag.code, &clear, code);
  }
  pthread_mutex_unlock(&s->watch_lock);
}

/* The job at p has ended (its memory may be gone): its deadline no longer matters. */
static void job_end(ttd_scheduler *s, place *p) {
  pthread_mutex_lock(&s->watch_lock);
  p->deadline_ns = 0;
  pthread_mutex_unlock(&s->watch_lock);
}

static void run_at(ttd_scheduler *s, place *p, ttd_job *job, int sharing) {
  job->sharing = sharing;
  job_begin(s, p, job);
  job->run(job);
  job_end(s, p);
}

/* Runs job on the calling thread, with no queue (no memory left for its lane): a flag of its
 * own, clear, listed while it runs (on this stack, so no memory is needed) for
 * ttd_scheduler_stop_running and its session's close to set, and no deadline watched. */
static void run_unqueued(ttd_scheduler *s, ttd_job *job) {
  unqueued u = {.flag = {0}};
  pthread_mutex_lock(&s->watch_lock);
  u.next = s->unqueued;
  s->unqueued = &u;
  pthread_mutex_unlock(&s->watch_lock);
  job->sharing = 1;
  job->cancel = &u.flag;
  job->run(job);
  pthread_mutex_lock(&s->watch_lock);
  unqueued **at = &s->unqueued;
  while (*at != &u) at = &(*at)->next;
  *at = u.next;
  pthread_mutex_unlock(&s->watch_lock);
}

/* Puts the group and lane whose turn it is first, and returns that lane's first job (the
 * next in turn); lock held, at least one group. A group or lane just served, that went and
 * came back with new work, still waits for the others' turns. Doing it again changes
 * nothing until a job is taken. */
static ttd_job *next_in_turn(device_queue *q) {
  group *g = q->first;
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
  }
  return g->first->head;
}

/* Takes the next job in turn; lock held, at least one group. The first group is served
 * (its first lane's first job, the lane then going behind its group's other lanes) until
 * it has had its weight of jobs or runs out, then goes behind every other group. */
static ttd_job *take_next(device_queue *q) {
  next_in_turn(q);
  group *g = q->first;
  lane *l = g->first;
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
    q->lanes--;
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

/* Whether a job of key runs at one of q's places; lock held. */
static bool key_running(const device_queue *q, uint64_t key) {
  for (int i = 0; i < q->at_once; i++) {
    if (q->places[i].running && q->places[i].key == key) return true;
  }
  return false;
}

/* One place of a batch (the card's run_together calls one per place): takes the next job in
 * turn whenever it is free, unless that job's session has one running (it waits for it);
 * waits while others run. The batch ends, at every place, once nothing runs and fewer
 * sessions wait than the device has places: each program of a batch runs on its place
 * alone, so fewer would leave places idle, where a job alone has the whole device
 * (executor_main). */
static void run_place(void *arg, size_t i) {
  device_queue *q = arg;
  place *p = &q->places[i];
  pthread_mutex_lock(&q->lock);
  while (!q->closing) {
    if (q->busy == 0 && q->lanes < (size_t)q->at_once) {
      q->closing = true;
      pthread_cond_broadcast(&q->wake);
      break;
    }
    if (!q->first || key_running(q, next_in_turn(q)->key)) {
      pthread_cond_wait(&q->wake, &q->lock);
      continue;
    }
    ttd_job *job = take_next(q);
    q->together++;
    p->running = true;
    p->key = job->key;
    q->busy++;
    pthread_mutex_unlock(&q->lock);
    run_at(q->owner, p, job, q->at_once);
    pthread_mutex_lock(&q->lock);
    p->running = false;
    q->busy--;
    pthread_cond_broadcast(&q->wake); /* a place waiting for this session, or for the end */
  }
  pthread_mutex_unlock(&q->lock);
}

static void *executor_main(void *arg) {
  device_queue *q = arg;
  ttd_scheduler *s = q->owner;
  char name[16];
  snprintf(name, sizeof(name), "ttd-exec-tt%d", q->device);
  pthread_setname_np(pthread_self(), name);
  pthread_mutex_lock(&q->lock);
  for (;;) {
    while (!q->first && !q->stopping) pthread_cond_wait(&q->wake, &q->lock);
    if (!q->first) break; /* stopping, and nothing left */
    if (q->at_once > 1 && q->lanes >= (size_t)q->at_once) { /* a session for every place */
      q->closing = false;
      pthread_mutex_unlock(&q->lock);
      s->card.run_together(s->card.ctx, q->device, (size_t)q->at_once, run_place, q);
      pthread_mutex_lock(&q->lock);
      continue;
    }
    ttd_job *job = take_next(q);
    pthread_mutex_unlock(&q->lock);
    run_at(s, &q->places[0], job, 1);
    pthread_mutex_lock(&q->lock);
  }
  pthread_mutex_unlock(&q->lock);
  return NULL;
}

ttd_status_t ttd_scheduler_create(int devices, const ttd_scheduler_card *card, ttd_scheduler **out_scheduler) {
  *out_scheduler = NULL;
  ttd_scheduler *s = calloc(1, sizeof(*s) + (size_t)devices * sizeof(device_queue));
  if (!s) return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
  s->devices = devices;
  if (card) s->card = *card;
  for (int d = 0; d < devices; d++) {
    device_queue *q = &s->queues[d];
    pthread_mutex_init(&q->lock, NULL);
    pthread_cond_init(&q->wake, NULL);
    q->device = d;
    q->owner = s;
    int at_once = s->card.at_once && s->card.run_together ? s->card.at_once(s->card.ctx, d) : 1;
    q->at_once = at_once < 1 ? 1 : at_once > TTD_SCHEDULER_AT_ONCE_MAX ? TTD_SCHEDULER_AT_ONCE_MAX : at_once;
  }
  pthread_mutex_init(&s->watch_lock, NULL);
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&s->watch_wake, &attr);
  pthread_condattr_destroy(&attr);
  s->watch_until = INT64_MAX;
  if (pthread_create(&s->watchdog, NULL, watchdog_main, s) != 0) {
    ttd_scheduler_destroy(s);
    return ttd_make_status(GRPC_STATUS_INTERNAL, "cannot start the scheduler's deadline thread");
  }
  s->watchdog_started = true;
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
    run_unqueued(scheduler, job); /* out of memory: run it here rather than lose the call */
    return;
  }
  lane *l = g->first;
  while (l && l->key != job->key) l = l->next;
  bool new_lane = !l;
  if (new_lane && !(l = calloc(1, sizeof(*l)))) {
    if (new_group) free(g);
    pthread_mutex_unlock(&q->lock);
    run_unqueued(scheduler, job);
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
    q->lanes++;
    l->key = job->key;
    if (g->last) g->last->next = l;
    else g->first = l;
    g->last = l;
  }
  if (l->tail) l->tail->next = job;
  else l->head = job;
  l->tail = job;
  q->queued++;
  pthread_cond_broadcast(&q->wake); /* the executor, or every place of a batch */
  pthread_mutex_unlock(&q->lock);
}

size_t ttd_scheduler_queued(ttd_scheduler *scheduler, int device) {
  device_queue *q = &scheduler->queues[device];
  pthread_mutex_lock(&q->lock);
  size_t n = q->queued;
  pthread_mutex_unlock(&q->lock);
  return n;
}

uint64_t ttd_scheduler_together(ttd_scheduler *scheduler, int device) {
  device_queue *q = &scheduler->queues[device];
  pthread_mutex_lock(&q->lock);
  uint64_t n = q->together;
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
  pthread_mutex_lock(&scheduler->watch_lock);
  scheduler->watchdog_stopping = true;
  pthread_cond_signal(&scheduler->watch_wake);
  pthread_mutex_unlock(&scheduler->watch_lock);
  if (scheduler->watchdog_started) pthread_join(scheduler->watchdog, NULL);
  pthread_mutex_destroy(&scheduler->watch_lock);
  pthread_cond_destroy(&scheduler->watch_wake);
  free(scheduler);
}
