/* Safetensors checkpoints of libttclient: saving host tensors to a file and reading them back,
 * over the format code that ttd shares (runtime/wire/safetensors.h), which builds, parses and
 * checks the header and writes the file atomically. Data is little-endian and row-major.
 *
 * Reading checks the whole header up front and keeps the file open; tt_safetensors_get reads
 * one tensor's bytes with pread, so several threads may get tensors of one file at once. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file_io.h"
#include "tensor/tensor.h"
#include "wire/safetensors.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c writes host memory as the file's little-endian data; add byte swapping for this host"
#endif

_Static_assert(TT_FLOAT32 == (int)TTD_DTYPE_FLOAT32 && TT_BFLOAT16 == (int)TTD_DTYPE_BFLOAT16 &&
                   TT_INT32 == (int)TTD_DTYPE_INT32,
               "tt_dtype and ttd_dtype share values");
_Static_assert(TT_MAX_DIMS == TTD_SAFETENSORS_MAX_DIMS, "an entry holds a tensor's whole shape");

struct tt_safetensors {
  tt_client *client;
  char *path;
  int fd;
  ttd_st_header header;
};

/* ---- saving ---- */

tt_status tt_safetensors_save(tt_client *client, const char *path, const char *const *names, tt_tensor *const *tensors,
                              int n) {
  return tt_safetensors_save_metadata(client, path, names, tensors, n, NULL, 0);
}

/* Describes host tensor t, named name (index i), as entry e. Records errors. */
static tt_status describe(tt_client *client, const char *name, tt_tensor *t, int i, ttd_st_entry *e) {
  if (!t) return tt_client_fail(client, TT_INVALID_ARGUMENT, "tensor %d ('%s') is NULL", i, name ? name : "?");
  if (!tt_tensor_is_host(t)) {
    return tt_client_fail(client, TT_INVALID_ARGUMENT,
                          "tensor '%s' is on %s; move it to the host first: tt_to(tensor, \"cpu\")",
                          name ? name : "?", tt_tensor_device(t));
  }
  e->name = name;
  e->dtype = (ttd_dtype)tt_tensor_dtype(t);
  e->ndim = tt_tensor_ndim(t);
  if (e->ndim > 0) memcpy(e->shape, tt_tensor_shape(t), (size_t)e->ndim * sizeof(e->shape[0]));
  return TT_OK;
}

tt_status tt_safetensors_save_metadata(tt_client *client, const char *path, const char *const *names,
                                       tt_tensor *const *tensors, int n, const char *const *metadata, int n_metadata) {
  if (!client && n > 0 && tensors && tensors[0]) client = tt_tensor_client(tensors[0]);
  if (!client) return TT_INVALID_ARGUMENT;
  if (!path || !*path) return tt_client_fail(client, TT_INVALID_ARGUMENT, "the checkpoint path is NULL or empty");
  if (n < 0) return tt_client_fail(client, TT_INVALID_ARGUMENT, "n is %d; it counts tensors and must be >= 0", n);
  if (n > 0 && (!names || !tensors)) {
    return tt_client_fail(client, TT_INVALID_ARGUMENT, "%s is NULL with n = %d", names ? "tensors" : "names", n);
  }
  ttd_st_entry *entries = calloc(n ? (size_t)n : 1, sizeof(*entries));
  const void **data = calloc(n ? (size_t)n : 1, sizeof(*data));
  tt_status st = entries && data ? TT_OK : tt_client_fail(client, TT_RESOURCE_EXHAUSTED, "out of host memory");
  for (int i = 0; i < n && st == TT_OK; i++) {
    st = describe(client, names[i], tensors[i], i, &entries[i]);
    if (st == TT_OK) data[i] = tt_tensor_data(tensors[i]);
  }
  if (st == TT_OK) {
    ttd_status_t status = ttd_safetensors_write_file(path, entries, n, metadata, n_metadata, data);
    if (ttd_status_code(status) == GRPC_STATUS_UNAVAILABLE) {
      st = tt_client_fail(client, TT_UNAVAILABLE, "cannot save checkpoint '%s': %s", path, ttd_status_message(status));
      ttd_status_free(status);
    } else if (status) {
      st = tt_client_fail_status(client, status);
    }
  }
  free(entries);
  free(data);
  return st;
}

/* ---- reading ---- */

