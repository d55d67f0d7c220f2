#include "session/session.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/program_run.h"
#include "wire/shm_protocol.h"
#include "base/random.h"

/* Copies a client-chosen name for logs and operators' tools: printable ASCII only, with
 * quotes, backslashes and anything else (control characters, bytes of UTF-8) as '?', so a
 * name can neither forge log lines nor break JSON or a terminal. */
static void copy_display_name(char *dst, size_t size, const char *src) {
  size_t n = 0;
  for (; src && src[n] && n + 1 < size; n++) {
    unsigned char ch = (unsigned char)src[n];
    dst[n] = ch >= 0x20 && ch < 0x7f && ch != '"' && ch != '\\' ? (char)ch : '?';
  }
  dst[n] = '\0';
}

ttd_session *ttd_session_create(uint64_t id, const ttd_session_params *params, int64_t now_ms) {
  ttd_session *s = calloc(1, sizeof(*s));
  if (!s) return NULL;
  s->quota = ttd_quota_create_under(params->quota, params->tenant_quota);
  if (!s->quota) {
    free(s);
    return NULL;
  }
  atomic_init(&s->refs, 1);
  s->id = id;
  copy_display_name(s->client_name, sizeof(s->client_name), params->client_name);
  snprintf(s->tenant, sizeof(s->tenant), "%s", params->tenant ? params->tenant : "");
  s->tenant_key = 1469598103934665603ull; /* FNV-1a of the name: tenants apart in the scheduler */
  for (const char *k = s->tenant; *k; k++) s->tenant_key = (s->tenant_key ^ (unsigned char)*k) * 1099511628211ull;
  atomic_init(&s->weight, params->weight ? params->weight : 1);
  snprintf(s->peer, sizeof(s->peer), "%s", params->peer ? params->peer : "");
  s->quota_asked = params->quota_asked;
  s->shm_key[0] = ttd_random_u64();
  s->shm_key[1] = ttd_random_u64();
  for (size_t i = 0; i < TTD_RESUME_SECRET_BYTES; i += 8) {
    uint64_t r = ttd_random_u64();
    memcpy(s->resume_secret + i, &r, 8);
  }
  s->opened_ms = now_ms;
  atomic_init(&s->last_seen_ms, now_ms);
  pthread_mutex_init(&s->lock, NULL);
  ttd_session_set_token(s, params->token_digest);
  return s;
}

void ttd_session_set_token(ttd_session *session, const uint8_t *token_digest) {
  pthread_mutex_lock(&session->lock);
  session->by_token = token_digest != NULL;
  if (token_digest) memcpy(session->token_digest, token_digest, TTD_TOKEN_DIGEST_BYTES);
  else memset(session->token_digest, 0, TTD_TOKEN_DIGEST_BYTES);
  pthread_mutex_unlock(&session->lock);
}

ttd_session *ttd_session_retain(ttd_session *session) {
  atomic_fetch_add_explicit(&session->refs, 1, memory_order_relaxed);
  return session;
}

void ttd_session_release(ttd_session *session) {
  if (!session) return;
  if (atomic_fetch_sub_explicit(&session->refs, 1, memory_order_acq_rel) != 1) return;
  ttd_session_close(session, NULL, NULL);
  ttd_handle_map_clear(&session->tensors);
  ttd_handle_map_clear(&session->programs);
  ttd_handle_map_clear(&session->runs);
  ttd_handle_map_clear(&session->segments);
  pthread_mutex_destroy(&session->lock);
  ttd_quota_release(session->quota);
  free(session);
}

void ttd_session_touch(ttd_session *session, int64_t now_ms) {
  atomic_store_explicit(&session->last_seen_ms, now_ms, memory_order_relaxed);
}

void ttd_session_device_call_begin(ttd_session *session) { atomic_fetch_add(&session->device_calls, 1); }

