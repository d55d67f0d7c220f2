/* daemon/cq_spin.c: waiting on a completion queue by polling first. Events come from
 * gRPC's own timers: watching an idle channel's state with a deadline (the channel never
 * connects) completes the watch at that deadline. */
#include <check.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>
#include <stdbool.h>

#include "wire/cq_spin.h"
#include "suites.h"

#define US 1000
#define MS 1000000

static grpc_channel *channel;

static void setup(void) {
  grpc_init();
  grpc_channel_credentials *creds = grpc_insecure_credentials_create();
  channel = grpc_channel_create("unix:/nonexistent/ttd-cq-spin.sock", creds, NULL);
  grpc_channel_credentials_release(creds);
  ck_assert_ptr_nonnull(channel);
  ck_assert_int_eq(grpc_channel_check_connectivity_state(channel, 0), GRPC_CHANNEL_IDLE);
}

static void teardown(void) {
  grpc_channel_destroy(channel);
  grpc_shutdown();
}

static gpr_timespec after_ns(int64_t ns) {
  return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_nanos(ns, GPR_TIMESPAN));
}

static int64_t elapsed_ns(gpr_timespec since) {
  gpr_timespec d = gpr_time_sub(gpr_now(GPR_CLOCK_MONOTONIC), since);
  return (int64_t)d.tv_sec * 1000000000 + d.tv_nsec;
}

/* An event on cq (tagged tag) in_ns from now. */
static void event_in(grpc_completion_queue *cq, void *tag, int64_t in_ns) {
  grpc_channel_watch_connectivity_state(channel, GRPC_CHANNEL_IDLE, after_ns(in_ns), cq, tag);
}

