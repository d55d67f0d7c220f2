/* OpenSession, KeepAlive, CloseSession. */
#include <inttypes.h>
#include <string.h>

#include "methods/methods.h"
#include "rpc/server.h"
#include "telemetry/log.h"
#include "ttd/v1/ttd.pb-c.h"

/* What OpenSession answers for session; NULL when out of memory. */
static Ttd__V1__OpenSessionResponse *session_response(ttd_call *call, ttd_session *session, uint64_t quota) {
  Ttd__V1__OpenSessionResponse *resp = ttd_call_alloc(call, sizeof(*resp));
  if (!resp) return NULL;
  ttd__v1__open_session_response__init(resp);
  resp->session_id = session->id;
  resp->lease_ms = (uint32_t)call->core->config->lease_ms;
  resp->instance_id = call->core->instance_id;
  resp->protocol_version = TTD_PROTOCOL_VERSION;
  resp->quota_bytes = quota;
  resp->tenant = ttd_call_strdup(call, session->tenant);
  resp->shm_socket = call->core->shm_socket;
  resp->shm_key_hi = session->shm_key[0];
  resp->shm_key_lo = session->shm_key[1];
  if (call->core->config->state_dir) { /* only a ttd that saves its state can resume */
    resp->resume_secret.data = ttd_call_alloc(call, TTD_RESUME_SECRET_BYTES);
    if (!resp->resume_secret.data) return NULL;
    memcpy(resp->resume_secret.data, session->resume_secret, TTD_RESUME_SECRET_BYTES);
    resp->resume_secret.len = TTD_RESUME_SECRET_BYTES;
  }
  return resp;
}

/* OpenSession with resume_session: a saved session back to the client holding its secret. */
static ttd_status_t resume_session(ttd_call *call, const Ttd__V1__OpenSessionRequest *req,
                                   ProtobufCMessage **out_response) {
  ttd_session *session = NULL;
  pthread_rwlock_rdlock(&call->core->reload_lock); /* no reload between the token's check and its record */
  ttd_status_t status = ttd_auth_recheck(&call->core->auth, &call->principal);
  if (!status) {
    status = ttd_session_table_resume(&call->core->sessions, req->resume_session, call->principal.tenant,
                                      req->resume_secret.data, req->resume_secret.len, ttd_now_ms(), &session);
  }
  if (!status) ttd_session_set_token(session, call->principal.by_token ? call->principal.token_digest : NULL);
  pthread_rwlock_unlock(&call->core->reload_lock);
  TTD_RETURN_IF_ERROR(status);
  Ttd__V1__OpenSessionResponse *resp = session_response(call, session, atomic_load(&session->quota->limit));
  if (resp) resp->resumed = true;
  TTD_LOG(TTD_LOG_INFO, "session=%016" PRIx64 " event=resumed tenant=%s client=\"%s\"", session->id, session->tenant,
          session->client_name);
  ttd_session_release(session); /* the table keeps its own reference; the response copies what it needs */
  if (!resp) return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  *out_response = &resp->base;
  return TTD_OK;
}

ttd_status_t ttd_method_open_session(ttd_call *call, const ProtobufCMessage *request, ProtobufCMessage **out_response) {
  const Ttd__V1__OpenSessionRequest *req = (const Ttd__V1__OpenSessionRequest *)request;
  if (req->protocol_version != TTD_PROTOCOL_VERSION) {
    return ttd_make_status(GRPC_STATUS_FAILED_PRECONDITION,
                           "protocol version mismatch: the client speaks ttd.v1 protocol %u, this daemon speaks %d; "
                           "use a client library built from the daemon's proto/",
                           req->protocol_version, TTD_PROTOCOL_VERSION);
  }
  if (req->resume_session) return resume_session(call, req, out_response);
  uint64_t quota = 0;
  pthread_rwlock_rdlock(&call->core->reload_lock);
  /* The token was checked before this lock: a reload since may have revoked it. */
  ttd_status_t status = ttd_auth_recheck(&call->core->auth, &call->principal);
  if (!status) status = ttd_auth_session_quota(&call->core->auth, call->principal.tenant, req->quota_bytes, &quota);
  if (status) {
    pthread_rwlock_unlock(&call->core->reload_lock);
    return status;
  }
  ttd_conn_peer peer;
  ttd_call_peer(call, &peer); /* no name for a call run in process */
  ttd_session_params params = {.client_name = req->client_name,
                               .tenant = call->principal.tenant,
                               .peer = peer.name[0] ? peer.name : NULL,
                               .quota_asked = req->quota_bytes,
                               .quota = quota,
                               .max_tenant_sessions = ttd_auth_max_sessions(&call->core->auth, call->principal.tenant),
                               .weight = ttd_auth_weight(&call->core->auth, call->principal.tenant),
                               .token_digest = call->principal.by_token ? call->principal.token_digest : NULL};
  params.tenant_quota = ttd_auth_tenant_quota(&call->core->auth, call->principal.tenant);
  ttd_session *session = NULL;
  status = params.tenant_quota ? ttd_session_table_open(&call->core->sessions, &params, ttd_now_ms(), &session)
                               : ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  ttd_quota_release(params.tenant_quota);
  pthread_rwlock_unlock(&call->core->reload_lock);
  TTD_RETURN_IF_ERROR(status);
  Ttd__V1__OpenSessionResponse *resp = session_response(call, session, quota);
  if (!resp) {
    ttd_session_table_close(&call->core->sessions, session, NULL, NULL);
    ttd_session_release(session);
    return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  }
  TTD_LOG(TTD_LOG_INFO, "session=%016" PRIx64 " event=open tenant=%s client=\"%s\" peer=%s quota=%" PRIu64, session->id,
          session->tenant, session->client_name, session->peer, quota);
  ttd_session_release(session);
  *out_response = &resp->base;
  return TTD_OK;
}

ttd_status_t ttd_method_keep_alive(ttd_call *call, const ProtobufCMessage *request, ProtobufCMessage **out_response) {
  (void)request;
  Ttd__V1__KeepAliveResponse *resp = ttd_call_alloc(call, sizeof(*resp));
  TTD_CHECK_ALLOC(resp);
  ttd__v1__keep_alive_response__init(resp);
  resp->lease_ms = (uint32_t)call->core->config->lease_ms;
  *out_response = &resp->base;
  return TTD_OK;
}

ttd_status_t ttd_method_close_session(ttd_call *call, const ProtobufCMessage *request, ProtobufCMessage **out_response) {
  (void)request;
  Ttd__V1__CloseSessionResponse *resp = ttd_call_alloc(call, sizeof(*resp));
  TTD_CHECK_ALLOC(resp);
  ttd__v1__close_session_response__init(resp);
  ttd_session_table_close(&call->core->sessions, call->session, &resp->tensors_freed, &resp->bytes_freed);
  TTD_LOG(TTD_LOG_INFO, "session=%016" PRIx64 " event=close tensors_freed=%" PRIu64 " bytes_freed=%" PRIu64,
          call->session->id, resp->tensors_freed, resp->bytes_freed);
  *out_response = &resp->base;
  return TTD_OK;
}
