/* The device scheduler: round-robin between keys, FIFO within a key, per-device executors,
 * queue depth, a destroy that runs what is queued, and jobs of different sessions run
 * together where the card can. */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "alloc_fail.h"
#include "work/scheduler.h"
#include "suites.h"

/* A job that records its name in the shared order, and can be held until released. */
typedef struct test_job {
  ttd_job job;
  char name[8];
  int hold; /* wait for the gate before returning */
} test_job;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static char order[256];
static int gate_open, started, finished;

static void record(ttd_job *j) {
  test_job *t = (test_job *)j;
  pthread_mutex_lock(&lock);
  started++;
  pthread_cond_broadcast(&cond);
  while (t->hold && !gate_open) pthread_cond_wait(&cond, &lock);
  strcat(order, t->name);
  strcat(order, " ");
  finished++;
  pthread_cond_broadcast(&cond);
  pthread_mutex_unlock(&lock);
}

static void reset(void) {
  order[0] = '\0';
  gate_open = 0;
  started = 0;
  finished = 0;
}

static void init_job(test_job *t, const char *name, uint64_t key, int hold) {
  memset(t, 0, sizeof(*t));
  snprintf(t->name, sizeof(t->name), "%s", name);
  t->job.key = key;
  t->job.run = record;
  t->hold = hold;
}

static void wait_started(int n) {
  pthread_mutex_lock(&lock);
  while (started < n) pthread_cond_wait(&cond, &lock);
  pthread_mutex_unlock(&lock);
}

static void open_gate_and_wait(int n) {
  pthread_mutex_lock(&lock);
  gate_open = 1;
  pthread_cond_broadcast(&cond);
  while (finished < n) pthread_cond_wait(&cond, &lock);
  pthread_mutex_unlock(&lock);
}

/* While A1 runs, A queues four more and B one: B goes next, then A in order. A session with
 * a long queue delays another by one program, not by its queue. */
START_TEST(test_round_robin_two_keys) {
  reset();
  ttd_scheduler *s = NULL;
  ck_assert_ptr_null(ttd_scheduler_create(1, NULL, &s));
  test_job j[6];
  init_job(&j[0], "A1", 1, 1);
  ttd_scheduler_submit(s, 0, &j[0].job);
  wait_started(1);
  init_job(&j[1], "A2", 1, 0);
  init_job(&j[2], "A3", 1, 0);
  init_job(&j[3], "A4", 1, 0);
  init_job(&j[4], "A5", 1, 0);
  init_job(&j[5], "B1", 2, 0);
  for (int i = 1; i < 6; i++) ttd_scheduler_submit(s, 0, &j[i].job);
  ck_assert_uint_eq(ttd_scheduler_queued(s, 0), 5);
  open_gate_and_wait(6);
  ck_assert_str_eq(order, "A1 B1 A2 A3 A4 A5 ");
  ck_assert_uint_eq(ttd_scheduler_queued(s, 0), 0);
  ttd_scheduler_destroy(s);
}
END_TEST

START_TEST(test_round_robin_three_keys) {
  reset();
  ttd_scheduler *s = NULL;
  ck_assert_ptr_null(ttd_scheduler_create(1, NULL, &s));
  test_job j[7];
  init_job(&j[0], "A1", 10, 1);
  ttd_scheduler_submit(s, 0, &j[0].job);
  wait_started(1);
  const char *names[] = {"A2", "A3", "B1", "B2", "C1", "B3"};
  const uint64_t keys[] = {10, 10, 20, 20, 30, 20};
  for (int i = 0; i < 6; i++) {
    init_job(&j[i + 1], names[i], keys[i], 0);
    ttd_scheduler_submit(s, 0, &j[i + 1].job);
  }
  open_gate_and_wait(7);
  ck_assert_str_eq(order, "A1 B1 C1 A2 B2 A3 B3 ");
  ttd_scheduler_destroy(s);
}
END_TEST

/* Groups (tenants) take turns before keys (sessions) do: tenant X with four sessions and
 * tenant Y with one alternate job for job, X's sessions in turn within X's turns; with
 * weight 2, Y is served two jobs a turn. */
