/* Resuming a session after ttd restarted gracefully (ttd --state-dir): ttd saved the session
 * at its stop and reads it back at start, and the client whose call failed meanwhile waits
 * for ttd, hands back the session's secret (OpenSession with resume_session) and runs the
 * call again. Handles stay valid, so the program above notices only a pause. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "conn/conn.h"

void tt_session_adopt(tt_client *c, const Ttd__V1__OpenSessionResponse *resp) {
  c->session_id = resp->session_id;
  snprintf(c->session_hex, sizeof(c->session_hex), "%016" PRIx64, resp->session_id);
  snprintf(c->instance_id, sizeof(c->instance_id), "%s", resp->instance_id);
  c->lease_ms = resp->lease_ms;
  c->quota_bytes = resp->quota_bytes;
  c->shm_key[0] = resp->shm_key_hi;
  c->shm_key[1] = resp->shm_key_lo;
  snprintf(c->tenant, sizeof(c->tenant), "%s", resp->tenant);
  size_t n = resp->resume_secret.len == sizeof(c->resume_secret) ? resp->resume_secret.len : 0;
  if (n) memcpy(c->resume_secret, resp->resume_secret.data, n);
  c->resume_secret_len = n;
}

bool tt_resume_wanted(tt_client *c, tt_rpc_method method, tt_status st, const char *err) {
  if (c->closed || !c->resume_secret_len || method == TT_RPC_OPEN_SESSION) return false;
  /* Unreachable: ttd is stopping or not back yet. CANCELLED, which this library never asks
   * for and ttd never answers a call it ran: a stopping ttd's gRPC server kills the calls it
   * had not taken yet (those queued for a handler, those arriving once the stop began), so
   * the call never ran. Or back, under another instance id, or holding the session for its
   * client to resume. */
  return st == TT_UNAVAILABLE || st == TT_CANCELLED ||
         (st == TT_FAILED_PRECONDITION && (strstr(err, "daemon restarted") || strstr(err, "to resume it")));
}

#define CLOSE_WAIT_MS 5000

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Starts a connection attempt now, not after gRPC's backoff (up to 2 s) from the attempts
 * made while ttd was down, and waits up to ms for the channel's state to change. The wait
 * polls the channel: a thread asleep would leave a new connection's handshake unread until
 * some other call polled it (the lease renewal's, tens of milliseconds later). A channel
 * already connected has nothing to read: the pause is a sleep, so that an attempt the
 * daemon keeps refusing for now is not repeated at once. */
static void await_channel(tt_client *c, int64_t ms) {
  grpc_channel_reset_connect_backoff(c->channel);
  grpc_connectivity_state state = grpc_channel_check_connectivity_state(c->channel, 1);
  if (state == GRPC_CHANNEL_READY) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
    return;
  }
  grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
  gpr_timespec until = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(ms, GPR_TIMESPAN));
  grpc_channel_watch_connectivity_state(c->channel, state, until, cq, NULL);
  grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL); /* the change, or until */
  grpc_completion_queue_shutdown(cq);
  while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type != GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(cq);
}

bool tt_resume_refused(tt_status st) {
  return st != TT_UNAVAILABLE && st != TT_CANCELLED && st != TT_DEADLINE_EXCEEDED && st != TT_INTERNAL;
}

tt_status tt_resume(tt_client *c, tt_rpc_method method, unsigned generation, char *err, size_t err_len) {
  pthread_mutex_lock(&c->resume_lock);
  if (atomic_load(&c->resume_generation) != generation) { /* another thread resumed it meanwhile */
    pthread_mutex_unlock(&c->resume_lock);
    return TT_OK;
  }
  char cause[512];
  snprintf(cause, sizeof(cause), "%s", err);
  /* A program that disconnects while ttd restarts waits a little for it, so that its session
   * is closed (its memory freed at once) rather than left to its lease. */
  int64_t wait_ms = method == TT_RPC_CLOSE_SESSION && c->resume_timeout_ms > CLOSE_WAIT_MS ? CLOSE_WAIT_MS
                                                                                           : c->resume_timeout_ms;
  int64_t deadline = now_ms() + wait_ms;
  int64_t pause = 5;
  tt_status st;
  char why[512] = "";
  for (;;) {
    Ttd__V1__OpenSessionRequest req = TTD__V1__OPEN_SESSION_REQUEST__INIT;
    req.client_name = c->client_name;
    req.protocol_version = TTD_PROTOCOL_VERSION;
    req.resume_session = c->session_id;
    req.resume_secret.data = c->resume_secret;
    req.resume_secret.len = c->resume_secret_len;
    ProtobufCMessage *out = NULL;
    st = tt_rpc_unary_quiet(c, TT_RPC_OPEN_SESSION, &req.base, &ttd__v1__open_session_response__descriptor, &out, why,
                            sizeof(why));
    if (st == TT_OK) {
      const Ttd__V1__OpenSessionResponse *resp = (const Ttd__V1__OpenSessionResponse *)out;
      tt_session_adopt(c, resp);
      tt_shm_reattach(c, resp->shm_socket);
      tt_lane_open(c); /* a new lane for the resumed session */
      protobuf_c_message_free_unpacked(out, NULL);
      atomic_fetch_add(&c->resume_generation, 1);
      break;
    }
    if (tt_resume_refused(st)) {
      c->resume_secret_len = 0; /* nothing to resume any more: later calls fail at once */
      snprintf(err, err_len, "daemon restarted, tensors are gone: ttd at %s could not resume session %s (%s); "
               "connect again and upload again [the call failed with: %s]", c->target, c->session_hex, why, cause);
      st = TT_FAILED_PRECONDITION;
      break;
    }
    if (now_ms() >= deadline) {
      snprintf(err, err_len, "ttd at %s did not come back within %lld ms to resume session %s (TTD_RESUME_TIMEOUT_MS "
               "sets how long to wait): %s [the call failed with: %s]", c->target, (long long)c->resume_timeout_ms,
               c->session_hex, why, cause);
      st = TT_UNAVAILABLE;
      break;
    }
    await_channel(c, pause);
    pause = pause * 2 > 20 ? 20 : pause * 2;
  }
  pthread_mutex_unlock(&c->resume_lock);
  return st;
}
