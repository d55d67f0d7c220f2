#define _GNU_SOURCE /* sync_file_range */
#include "state/state_files.h"

#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "base/file_io.h"
#include "thread_pool.h"

void ttd_state_file_name(char *buf, size_t size, uint64_t session_id, const char *suffix) {
  snprintf(buf, size, "%016" PRIx64 ".%s", session_id, suffix);
}

static ttd_status_t io_error(const char *what, const char *name, int err) {
  return ttd_make_status(GRPC_STATUS_INTERNAL, "state file %s: cannot %s: %s", name, what, strerror(err));
}

ttd_status_t ttd_state_writer_open(ttd_state_writer *w, int dir_fd, const char *name, bool checksum) {
  *w = (ttd_state_writer){.name = name, .crc = (uint32_t)crc32_z(0, NULL, 0), .checksum = checksum};
  w->fd = openat(dir_fd, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  return w->fd < 0 ? io_error("create", name, errno) : TTD_OK;
}

ttd_status_t ttd_state_writer_open_over(ttd_state_writer *w, int from_fd, int dir_fd, const char *name) {
  if (renameat(from_fd, name, dir_fd, name) == 0) {
    *w = (ttd_state_writer){.name = name, .crc = (uint32_t)crc32_z(0, NULL, 0)};
    w->fd = openat(dir_fd, name, O_WRONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    struct stat st;
    ttd_status_t private = w->fd < 0 ? NULL : ttd_state_check_private(w->fd, name);
    if (w->fd >= 0 && !private && fstat(w->fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink == 1) return TTD_OK;
    ttd_status_free(private);
    if (w->fd >= 0) close(w->fd);
    unlinkat(dir_fd, name, 0); /* not one ttd wrote: a new file instead */
  }
  return ttd_state_writer_open(w, dir_fd, name, false);
}

/* Bytes written between two starts of their writeback (ttd_state_pieces_run). */
#define WRITEBACK_STEP ((uint64_t)64 << 20)

ttd_status_t ttd_state_writer_put(ttd_state_writer *w, const void *data, uint64_t len) {
  TTD_RETURN_IF_ERROR(ttd_write_all(w->fd, data, len));
  if (w->checksum) w->crc = (uint32_t)crc32_z(w->crc, data, (z_size_t)len);
  w->bytes += len;
  return TTD_OK;
}

ttd_status_t ttd_state_writer_finish(ttd_state_writer *w, Ttd__V1__SavedFile *file) {
  const char *what = "cut to size"; /* a file written over may have been longer */
  int rc = ftruncate(w->fd, (off_t)w->bytes);
  if (rc == 0) {
    what = "sync";
    rc = fsync(w->fd);
  }
  int err = errno;
  if (close(w->fd) != 0 && rc == 0) {
    rc = -1;
    err = errno;
  }
  w->fd = -1;
  if (rc != 0) return io_error(what, w->name, err);
  if (file) {
    file->name = (char *)w->name;
    file->bytes = w->bytes;
    file->crc32 = w->crc;
  }
  return TTD_OK;
}

ttd_status_t ttd_state_write_message(int dir_fd, const char *name, const ProtobufCMessage *msg, Ttd__V1__SavedFile *file) {
  size_t len = protobuf_c_message_get_packed_size(msg);
  uint8_t *buf = malloc(len ? len : 1);
  if (!buf) return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "out of host memory writing state file %s", name);
  protobuf_c_message_pack(msg, buf);
  ttd_state_writer w;
  ttd_status_t status = ttd_state_writer_open(&w, dir_fd, name, true);
  if (!status) {
    status = ttd_state_writer_put(&w, buf, len);
    ttd_status_t finished = ttd_state_writer_finish(&w, file);
    if (!status) status = finished;
    else ttd_status_free(finished);
  }
  free(buf);
  return status;
}

ttd_status_t ttd_state_check_private(int fd, const char *name) {
  struct stat st;
  if (fstat(fd, &st) != 0) return io_error("stat", name, errno);
  if (st.st_uid != geteuid() || (st.st_mode & 077)) {
    return ttd_make_status(GRPC_STATUS_FAILED_PRECONDITION,
                           "%s belongs to uid %u with mode %04o: state must belong to ttd's user (uid %u) and be "
                           "private to it (mode 0600 for files, 0700 for folders)",
                           name, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777), (unsigned)geteuid());
  }
  return TTD_OK;
}

ttd_status_t ttd_state_read_small(int dir_fd, const char *name, const Ttd__V1__SavedFile *expected,
                                  uint8_t **out_data, size_t *out_len) {
  *out_data = NULL;
  *out_len = 0;
  int fd = openat(dir_fd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    if (errno == ENOENT) return ttd_make_status(GRPC_STATUS_NOT_FOUND, "state file %s is missing", name);
    return io_error("open", name, errno);
  }
  ttd_status_t status = ttd_state_check_private(fd, name);
  struct stat st;
  if (!status && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))) {
    status = ttd_make_status(GRPC_STATUS_DATA_LOSS, "state file %s is not a regular file", name);
  }
  if (!status && st.st_size > (64 << 20)) {
    status = ttd_make_status(GRPC_STATUS_DATA_LOSS, "state file %s holds %lld bytes, more than a state message may",
                             name, (long long)st.st_size);
  }
  if (!status && expected && (uint64_t)st.st_size != expected->bytes) {
    status = ttd_make_status(GRPC_STATUS_DATA_LOSS, "state file %s holds %lld bytes, the manifest says %" PRIu64
                             " (torn or truncated)", name, (long long)st.st_size, expected->bytes);
  }
  uint8_t *data = status ? NULL : malloc(st.st_size ? (size_t)st.st_size : 1);
  if (!status && !data) status = ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "out of host memory reading %s", name);
  if (!status) status = ttd_read_all_at(fd, data, (uint64_t)st.st_size, 0);
  if (!status && expected && (uint32_t)crc32_z(crc32_z(0, NULL, 0), data, (z_size_t)st.st_size) != expected->crc32) {
    status = ttd_make_status(GRPC_STATUS_DATA_LOSS, "state file %s does not match its checksum in the manifest", name);
  }
  close(fd);
  if (status) {
    free(data);
    return status;
  }
  *out_data = data;
  *out_len = (size_t)st.st_size;
  return TTD_OK;
}