void ttd_session_device_call_end(ttd_session *session, int64_t now_ms) {
  ttd_session_touch(session, now_ms); /* first: a sweep that sees no call sees the new lease */
  atomic_fetch_sub(&session->device_calls, 1);
}

ttd_status_t ttd_session_handle_not_found(uint64_t handle) {
  return ttd_make_status(GRPC_STATUS_NOT_FOUND,
                         "tensor 0x%016" PRIx64 " not found in this session "
                         "(freed, never issued, or owned by another session)",
                         handle);
}

/* Puts value under a new random handle unused by any of the session's maps; bytes are
 * added to the session's tensor bytes. */
static ttd_status_t closed_status(const ttd_session *session) {
  return ttd_make_status(GRPC_STATUS_FAILED_PRECONDITION,
                         "session %016" PRIx64 " was closed during the call; open a new session", session->id);
}

/* With the lock held and the session open: value under a new random handle unused by any
 * of the session's maps. */
static ttd_status_t add_locked(ttd_session *session, ttd_handle_map *map, void *value, uint64_t bytes,
                               uint64_t *out_handle) {
  uint64_t handle;
  int rc;
  do {
    handle = ttd_random_u64();
    rc = ttd_handle_map_get(&session->tensors, handle) || ttd_handle_map_get(&session->programs, handle) ||
                 ttd_handle_map_get(&session->runs, handle) || ttd_handle_map_get(&session->segments, handle)
             ? -1
             : ttd_handle_map_put(map, handle, value);
  } while (rc == -1); /* a collision with a live handle: draw again */
  if (rc) return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  session->tensor_bytes += bytes;
  *out_handle = handle;
  return TTD_OK;
}

/* Puts value under a new random handle; bytes are added to the session's tensor bytes. */
static ttd_status_t add_object(ttd_session *session, ttd_handle_map *map, void *value, uint64_t bytes,
                               uint64_t *out_handle) {
  *out_handle = 0;
  pthread_mutex_lock(&session->lock);
  ttd_status_t status = session->closed ? closed_status(session) : add_locked(session, map, value, bytes, out_handle);
  pthread_mutex_unlock(&session->lock);
  return status;
}

bool ttd_session_resume_secret_matches(const ttd_session *session, const uint8_t *secret, size_t len) {
  if (len != TTD_RESUME_SECRET_BYTES) return false;
  uint8_t diff = 0;
  for (size_t i = 0; i < len; i++) diff |= session->resume_secret[i] ^ secret[i];
  return diff == 0;
}

bool ttd_session_shm_key_matches(const ttd_session *session, const uint64_t key[2]) {
  uint64_t diff = (session->shm_key[0] ^ key[0]) | (session->shm_key[1] ^ key[1]);
  return diff == 0;
}

ttd_status_t ttd_session_segment_add(ttd_session *session, ttd_shm_segment *segment, uid_t uid, uint64_t *out_id) {
  return ttd_session_segment_add_as(session, segment, uid, 0, out_id);
}

/* With the lock held and the session open: value under handle, which no map of the session
 * uses yet. */
static ttd_status_t put_locked(ttd_session *session, ttd_handle_map *map, void *value, uint64_t handle) {
  if (ttd_handle_map_get(&session->tensors, handle) || ttd_handle_map_get(&session->programs, handle) ||
      ttd_handle_map_get(&session->runs, handle) || ttd_handle_map_get(&session->segments, handle)) {
    return ttd_make_status(GRPC_STATUS_ALREADY_EXISTS, "id %016" PRIx64 " is taken in session %016" PRIx64
                           "; register without asking for an id", handle, session->id);
  }
  if (ttd_handle_map_put(map, handle, value) != 0) {
    return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  }
  return TTD_OK;
}

/* The tenant's account of segments (its quota, the parent of the session's), or NULL. */
static ttd_quota *segment_tenant(const ttd_session *session) {
  return session->quota ? session->quota->parent : NULL;
}

