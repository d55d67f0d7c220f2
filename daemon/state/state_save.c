/* Writing the state at a stop: each session's tensors (every one it can reach: by handle,
 * as a parameter's .grad or optimizer state, or through a kept run, each once) into a
 * safetensors file, the rest into a SavedSession, then the manifest, then one rename. */
#define _GNU_SOURCE /* renameat2 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "device/program_run.h"
#include "state/state_files.h"
#include "telemetry/log.h"
#include "wire/safetensors.h"


/* A session's tensors in the order they are saved, each once. */
typedef struct collected {
  ttd_tensor **tensors;
  size_t count, cap;
  ttd_handle_map index; /* tensor address -> its index + 1 */
} collected;

/* index + 1 of t, adding it; 0 for NULL, or when out of memory (*oom set). */
static uint32_t collect(collected *c, ttd_tensor *t, bool *oom) {
  if (!t) return 0;
  uint64_t key = (uint64_t)(uintptr_t)t;
  void *found = ttd_handle_map_get(&c->index, key);
  if (found) return (uint32_t)(uintptr_t)found;
  if (c->count == c->cap) {
    size_t cap = c->cap ? 2 * c->cap : 64;
    ttd_tensor **grown = realloc(c->tensors, cap * sizeof(*grown));
    if (!grown) {
      *oom = true;
      return 0;
    }
    c->tensors = grown;
    c->cap = cap;
  }
  if (ttd_handle_map_put(&c->index, key, (void *)(uintptr_t)(c->count + 1)) != 0) {
    *oom = true;
    return 0;
  }
  c->tensors[c->count++] = t;
  return (uint32_t)c->count;
}

/* Everything a SavedSession points into, freed together. */
typedef struct saved_session {
  Ttd__V1__SavedSession msg;
  Ttd__V1__SavedTensor *tensors, **tensor_ptrs;
  Ttd__V1__SavedProgram *programs, **program_ptrs;
  Ttd__V1__SavedRun *runs, **run_ptrs;
  uint32_t *indices; /* grads, optimizer state, run slots: carved per entry */
  uint64_t *handles;
  char (*names)[24];
  collected c;
} saved_session;

static void saved_session_free(saved_session *s) {
  free(s->tensors);
  free(s->tensor_ptrs);
  free(s->programs);
  free(s->program_ptrs);
  free(s->runs);
  free(s->run_ptrs);
  free(s->indices);
  free(s->handles);
  free(s->names);
  free(s->c.tensors);
  ttd_handle_map_clear(&s->c.index);
}

static ttd_status_t oom(void) {
  return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory while saving state");
}

