/* tt_list_sessions and tt_kill_session: the operator's calls (admin tenants only). */
#include <stdio.h>
#include <stdlib.h>

#include "conn/conn.h"

tt_status tt_list_sessions(tt_client *client, tt_session_info **out_sessions, size_t *out_count) {
  *out_sessions = NULL;
  *out_count = 0;
  Ttd__V1__ListSessionsRequest req = TTD__V1__LIST_SESSIONS_REQUEST__INIT;
  ProtobufCMessage *out = NULL;
  tt_status st =
      tt_rpc_unary(client, TT_RPC_LIST_SESSIONS, &req.base, &ttd__v1__list_sessions_response__descriptor, &out);
  if (st != TT_OK) return st;
  Ttd__V1__ListSessionsResponse *resp = (Ttd__V1__ListSessionsResponse *)out;
  tt_session_info *list = calloc(resp->n_sessions ? resp->n_sessions : 1, sizeof(*list));
  if (!list) {
    protobuf_c_message_free_unpacked(out, NULL);
    return tt_client_fail(client, TT_RESOURCE_EXHAUSTED, "out of host memory");
  }
  for (size_t i = 0; i < resp->n_sessions; i++) {
    const Ttd__V1__SessionInfo *s = resp->sessions[i];
    tt_session_info *info = &list[i];
    info->session_id = s->session_id;
    snprintf(info->tenant, sizeof(info->tenant), "%s", s->tenant);
    snprintf(info->client_name, sizeof(info->client_name), "%s", s->client_name);
    snprintf(info->peer, sizeof(info->peer), "%s", s->peer);
    info->age_ms = s->age_ms;
    info->idle_ms = s->idle_ms;
    info->tensors = s->tensors;
    info->used_bytes = s->used_bytes;
    info->quota_bytes = s->quota_bytes;
  }
  *out_sessions = list;
  *out_count = resp->n_sessions;
  protobuf_c_message_free_unpacked(out, NULL);
  return TT_OK;
}

void tt_session_list_free(tt_session_info *sessions) { free(sessions); }

tt_status tt_kill_session(tt_client *client, uint64_t session_id, uint64_t *out_tensors, uint64_t *out_bytes) {
  Ttd__V1__KillSessionRequest req = TTD__V1__KILL_SESSION_REQUEST__INIT;
  req.session_id = session_id;
  ProtobufCMessage *out = NULL;
  tt_status st = tt_rpc_unary(client, TT_RPC_KILL_SESSION, &req.base, &ttd__v1__kill_session_response__descriptor, &out);
  if (st != TT_OK) return st;
  const Ttd__V1__KillSessionResponse *resp = (const Ttd__V1__KillSessionResponse *)out;
  if (out_tensors) *out_tensors = resp->tensors_freed;
  if (out_bytes) *out_bytes = resp->bytes_freed;
  protobuf_c_message_free_unpacked(out, NULL);
  return TT_OK;
}
