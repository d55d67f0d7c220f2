/* Polling a completion queue before sleeping on it, with an adaptive window (cq_spin.h). */
#include "wire/cq_spin.h"

#include <grpc/support/time.h>
#include <sched.h>

void ttd_cq_spin_init(ttd_cq_spin *spin, int64_t max_us) {
  spin->max_ns = max_us > 0 ? max_us * 1000 : 0;
  atomic_init(&spin->window_ns, spin->max_ns);
  atomic_init(&spin->hits, 0);
  atomic_init(&spin->misses, 0);
  atomic_init(&spin->spin_ns, 0);
}

int64_t ttd_cq_spin_next_window(int64_t window_ns, int64_t max_ns, int64_t waited_ns) {
  if (waited_ns <= window_ns) return window_ns;
  if (waited_ns > max_ns) {
    int64_t half = window_ns / 2;
    return half < TTD_CQ_SPIN_GROW_START_NS ? 0 : half;
  }
  int64_t grown = window_ns < TTD_CQ_SPIN_GROW_START_NS ? TTD_CQ_SPIN_GROW_START_NS : window_ns * 2;
  return grown < max_ns ? grown : max_ns;
}

static grpc_event poll_queue(grpc_completion_queue *cq, void *tag, gpr_timespec deadline) {
  return tag ? grpc_completion_queue_pluck(cq, tag, deadline, NULL) : grpc_completion_queue_next(cq, deadline, NULL);
}

static int64_t ns_since(gpr_timespec start) {
  gpr_timespec d = gpr_time_sub(gpr_now(GPR_CLOCK_MONOTONIC), start);
  return (int64_t)d.tv_sec * 1000000000 + d.tv_nsec;
}

grpc_event ttd_cq_spin_wait(ttd_cq_spin *spin, grpc_completion_queue *cq, void *tag, gpr_timespec deadline) {
  if (spin->max_ns <= 0) return poll_queue(cq, tag, deadline);
  int64_t window = atomic_load_explicit(&spin->window_ns, memory_order_relaxed);
  gpr_timespec start = gpr_now(GPR_CLOCK_MONOTONIC);
  if (window > 0) {
    gpr_timespec end = gpr_time_add(start, gpr_time_from_nanos(window, GPR_TIMESPAN));
    gpr_timespec limit = gpr_convert_clock_type(deadline, GPR_CLOCK_MONOTONIC);
    if (gpr_time_cmp(limit, end) < 0) end = limit;
    /* A past deadline makes one poll that does not block. */
    gpr_timespec now_only = gpr_inf_past(GPR_CLOCK_MONOTONIC);
    for (;;) {
      grpc_event ev = poll_queue(cq, tag, now_only);
      if (ev.type != GRPC_QUEUE_TIMEOUT) {
        atomic_fetch_add_explicit(&spin->hits, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&spin->spin_ns, (unsigned long long)ns_since(start), memory_order_relaxed);
        return ev;
      }
      if (gpr_time_cmp(gpr_now(GPR_CLOCK_MONOTONIC), end) >= 0) break;
      sched_yield(); /* a peer on this same CPU (one vCPU, a busy host) gets to answer */
    }
    atomic_fetch_add_explicit(&spin->misses, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&spin->spin_ns, (unsigned long long)ns_since(start), memory_order_relaxed);
  }
  grpc_event ev = poll_queue(cq, tag, deadline);
  if (ev.type == GRPC_OP_COMPLETE) {
    atomic_store_explicit(&spin->window_ns, ttd_cq_spin_next_window(window, spin->max_ns, ns_since(start)),
                          memory_order_relaxed);
  }
  return ev;
}