/* Fills s from session (its lock held: nothing changes meanwhile). */
static ttd_status_t describe(ttd_session *session, saved_session *s) {
  collected *c = &s->c;
  bool out_of_memory = false;
  const ttd_handle_map *tensors = &session->tensors, *runs = &session->runs, *programs = &session->programs;
  for (size_t i = 0; i < tensors->capacity; i++) {
    if (tensors->keys[i]) collect(c, tensors->values[i], &out_of_memory);
  }
  for (size_t i = 0; i < runs->capacity; i++) {
    if (!runs->keys[i]) continue;
    const ttd_run *run = runs->values[i];
    const ttd_program *p = run->program;
    for (int v = 0; v < p->n_values; v++) collect(c, run->values[v], &out_of_memory);
    for (int v = 0; v < p->n_inputs + p->n_params; v++) collect(c, run->operands[v], &out_of_memory);
    for (int v = 0; v < 2 * p->n_nodes; v++) collect(c, run->saved[v], &out_of_memory);
  }
  /* A parameter's gradient and optimizer state, found as the list grows. */
  for (size_t i = 0; i < c->count && !out_of_memory; i++) {
    ttd_tensor *t = c->tensors[i];
    pthread_mutex_lock(&t->train_lock);
    collect(c, t->grad, &out_of_memory);
    collect(c, t->opt_state[0], &out_of_memory);
    collect(c, t->opt_state[1], &out_of_memory);
    pthread_mutex_unlock(&t->train_lock);
  }
  if (out_of_memory) return oom();

  size_t run_slots = 0;
  for (size_t i = 0; i < runs->capacity; i++) {
    if (!runs->keys[i]) continue;
    const ttd_program *p = ((const ttd_run *)runs->values[i])->program;
    run_slots += (size_t)p->n_values + (size_t)p->n_inputs + (size_t)p->n_params + 2 * (size_t)p->n_nodes;
  }
  s->tensors = calloc(c->count + 1, sizeof(*s->tensors));
  s->tensor_ptrs = calloc(c->count + 1, sizeof(*s->tensor_ptrs));
  s->names = calloc(c->count + 1, sizeof(*s->names));
  s->indices = calloc(3 * c->count + run_slots + 1, sizeof(*s->indices));
  s->handles = calloc(tensors->count + 1, sizeof(*s->handles));
  s->programs = calloc(programs->count + 1, sizeof(*s->programs));
  s->program_ptrs = calloc(programs->count + 1, sizeof(*s->program_ptrs));
  s->runs = calloc(runs->count + 1, sizeof(*s->runs));
  s->run_ptrs = calloc(runs->count + 1, sizeof(*s->run_ptrs));
  if (!s->tensors || !s->tensor_ptrs || !s->names || !s->indices || !s->handles || !s->programs || !s->program_ptrs ||
      !s->runs || !s->run_ptrs) {
    return oom();
  }
  uint32_t *slot = s->indices;
  for (size_t i = 0; i < c->count; i++) {
    ttd_tensor *t = c->tensors[i];
    Ttd__V1__SavedTensor *m = &s->tensors[i];
    ttd__v1__saved_tensor__init(m);
    snprintf(s->names[i], sizeof(s->names[i]), "t%zu", i);
    m->name = s->names[i];
    m->dtype = (Ttd__V1__DType)t->spec.dtype;
    m->n_shape = (size_t)t->spec.ndim;
    m->shape = (int64_t *)t->spec.shape;
    m->device = (uint32_t)t->spec.device;
    m->location = (Ttd__V1__MemoryLocation)t->spec.location;
    pthread_mutex_lock(&t->train_lock);
    m->grad = collect(c, t->grad, &out_of_memory);
    m->optimizer_state = slot;
    m->n_optimizer_state = 2;
    slot[0] = collect(c, t->opt_state[0], &out_of_memory);
    slot[1] = collect(c, t->opt_state[1], &out_of_memory);
    slot += 2;
    m->optimizer_step = t->opt_step;
    pthread_mutex_unlock(&t->train_lock);
    s->tensor_ptrs[i] = m;
  }
  /* Handles, grouped per tensor: counted first, then placed. */
  uint32_t *per_tensor = calloc(c->count + 1, sizeof(*per_tensor));
  if (!per_tensor) return oom();
  for (size_t i = 0; i < tensors->capacity; i++) {
    if (tensors->keys[i]) per_tensor[collect(c, tensors->values[i], &out_of_memory) - 1]++;
  }
  uint64_t *h = s->handles;
  for (size_t i = 0; i < c->count; i++) {
    s->tensors[i].handles = h;
    h += per_tensor[i];
  }
  free(per_tensor);
  for (size_t i = 0; i < tensors->capacity; i++) {
    if (!tensors->keys[i]) continue;
    Ttd__V1__SavedTensor *m = &s->tensors[collect(c, tensors->values[i], &out_of_memory) - 1];
    m->handles[m->n_handles++] = tensors->keys[i];
  }
  size_t np = 0;
  for (size_t i = 0; i < programs->capacity; i++) {
    if (!programs->keys[i]) continue;
    const ttd_program *p = programs->values[i];
    Ttd__V1__SavedProgram *m = &s->programs[np];
    ttd__v1__saved_program__init(m);
    m->handle = programs->keys[i];
    m->graph.data = (uint8_t *)ttd_program_cache_graph(p, &m->graph.len);
    s->program_ptrs[np++] = m;
  }
  size_t nr = 0;
  for (size_t i = 0; i < runs->capacity; i++) {
    if (!runs->keys[i]) continue;
    const ttd_run *run = runs->values[i];
    const ttd_program *p = run->program;
    Ttd__V1__SavedRun *m = &s->runs[nr];
    ttd__v1__saved_run__init(m);
    m->handle = runs->keys[i];
    for (size_t k = 0; k < programs->capacity && !m->program; k++) {
      if (programs->keys[k] && programs->values[k] == p) m->program = programs->keys[k];
    }
    if (!m->program) {
      return ttd_make_status(GRPC_STATUS_INTERNAL, "run %016" PRIx64 " of session %016" PRIx64
                             " holds a program the session has no handle for", m->handle, session->id);
    }
    m->device = (uint32_t)run->device;
    m->eval = run->mode.eval;
    m->dropout_step = run->mode.dropout_step;
    m->values = slot;
    m->n_values = (size_t)p->n_values;
    for (int v = 0; v < p->n_values; v++) *slot++ = collect(c, run->values[v], &out_of_memory);
    m->operands = slot;
    m->n_operands = (size_t)(p->n_inputs + p->n_params);
    for (int v = 0; v < p->n_inputs + p->n_params; v++) *slot++ = collect(c, run->operands[v], &out_of_memory);
    m->saved = slot;
    m->n_saved = 2 * (size_t)p->n_nodes;
    for (int v = 0; v < 2 * p->n_nodes; v++) *slot++ = collect(c, run->saved[v], &out_of_memory);
    s->run_ptrs[nr++] = m;
  }
  if (out_of_memory) return oom();
  Ttd__V1__SavedSession *msg = &s->msg;
  ttd__v1__saved_session__init(msg);
  msg->id = session->id;
  msg->resume_secret.data = session->resume_secret;
  msg->resume_secret.len = TTD_RESUME_SECRET_BYTES;
  msg->tenant = session->tenant;
  msg->client_name = session->client_name;
  msg->peer = session->peer;
  msg->quota_asked = session->quota_asked;
  msg->n_tensors = c->count;
  msg->tensors = s->tensor_ptrs;
  msg->n_programs = np;
  msg->programs = s->program_ptrs;
  msg->n_runs = nr;
  msg->runs = s->run_ptrs;
  return TTD_OK;
}

