/* Reading the state back at start. Every session is rebuilt off the table first; only when
 * the whole state has read back sound do they join it. A file that is missing, torn, of
 * another format or checksum, or not private sets the whole state aside. */
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/file_io.h"
#include "device/program_run.h"
#include "state/state_files.h"
#include "telemetry/log.h"
#include "wire/safetensors.h"


static ttd_status_t damaged(const char *file, const char *what) {
  return ttd_make_status(GRPC_STATUS_DATA_LOSS, "%s: %s", file, what);
}

/* The data file: opened, private, of the manifest's size, its header sound. */
typedef struct data_file {
  int fd;
  const char *name;
  ttd_st_header header;
  uint64_t read_upto; /* the file is read once, in order: the offset reached */
} data_file;

/* Reads len bytes at offset into dst: the tensors are read in the order ttd writes them,
 * so every byte of the file is read once, and a file laid out otherwise is refused. */
static ttd_status_t data_read(data_file *f, void *dst, uint64_t len, uint64_t offset) {
  if (offset != f->read_upto) return damaged(f->name, "its tensors are not laid out as ttd writes them");
  TTD_RETURN_IF_ERROR(ttd_read_all_at(f->fd, dst, len, offset));
  f->read_upto += len;
  return TTD_OK;
}

static ttd_status_t open_data(int dir_fd, const Ttd__V1__SavedFile *expected, data_file *f) {
  f->fd = openat(dir_fd, expected->name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (f->fd < 0) return damaged(expected->name, strerror(errno));
  TTD_RETURN_IF_ERROR(ttd_state_check_private(f->fd, expected->name));
  struct stat st;
  if (fstat(f->fd, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != expected->bytes) {
    return ttd_make_status(GRPC_STATUS_DATA_LOSS, "%s holds %lld bytes, the manifest says %" PRIu64
                           " (torn or truncated)", expected->name, (long long)st.st_size, expected->bytes);
  }
  ttd_status_t status = ttd_safetensors_read_header(f->fd, (uint64_t)st.st_size, &f->header);
  if (status) {
    ttd_status_t named = damaged(expected->name, ttd_status_message(status));
    ttd_status_free(status);
    return named;
  }
  f->read_upto = f->header.data_start;
  return TTD_OK;
}

/* One tensor: its spec checked against the file's entry, device memory made, bytes read in
 * through a bounce buffer, or, where the card's memory shows to the host, added to pieces
 * (n_pieces of them so far) to be read straight into it. */
static ttd_status_t load_tensor(ttd_core *core, ttd_session *session, data_file *f, const Ttd__V1__SavedTensor *m,
                                uint8_t **bounce, ttd_state_piece *pieces, size_t *n_pieces, ttd_tensor **out) {
  *out = NULL;
  ttd_tensor_spec spec = {.dtype = (ttd_dtype)m->dtype, .ndim = (int)m->n_shape, .device = (int)m->device,
                          .location = m->location == TTD__V1__MEMORY_LOCATION__MEMORY_LOCATION_L1 ? TTD_MEM_L1 : TTD_MEM_DRAM};
  if (m->n_shape > TTD_MAX_DIMS) return damaged(f->name, "a tensor has more dims than ttd allows");
  for (size_t d = 0; d < m->n_shape; d++) spec.shape[d] = m->shape[d];
  ttd_status_t status = ttd_tensor_spec_finish(&spec);
  if (status) {
    ttd_status_free(status);
    return damaged(f->name, "a tensor's dtype or shape is invalid");
  }
  const ttd_st_entry *e = m->name ? ttd_safetensors_find(&f->header, m->name) : NULL;
  bool same = e && e->dtype == spec.dtype && e->ndim == spec.ndim && e->end - e->begin == spec.nbytes;
  for (int d = 0; same && d < spec.ndim; d++) same = e->shape[d] == spec.shape[d];
  if (!same) return damaged(f->name, "a tensor of the session file has no matching entry in the data file");
  int devices = core->backend->vtable->device_count(core->backend);
  if (spec.device < 0 || spec.device >= devices) {
    return ttd_make_status(GRPC_STATUS_FAILED_PRECONDITION, "it holds a tensor on tt:%d and this ttd has %d card%s",
                           spec.device, devices, devices == 1 ? "" : "s");
  }
  ttd_tensor *t = NULL;
  TTD_RETURN_IF_ERROR(ttd_tensor_create(core->backend, session->quota, &spec, &t));
  uint64_t file_at = f->header.data_start + e->begin;
  ttd_backend *b = core->backend;
  void *mapped = spec.nbytes && b->vtable->buffer_host_map ? b->vtable->buffer_host_map(b, t->buffer, 0, spec.nbytes)
                                                             : NULL;
  if (mapped) { /* straight from the file into the card's memory, later */
    if (file_at != f->read_upto) status = damaged(f->name, "its tensors are not laid out as ttd writes them");
    f->read_upto += spec.nbytes;
    pieces[(*n_pieces)++] = (ttd_state_piece){.mem = mapped, .len = spec.nbytes, .file_offset = file_at};
  } else if (!*bounce && spec.nbytes && !(*bounce = malloc(BOUNCE_BYTES))) {
    status = ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "out of host memory");
  }
  for (uint64_t at = 0; !mapped && at < spec.nbytes && !status; at += BOUNCE_BYTES) {
    uint64_t len = spec.nbytes - at < BOUNCE_BYTES ? spec.nbytes - at : BOUNCE_BYTES;
    status = data_read(f, *bounce, len, file_at + at);
    if (!status) status = core->backend->vtable->buffer_write(core->backend, t->buffer, at, *bounce, len);
  }
  if (status) {
    ttd_tensor_release(t);
    return status;
  }
  *out = t;
  return TTD_OK;
}

/* The tensor of a saved index + 1 (0: none), or -1 when out of range. */
static int ref(uint32_t index, size_t count) { return index <= count ? (int)index - 1 : -2; }

/* Whether t is a tensor of want's dtype and shape on device: what a program's kernels take it
 * to be, which they read without a check of their own. */
static bool fits(const ttd_tensor *t, const ttd_value_type *want, int device) {
  if (t->spec.dtype != want->dtype || t->spec.ndim != want->shape.ndim || t->spec.device != device) return false;
  for (int d = 0; d < want->shape.ndim; d++) {
    if (t->spec.shape[d] != want->shape.d[d]) return false;
  }
  return true;
}

/* Whether t may be the .grad or an optimizer state of param: float32, its shape, its device. */
static bool fits_param(const ttd_tensor *t, const ttd_tensor *param) {
  ttd_value_type want = {.dtype = TTD_DTYPE_FLOAT32, .shape.ndim = param->spec.ndim};
  memcpy(want.shape.d, param->spec.shape, sizeof(want.shape.d));
  return fits(t, &want, param->spec.device);
}

static ttd_status_t load_run(ttd_core *core, ttd_session *session, const Ttd__V1__SavedRun *m, ttd_tensor **tensors,
                             size_t count, const char *file) {
  ttd_program *p = ttd_handle_map_get(&session->programs, m->program);
  if (!p || m->n_values != (size_t)p->n_values || m->n_operands != (size_t)(p->n_inputs + p->n_params) ||
      m->n_saved != 2 * (size_t)p->n_nodes ||
      m->device >= (uint32_t)core->backend->vtable->device_count(core->backend)) {
    return damaged(file, "a kept run does not fit its program");
  }
  ttd_run *run = calloc(1, sizeof(*run));
  if (run) {
    run->program = ttd_program_retain(p);
    run->quota = ttd_quota_retain(session->quota);
    run->values = calloc((size_t)p->n_values + 1, sizeof(*run->values));
    run->saved = calloc(2 * (size_t)p->n_nodes + 1, sizeof(*run->saved));
    run->operands = calloc(m->n_operands + 1, sizeof(*run->operands));
  }
  if (!run || !run->values || !run->saved || !run->operands) {
    ttd_run_free(run);
    return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "out of host memory");
  }
  run->device = (int)m->device;
  run->mode.eval = m->eval;
  run->mode.dropout_step = m->dropout_step;
  bool ok = true;
  struct { const uint32_t *from; ttd_tensor **to; size_t n; } slots[] = {
      {m->values, run->values, m->n_values}, {m->operands, run->operands, m->n_operands}, {m->saved, run->saved, m->n_saved}};
  bool fit = true;
  for (size_t k = 0; k < 3; k++) {
    for (size_t i = 0; i < slots[k].n; i++) {
      int at = ref(slots[k].from[i], count);
      ok = ok && at >= -1;
      if (at < 0) continue;
      /* values and operands (inputs, then parameters) are the program's values of their
       * index; a saved tensor is on the run's device */
      fit = fit && (k == 2 ? tensors[at]->spec.device == run->device : fits(tensors[at], &p->values[i].type, run->device));
      slots[k].to[i] = ttd_tensor_retain(tensors[at]);
    }
  }
  if (!fit) {
    ttd_run_free(run);
    return damaged(file, "a kept run's tensor is not of its program's dtype, shape or device");
  }
  if (!ok || ttd_handle_map_put(&session->runs, m->handle, run) != 0) {
    ttd_run_free(run);
    return damaged(file, "a kept run names a tensor or handle that is not in the file");
  }
  return TTD_OK;
}