/* Counts one more segment against the session's tenant: RESOURCE_EXHAUSTED naming the tenant
 * and its bound when its sessions already hold ttd_shm_segment_tenant_limit(). */
static ttd_status_t charge_tenant_segment(ttd_session *session) {
  ttd_quota *tenant = segment_tenant(session);
  if (!tenant) return TTD_OK;
  uint64_t cap = ttd_shm_segment_tenant_limit();
  if (atomic_fetch_add(&tenant->shm_segments, 1) < cap) return TTD_OK;
  atomic_fetch_sub(&tenant->shm_segments, 1);
  return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED,
                         "tenant %s holds %" PRIu64 " shared-memory segments over its sessions, its bound (a "
                         "quarter of the daemon's %" PRIu64 "): release segments, or register fewer and larger ones",
                         session->tenant, cap, ttd_shm_segment_limit());
}

static void refund_tenant_segments(ttd_session *session, uint64_t n) {
  ttd_quota *tenant = segment_tenant(session);
  if (tenant && n) atomic_fetch_sub(&tenant->shm_segments, n);
}

ttd_status_t ttd_session_segment_add_as(ttd_session *session, ttd_shm_segment *segment, uid_t uid, uint64_t wanted,
                                        uint64_t *out_id) {
  *out_id = 0;
  ttd_status_t status = TTD_OK;
  pthread_mutex_lock(&session->lock);
  if (session->closed) {
    status = closed_status(session);
  } else if (session->segments.count && session->segments_uid != uid) {
    status = ttd_make_status(GRPC_STATUS_PERMISSION_DENIED,
                             "session %016" PRIx64 " has segments of uid %u; uid %u cannot add to them", session->id,
                             (unsigned)session->segments_uid, (unsigned)uid);
  } else if (segment->size > TTD_SHM_MAX_SESSION_BYTES - session->segments_bytes) {
    status = ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED,
                             "session %016" PRIx64 " would map more than %llu bytes of shared memory; release "
                             "segments first", session->id, (unsigned long long)TTD_SHM_MAX_SESSION_BYTES);
  } else if (session->segments.count >= TTD_SHM_MAX_SEGMENTS) {
    status = ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED,
                             "session %016" PRIx64 " already has %d shared-memory segments; release some", session->id,
                             TTD_SHM_MAX_SEGMENTS);
  } else if (!(status = charge_tenant_segment(session))) {
    status = wanted ? put_locked(session, &session->segments, segment, wanted)
                    : add_locked(session, &session->segments, segment, 0, out_id);
    if (!status && wanted) *out_id = wanted;
    if (!status) {
      session->segments_uid = uid;
      session->segments_bytes += segment->size;
    } else {
      refund_tenant_segments(session, 1);
    }
  }
  pthread_mutex_unlock(&session->lock);
  return status;
}

ttd_status_t ttd_session_segment_lookup(ttd_session *session, uint64_t id, ttd_shm_segment **out_segment) {
  pthread_mutex_lock(&session->lock);
  ttd_shm_segment *s = ttd_handle_map_get(&session->segments, id);
  if (s) ttd_shm_segment_retain(s);
  pthread_mutex_unlock(&session->lock);
  *out_segment = s;
  if (s) return TTD_OK;
  return ttd_make_status(GRPC_STATUS_NOT_FOUND,
                         "shared-memory segment 0x%016" PRIx64 " is not registered in this session", id);
}

ttd_status_t ttd_session_segment_remove(ttd_session *session, uint64_t id, uid_t uid) {
  pthread_mutex_lock(&session->lock);
  bool other = session->segments.count && session->segments_uid != uid;
  ttd_shm_segment *s = other ? NULL : ttd_handle_map_remove(&session->segments, id);
  if (s) {
    session->segments_bytes -= s->size;
    refund_tenant_segments(session, 1);
  }
  pthread_mutex_unlock(&session->lock);
  if (other) {
    return ttd_make_status(GRPC_STATUS_PERMISSION_DENIED, "the session's segments belong to uid %u, not %u",
                           (unsigned)session->segments_uid, (unsigned)uid);
  }
  if (!s) {
    return ttd_make_status(GRPC_STATUS_NOT_FOUND,
                           "shared-memory segment 0x%016" PRIx64 " is not registered in this session", id);
  }
  ttd_shm_segment_release(s);
  return TTD_OK;
}

