#include "session/session_table.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "telemetry/log.h"
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

ttd_status_t ttd_session_table_lookup(ttd_session_table *table, uint64_t id, const char *tenant, int64_t now_ms,
                                      ttd_session **out_session) {
  pthread_mutex_lock(&table->lock);
  ttd_session *s = ttd_handle_map_get(&table->sessions, id);
  if (s && tenant && strcmp(s->tenant, tenant) != 0) s = NULL;
  if (s) {
    ttd_session_retain(s);
    ttd_session_touch(s, now_ms);
  }
  pthread_mutex_unlock(&table->lock);
  *out_session = s;
  if (s) return TTD_OK;
  return ttd_make_status(GRPC_STATUS_NOT_FOUND,
                         "session %016" PRIx64 " is not open: it was closed, or expired after %" PRId64
                         " ms without a call; open a new session",
                         id, table->lease_ms);
}

void ttd_session_table_close(ttd_session_table *table, ttd_session *session, uint64_t *out_tensors,
                             uint64_t *out_bytes) {
  pthread_mutex_lock(&table->lock);
  ttd_session *owned = ttd_handle_map_remove(&table->sessions, session->id);
  pthread_mutex_unlock(&table->lock);
  ttd_session_close(session, out_tensors, out_bytes);
  ttd_session_release(owned);
}

size_t ttd_session_table_sweep(ttd_session_table *table, int64_t now_ms) {
  size_t closed = 0;
  for (;;) {
    ttd_session *expired = NULL;
    pthread_mutex_lock(&table->lock);
    for (size_t i = 0; i < table->sessions.capacity && !expired; i++) {
      ttd_session *s = table->sessions.values[i];
      if (table->sessions.keys[i] &&
          now_ms - atomic_load_explicit(&s->last_seen_ms, memory_order_relaxed) > table->lease_ms) {
        expired = ttd_handle_map_remove(&table->sessions, s->id);
      }
    }
    pthread_mutex_unlock(&table->lock);
    if (!expired) return closed;
    uint64_t tensors = 0, bytes = 0;
    ttd_session_close(expired, &tensors, &bytes);
    TTD_LOG(TTD_LOG_INFO, "session=%016" PRIx64 " event=lease-expired client=\"%s\" tensors_freed=%" PRIu64
            " bytes_freed=%" PRIu64, expired->id, expired->client_name, tensors, bytes);
    ttd_session_release(expired);
    closed++;
  }
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