/* Rebuilds the session of manifest entry e, off the table. */
static ttd_status_t load_session(ttd_state *state, int dir_fd, const Ttd__V1__SavedState__Session *e,
                                 ttd_session **out_session, uint64_t *out_bytes) {
  *out_session = NULL;
  ttd_core *core = state->core;
  if (!e->meta || !e->data || !e->meta->name || !e->data->name) return damaged(TTD_STATE_MANIFEST, "an entry lacks its files");
  char want[2][32];
  ttd_state_file_name(want[0], sizeof(want[0]), e->id, "session");
  ttd_state_file_name(want[1], sizeof(want[1]), e->id, "safetensors");
  if (strcmp(e->meta->name, want[0]) != 0 || strcmp(e->data->name, want[1]) != 0) {
    return damaged(TTD_STATE_MANIFEST, "an entry names files of another session");
  }
  uint8_t *bytes = NULL;
  size_t len = 0;
  TTD_RETURN_IF_ERROR(ttd_state_read_small(dir_fd, e->meta->name, e->meta, &bytes, &len));
  Ttd__V1__SavedSession *m = ttd__v1__saved_session__unpack(NULL, len, bytes);
  free(bytes);
  if (!m || m->id != e->id || m->resume_secret.len != TTD_RESUME_SECRET_BYTES || !m->tenant) {
    if (m) ttd__v1__saved_session__free_unpacked(m, NULL);
    return damaged(e->meta->name, "not a SavedSession of the session the manifest names");
  }
  ttd_status_t status = TTD_OK;
  uint64_t quota = 0;
  if (!ttd_auth_tenant_known(&core->auth, m->tenant)) {
    status = ttd_make_status(GRPC_STATUS_PERMISSION_DENIED, "its tenant '%s' is no longer in the tokens file", m->tenant);
  } else {
    status = ttd_auth_session_quota(&core->auth, m->tenant, m->quota_asked, &quota);
  }
  ttd_session *session = NULL;
  if (!status) {
    ttd_session_params params = {.client_name = m->client_name, .tenant = m->tenant, .peer = m->peer,
                                 .quota_asked = m->quota_asked, .quota = quota,
                                 .weight = ttd_auth_weight(&core->auth, m->tenant),
                                 .tenant_quota = ttd_auth_tenant_quota(&core->auth, m->tenant)};
    session = params.tenant_quota ? ttd_session_create(e->id, &params, ttd_now_ms()) : NULL;
    ttd_quota_release(params.tenant_quota);
    if (!session) status = ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "out of host memory");
  }
  data_file f = {.fd = -1, .name = e->data->name};
  ttd_tensor **tensors = NULL;
  if (!status) status = open_data(dir_fd, e->data, &f);
  if (!status && !(tensors = calloc(m->n_tensors + 1, sizeof(*tensors)))) {
    status = ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "out of host memory");
  }
  uint8_t *bounce = NULL;
  ttd_state_piece *pieces = status ? NULL : calloc(m->n_tensors + 1, sizeof(*pieces));
  size_t n_pieces = 0;
  if (!status && !pieces) status = ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "out of host memory");
  for (size_t i = 0; i < m->n_tensors && !status; i++) {
    status = load_tensor(core, session, &f, m->tensors[i], &bounce, pieces, &n_pieces, &tensors[i]);
  }
  if (!status) status = ttd_state_pieces_run(f.fd, pieces, n_pieces, false);
  free(pieces);
  free(bounce);
  if (!status && f.read_upto != e->data->bytes) status = damaged(f.name, "bytes follow the last tensor");
  /* Links between tensors, and the handles. */
  for (size_t i = 0; i < m->n_tensors && !status; i++) {
    const Ttd__V1__SavedTensor *st = m->tensors[i];
    ttd_tensor *t = tensors[i];
    int grad = ref(st->grad, m->n_tensors);
    int o0 = st->n_optimizer_state == 2 ? ref(st->optimizer_state[0], m->n_tensors) : -2;
    int o1 = st->n_optimizer_state == 2 ? ref(st->optimizer_state[1], m->n_tensors) : -2;
    if (grad < -1 || o0 < -1 || o1 < -1) {
      status = damaged(e->meta->name, "a tensor links to one that is not in the file");
      break;
    }
    if ((grad >= 0 && !fits_param(tensors[grad], t)) || (o0 >= 0 && !fits_param(tensors[o0], t)) ||
        (o1 >= 0 && !fits_param(tensors[o1], t))) {
      status = damaged(e->meta->name, "a tensor's .grad or optimizer state is not float32 of its shape on its device");
      break;
    }
    t->grad = grad >= 0 ? ttd_tensor_retain(tensors[grad]) : NULL;
    t->opt_state[0] = o0 >= 0 ? ttd_tensor_retain(tensors[o0]) : NULL;
    t->opt_state[1] = o1 >= 0 ? ttd_tensor_retain(tensors[o1]) : NULL;
    t->opt_step = st->optimizer_step;
    if (grad >= 0 && m->tensors[grad]->n_handles) t->grad_handle = m->tensors[grad]->handles[0];
    for (size_t k = 0; k < st->n_handles && !status; k++) {
      if (ttd_handle_map_put(&session->tensors, st->handles[k], t) != 0) {
        status = damaged(e->meta->name, "a handle is 0 or given twice");
      } else {
        ttd_tensor_retain(t);
        session->tensor_bytes += t->spec.nbytes;
      }
    }
  }
  for (size_t i = 0; i < m->n_programs && !status; i++) {
    const Ttd__V1__SavedProgram *sp = m->programs[i];
    Ttd__V1__Graph *graph = ttd__v1__graph__unpack(NULL, sp->graph.len, sp->graph.data);
    ttd_program *p = NULL;
    bool cached;
    if (!graph) {
      status = damaged(e->meta->name, "a program's graph does not decode");
    } else {
      status = ttd_program_cache_get(&core->programs, m->tenant, graph, &p, &cached);
      ttd__v1__graph__free_unpacked(graph, NULL);
    }
    if (!status && (status = ttd_session_program_charge(session, p))) {
      ttd_program_release(p);
    } else if (!status && ttd_handle_map_put(&session->programs, sp->handle, p) != 0) {
      ttd_program_release(p); /* its charge goes back with the session */
      status = damaged(e->meta->name, "a program handle is 0 or given twice");
    }
  }
  for (size_t i = 0; i < m->n_runs && !status; i++) {
    status = load_run(core, session, m->runs[i], tensors, m->n_tensors, e->meta->name);
  }
  for (size_t i = 0; tensors && i < m->n_tensors; i++) ttd_tensor_release(tensors[i]);
  free(tensors);
  if (f.fd >= 0) close(f.fd);
  ttd_safetensors_header_clear(&f.header);
  if (!status) {
    memcpy(session->resume_secret, m->resume_secret.data, TTD_RESUME_SECRET_BYTES);
    atomic_store(&session->awaiting_resume, true);
    atomic_store(&session->on_disk, TTD_ON_DISK_STATE);
    *out_bytes = atomic_load(&session->quota->used);
    *out_session = session;
  } else if (session) {
    ttd_session_close(session, NULL, NULL);
    ttd_session_release(session);
  }
  ttd__v1__saved_session__free_unpacked(m, NULL);
  return status;
}