ttd_status_t ttd_session_tensor_add(ttd_session *session, ttd_tensor *tensor, uint64_t *out_handle) {
  ttd_tensor_retain(tensor);
  ttd_status_t status = add_object(session, &session->tensors, tensor, tensor->spec.nbytes, out_handle);
  if (status) ttd_tensor_release(tensor);
  return status;
}

ttd_status_t ttd_session_tensor_lookup(ttd_session *session, uint64_t handle, ttd_tensor **out_tensor) {
  pthread_mutex_lock(&session->lock);
  ttd_tensor *t = ttd_handle_map_get(&session->tensors, handle);
  if (t) ttd_tensor_retain(t);
  pthread_mutex_unlock(&session->lock);
  *out_tensor = t;
  return t ? TTD_OK : ttd_session_handle_not_found(handle);
}

int ttd_session_device_of(ttd_session *session, const uint64_t *handles, size_t count) {
  int device = -1;
  pthread_mutex_lock(&session->lock);
  for (size_t i = 0; i < count && device < 0; i++) {
    ttd_tensor *t = ttd_handle_map_get(&session->tensors, handles[i]);
    if (t) device = t->spec.device;
  }
  pthread_mutex_unlock(&session->lock);
  return device;
}

int ttd_session_run_device(ttd_session *session, uint64_t handle) {
  pthread_mutex_lock(&session->lock);
  ttd_run *run = ttd_handle_map_get(&session->runs, handle);
  int device = run ? run->device : -1;
  pthread_mutex_unlock(&session->lock);
  return device;
}

ttd_status_t ttd_handles_check_distinct(const uint64_t *handles, size_t count) {
  if (count < 2) return TTD_OK;
  ttd_handle_map seen = {0};
  ttd_status_t status = TTD_OK;
  for (size_t i = 0; i < count && !status; i++) {
    int rc = handles[i] ? ttd_handle_map_put(&seen, handles[i], (void *)1) : 0;
    if (rc == -1) {
      status = ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                               "handle 0x%016" PRIx64 " is listed twice (at %zu); list each once", handles[i], i);
    } else if (rc) {
      status = ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
    }
  }
  ttd_handle_map_clear(&seen);
  return status;
}

ttd_status_t ttd_session_tensors_free(ttd_session *session, const uint64_t *handles, size_t count,
                                      uint64_t *out_tensors, uint64_t *out_bytes) {
  *out_tensors = 0;
  *out_bytes = 0;
  if (count == 0) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "Free needs at least one handle");
  }
  TTD_RETURN_IF_ERROR(ttd_handles_check_distinct(handles, count));
  ttd_status_t status = TTD_OK;
  ttd_tensor **doomed = malloc(count * sizeof(*doomed));
  if (!doomed) return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  pthread_mutex_lock(&session->lock);
  for (size_t i = 0; i < count && !status; i++) {
    if (!ttd_handle_map_get(&session->tensors, handles[i])) status = ttd_session_handle_not_found(handles[i]);
  }
  if (!status) {
    for (size_t i = 0; i < count; i++) {
      doomed[i] = ttd_handle_map_remove(&session->tensors, handles[i]);
      session->tensor_bytes -= doomed[i]->spec.nbytes;
      *out_bytes += doomed[i]->spec.nbytes;
    }
    *out_tensors = count;
  }
  pthread_mutex_unlock(&session->lock);
  if (!status) {
    for (size_t i = 0; i < count; i++) ttd_tensor_release(doomed[i]);
  }
  free(doomed);
  return status;
}