/* Reads and checks the header of f's open file. Records errors. */
static tt_status load_header(tt_safetensors *f) {
  struct stat sb;
  if (fstat(f->fd, &sb) != 0) {
    return tt_client_fail(f->client, TT_UNAVAILABLE, "cannot stat checkpoint '%s': %s", f->path, strerror(errno));
  }
  if (!S_ISREG(sb.st_mode)) {
    return tt_client_fail(f->client, TT_INVALID_ARGUMENT, "checkpoint '%s' is not a regular file", f->path);
  }
  ttd_status_t status = ttd_safetensors_read_header(f->fd, (uint64_t)sb.st_size, &f->header);
  if (!status) return TT_OK;
  /* DATA_LOSS reads "checkpoint 'PATH' is not a valid safetensors file: ..." */
  tt_status code = tt_client_fail(f->client, (tt_status)ttd_status_code(status), "checkpoint '%s'%s %s", f->path,
                                  ttd_status_code(status) == GRPC_STATUS_DATA_LOSS ? " is" : ":",
                                  ttd_status_message(status));
  ttd_status_free(status);
  return code;
}

tt_status tt_safetensors_open(tt_client *client, const char *path, tt_safetensors **out_file) {
  if (out_file) *out_file = NULL;
  if (!client) return TT_INVALID_ARGUMENT;
  if (!path || !out_file) {
    return tt_client_fail(client, TT_INVALID_ARGUMENT, "tt_safetensors_open needs a path and out_file");
  }
  tt_safetensors *f = calloc(1, sizeof(*f));
  if (f) f->fd = -1;
  if (!f || !(f->path = strdup(path))) {
    free(f);
    return tt_client_fail(client, TT_RESOURCE_EXHAUSTED, "out of host memory");
  }
  f->client = client;
  f->fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* O_NONBLOCK: a FIFO fails the S_ISREG check, not hangs */
  if (f->fd < 0) {
    int err = errno;
    tt_safetensors_close(f);
    if (err == ENOENT || err == ENOTDIR) {
      return tt_client_fail(client, TT_NOT_FOUND, "checkpoint '%s' does not exist", path);
    }
    return tt_client_fail(client, err == EACCES || err == EPERM ? TT_PERMISSION_DENIED : TT_UNAVAILABLE,
                          "cannot open checkpoint '%s': %s", path, strerror(err));
  }
  tt_status st = load_header(f);
  if (st != TT_OK) {
    tt_safetensors_close(f);
    return st;
  }
  *out_file = f;
  return TT_OK;
}

int tt_safetensors_count(const tt_safetensors *file) { return file ? file->header.count : 0; }

const char *tt_safetensors_metadata(const tt_safetensors *file, const char *key) {
  return file ? ttd_safetensors_metadata(&file->header, key) : NULL;
}

const char *tt_safetensors_name(const tt_safetensors *file, int index) {
  if (!file || index < 0 || index >= file->header.count) return NULL;
  return file->header.entries[index].name;
}

tt_tensor *tt_safetensors_get(tt_safetensors *file, const char *name) {
  if (!file) return NULL;
  if (!name) {
    tt_client_fail(file->client, TT_INVALID_ARGUMENT, "tt_safetensors_get needs a tensor name");
    return NULL;
  }
  const ttd_st_entry *e = ttd_safetensors_find(&file->header, name);
  if (!e) {
    tt_client_fail(file->client, TT_NOT_FOUND, "checkpoint '%s' has no tensor '%s'", file->path, name);
    return NULL;
  }
  if (!e->dtype) {
    tt_client_fail(file->client, TT_UNIMPLEMENTED,
                   "tensor '%s' of checkpoint '%s' is %s; libttclient loads F32, BF16 and I32 only", name, file->path,
                   e->dtype_name);
    return NULL;
  }
  if (e->ndim > TT_MAX_DIMS) {
    tt_client_fail(file->client, TT_UNIMPLEMENTED,
                   "tensor '%s' of checkpoint '%s' has %d dims; tensors have at most %d", name, file->path, e->ndim,
                   TT_MAX_DIMS);
    return NULL;
  }
  tt_tensor *t = tt_tensor_from_host(file->client, NULL, (tt_dtype)e->dtype, e->shape, e->ndim);
  if (!t) return NULL;
  ttd_status_t status =
      ttd_read_all_at(file->fd, tt_tensor_data(t), e->end - e->begin, file->header.data_start + e->begin);
  if (status) {
    tt_tensor_free(t);
    if (ttd_status_code(status) == GRPC_STATUS_OUT_OF_RANGE) {
      tt_client_fail(file->client, TT_DATA_LOSS, "checkpoint '%s' ended inside tensor '%s'; it shrank after opening",
                     file->path, name);
    } else {
      tt_client_fail(file->client, TT_UNAVAILABLE, "cannot read tensor '%s' of checkpoint '%s': %s", name, file->path,
                     ttd_status_message(status));
    }
    ttd_status_free(status);
    return NULL;
  }
  return t;
}

void tt_safetensors_close(tt_safetensors *file) {
  if (!file) return;
  if (file->fd >= 0) close(file->fd);
  ttd_safetensors_header_clear(&file->header);
  free(file->path);
  free(file);
}
