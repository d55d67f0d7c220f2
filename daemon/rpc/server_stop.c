/* ttd_server_stop: stop accepting, drain the calls in flight for the drain timeout, then
 * answer or cancel the rest, and free the server. */
#include <inttypes.h>
#include <time.h>

#include "base/clock.h"
#include "rpc/server_internal.h"
#include "telemetry/log.h"

static const char shutting_down[] = "ttd is shutting down: its drain timeout passed before this call finished; "
                                    "reconnect when it is back";

/* Device calls are left alone: a running program stops at its kernels' next check
 * (stop_device_work) and is answered ABORTED, those queued behind it UNAVAILABLE the moment
 * their turn comes (the server is cancelling). */
static void active_cancel_all(ttd_server *server) {
  pthread_mutex_lock(&server->lock);
  for (ttd_call *c = server->active; c; c = c->active_next) {
    if (atomic_load(&c->on_device)) continue;
    grpc_call_cancel_with_status(c->call, GRPC_STATUS_UNAVAILABLE, shutting_down, NULL);
  }
  pthread_mutex_unlock(&server->lock);
}

/* With no poller thread (start failed), the caller drains the queue until shutdown is done. */
static void pump_until_shutdown(ttd_server *server) {
  while (!server->shutdown_done) {
    grpc_event ev = grpc_completion_queue_next(server->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    if (ev.type != GRPC_OP_COMPLETE) break;
    if (ev.tag == &server->shutdown_tag) server->shutdown_done = true;
    else ttd_server_on_call_event(ev.tag, ev.success != 0);
  }
}

/* How long calls refused at the drain timeout get to be answered before the rest is cut. */
#define TTD_CANCEL_GRACE_MS 500

/* Waits up to ms (-1: for good) for the server's shutdown to complete; whether it did. */
static bool wait_shutdown_done(ttd_server *server, int64_t ms) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += ms / 1000;
  until.tv_nsec += (ms % 1000) * 1000000;
  if (until.tv_nsec >= 1000000000) {
    until.tv_sec++;
    until.tv_nsec -= 1000000000;
  }
  pthread_mutex_lock(&server->lock);
  while (!server->shutdown_done) {
    if (ms < 0) pthread_cond_wait(&server->shutdown_done_cond, &server->lock);
    else if (pthread_cond_timedwait(&server->shutdown_done_cond, &server->lock, &until) != 0) break;
  }
  bool done = server->shutdown_done;
  pthread_mutex_unlock(&server->lock);
  return done;
}

/* The drain timeout has passed: device work queued is refused at its turn (run_scheduled:
 * UNAVAILABLE, the call never ran, and a client resumes and sends it again), and what runs
 * stops at its next check (explain_stop: ABORTED, since part of it may have taken effect
 * and sending it again could apply that twice), in that order, so that a job starting
 * between the two is refused by the first. */
static void stop_device_work(ttd_server *server) {
  atomic_store(&server->cancelling, true);
  ttd_scheduler_stop_running(server->core->scheduler, GRPC_STATUS_ABORTED);
}

void ttd_server_stop(ttd_server *server, int64_t drain_ms) {
  if (!server) return;
  int64_t stop_began_ms = ttd_now_ms();
  ttd_conn_gate_stop(server->gate); /* no more connections handed over; freed with the server */
  grpc_server_shutdown_and_notify(server->server, server->cq, &server->shutdown_tag);
  /* Lane calls are refused from now on, as gRPC ones are; only now: a client told so at
   * once resumes its session over gRPC, which must not reach this ttd any more. */
  ttd_lanes_stop(server->lanes);
  if (server->thread_count == 0) {
    grpc_server_cancel_all_calls(server->server);
    pump_until_shutdown(server);
  }
  if (!wait_shutdown_done(server, drain_ms)) {
    TTD_LOG(TTD_LOG_WARN, "event=drain-timeout drain_ms=%" PRId64 " action=cancel-in-flight-calls", drain_ms);
    /* Programs running on a device stop at their kernels' next check (ABORTED "ttd is
     * shutting down"), and calls still waiting for the device are answered UNAVAILABLE "ttd
     * is shutting down" when their turn comes, which is at once: plain answers, sent like
     * any other. Only what is left after a short grace (a stalled stream, a program between
     * checks) is cancelled, since a cancelled call's status may not leave before the
     * connection closes. */
    stop_device_work(server);
    if (!wait_shutdown_done(server, TTD_CANCEL_GRACE_MS)) {
      active_cancel_all(server);
      wait_shutdown_done(server, -1);
    }
  }
  /* Device work still queued in the scheduler holds its calls: the executors run it and the
   * poller completes its batches, so wait until every call context is gone. */
  for (int waited_ms = 0; atomic_load(&server->live_calls) > 0 && server->thread_count > 0; waited_ms++) {
    /* Lane calls are not gRPC's to drain: the same timeout applies to them here */
    if (!atomic_load(&server->cancelling) && drain_ms >= 0 && ttd_now_ms() - stop_began_ms >= drain_ms) {
      TTD_LOG(TTD_LOG_WARN, "event=drain-timeout drain_ms=%" PRId64 " action=refuse-queued-lane-calls", drain_ms);
      stop_device_work(server);
    }
    if (waited_ms % 1000 == 999) {
      TTD_LOG(TTD_LOG_INFO, "event=drain-wait calls=%ld", atomic_load(&server->live_calls));
    }
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, NULL);
  }
  grpc_server_destroy(server->server);
  grpc_completion_queue_shutdown(server->cq);
  if (server->thread_count) pthread_join(server->poller, NULL);
  ttd_work_queue_stop(server->heavy); /* idle: every call is gone */
  if (server->thread_count == 0) {
    while (grpc_completion_queue_next(server->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
  }
  grpc_completion_queue_destroy(server->cq);
  ttd_lanes_destroy(server->lanes); /* no lane call is left */
  long leaked = atomic_load(&server->live_calls);
  if (leaked) TTD_LOG(TTD_LOG_ERROR, "event=calls-leaked count=%ld", leaked);
  ttd_server_free(server);
}