/* Whether a and b were compiled from the same graph (the cache may have made b anew). */
static bool same_program(const ttd_program *a, const ttd_program *b) {
  return a == b || (a->key && b->key && a->hash == b->hash && a->key_len == b->key_len &&
                    memcmp(a->key, b->key, a->key_len) == 0);
}

ttd_status_t ttd_session_program_add(ttd_session *session, ttd_program *program, uint64_t *out_handle) {
  *out_handle = 0;
  ttd_status_t status = TTD_OK;
  pthread_mutex_lock(&session->lock);
  const ttd_handle_map *m = &session->programs;
  for (size_t i = 0; i < m->capacity && !*out_handle; i++) {
    if (m->keys[i] && same_program(m->values[i], program)) *out_handle = m->keys[i];
  }
  if (*out_handle) {
    /* already held */
  } else if (session->closed) {
    status = closed_status(session);
  } else if (m->count >= TTD_SESSION_MAX_PROGRAMS) {
    status = ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED,
                             "session %016" PRIx64 " holds %d programs, the most one session may; compile fewer "
                             "distinct graphs (or shapes) in one session, or open another session", session->id,
                             TTD_SESSION_MAX_PROGRAMS);
  } else if (!(status = ttd_session_program_charge(session, program))) {
    ttd_program_retain(program);
    status = add_locked(session, &session->programs, program, 0, out_handle);
    if (status) ttd_program_release(program); /* out of host memory: the session is done for anyway */
  }
  pthread_mutex_unlock(&session->lock);
  return status;
}

ttd_status_t ttd_session_program_charge(ttd_session *session, const ttd_program *program) {
  uint64_t held = session->program_bytes + program->host_bytes;
  uint64_t owed = held > TTD_SESSION_PROGRAM_ALLOWANCE ? held - TTD_SESSION_PROGRAM_ALLOWANCE : 0;
  ttd_status_t status = ttd_quota_charge(session->quota, owed - session->program_charged);
  if (!status) {
    session->program_bytes = held;
    session->program_charged = owed;
    return TTD_OK;
  }
  char need[32];
  ttd_status_t named = ttd_make_status(ttd_status_code(status),
                                       "the program of this graph takes %s of the daemon's memory, which counts "
                                       "against the quota past the first %d KiB of a session's programs: %s",
                                       ttd_format_bytes(program->host_bytes, need, sizeof(need)),
                                       (int)(TTD_SESSION_PROGRAM_ALLOWANCE >> 10), ttd_status_message(status));
  ttd_status_free(status);
  return named;
}

ttd_status_t ttd_session_program_lookup(ttd_session *session, uint64_t handle, ttd_program **out_program) {
  pthread_mutex_lock(&session->lock);
  ttd_program *p = ttd_handle_map_get(&session->programs, handle);
  if (p) ttd_program_retain(p);
  pthread_mutex_unlock(&session->lock);
  *out_program = p;
  if (p) return TTD_OK;
  return ttd_make_status(GRPC_STATUS_NOT_FOUND,
                         "program 0x%016" PRIx64 " not found in this session (never compiled here, or released)", handle);
}

ttd_status_t ttd_session_run_add(ttd_session *session, ttd_run *run, uint64_t *out_handle) {
  ttd_status_t status = add_object(session, &session->runs, run, 0, out_handle);
  if (status) ttd_run_free(run);
  return status;
}

ttd_status_t ttd_session_run_take(ttd_session *session, uint64_t handle, ttd_run **out_run) {
  pthread_mutex_lock(&session->lock);
  *out_run = ttd_handle_map_remove(&session->runs, handle);
  pthread_mutex_unlock(&session->lock);
  if (*out_run) return TTD_OK;
  return ttd_make_status(GRPC_STATUS_NOT_FOUND,
                         "run 0x%016" PRIx64 " not found in this session (already backpropagated or released, or "
                         "Execute was called without keep_for_backward)", handle);
}