/* The session's tensors' bytes as a safetensors file, straight from the card's memory where
 * the backend shows it to the host; written over the file of that name in spare_fd where
 * there is one (spare_fd -1: none). */
static ttd_status_t write_data(int dir_fd, int spare_fd, const char *name, ttd_backend *backend, const collected *c,
                               Ttd__V1__SavedFile *file) {
  ttd_st_entry *entries = calloc(c->count + 1, sizeof(*entries));
  char (*names)[24] = calloc(c->count + 1, sizeof(*names));
  if (!entries || !names) {
    free(entries);
    free(names);
    return oom();
  }
  for (size_t i = 0; i < c->count; i++) {
    const ttd_tensor_spec *spec = &c->tensors[i]->spec;
    snprintf(names[i], sizeof(names[i]), "t%zu", i);
    entries[i].name = names[i];
    entries[i].dtype = spec->dtype;
    entries[i].dtype_name = ttd_safetensors_dtype_name(spec->dtype);
    entries[i].ndim = spec->ndim;
    memcpy(entries[i].shape, spec->shape, sizeof(int64_t) * (size_t)spec->ndim);
  }
  char *header = NULL;
  size_t header_len = 0;
  ttd_status_t status = ttd_safetensors_build_header(entries, (int)c->count, NULL, 0, &header, &header_len);
  free(entries);
  ttd_state_writer w = {.fd = -1};
  if (!status) {
    status = spare_fd >= 0 ? ttd_state_writer_open_over(&w, spare_fd, dir_fd, name)
                           : ttd_state_writer_open(&w, dir_fd, name, false);
  }
  if (!status) status = ttd_state_writer_put(&w, header, header_len);
  free(header);
  /* Where the card's memory shows to the host, the tensors go from it to the file over a few
   * threads; otherwise one by one through a bounce buffer. */
  ttd_state_piece *pieces = calloc(c->count + 1, sizeof(*pieces));
  ttd_host_pin **pins = calloc(c->count + 1, sizeof(*pins));
  size_t n_pieces = 0;
  uint64_t offset = header_len;
  if (!status && (!pieces || !pins)) status = oom();
  uint8_t *bounce = NULL;
  for (size_t i = 0; i < c->count && !status; i++) {
    ttd_tensor *t = c->tensors[i];
    uint64_t n = t->spec.nbytes;
    const void *view = n && backend->vtable->buffer_host_view
                           ? backend->vtable->buffer_host_view(backend, t->buffer, 0, n, &pins[n_pieces])
                           : NULL;
    if (view) {
      pieces[n_pieces++] = (ttd_state_piece){.mem = (void *)view, .len = n, .file_offset = offset};
    } else if (n && !bounce && !(bounce = malloc(BOUNCE_BYTES))) {
      status = oom();
    }
    for (uint64_t at = 0; !view && at < n && !status; at += BOUNCE_BYTES) {
      uint64_t len = n - at < BOUNCE_BYTES ? n - at : BOUNCE_BYTES;
      status = backend->vtable->buffer_read(backend, t->buffer, at, bounce, len);
      ttd_state_piece part = {.mem = bounce, .len = len, .file_offset = offset + at};
      if (!status) status = ttd_state_pieces_run(w.fd, &part, 1, true);
    }
    offset += n;
  }
  if (!status) status = ttd_state_pieces_run(w.fd, pieces, n_pieces, true);
  for (size_t i = 0; i < n_pieces; i++) pins[i]->release(pins[i]);
  free(pieces);
  free(pins);
  w.bytes = offset;
  free(bounce);
  free(names);
  if (w.fd >= 0) {
    ttd_status_t finished = ttd_state_writer_finish(&w, file);
    if (!status) status = finished;
    else ttd_status_free(finished);
  }
  return status;
}