START_TEST(test_groups_take_turns_by_weight) {
  for (int weight = 1; weight <= 2; weight++) {
    reset();
    ttd_scheduler *s = NULL;
    ck_assert_ptr_null(ttd_scheduler_create(1, NULL, &s));
    test_job hold, x[8], y[8];
    init_job(&hold, "H", 99, 1);
    hold.job.group = 99;
    ttd_scheduler_submit(s, 0, &hold.job);
    wait_started(1);
    for (int i = 0; i < 8; i++) { /* X: sessions 1..4, two jobs each; Y: session 5, eight */
      char name[8];
      snprintf(name, sizeof(name), "x%d", i % 4 + 1);
      init_job(&x[i], name, (uint64_t)(i % 4 + 1), 0);
      x[i].job.group = 100;
      snprintf(name, sizeof(name), "y%d", i + 1);
      init_job(&y[i], name, 5, 0);
      y[i].job.group = 200;
      y[i].job.weight = (uint32_t)weight;
    }
    for (int i = 0; i < 8; i++) ttd_scheduler_submit(s, 0, &x[i].job);
    for (int i = 0; i < 8; i++) ttd_scheduler_submit(s, 0, &y[i].job);
    open_gate_and_wait(17);
    if (weight == 1) {
      ck_assert_str_eq(order, "H x1 y1 x2 y2 x3 y3 x4 y4 x1 y5 x2 y6 x3 y7 x4 y8 ");
    } else {
      ck_assert_str_eq(order, "H x1 y1 y2 x2 y3 y4 x3 y5 y6 x4 y7 y8 x1 x2 x3 x4 ");
    }
    ttd_scheduler_destroy(s);
  }
}
END_TEST

/* Devices have their own executors: a job held on tt:0 does not stop tt:1. */
START_TEST(test_devices_are_independent) {
  reset();
  ttd_scheduler *s = NULL;
  ck_assert_ptr_null(ttd_scheduler_create(2, NULL, &s));
  ck_assert_int_eq(ttd_scheduler_devices(s), 2);
  test_job held, other;
  init_job(&held, "X", 1, 1);
  init_job(&other, "Y", 2, 0);
  ttd_scheduler_submit(s, 0, &held.job);
  wait_started(1);
  ttd_scheduler_submit(s, 1, &other.job);
  pthread_mutex_lock(&lock);
  while (finished < 1) pthread_cond_wait(&cond, &lock);
  ck_assert_str_eq(order, "Y ");
  pthread_mutex_unlock(&lock);
  open_gate_and_wait(2);
  ck_assert_str_eq(order, "Y X ");
  ttd_scheduler_destroy(s);
}
END_TEST

/* A job with no memory for its queue runs at once on the submitting thread, and
 * ttd_scheduler_stop_running (a stopping daemon past its drain timeout) still reaches it:
 * its flag, clear when it starts, holds the code when the stop comes while it runs, and a
 * job queued the usual way afterwards starts clear. */
typedef struct stop_job {
  ttd_job job;
  ttd_scheduler *s;
  int before, after; /* the flag's code when the job started, and after the stop */
} stop_job;

static void stopped_while_running(ttd_job *j) {
  stop_job *t = (stop_job *)j;
  t->before = atomic_load(&j->cancel->code);
  ttd_scheduler_stop_running(t->s, 10 /* ABORTED */);
  t->after = atomic_load(&j->cancel->code);
}

START_TEST(test_stop_reaches_unqueued_jobs) {
  ttd_scheduler *s = NULL;
  ck_assert_ptr_null(ttd_scheduler_create(1, NULL, &s));
  stop_job unq = {.job = {.key = 1, .group = 1, .run = stopped_while_running}, .s = s};
  harness_fail_callocs(1); /* the new group's calloc: no queue for it */
  ttd_scheduler_submit(s, 0, &unq.job);
  harness_fail_callocs(0);
  ck_assert_int_eq(unq.before, 0);
  ck_assert_int_eq(unq.after, 10); /* run on this thread, before submit returned */
  stop_job queued = {.job = {.key = 2, .group = 2, .run = stopped_while_running}, .s = s};
  ttd_scheduler_submit(s, 0, &queued.job);
  ttd_scheduler_destroy(s); /* runs what is queued */
  ck_assert_int_eq(queued.before, 0);
  ck_assert_int_eq(queued.after, 10);
}
END_TEST

