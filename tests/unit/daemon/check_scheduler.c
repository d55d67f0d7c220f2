/* The device scheduler: round-robin between keys, FIFO within a key, per-device executors,
 * queue depth, and a destroy that runs what is queued. */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

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
  ck_assert_ptr_null(ttd_scheduler_create(1, &s));
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
  ck_assert_ptr_null(ttd_scheduler_create(1, &s));
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
    ck_assert_ptr_null(ttd_scheduler_create(1, &s));
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
  ck_assert_ptr_null(ttd_scheduler_create(2, &s));
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

/* Destroy runs every job still queued (in-flight calls must be answered) and stops. */
START_TEST(test_destroy_runs_queued_jobs) {
  reset();
  ttd_scheduler *s = NULL;
  ck_assert_ptr_null(ttd_scheduler_create(1, &s));
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

Suite *scheduler_suite(void) {
  Suite *s = suite_create("scheduler");
  TCase *tc = tcase_create("scheduler");
  tcase_add_test(tc, test_round_robin_two_keys);
  tcase_add_test(tc, test_groups_take_turns_by_weight);
  tcase_add_test(tc, test_round_robin_three_keys);
  tcase_add_test(tc, test_devices_are_independent);
  tcase_add_test(tc, test_destroy_runs_queued_jobs);
  suite_add_tcase(s, tc);
  return s;
}
