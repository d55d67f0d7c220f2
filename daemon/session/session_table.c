#include "session/session_table.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "telemetry/log.h"
#include "base/clock.h"
#include "base/random.h"

void ttd_session_table_init(ttd_session_table *table, int64_t lease_ms) {
  pthread_mutex_init(&table->lock, NULL);
  table->sessions = (ttd_handle_map){0};
  table->lease_ms = lease_ms;
}

void ttd_session_table_destroy(ttd_session_table *table) {
  for (size_t i = 0; i < table->sessions.capacity; i++) {
    ttd_session *s = table->sessions.values[i];
    if (!table->sessions.keys[i]) continue;
    ttd_session_close(s, NULL, NULL);
    ttd_session_release(s);
  }
  ttd_handle_map_clear(&table->sessions);
  pthread_mutex_destroy(&table->lock);
}

ttd_status_t ttd_session_table_open(ttd_session_table *table, const ttd_session_params *params, int64_t now_ms,
                                    ttd_session **out_session) {
  *out_session = NULL;
  ttd_session *s = ttd_session_create(0, params, now_ms);
  if (!s) return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  int rc;
  pthread_mutex_lock(&table->lock);
  if (params->max_tenant_sessions) {
    uint32_t open = 0;
    for (size_t i = 0; i < table->sessions.capacity; i++) {
      const ttd_session *other = table->sessions.values[i];
      open += table->sessions.keys[i] && strcmp(other->tenant, s->tenant) == 0;
    }
    if (open >= params->max_tenant_sessions) {
      pthread_mutex_unlock(&table->lock);
      ttd_session_release(s);
      return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED,
                             "tenant %s holds %u open sessions, its limit (max_sessions= in the tokens file, else "
                             "ttd --max-sessions): close one, or ask the operator for more",
                             params->tenant ? params->tenant : "", open);
    }
  }
  do {
    s->id = ttd_random_u64();
    rc = ttd_handle_map_put(&table->sessions, s->id, s);
  } while (rc == -1);
  pthread_mutex_unlock(&table->lock);
  if (rc) {
    ttd_session_release(s);
    return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  }
  *out_session = ttd_session_retain(s);
  return TTD_OK;
}

ttd_status_t ttd_session_table_insert(ttd_session_table *table, ttd_session *session) {
  pthread_mutex_lock(&table->lock);
  int rc = ttd_handle_map_put(&table->sessions, session->id, session);
  if (rc == 0) ttd_session_retain(session);
  pthread_mutex_unlock(&table->lock);
  if (rc == -1) {
    return ttd_make_status(GRPC_STATUS_ALREADY_EXISTS, "session %016" PRIx64 " is open already", session->id);
  }
  return rc ? ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory") : TTD_OK;
}

/* Tells the state that the session was resumed or ended, if it has files on disk. */
static void forget_files(ttd_session_table *table, ttd_session *s, bool resumed) {
  if (table->forget && atomic_load(&s->on_disk) != TTD_ON_DISK_NONE) table->forget(table->forget_ctx, s, resumed);
}

/* Remembers how a session left the table; the caller holds the lock. */
static void note_end(ttd_session_table *table, const ttd_session *s, ttd_session_end_kind kind, const char *by,
                     int64_t now_ms) {
  ttd_session_end *e = &table->ends[table->next_end++ % TTD_SESSION_ENDS_KEPT];
  *e = (ttd_session_end){.id = s->id, .kind = kind, .at_ms = now_ms};
  snprintf(e->tenant, sizeof(e->tenant), "%s", s->tenant);
  snprintf(e->by, sizeof(e->by), "%s", by ? by : "");
}