/* Destroy runs every job still queued (in-flight calls must be answered) and stops. */
START_TEST(test_destroy_runs_queued_jobs) {
  reset();
  ttd_scheduler *s = NULL;
  ck_assert_ptr_null(ttd_scheduler_create(1, NULL, &s));
  test_job j[4];
  init_job(&j[0], "A1", 1, 1);
  ttd_scheduler_submit(s, 0, &j[0].job);
  wait_started(1);
  init_job(&j[1], "A2", 1, 0);
  init_job(&j[2], "B1", 2, 0);
  init_job(&j[3], "C1", 3, 0);
  for (int i = 1; i < 4; i++) ttd_scheduler_submit(s, 0, &j[i].job);
  pthread_mutex_lock(&lock);
  gate_open = 1;
  pthread_cond_broadcast(&cond);
  pthread_mutex_unlock(&lock);
  ttd_scheduler_destroy(s);
  ck_assert_int_eq(finished, 4);
  ck_assert_str_eq(order, "A1 B1 C1 A2 ");
}
END_TEST

/* A card that runs jobs together on threads of its own, as the simulated card does on its
 * pool: the most it was asked to run at once is recorded. */
typedef struct together_item {
  void (*run)(void *arg, size_t i);
  void *arg;
  size_t i;
} together_item;

static size_t most_together;

static int two_at_once(void *ctx, int device) {
  (void)ctx;
  (void)device;
  return 2;
}

static void *together_thread(void *p) {
  together_item *it = p;
  it->run(it->arg, it->i);
  return NULL;
}

static void threads_run_together(void *ctx, int device, size_t n, void (*run)(void *arg, size_t i), void *arg) {
  (void)ctx;
  (void)device;
  pthread_mutex_lock(&lock);
  if (n > most_together) most_together = n;
  pthread_mutex_unlock(&lock);
  pthread_t threads[TTD_SCHEDULER_AT_ONCE_MAX];
  together_item items[TTD_SCHEDULER_AT_ONCE_MAX];
  for (size_t i = 1; i < n; i++) {
    items[i] = (together_item){.run = run, .arg = arg, .i = i};
    ck_assert_int_eq(pthread_create(&threads[i], NULL, together_thread, &items[i]), 0);
  }
  run(arg, 0);
  for (size_t i = 1; i < n; i++) pthread_join(threads[i], NULL);
}

static const ttd_scheduler_card two_card = {.at_once = two_at_once, .run_together = threads_run_together};

static int three_at_once(void *ctx, int device) {
  (void)ctx;
  (void)device;
  return 3;
}

static const ttd_scheduler_card three_card = {.at_once = three_at_once, .run_together = threads_run_together};

/* Jobs that note how many run at once, overall and per key, each waiting a while for a
 * partner so that two taken together are seen together. */
static int running, most_running, running_of_key[8], same_key_overlaps;
static int partners = 2; /* how many running at once a job waits for (200 ms at most) */

static void overlap_job(ttd_job *j) {
  test_job *t = (test_job *)j;
  pthread_mutex_lock(&lock);
  started++;
  running++;
  if (running > most_running) most_running = running;
  if (++running_of_key[j->key] > 1) same_key_overlaps++;
  pthread_cond_broadcast(&cond);
  while (t->hold && !gate_open) pthread_cond_wait(&cond, &lock);
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_nsec += 200 * 1000000L;
  if (until.tv_nsec >= 1000000000L) {
    until.tv_sec++;
    until.tv_nsec -= 1000000000L;
  }
  while (running < partners && pthread_cond_timedwait(&cond, &lock, &until) == 0) {
  }
  strcat(order, t->name);
  strcat(order, " ");
  running--;
  running_of_key[j->key]--;
  finished++;
  pthread_cond_broadcast(&cond);
  pthread_mutex_unlock(&lock);
}

/* A scheduler on card, counters cleared, and n overlap_jobs: spec holds "NAME KEY HOLD" per
 * job. */
static ttd_scheduler *start_overlap_on(const ttd_scheduler_card *card, test_job *j, int n, const char *const *spec) {
  reset();
  running = most_running = same_key_overlaps = 0;
  memset(running_of_key, 0, sizeof(running_of_key));
  most_together = 0;
  partners = card->at_once(NULL, 0);
  ttd_scheduler *s = NULL;
  ck_assert_ptr_null(ttd_scheduler_create(1, card, &s));
  for (int i = 0; i < n; i++) {
    char name[8];
    unsigned key;
    int hold;
    ck_assert_int_eq(sscanf(spec[i], "%7s %u %d", name, &key, &hold), 3);
    init_job(&j[i], name, key, hold);
    j[i].job.run = overlap_job;
  }
  return s;
}