static void destroy_queue(grpc_completion_queue *cq, bool pluck) {
  grpc_completion_queue_shutdown(cq);
  gpr_timespec forever = gpr_inf_future(GPR_CLOCK_MONOTONIC);
  while ((pluck ? grpc_completion_queue_pluck(cq, NULL, forever, NULL) : grpc_completion_queue_next(cq, forever, NULL))
             .type != GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(cq);
}

/* The window rule: unchanged on a hit; doubled from 10 us up to the maximum after a wait
 * within the maximum; halved after a longer one, to 0 below 10 us. */
START_TEST(test_window_rule) {
  ck_assert_int_eq(ttd_cq_spin_next_window(50 * US, 50 * US, 20 * US), 50 * US);
  ck_assert_int_eq(ttd_cq_spin_next_window(0, 50 * US, 30 * US), 10 * US);
  ck_assert_int_eq(ttd_cq_spin_next_window(10 * US, 50 * US, 30 * US), 20 * US);
  ck_assert_int_eq(ttd_cq_spin_next_window(40 * US, 50 * US, 45 * US), 50 * US);
  ck_assert_int_eq(ttd_cq_spin_next_window(50 * US, 50 * US, 200 * US), 25 * US);
  ck_assert_int_eq(ttd_cq_spin_next_window(25 * US, 50 * US, 200 * US), 12500);
  ck_assert_int_eq(ttd_cq_spin_next_window(12500, 50 * US, 200 * US), 0);
  ck_assert_int_eq(ttd_cq_spin_next_window(0, 50 * US, 200 * US), 0);
  ck_assert_int_eq(ttd_cq_spin_next_window(0, 5 * US, 4 * US), 5 * US); /* a maximum under 10 us */
}
END_TEST

/* An event inside the window is caught by polling: a hit, no sleep, the window kept. */
START_TEST(test_event_within_window_is_a_hit) {
  grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
  ttd_cq_spin spin;
  ttd_cq_spin_init(&spin, 2000 * 1000); /* 2 s: the 5 ms event falls inside, even under ASan */
  int tag;
  event_in(cq, &tag, 5 * MS);
  gpr_timespec t0 = gpr_now(GPR_CLOCK_MONOTONIC);
  grpc_event ev = ttd_cq_spin_wait(&spin, cq, &tag, gpr_inf_future(GPR_CLOCK_MONOTONIC));
  ck_assert_int_eq(ev.type, GRPC_OP_COMPLETE);
  ck_assert_ptr_eq(ev.tag, &tag);
  ck_assert_uint_eq(atomic_load(&spin.hits), 1);
  ck_assert_uint_eq(atomic_load(&spin.misses), 0);
  ck_assert_int_ge(elapsed_ns(t0), 4 * MS);
  ck_assert_uint_ge(atomic_load(&spin.spin_ns), 4 * MS); /* the whole wait was polling */
  ck_assert_int_eq(atomic_load(&spin.window_ns), 2000 * MS);
  destroy_queue(cq, true);
}
END_TEST

/* Events later than the maximum: each wait polls, sleeps (a miss) and halves the window,
 * until it is 0 and waits sleep at once. A GRPC_CQ_NEXT queue (tag NULL). */
START_TEST(test_slow_events_stop_the_spin) {
  grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
  ttd_cq_spin spin;
  ttd_cq_spin_init(&spin, 100);
  int tag;
  const int64_t windows[] = {50 * US, 25 * US, 12500, 0, 0};
  for (int i = 0; i < 5; i++) {
    event_in(cq, &tag, 3 * MS);
    grpc_event ev = ttd_cq_spin_wait(&spin, cq, NULL, gpr_inf_future(GPR_CLOCK_MONOTONIC));
    ck_assert_int_eq(ev.type, GRPC_OP_COMPLETE);
    ck_assert_ptr_eq(ev.tag, &tag);
    ck_assert_int_eq(atomic_load(&spin.window_ns), windows[i]);
    ck_assert_uint_eq(atomic_load(&spin.misses), i < 4 ? i + 1 : 4);
  }
  ck_assert_uint_eq(atomic_load(&spin.hits), 0);
  /* Spinning took at least the four windows it polled for, far less than the waits. */
  ck_assert_uint_ge(atomic_load(&spin.spin_ns), (100 + 50 + 25 + 12) * US);
  ck_assert_uint_lt(atomic_load(&spin.spin_ns), 4 * 3 * MS);
  destroy_queue(cq, false);
}
END_TEST

/* The deadline bounds the polling: with no event, a wait whose window is 2 s ends with
 * GRPC_QUEUE_TIMEOUT at its 20 ms deadline, and a timeout does not change the window. */
START_TEST(test_deadline_ends_the_spin) {
  grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
  ttd_cq_spin spin;
  ttd_cq_spin_init(&spin, 2000 * 1000);
  int tag;
  gpr_timespec t0 = gpr_now(GPR_CLOCK_MONOTONIC);
  grpc_event ev = ttd_cq_spin_wait(&spin, cq, &tag, after_ns(20 * MS));
  int64_t took = elapsed_ns(t0);
  ck_assert_int_eq(ev.type, GRPC_QUEUE_TIMEOUT);
  ck_assert_int_ge(took, 20 * MS);
  ck_assert_int_lt(took, 1000 * MS);
  ck_assert_int_eq(atomic_load(&spin.window_ns), 2000 * MS);
  ck_assert_uint_eq(atomic_load(&spin.misses), 1);
  destroy_queue(cq, true);
}
END_TEST

/* A maximum of 0 never polls: the wait sleeps for its event and counts nothing. */
START_TEST(test_zero_never_spins) {
  grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
  ttd_cq_spin spin;
  ttd_cq_spin_init(&spin, 0);
  int tag;
  event_in(cq, &tag, 2 * MS);
  grpc_event ev = ttd_cq_spin_wait(&spin, cq, &tag, gpr_inf_future(GPR_CLOCK_MONOTONIC));
  ck_assert_int_eq(ev.type, GRPC_OP_COMPLETE);
  ck_assert_uint_eq(atomic_load(&spin.hits) + atomic_load(&spin.misses) + atomic_load(&spin.spin_ns), 0);
  ck_assert_int_eq(atomic_load(&spin.window_ns), 0);
  destroy_queue(cq, true);
}
END_TEST

Suite *cq_spin_suite(void) {
  Suite *s = suite_create("cq_spin");
  TCase *tc = tcase_create("cq_spin");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_window_rule);
  tcase_add_test(tc, test_event_within_window_is_a_hit);
  tcase_add_test(tc, test_slow_events_stop_the_spin);
  tcase_add_test(tc, test_deadline_ends_the_spin);
  tcase_add_test(tc, test_zero_never_spins);
  suite_add_tcase(s, tc);
  return s;
}