/* Why id is not open, for tenant (NULL: any); the caller holds the lock. */
static ttd_status_t not_open(const ttd_session_table *table, uint64_t id, const char *tenant, int64_t now_ms) {
  for (size_t i = 0; i < TTD_SESSION_ENDS_KEPT; i++) {
    const ttd_session_end *e = &table->ends[i];
    if (!e->kind || e->id != id || (tenant && strcmp(e->tenant, tenant) != 0)) continue;
    switch (e->kind) {
      case TTD_SESSION_KILLED:
        return ttd_make_status(GRPC_STATUS_NOT_FOUND,
                               "session %016" PRIx64 " is not open: it was killed by admin tenant '%s' (ttctl kill) "
                               "%" PRId64 " s ago, and its tensors freed; open a new session",
                               id, e->by, (now_ms - e->at_ms) / 1000);
      case TTD_SESSION_REVOKED:
        return ttd_make_status(GRPC_STATUS_NOT_FOUND,
                               "session %016" PRIx64 " is not open: the token it was opened with was revoked at a "
                               "reload %" PRId64 " s ago, and its tensors freed; open a new session with a token of "
                               "the tokens file", id, (now_ms - e->at_ms) / 1000);
      case TTD_SESSION_EXPIRED:
        return ttd_make_status(GRPC_STATUS_NOT_FOUND,
                               "session %016" PRIx64 " is not open: it expired after %" PRId64 " ms without a call; "
                               "open a new session (or keep it alive)", id, table->lease_ms);
      case TTD_SESSION_CLOSED:
        return ttd_make_status(GRPC_STATUS_NOT_FOUND,
                               "session %016" PRIx64 " is not open: its client closed it; open a new session", id);
    }
  }
  return ttd_make_status(GRPC_STATUS_NOT_FOUND,
                         "session %016" PRIx64 " is not open: it was closed, or expired after %" PRId64
                         " ms without a call; open a new session",
                         id, table->lease_ms);
}

/* ttd_session_table_lookup, touching the session found when touch. */
static ttd_status_t lookup(ttd_session_table *table, uint64_t id, const char *tenant, int64_t now_ms, bool touch,
                           ttd_session **out_session) {
  pthread_mutex_lock(&table->lock);
  ttd_session *s = ttd_handle_map_get(&table->sessions, id);
  if (s && tenant && strcmp(s->tenant, tenant) != 0) s = NULL;
  ttd_status_t status = TTD_OK;
  if (s && atomic_load(&s->awaiting_resume)) {
    status = ttd_make_status(GRPC_STATUS_FAILED_PRECONDITION,
                             "session %016" PRIx64 " was saved at a restart of ttd and waits for its client to resume "
                             "it: OpenSession with resume_session and the session's resume_secret (libttclient does "
                             "this by itself)", id);
    s = NULL;
  } else if (s) {
    ttd_session_retain(s);
    if (touch) ttd_session_touch(s, now_ms);
  } else {
    status = not_open(table, id, tenant, now_ms);
  }
  pthread_mutex_unlock(&table->lock);
  *out_session = s;
  return status;
}

ttd_status_t ttd_session_table_lookup(ttd_session_table *table, uint64_t id, const char *tenant, int64_t now_ms,
                                      ttd_session **out_session) {
  return lookup(table, id, tenant, now_ms, true, out_session);
}

ttd_status_t ttd_session_table_peek(ttd_session_table *table, uint64_t id, const char *tenant, int64_t now_ms,
                                    ttd_session **out_session) {
  return lookup(table, id, tenant, now_ms, false, out_session);
}

ttd_status_t ttd_session_table_resume(ttd_session_table *table, uint64_t id, const char *tenant, const uint8_t *secret,
                                      size_t secret_len, int64_t now_ms, ttd_session **out_session) {
  pthread_mutex_lock(&table->lock);
  ttd_session *s = ttd_handle_map_get(&table->sessions, id);
  bool ok = s && strcmp(s->tenant, tenant) == 0 && atomic_load(&s->awaiting_resume) &&
            ttd_session_resume_secret_matches(s, secret, secret_len);
  if (ok) {
    atomic_store(&s->awaiting_resume, false);
    ttd_session_retain(s);
    ttd_session_touch(s, now_ms);
  }
  pthread_mutex_unlock(&table->lock);
  *out_session = ok ? s : NULL;
  if (!ok) {
    return ttd_make_status(GRPC_STATUS_NOT_FOUND,
                           "session %016" PRIx64 " cannot be resumed: no saved session of this tenant has that id "
                           "and secret (ttd restarted without saving it, after a crash, or it expired); open a new "
                           "session", id);
  }
  /* From here on the session's state lives in memory only: files left behind would bring
   * back stale tensors after a crash. */
  forget_files(table, s, true);
  return TTD_OK;
}

static void close_as(ttd_session_table *table, ttd_session *session, ttd_session_end_kind kind, const char *by,
                     uint64_t *out_tensors, uint64_t *out_bytes) {
  pthread_mutex_lock(&table->lock);
  ttd_session *owned = ttd_handle_map_remove(&table->sessions, session->id);
  if (owned) note_end(table, owned, kind, by, ttd_now_ms());
  pthread_mutex_unlock(&table->lock);
  ttd_session_close(session, out_tensors, out_bytes);
  forget_files(table, session, false);
  ttd_session_release(owned);
}