static ttd_scheduler *start_overlap(test_job *j, int n, const char *const *spec) {
  return start_overlap_on(&two_card, j, n, spec);
}

/* With a card that runs two at once, the jobs waiting behind a held one go two by two in
 * turn (A1 with B1, then C1 with A2), never two of one session together, and a job alone
 * runs alone. */
START_TEST(test_sessions_run_together) {
  test_job j[5];
  ttd_scheduler *s = start_overlap(j, 5, (const char *const[]){"H 7 1", "A1 1 0", "A2 1 0", "B1 2 0", "C1 3 0"});
  ttd_scheduler_submit(s, 0, &j[0].job);
  wait_started(1);
  pthread_mutex_lock(&lock);
  ck_assert_int_eq(most_running, 1); /* alone: nothing else was waiting */
  pthread_mutex_unlock(&lock);
  for (int i = 1; i < 5; i++) ttd_scheduler_submit(s, 0, &j[i].job);
  open_gate_and_wait(5);
  ck_assert_int_eq(most_running, 2);
  ck_assert_uint_eq(most_together, 2);
  ck_assert_int_eq(same_key_overlaps, 0);
  /* H alone, then A1 and B1 together, C1 and A2 each as soon as a place is free */
  ck_assert_msg(strncmp(order, "H ", 2) == 0 && strstr(order, "A1") < strstr(order, "A2") &&
                    strstr(order, "B1") && strstr(order, "C1"),
                "order %s", order);
  ck_assert_int_eq(j[0].job.sharing, 1);
  ck_assert_int_eq(j[1].job.sharing, 2);
  ttd_scheduler_destroy(s);
}
END_TEST

/* A place that finishes takes the next job at once, while a long job runs beside it: B1 and
 * then C1 pass A1, which is held. */
START_TEST(test_free_place_takes_next) {
  test_job j[4];
  ttd_scheduler *s = start_overlap(j, 4, (const char *const[]){"H 7 0", "A1 1 1", "B1 2 0", "C1 3 0"});
  pthread_mutex_lock(&lock);
  for (int i = 0; i < 4; i++) ttd_scheduler_submit(s, 0, &j[i].job);
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 5;
  while (finished < 3 && pthread_cond_timedwait(&cond, &lock, &until) == 0) {
  }
  int passed = finished;
  pthread_mutex_unlock(&lock);
  open_gate_and_wait(4);
  ck_assert_int_eq(passed, 3);
  ck_assert_int_eq(same_key_overlaps, 0);
  ck_assert_str_eq(order, "H B1 C1 A1 ");
  ttd_scheduler_destroy(s);
}
END_TEST

/* A card of three places runs jobs together only once three sessions wait: two sessions
 * would leave a place idle, and each job runs alone on the whole card instead. */
START_TEST(test_together_needs_a_session_per_place) {
  test_job j[6];
  ttd_scheduler *s = start_overlap_on(&three_card, j, 6,
                                      (const char *const[]){"H 7 1", "A1 1 0", "B1 2 0", "H2 7 1", "A2 1 0", "B2 2 0"});
  ttd_scheduler_submit(s, 0, &j[0].job);
  wait_started(1);
  ttd_scheduler_submit(s, 0, &j[1].job); /* two sessions wait behind H: alone, one by one */
  ttd_scheduler_submit(s, 0, &j[2].job);
  open_gate_and_wait(3);
  ck_assert_int_eq(most_running, 1);
  ck_assert_uint_eq(most_together, 0);
  ck_assert_int_eq(j[1].job.sharing, 1);
  pthread_mutex_lock(&lock);
  gate_open = 0;
  pthread_mutex_unlock(&lock);
  ttd_scheduler_submit(s, 0, &j[3].job);
  wait_started(4);
  ttd_scheduler_submit(s, 0, &j[4].job); /* H2's session, A and B: three wait */
  ttd_scheduler_submit(s, 0, &j[5].job);
  ttd_scheduler_submit(s, 0, &j[0].job);
  open_gate_and_wait(7);
  ck_assert_uint_eq(most_together, 3);
  ck_assert_int_eq(most_running, 3);
  ck_assert_int_eq(same_key_overlaps, 0);
  ttd_scheduler_destroy(s);
}
END_TEST