/* Whether status condemns the whole state (the files), rather than one session (policy). */
static bool condemns_state(ttd_status_t status) {
  ttd_code code = ttd_status_code(status);
  return code == GRPC_STATUS_DATA_LOSS || code == GRPC_STATUS_NOT_FOUND || code == GRPC_STATUS_INTERNAL;
}

/* Reads DIR/state; *out_reason set when the state is refused (all of it). */
static ttd_status_t load_all(ttd_state *state, size_t *out_loaded, uint64_t *out_bytes) {
  int dir_fd = openat(state->dir_fd, TTD_STATE_CURRENT, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
  if (dir_fd < 0) return damaged(TTD_STATE_CURRENT, strerror(errno));
  ttd_status_t status = ttd_state_check_private(dir_fd, TTD_STATE_CURRENT);
  uint8_t *bytes = NULL;
  size_t len = 0;
  if (!status) {
    status = ttd_state_read_small(dir_fd, TTD_STATE_MANIFEST, NULL, &bytes, &len);
    if (status && ttd_status_code(status) == GRPC_STATUS_NOT_FOUND) {
      ttd_status_free(status);
      status = damaged(TTD_STATE_MANIFEST, "missing: the save that wrote this state did not finish");
    }
  }
  Ttd__V1__SavedState *manifest = status ? NULL : ttd__v1__saved_state__unpack(NULL, len, bytes);
  free(bytes);
  if (!status && !manifest) status = damaged(TTD_STATE_MANIFEST, "not a SavedState message");
  if (!status && manifest->format != TTD_STATE_FORMAT) {
    status = ttd_make_status(GRPC_STATUS_FAILED_PRECONDITION, "%s: state format %u (written by ttd %s); this ttd %s "
                             "reads format %d", TTD_STATE_MANIFEST, manifest->format,
                             manifest->daemon_version ? manifest->daemon_version : "?", TTD_VERSION, TTD_STATE_FORMAT);
  }
  ttd_session **loaded = status ? NULL : calloc(manifest->n_sessions + 1, sizeof(*loaded));
  if (!status && !loaded) status = ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "out of host memory");
  size_t n = 0;
  *out_bytes = 0;
  for (size_t i = 0; !status && i < manifest->n_sessions; i++) {
    const Ttd__V1__SavedState__Session *e = manifest->sessions[i];
    char name[32];
    ttd_state_file_name(name, sizeof(name), e->id, "session");
    struct stat st;
    if (fstatat(dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0 && errno == ENOENT) {
      continue; /* resumed or ended after an earlier start: its files went then (a data file
                 * may be left behind; the next save drops it) */
    }
    uint64_t bytes_of = 0;
    ttd_status_t one = load_session(state, dir_fd, e, &loaded[n], &bytes_of);
    if (!one) {
      *out_bytes += bytes_of;
      n++;
    } else if (condemns_state(one)) {
      status = one;
    } else {
      TTD_LOG(TTD_LOG_WARN, "event=state-session-skipped session=%016" PRIx64 " message=\"%s\"", e->id,
              ttd_status_message(one));
      ttd_status_free(one);
    }
  }
  for (size_t i = 0; i < n; i++) {
    if (!status) {
      ttd_status_t in = ttd_session_table_insert(&state->core->sessions, loaded[i]);
      if (in) {
        TTD_LOG(TTD_LOG_WARN, "event=state-session-skipped session=%016" PRIx64 " message=\"%s\"", loaded[i]->id,
                ttd_status_message(in));
        ttd_status_free(in);
      } else {
        (*out_loaded)++;
      }
    }
    if (status) ttd_session_close(loaded[i], NULL, NULL);
    ttd_session_release(loaded[i]);
  }
  free(loaded);
  if (manifest) ttd__v1__saved_state__free_unpacked(manifest, NULL);
  close(dir_fd);
  return status;
}

/* Unlinks a data file: off the caller's thread, since dropping a big file's pages takes
 * hundreds of ms and the caller may be a resume waiting for its answer. Takes dir_fd. */
typedef struct doomed_file {
  int dir_fd;
  char name[32];
} doomed_file;

static void *unlink_main(void *arg) {
  doomed_file *d = arg;
  unlinkat(d->dir_fd, d->name, 0);
  close(d->dir_fd);
  free(d);
  return NULL;
}

static void unlink_in_background(int dir_fd, const char *name) {
  doomed_file *d = malloc(sizeof(*d));
  pthread_t thread;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  if (d) {
    d->dir_fd = dir_fd;
    snprintf(d->name, sizeof(d->name), "%s", name);
  }
  if (!d || pthread_create(&thread, &attr, unlink_main, d) != 0) {
    unlinkat(dir_fd, name, 0);
    close(dir_fd);
    free(d);
  }
  pthread_attr_destroy(&attr);
}

/* A resumed or ended session's state files go: its session file first, synced (a data file
 * left without one means exactly this), then its data file, which a resumed session keeps
 * in DIR/spare/ for its next save to write over; an ended session's spare goes too. The
 * session file goes outside the lock (a second unlink of it is harmless), so that resumes
 * after a restart sync the folder side by side. */
static void forget(void *ctx, ttd_session *session, bool resumed) {
  ttd_state *state = ctx;
  char data[32], meta[32];
  ttd_state_file_name(data, sizeof(data), session->id, "safetensors");
  ttd_state_file_name(meta, sizeof(meta), session->id, "session");
  int dir_fd = -1;
  if (atomic_load(&session->on_disk) == TTD_ON_DISK_STATE) {
    dir_fd = openat(state->dir_fd, TTD_STATE_CURRENT, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (dir_fd >= 0) {
      unlinkat(dir_fd, meta, 0);
      fsync(dir_fd);
    }
  }
  pthread_mutex_lock(&state->files_lock);
  int was = atomic_load(&session->on_disk);
  int now = !resumed ? TTD_ON_DISK_NONE : was == TTD_ON_DISK_STATE ? TTD_ON_DISK_SPARE : was;
  int doomed_in = -1; /* the folder whose data file goes, or -1 */
  if (was == TTD_ON_DISK_STATE && now != was) {
    if (dir_fd < 0 || (now == TTD_ON_DISK_SPARE && renameat(dir_fd, data, state->spare_fd, data) != 0)) {
      now = TTD_ON_DISK_NONE; /* no spare: the file goes */
    }
    if (now == TTD_ON_DISK_NONE) {
      doomed_in = dir_fd;
      dir_fd = -1;
    }
  } else if (was == TTD_ON_DISK_SPARE && now != was) {
    doomed_in = fcntl(state->spare_fd, F_DUPFD_CLOEXEC, 0);
    if (doomed_in < 0) unlinkat(state->spare_fd, data, 0); /* no descriptor to spare: here and now */
  }
  atomic_store(&session->on_disk, now);
  pthread_mutex_unlock(&state->files_lock);
  if (dir_fd >= 0) close(dir_fd);
  if (doomed_in >= 0) unlink_in_background(doomed_in, data);
}

ttd_status_t ttd_state_open(ttd_core *core, const char *dir, ttd_state **out_state) {
  *out_state = NULL;
  if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
    return ttd_make_status(GRPC_STATUS_FAILED_PRECONDITION, "--state-dir %s: cannot create it: %s", dir, strerror(errno));
  }
  int dir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) {
    return ttd_make_status(GRPC_STATUS_FAILED_PRECONDITION, "--state-dir %s: cannot open it as a folder: %s", dir,
                           strerror(errno));
  }
  ttd_status_t status = ttd_state_check_private(dir_fd, dir);
  if (status) {
    close(dir_fd);
    ttd_status_t named = ttd_make_status(GRPC_STATUS_FAILED_PRECONDITION, "--state-dir: %s (chown it to ttd's user and "
                                         "chmod 700)", ttd_status_message(status));
    ttd_status_free(status);
    return named;
  }
  /* Two daemons on one state folder would each save over the other's sessions. */
  int lock_fd = openat(dir_fd, TTD_STATE_LOCK, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (lock_fd < 0 || flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    int err = errno;
    if (lock_fd >= 0) close(lock_fd);
    close(dir_fd);
    return ttd_make_status(GRPC_STATUS_FAILED_PRECONDITION, "--state-dir %s: %s", dir,
                           err == EWOULDBLOCK ? "another ttd uses this state folder; give each ttd its own"
                                              : strerror(err));
  }
  ttd_state *state = calloc(1, sizeof(*state));
  char *copy = strdup(dir);
  if (!state || !copy) {
    free(state);
    free(copy);
    close(lock_fd);
    close(dir_fd);
    return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "out of host memory");
  }
  state->lock_fd = lock_fd;
  state->core = core;
  state->dir = copy;
  state->dir_fd = dir_fd;
  pthread_mutex_init(&state->files_lock, NULL);
  ttd_state_remove_tree(dir_fd, TTD_STATE_NEXT); /* a save that did not finish; the state before it stands */
  /* Spares of the last run's sessions are theirs alone: none of this run's sessions owns one yet. */
  ttd_state_remove_tree(dir_fd, TTD_STATE_SPARE);
  state->spare_fd = mkdirat(dir_fd, TTD_STATE_SPARE, 0700) == 0
                       ? openat(dir_fd, TTD_STATE_SPARE, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW)
                       : -1;
  if (state->spare_fd < 0) {
    TTD_LOG(TTD_LOG_WARN, "event=state-spare-unavailable dir=%s/%s message=\"%s\" action=\"saves write new files; "
            "remove what is at that path\"", dir, TTD_STATE_SPARE, strerror(errno));
  }
  core->sessions.forget_ctx = state;
  core->sessions.forget = forget;
  struct stat st;
  if (fstatat(dir_fd, TTD_STATE_CURRENT, &st, AT_SYMLINK_NOFOLLOW) == 0) {
    int64_t started = ttd_now_ms();
    size_t loaded = 0;
    uint64_t bytes = 0;
    status = load_all(state, &loaded, &bytes);
    if (status) {
      char aside[64];
      snprintf(aside, sizeof(aside), "refused-%lld", (long long)time(NULL));
      int moved = renameat(dir_fd, TTD_STATE_CURRENT, dir_fd, aside);
      TTD_LOG(TTD_LOG_ERROR, "event=state-refused dir=%s moved_to=%s/%s message=\"%s\" action=\"nothing is resumed; "
              "inspect or remove the folder\"", dir, dir, moved == 0 ? aside : TTD_STATE_CURRENT,
              ttd_status_message(status));
      ttd_status_free(status);
    } else {
      TTD_LOG(TTD_LOG_INFO, "event=state-loaded dir=%s sessions=%zu bytes=%" PRIu64 " ms=%lld", dir, loaded, bytes,
              (long long)(ttd_now_ms() - started));
    }
  }
  *out_state = state;
  return TTD_OK;
}

void ttd_state_close(ttd_state *state) {
  if (!state) return;
  if (state->core->sessions.forget_ctx == state) {
    state->core->sessions.forget = NULL;
    state->core->sessions.forget_ctx = NULL;
  }
  if (state->spare_fd >= 0) close(state->spare_fd);
  /* After a save every spare is in the state; any left (a failed save) holds bytes of a
   * session that is ending now. */
  ttd_state_remove_tree(state->dir_fd, TTD_STATE_SPARE);
  pthread_mutex_destroy(&state->files_lock);
  close(state->dir_fd);
  close(state->lock_fd); /* the lock goes with it */
  free(state->dir);
  free(state);
}
