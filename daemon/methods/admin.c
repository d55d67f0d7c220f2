/* ListSessions and KillSession: the operator's view of who holds the card (admin tenants
 * only; the method table marks them). */
#include <inttypes.h>

#include "methods/methods.h"
#include "telemetry/log.h"
#include "ttd/v1/ttd.pb-c.h"

ttd_status_t ttd_method_list_sessions(ttd_call *call, const ProtobufCMessage *request, ProtobufCMessage **out_response) {
  (void)request;
  Ttd__V1__ListSessionsResponse *resp = ttd_call_alloc(call, sizeof(*resp));
  TTD_CHECK_ALLOC(resp);
  ttd__v1__list_sessions_response__init(resp);
  ttd_session **sessions;
  size_t n;
  TTD_RETURN_IF_ERROR(ttd_session_table_snapshot(&call->core->sessions, &sessions, &n));
  resp->sessions = ttd_call_alloc(call, (n + 1) * sizeof(*resp->sessions));
  Ttd__V1__SessionInfo *infos = ttd_call_alloc(call, (n + 1) * sizeof(*infos));
  if (!resp->sessions || !infos) {
    ttd_session_table_snapshot_free(sessions, n);
    return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  }
  int64_t now = ttd_now_ms();
  for (size_t i = 0; i < n; i++) {
    ttd_session *s = sessions[i];
    Ttd__V1__SessionInfo *info = &infos[i];
    ttd__v1__session_info__init(info);
    info->session_id = s->id;
    info->tenant = ttd_call_strdup(call, s->tenant);
    info->client_name = ttd_call_strdup(call, s->client_name);
    info->peer = ttd_call_strdup(call, s->peer);
    info->age_ms = (uint64_t)(now - s->opened_ms);
    int64_t seen = atomic_load_explicit(&s->last_seen_ms, memory_order_relaxed);
    info->idle_ms = now > seen ? (uint64_t)(now - seen) : 0;
    pthread_mutex_lock(&s->lock);
    info->tensors = s->tensors.count;
    pthread_mutex_unlock(&s->lock);
    info->used_bytes = atomic_load_explicit(&s->quota->used, memory_order_relaxed);
    info->quota_bytes = atomic_load_explicit(&s->quota->limit, memory_order_relaxed);
    if (!info->tenant || !info->client_name || !info->peer) {
      ttd_session_table_snapshot_free(sessions, n);
      return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
    }
    resp->sessions[i] = info;
  }
  resp->n_sessions = n;
  ttd_session_table_snapshot_free(sessions, n);
  *out_response = &resp->base;
  return TTD_OK;
}

ttd_status_t ttd_method_kill_session(ttd_call *call, const ProtobufCMessage *request, ProtobufCMessage **out_response) {
  const Ttd__V1__KillSessionRequest *req = (const Ttd__V1__KillSessionRequest *)request;
  Ttd__V1__KillSessionResponse *resp = ttd_call_alloc(call, sizeof(*resp));
  TTD_CHECK_ALLOC(resp);
  ttd__v1__kill_session_response__init(resp);
  ttd_session *victim = NULL;
  TTD_RETURN_IF_ERROR(ttd_session_table_lookup(&call->core->sessions, req->session_id, NULL, ttd_now_ms(), &victim));
  ttd_session_table_kill(&call->core->sessions, victim, call->principal.tenant, &resp->tensors_freed,
                         &resp->bytes_freed);
  TTD_LOG(TTD_LOG_INFO, "session=%016" PRIx64 " event=killed by=%s tenant=%s client=\"%s\" tensors_freed=%" PRIu64
          " bytes_freed=%" PRIu64, victim->id, call->principal.tenant, victim->tenant, victim->client_name,
          resp->tensors_freed, resp->bytes_freed);
  ttd_session_release(victim);
  *out_response = &resp->base;
  return TTD_OK;
}