void ttd_state_remove_tree(int dir_fd, const char *name) {
  int fd = openat(dir_fd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return;
  DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    return;
  }
  struct dirent *e;
  while ((e = readdir(d))) {
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) unlinkat(fd, e->d_name, 0);
  }
  closedir(d);
  unlinkat(dir_fd, name, AT_REMOVEDIR);
}

/* Parts of the pieces, handed out to the threads by an atomic counter. */
typedef struct pieces_job {
  int fd;
  bool write;
  const ttd_state_piece *pieces;
  size_t n;
  uint64_t *part_start; /* per piece: the index of its first part */
  uint64_t parts;
  atomic_ullong next;
  pthread_mutex_t lock;
  ttd_status_t status; /* the first error, under lock */
} pieces_job;

static void *pieces_main(void *arg) {
  pieces_job *j = arg;
  for (;;) {
    uint64_t part = atomic_fetch_add(&j->next, 1);
    if (part >= j->parts) return NULL;
    size_t lo = 0, hi = j->n; /* the last piece whose first part is <= part */
    while (hi - lo > 1) {
      size_t mid = lo + (hi - lo) / 2;
      if (j->part_start[mid] <= part) lo = mid;
      else hi = mid;
    }
    size_t k = lo;
    const ttd_state_piece *p = &j->pieces[k];
    uint64_t at = (part - j->part_start[k]) * WRITEBACK_STEP;
    uint64_t len = p->len - at < WRITEBACK_STEP ? p->len - at : WRITEBACK_STEP;
    unsigned char *mem = (unsigned char *)p->mem + at;
    ttd_status_t status = TTD_OK;
    if (j->write) {
      for (uint64_t done = 0; done < len && !status;) {
        ssize_t w = pwrite(j->fd, mem + done, len - done, (off_t)(p->file_offset + at + done));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) status = io_error("write", "data", errno);
        else done += (uint64_t)w;
      }
      if (!status) sync_file_range(j->fd, (off_t)(p->file_offset + at), (off_t)len, SYNC_FILE_RANGE_WRITE);
    } else {
      status = ttd_read_all_at(j->fd, mem, len, p->file_offset + at);
    }
    if (status) {
      pthread_mutex_lock(&j->lock);
      if (!j->status) j->status = status;
      else ttd_status_free(status);
      pthread_mutex_unlock(&j->lock);
      atomic_store(&j->next, j->parts); /* the others stop too */
    }
  }
}

#define PIECE_THREADS 4

ttd_status_t ttd_state_pieces_run(int fd, const ttd_state_piece *pieces, size_t n, bool write) {
  if (n == 0) return TTD_OK;
  pieces_job j = {.fd = fd, .write = write, .pieces = pieces, .n = n};
  j.part_start = calloc(n, sizeof(*j.part_start));
  if (!j.part_start) return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "out of host memory");
  for (size_t k = 0; k < n; k++) {
    j.part_start[k] = j.parts;
    j.parts += (pieces[k].len + WRITEBACK_STEP - 1) / WRITEBACK_STEP;
  }
  atomic_init(&j.next, 0);
  pthread_mutex_init(&j.lock, NULL);
  int cores = ttd_pool_usable_cpus();
  int helpers = (cores < PIECE_THREADS ? cores : PIECE_THREADS) - 1;
  if ((uint64_t)helpers >= j.parts) helpers = (int)j.parts - 1;
  pthread_t threads[PIECE_THREADS];
  int started = 0;
  for (; started < helpers; started++) {
    if (pthread_create(&threads[started], NULL, pieces_main, &j) != 0) break;
  }
  pieces_main(&j);
  for (int i = 0; i < started; i++) pthread_join(threads[i], NULL);
  pthread_mutex_destroy(&j.lock);
  free(j.part_start);
  return j.status;
}