void ttd_session_table_close(ttd_session_table *table, ttd_session *session, uint64_t *out_tensors,
                             uint64_t *out_bytes) {
  close_as(table, session, TTD_SESSION_CLOSED, NULL, out_tensors, out_bytes);
}

void ttd_session_table_kill(ttd_session_table *table, ttd_session *session, const char *by, uint64_t *out_tensors,
                            uint64_t *out_bytes) {
  close_as(table, session, TTD_SESSION_KILLED, by, out_tensors, out_bytes);
}

void ttd_session_table_revoke(ttd_session_table *table, ttd_session *session, uint64_t *out_tensors,
                              uint64_t *out_bytes) {
  close_as(table, session, TTD_SESSION_REVOKED, NULL, out_tensors, out_bytes);
}

size_t ttd_session_table_sweep(ttd_session_table *table, int64_t now_ms) {
  ttd_session *batch[TTD_SWEEP_MAX_CLOSE];
  size_t n = 0;
  pthread_mutex_lock(&table->lock);
  /* One pass over the slots collects the expired ids; they leave the map after it (removal
   * shifts entries, so not during it). */
  uint64_t ids[TTD_SWEEP_MAX_CLOSE];
  for (size_t i = 0; i < table->sessions.capacity && n < TTD_SWEEP_MAX_CLOSE; i++) {
    ttd_session *s = table->sessions.values[i];
    if (table->sessions.keys[i] && atomic_load(&s->device_calls) == 0 &&
        now_ms - atomic_load_explicit(&s->last_seen_ms, memory_order_relaxed) > table->lease_ms) {
      ids[n++] = table->sessions.keys[i];
    }
  }
  for (size_t k = 0; k < n; k++) {
    batch[k] = ttd_handle_map_remove(&table->sessions, ids[k]);
    note_end(table, batch[k], TTD_SESSION_EXPIRED, NULL, now_ms);
  }
  pthread_mutex_unlock(&table->lock);
  for (size_t k = 0; k < n; k++) {
    ttd_session *expired = batch[k];
    uint64_t tensors = 0, bytes = 0;
    ttd_session_close(expired, &tensors, &bytes);
    forget_files(table, expired, false);
    TTD_LOG(TTD_LOG_INFO, "session=%016" PRIx64 " event=lease-expired client=\"%s\" tensors_freed=%" PRIu64
            " bytes_freed=%" PRIu64, expired->id, expired->client_name, tensors, bytes);
    ttd_session_release(expired);
  }
  return n;
}

size_t ttd_session_table_count(ttd_session_table *table) {
  pthread_mutex_lock(&table->lock);
  size_t n = table->sessions.count;
  pthread_mutex_unlock(&table->lock);
  return n;
}

void ttd_session_table_stats(ttd_session_table *table, uint64_t *out_sessions, uint64_t *out_tensors) {
  uint64_t tensors = 0;
  pthread_mutex_lock(&table->lock);
  *out_sessions = table->sessions.count;
  for (size_t i = 0; i < table->sessions.capacity; i++) {
    ttd_session *s = table->sessions.values[i];
    if (!table->sessions.keys[i]) continue;
    pthread_mutex_lock(&s->lock);
    tensors += s->tensors.count;
    pthread_mutex_unlock(&s->lock);
  }
  pthread_mutex_unlock(&table->lock);
  *out_tensors = tensors;
}

ttd_status_t ttd_session_table_snapshot(ttd_session_table *table, ttd_session ***out_sessions, size_t *out_count) {
  *out_sessions = NULL;
  *out_count = 0;
  pthread_mutex_lock(&table->lock);
  ttd_session **list = malloc((table->sessions.count + 1) * sizeof(*list));
  size_t n = 0;
  for (size_t i = 0; list && i < table->sessions.capacity; i++) {
    if (table->sessions.keys[i]) list[n++] = ttd_session_retain(table->sessions.values[i]);
  }
  pthread_mutex_unlock(&table->lock);
  if (!list) return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  *out_sessions = list;
  *out_count = n;
  return TTD_OK;
}

void ttd_session_table_snapshot_free(ttd_session **sessions, size_t count) {
  for (size_t i = 0; i < count; i++) ttd_session_release(sessions[i]);
  free(sessions);
}
