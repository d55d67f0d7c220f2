/* The RPC server's work queue (daemon/work_queue.c): FIFO hand-out, several items at once on
 * several threads, and a stop that runs what is still queued. */
#include <check.h>
#include <pthread.h>
#include <string.h>

#include "work/work_queue.h"
#include "suites.h"

typedef struct item {
  ttd_work work;
  int id;
  int hold; /* wait for the gate before returning */
} item;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static int ran[64], n_ran, running, gate_open;

static void run_item(ttd_work *w) {
  item *it = (item *)((char *)w - offsetof(item, work));
  pthread_mutex_lock(&lock);
  running++;
  pthread_cond_broadcast(&cond);
  while (it->hold && !gate_open) pthread_cond_wait(&cond, &lock);
  ran[n_ran++] = it->id;
  running--;
  pthread_cond_broadcast(&cond);
  pthread_mutex_unlock(&lock);
}

static void reset(void) {
  memset(ran, 0, sizeof(ran));
  n_ran = running = gate_open = 0;
}

/* One thread: items run one at a time in the order submitted; stop runs the rest first. */
START_TEST(test_fifo_and_drain) {
  reset();
  ttd_work_queue *q = NULL;
  ck_assert_ptr_null(ttd_work_queue_start(1, &q));
  item items[20];
  for (int i = 0; i < 20; i++) {
    items[i] = (item){.work.run = run_item, .id = i, .hold = i == 0};
    ttd_work_queue_submit(q, &items[i].work);
  }
  pthread_mutex_lock(&lock);
  while (running == 0) pthread_cond_wait(&cond, &lock);
  ck_assert_int_eq(n_ran, 0); /* the first holds the only thread */
  gate_open = 1;
  pthread_cond_broadcast(&cond);
  pthread_mutex_unlock(&lock);
  ttd_work_queue_stop(q);
  ck_assert_int_eq(n_ran, 20);
  for (int i = 0; i < 20; i++) ck_assert_int_eq(ran[i], i);
}
END_TEST

/* Three threads: a held item does not hold up the ones behind it. */
START_TEST(test_held_item_does_not_block_others) {
  reset();
  ttd_work_queue *q = NULL;
  ck_assert_ptr_null(ttd_work_queue_start(3, &q));
  item slow = {.work.run = run_item, .id = 99, .hold = 1}, quick[10];
  ttd_work_queue_submit(q, &slow.work);
  for (int i = 0; i < 10; i++) {
    quick[i] = (item){.work.run = run_item, .id = i};
    ttd_work_queue_submit(q, &quick[i].work);
  }
  pthread_mutex_lock(&lock);
  while (n_ran < 10) pthread_cond_wait(&cond, &lock);
  ck_assert_int_eq(running, 1); /* only the held one is left, still running */
  for (int i = 0; i < 10; i++) ck_assert_int_ne(ran[i], 99);
  gate_open = 1;
  pthread_cond_broadcast(&cond);
  pthread_mutex_unlock(&lock);
  ttd_work_queue_stop(q);
  ck_assert_int_eq(n_ran, 11);
  ck_assert_int_eq(ran[10], 99);
}
END_TEST

/* Stopping an idle queue, and a NULL one, returns at once. */
START_TEST(test_stop_idle) {
  ttd_work_queue *q = NULL;
  ck_assert_ptr_null(ttd_work_queue_start(2, &q));
  ck_assert_ptr_nonnull(q);
  ttd_work_queue_stop(q);
  ttd_work_queue_stop(NULL);
}
END_TEST

Suite *work_queue_suite(void) {
  Suite *s = suite_create("work_queue");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_fifo_and_drain);
  tcase_add_test(tc, test_held_item_does_not_block_others);
  tcase_add_test(tc, test_stop_idle);
  suite_add_tcase(s, tc);
  return s;
}