ttd_status_t ttd_session_run_put_back(ttd_session *session, uint64_t handle, ttd_run *run) {
  pthread_mutex_lock(&session->lock);
  int rc = session->closed ? -1 : ttd_handle_map_put(&session->runs, handle, run);
  pthread_mutex_unlock(&session->lock);
  if (rc == 0) return TTD_OK;
  ttd_run_free(run);
  return ttd_make_status(GRPC_STATUS_FAILED_PRECONDITION, "session closed during Backward; the run is released");
}

bool ttd_session_stream_add(ttd_session *session, ttd_session_stream *stream) {
  pthread_mutex_lock(&session->lock);
  bool open = !session->closed;
  if (open) {
    stream->prev = NULL;
    stream->next = session->streams;
    if (session->streams) session->streams->prev = stream;
    session->streams = stream;
  }
  pthread_mutex_unlock(&session->lock);
  return open;
}

void ttd_session_stream_remove(ttd_session *session, ttd_session_stream *stream) {
  if (!stream->cancel) return;
  pthread_mutex_lock(&session->lock);
  if (stream->prev) stream->prev->next = stream->next;
  else if (session->streams == stream) session->streams = stream->next;
  if (stream->next) stream->next->prev = stream->prev;
  stream->prev = stream->next = NULL;
  stream->cancel = NULL;
  pthread_mutex_unlock(&session->lock);
}

void ttd_session_close(ttd_session *session, uint64_t *out_tensors, uint64_t *out_bytes) {
  uint64_t charged_before = atomic_load(&session->quota->used);
  pthread_mutex_lock(&session->lock);
  ttd_handle_map runs = session->runs;
  memset(&session->runs, 0, sizeof(session->runs));
  ttd_handle_map programs = session->programs;
  memset(&session->programs, 0, sizeof(session->programs));
  ttd_handle_map segments = session->segments;
  memset(&session->segments, 0, sizeof(session->segments));
  refund_tenant_segments(session, segments.count);
  ttd_handle_map tensors = session->tensors;
  memset(&session->tensors, 0, sizeof(session->tensors));
  session->tensor_bytes = 0;
  /* A stream stalled on its client holds its tensor until it ends: end it now (once). Each
   * one unregisters under this lock before its call goes, so it is alive here. */
  for (ttd_session_stream *st = session->closed ? NULL : session->streams; st; st = st->next) st->cancel(st);
  session->closed = true;
  pthread_mutex_unlock(&session->lock);
  for (size_t i = 0; i < tensors.capacity; i++) {
    if (tensors.keys[i]) ttd_tensor_release(tensors.values[i]);
  }
  for (size_t i = 0; i < runs.capacity; i++) {
    if (runs.keys[i]) ttd_run_free(runs.values[i]);
  }
  ttd_handle_map_clear(&runs);
  /* Programs are host memory: their charge goes back after the device bytes are counted. */
  uint64_t charged_after = atomic_load(&session->quota->used);
  ttd_quota_refund(session->quota, session->program_charged);
  session->program_charged = session->program_bytes = 0;
  for (size_t i = 0; i < programs.capacity; i++) {
    if (programs.keys[i]) ttd_program_release(programs.values[i]);
  }
  ttd_handle_map_clear(&programs);
  for (size_t i = 0; i < segments.capacity; i++) {
    if (segments.keys[i]) ttd_shm_segment_release(segments.values[i]);
  }
  ttd_handle_map_clear(&segments);
  /* Freed: what the session's account dropped by (its gradients, optimizer state and kept
   * activations included), not only the tensors it had handles to. */
  if (out_tensors) *out_tensors = tensors.count;
  if (out_bytes) *out_bytes = charged_before > charged_after ? charged_before - charged_after : 0;
  ttd_handle_map_clear(&tensors);
}