/* One session's jobs never run together, however many wait: A1 A2 A3 go one by one. */
START_TEST(test_one_session_never_together) {
  test_job j[4];
  ttd_scheduler *s = start_overlap(j, 4, (const char *const[]){"H 7 1", "A1 1 0", "A2 1 0", "A3 1 0"});
  ttd_scheduler_submit(s, 0, &j[0].job);
  wait_started(1);
  for (int i = 1; i < 4; i++) ttd_scheduler_submit(s, 0, &j[i].job);
  open_gate_and_wait(4);
  ck_assert_int_eq(most_running, 1);
  ck_assert_uint_eq(most_together, 0);
  ck_assert_str_eq(order, "H A1 A2 A3 ");
  ttd_scheduler_destroy(s);
}
END_TEST

/* Jobs run together each have a flag of their own: a deadline that passes stops the job
 * it belongs to, not the one beside it. */
static atomic_int flag_seen[2];
static atomic_int both_started, first_done;

static void deadline_job(ttd_job *j) {
  int me = j->deadline_ns ? 0 : 1;
  atomic_fetch_add(&both_started, 1);
  for (int i = 0; i < 2000 && atomic_load(&both_started) < 2; i++) nanosleep(&(struct timespec){0, 1000000}, NULL);
  if (me == 0) {
    for (int i = 0; i < 2000 && !atomic_load(&j->cancel->code); i++) nanosleep(&(struct timespec){0, 1000000}, NULL);
    atomic_store(&flag_seen[0], atomic_load(&j->cancel->code));
    atomic_store(&first_done, 1);
  } else {
    for (int i = 0; i < 2000 && !atomic_load(&first_done); i++) nanosleep(&(struct timespec){0, 1000000}, NULL);
    atomic_store(&flag_seen[1], atomic_load(&j->cancel->code));
  }
  pthread_mutex_lock(&lock);
  finished++;
  pthread_cond_broadcast(&cond);
  pthread_mutex_unlock(&lock);
}

START_TEST(test_together_deadlines_are_per_job) {
  reset();
  atomic_store(&both_started, 0);
  atomic_store(&first_done, 0);
  atomic_store(&flag_seen[0], -1);
  atomic_store(&flag_seen[1], -1);
  ttd_scheduler *s = NULL;
  ck_assert_ptr_null(ttd_scheduler_create(1, &two_card, &s));
  test_job h, a, b;
  init_job(&h, "H", 7, 1);
  init_job(&a, "A", 1, 0);
  init_job(&b, "B", 2, 0);
  a.job.run = b.job.run = deadline_job;
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  a.job.deadline_ns = (int64_t)now.tv_sec * 1000000000 + now.tv_nsec + 50 * 1000000;
  ttd_scheduler_submit(s, 0, &h.job);
  wait_started(1);
  ttd_scheduler_submit(s, 0, &a.job);
  ttd_scheduler_submit(s, 0, &b.job);
  open_gate_and_wait(3);
  int started_together = atomic_load(&both_started), seen_a = atomic_load(&flag_seen[0]),
      seen_b = atomic_load(&flag_seen[1]);
  ck_assert_int_eq(started_together, 2);
  ck_assert_int_eq(seen_a, GRPC_STATUS_DEADLINE_EXCEEDED);
  ck_assert_int_eq(seen_b, 0);
  ttd_scheduler_destroy(s);
}
END_TEST

Suite *scheduler_suite(void) {
  Suite *s = suite_create("scheduler");
  TCase *tc = tcase_create("scheduler");
  tcase_add_test(tc, test_round_robin_two_keys);
  tcase_add_test(tc, test_groups_take_turns_by_weight);
  tcase_add_test(tc, test_round_robin_three_keys);
  tcase_add_test(tc, test_devices_are_independent);
  tcase_add_test(tc, test_destroy_runs_queued_jobs);
  tcase_add_test(tc, test_stop_reaches_unqueued_jobs);
  tcase_add_test(tc, test_sessions_run_together);
  tcase_add_test(tc, test_one_session_never_together);
  tcase_add_test(tc, test_free_place_takes_next);
  tcase_add_test(tc, test_together_needs_a_session_per_place);
  tcase_add_test(tc, test_together_deadlines_are_per_job);
  suite_add_tcase(s, tc);
  return s;
}