/* Both files of one session, into the folder dir_fd; entry says where they went. */
static ttd_status_t save_session(ttd_state *state, int dir_fd, ttd_session *session, Ttd__V1__SavedState__Session *entry,
                                 char (*file_names)[32], uint64_t *out_bytes) {
  saved_session s = {0};
  pthread_mutex_lock(&session->lock);
  ttd_status_t status = session->closed ? TTD_OK : describe(session, &s);
  bool closed = session->closed;
  pthread_mutex_unlock(&session->lock);
  if (!status && !closed) {
    /* No call runs during the stop: the tensors described are the tensors written. */
    ttd_state_file_name(file_names[0], sizeof(file_names[0]), session->id, "session");
    ttd_state_file_name(file_names[1], sizeof(file_names[1]), session->id, "safetensors");
    /* A resumed session's data file from the last restart takes the new bytes in place. */
    int was = TTD_ON_DISK_SPARE;
    pthread_mutex_lock(&state->files_lock);
    bool spare = atomic_compare_exchange_strong(&session->on_disk, &was, TTD_ON_DISK_NONE);
    pthread_mutex_unlock(&state->files_lock);
    status = write_data(dir_fd, spare ? state->spare_fd : -1, file_names[1], state->core->backend, &s.c, entry->data);
    if (!status) status = ttd_state_write_message(dir_fd, file_names[0], &s.msg.base, entry->meta);
    entry->id = session->id;
    for (size_t i = 0; i < s.c.count; i++) *out_bytes += s.c.tensors[i]->spec.nbytes;
  }
  saved_session_free(&s);
  return closed ? ttd_make_status(GRPC_STATUS_CANCELLED, "closed") : status;
}

ttd_status_t ttd_state_save(ttd_state *state) {
  int64_t started = ttd_now_ms();
  ttd_session **sessions = NULL;
  size_t count = 0;
  TTD_RETURN_IF_ERROR(ttd_session_table_snapshot(&state->core->sessions, &sessions, &count));
  ttd_state_remove_tree(state->dir_fd, TTD_STATE_NEXT); /* a save that died before */
  ttd_status_t status = TTD_OK;
  int next_fd = -1;
  if (mkdirat(state->dir_fd, TTD_STATE_NEXT, 0700) != 0 ||
      (next_fd = openat(state->dir_fd, TTD_STATE_NEXT, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW)) < 0) {
    status = ttd_make_status(GRPC_STATUS_INTERNAL, "cannot create %s/%s: %s", state->dir, TTD_STATE_NEXT,
                             strerror(errno));
  }
  Ttd__V1__SavedState manifest = TTD__V1__SAVED_STATE__INIT;
  Ttd__V1__SavedState__Session *entries = calloc(count + 1, sizeof(*entries));
  Ttd__V1__SavedState__Session **entry_ptrs = calloc(count + 1, sizeof(*entry_ptrs));
  Ttd__V1__SavedFile *files = calloc(2 * count + 1, sizeof(*files));
  char (*file_names)[32] = calloc(2 * count + 1, sizeof(*file_names));
  if (!status && (!entries || !entry_ptrs || !files || !file_names)) status = oom();
  uint64_t bytes = 0;
  size_t saved = 0;
  for (size_t i = 0; i < count && !status; i++) {
    Ttd__V1__SavedState__Session *e = &entries[saved];
    ttd__v1__saved_state__session__init(e);
    e->meta = &files[2 * saved];
    e->data = &files[2 * saved + 1];
    ttd__v1__saved_file__init(e->meta);
    ttd__v1__saved_file__init(e->data);
    status = save_session(state, next_fd, sessions[i], e, &file_names[2 * saved], &bytes);
    if (status && ttd_status_code(status) == GRPC_STATUS_CANCELLED) { /* closed meanwhile: nothing to keep */
      ttd_status_free(status);
      status = TTD_OK;
      continue;
    }
    entry_ptrs[saved++] = e;
  }
  if (!status) {
    manifest.format = TTD_STATE_FORMAT;
    manifest.daemon_version = TTD_VERSION;
    manifest.instance_id = state->core->instance_id;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    manifest.saved_unix_ms = (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000;
    manifest.n_sessions = saved;
    manifest.sessions = entry_ptrs;
    status = ttd_state_write_message(next_fd, TTD_STATE_MANIFEST, &manifest.base, NULL);
  }
  if (!status && fsync(next_fd) != 0) {
    status = ttd_make_status(GRPC_STATUS_INTERNAL, "cannot sync %s/%s: %s", state->dir, TTD_STATE_NEXT, strerror(errno));
  }
  /* The switch: state.new becomes state in one step (the old state, swapped out, goes). */
  if (!status) {
    int rc = renameat2(state->dir_fd, TTD_STATE_NEXT, state->dir_fd, TTD_STATE_CURRENT, RENAME_EXCHANGE);
    if (rc != 0 && errno == ENOENT) rc = renameat(state->dir_fd, TTD_STATE_NEXT, state->dir_fd, TTD_STATE_CURRENT);
    if (rc != 0 || fsync(state->dir_fd) != 0) {
      status = ttd_make_status(GRPC_STATUS_INTERNAL, "cannot put the new state in place in %s: %s", state->dir,
                               strerror(errno));
    }
  }
  ttd_state_remove_tree(state->dir_fd, TTD_STATE_NEXT); /* the old state, or a failed new one */
  if (next_fd >= 0) close(next_fd);
  free(entries);
  free(entry_ptrs);
  free(files);
  free(file_names);
  ttd_session_table_snapshot_free(sessions, count);
  if (status) {
    TTD_LOG(TTD_LOG_ERROR, "event=state-save-failed dir=%s message=\"%s\"", state->dir, ttd_status_message(status));
    return status;
  }
  TTD_LOG(TTD_LOG_INFO, "event=state-saved dir=%s sessions=%zu bytes=%" PRIu64 " ms=%lld", state->dir, saved, bytes,
          (long long)(ttd_now_ms() - started));
  return TTD_OK;
}
