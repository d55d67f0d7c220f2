/* Safetensors checkpoints of libttclient: saving host tensors to a file and reading them back.
 *
 * The format (what Hugging Face's safetensors reads and writes): an 8-byte little-endian
 * unsigned header length N, N bytes of UTF-8 JSON (padded with spaces so that the data starts
 * 8-byte aligned), then the data buffer. The JSON maps each tensor name to
 * {"dtype", "shape", "data_offsets": [begin, end]} (byte offsets into the data buffer, which
 * the tensors cover contiguously) plus an optional "__metadata__" object of strings. Data is
 * little-endian and row-major. The JSON is built and parsed by jansson.
 *
 * Reading checks the whole header up front and keeps the file open; tt_safetensors_get reads
 * one tensor's bytes with pread, so several threads may get tensors of one file at once. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/data.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c writes host memory as the file's little-endian data; add byte swapping for this host"
#endif

#define METADATA_KEY "__metadata__"
#define MAX_HEADER_BYTES 100000000u /* the limit Hugging Face's reader enforces */
#define IO_CHUNK (1u << 30)         /* largest single read/write, below Linux's 2 GiB cap */

/* Every dtype name the safetensors format defines, with its bits per element, so that a file
 * holding types libttclient cannot load (an int64 position_ids buffer, say) still opens and
 * only tt_safetensors_get of those tensors fails. tt is 0 where libttclient has no such type. */
static const struct {
  const char *name;
  unsigned bits;
  tt_dtype tt;
} dtype_table[] = {
    {"F32", 32, TT_FLOAT32}, {"BF16", 16, TT_BFLOAT16}, {"I32", 32, TT_INT32}, {"BOOL", 8, 0},
    {"U8", 8, 0},            {"I8", 8, 0},              {"F8_E5M2", 8, 0},     {"F8_E4M3", 8, 0},
    {"F8_E8M0", 8, 0},       {"I16", 16, 0},            {"U16", 16, 0},        {"F16", 16, 0},
    {"U32", 32, 0},          {"F64", 64, 0},            {"I64", 64, 0},        {"U64", 64, 0},
    {"C64", 64, 0},          {"F4", 4, 0},              {"F6_E2M3", 6, 0},     {"F6_E3M2", 6, 0},
};

typedef struct st_entry {
  const char *name;       /* a key of the header (owned by it) */
  const char *dtype_name; /* owned by the header */
  tt_dtype dtype;         /* 0: a safetensors type libttclient does not load */
  int ndim;               /* may exceed TT_MAX_DIMS; then shape holds the first dims only */
  int64_t shape[TT_MAX_DIMS];
  uint64_t begin, end; /* byte range in the data buffer */
} st_entry;

struct tt_safetensors {
  tt_client *client;
  char *path;
  int fd;
  uint64_t data_start; /* file offset of the data buffer: 8 + N */
  json_t *header;
  int count;
  st_entry *entries;  /* in file (header) order */
  st_entry **by_name; /* sorted by name, for bsearch */
};

static const char *dtype_to_name(tt_dtype dtype) {
  for (size_t i = 0; i < sizeof(dtype_table) / sizeof(dtype_table[0]); i++) {
    if (dtype_table[i].tt == dtype && dtype_table[i].tt != 0) return dtype_table[i].name;
  }
  return NULL;
}

/* ---- saving ---- */

static tt_status io_fail(tt_client *client, const char *path, const char *what, const char *file, int err) {
  return tt_client_fail(client, TT_UNAVAILABLE, "cannot save checkpoint '%s': %s '%s': %s", path, what, file,
                        strerror(err));
}

static int write_all(int fd, const void *buf, uint64_t len) {
  const char *p = buf;
  while (len > 0) {
    size_t want = len > IO_CHUNK ? IO_CHUNK : (size_t)len;
    ssize_t n = write(fd, p, want);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    p += n;
    len -= (uint64_t)n;
  }
  return 0;
}

/* Makes the rename durable; a filesystem that cannot sync folders (EINVAL) is fine. */
static int sync_parent_dir(const char *path) {
  const char *slash = strrchr(path, '/');
  char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
  if (!dir) return -1;
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int rc = 0;
  if (fd < 0 || (fsync(fd) != 0 && errno != EINVAL)) rc = -1;
  int saved = errno;
  if (fd >= 0) close(fd);
  free(dir);
  errno = saved;
  return rc;
}

/* The padded JSON header for the tensors, in the given order, after the metadata (n_meta
 * key, value pairs). Records errors. */
static tt_status build_header(tt_client *client, const char *const *names, tt_tensor *const *tensors, int n,
                              const char *const *meta, int n_meta, char **out_header, size_t *out_len) {
  *out_header = NULL;
  *out_len = 0;
  json_t *root = json_object();
  if (!root) return tt_client_fail(client, TT_RESOURCE_EXHAUSTED, "out of host memory for a checkpoint header");
  tt_status st = TT_OK;
  json_t *metadata = n_meta > 0 ? json_object() : NULL;
  for (int i = 0; metadata && i < n_meta; i++) {
    if (json_object_set_new(metadata, meta[2 * i], json_string(meta[2 * i + 1])) != 0) {
      json_decref(metadata);
      metadata = NULL;
    }
  }
  if (n_meta > 0 && (!metadata || json_object_set_new(root, METADATA_KEY, metadata) != 0)) {
    st = tt_client_fail(client, TT_INVALID_ARGUMENT, "the checkpoint's metadata is not valid UTF-8 (or host memory ran out)");
  }
  uint64_t offset = 0;
  for (int i = 0; i < n && st == TT_OK; i++) {
    const char *name = names[i];
    tt_tensor *t = tensors[i];
    if (!name || !*name) {
      st = tt_client_fail(client, TT_INVALID_ARGUMENT, "name %d is %s; every tensor needs a non-empty name", i,
                          name ? "empty" : "NULL");
    } else if (strcmp(name, METADATA_KEY) == 0) {
      st = tt_client_fail(client, TT_INVALID_ARGUMENT, "name %d is '%s', which safetensors reserves; rename the tensor",
                          i, name);
    } else if (!t) {
      st = tt_client_fail(client, TT_INVALID_ARGUMENT, "tensor %d ('%s') is NULL", i, name);
    } else if (!tt_tensor_is_host(t)) {
      st = tt_client_fail(client, TT_INVALID_ARGUMENT,
                          "tensor '%s' is on %s; move it to the host first: tt_to(tensor, \"cpu\")", name,
                          tt_tensor_device(t));
    } else if (json_object_get(root, name)) {
      st = tt_client_fail(client, TT_INVALID_ARGUMENT, "tensor name '%s' is given twice (at %d); names must be unique",
                          name, i);
    } else if (!dtype_to_name(tt_tensor_dtype(t))) {
      st = tt_client_fail(client, TT_INVALID_ARGUMENT, "tensor '%s' has dtype %d, which has no safetensors name", name,
                          (int)tt_tensor_dtype(t));
    } else if (__builtin_add_overflow(offset, tt_tensor_nbytes(t), &offset) || offset > (uint64_t)INT64_MAX) {
      st = tt_client_fail(client, TT_INVALID_ARGUMENT, "the tensors add up to more than 2^63 bytes");
    } else {
      json_t *shape = json_array();
      for (int d = 0; shape && d < tt_tensor_ndim(t); d++) {
        if (json_array_append_new(shape, json_integer(tt_tensor_shape(t)[d])) != 0) {
          json_decref(shape);
          shape = NULL;
        }
      }
      json_t *entry = json_pack("{s:s, s:o?, s:[I,I]}", "dtype", dtype_to_name(tt_tensor_dtype(t)), "shape", shape,
                                "data_offsets", (json_int_t)(offset - tt_tensor_nbytes(t)), (json_int_t)offset);
      if (!shape || !entry) {
        json_decref(entry);
        st = tt_client_fail(client, TT_RESOURCE_EXHAUSTED, "out of host memory for a checkpoint header");
      } else if (json_object_set_new(root, name, entry) != 0) {
        /* jansson refuses keys that are not UTF-8 */
        st = tt_client_fail(client, TT_INVALID_ARGUMENT, "tensor name %d is not valid UTF-8", i);
      }
    }
  }
  char *text = NULL;
  if (st == TT_OK && !(text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER))) {
    st = tt_client_fail(client, TT_RESOURCE_EXHAUSTED, "out of host memory for a checkpoint header");
  }
  json_decref(root);
  if (st != TT_OK) return st;
  size_t len = strlen(text);
  size_t padded = (len + 7) & ~(size_t)7;
  char *buf = realloc(text, padded + 1);
  if (!buf) {
    free(text);
    return tt_client_fail(client, TT_RESOURCE_EXHAUSTED, "out of host memory for a checkpoint header");
  }
  memset(buf + len, ' ', padded - len);
  buf[padded] = '\0';
  *out_header = buf;
  *out_len = padded;
  return TT_OK;
}

/* Writes the header and the data into tmp, synced. Records errors. */
static tt_status write_file(tt_client *client, const char *path, const char *tmp, const char *header,
                            size_t header_len, tt_tensor *const *tensors, int n) {
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return io_fail(client, path, "cannot create", tmp, errno);
  uint64_t len = header_len;
  unsigned char prefix[8];
  for (int i = 0; i < 8; i++) prefix[i] = (unsigned char)(len >> (8 * i));
  int rc = write_all(fd, prefix, sizeof(prefix));
  if (rc == 0) rc = write_all(fd, header, header_len);
  for (int i = 0; i < n && rc == 0; i++) rc = write_all(fd, tt_tensor_data(tensors[i]), tt_tensor_nbytes(tensors[i]));
  if (rc != 0) {
    int err = errno;
    close(fd);
    return io_fail(client, path, "cannot write", tmp, err);
  }
  if (fsync(fd) != 0) {
    int err = errno;
    close(fd);
    return io_fail(client, path, "cannot sync", tmp, err);
  }
  if (close(fd) != 0) return io_fail(client, path, "cannot close", tmp, errno);
  return TT_OK;
}

tt_status tt_safetensors_save(tt_client *client, const char *path, const char *const *names, tt_tensor *const *tensors,
                              int n) {
  return tt_safetensors_save_metadata(client, path, names, tensors, n, NULL, 0);
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
  char *header = NULL;
  size_t header_len = 0;
  tt_status st = build_header(client, names, tensors, n, metadata, n_metadata, &header, &header_len);
  if (st != TT_OK) return st;
  size_t path_len = strlen(path);
  char *tmp = malloc(path_len + sizeof(".tmp"));
  if (!tmp) {
    free(header);
    return tt_client_fail(client, TT_RESOURCE_EXHAUSTED, "out of host memory");
  }
  memcpy(tmp, path, path_len);
  memcpy(tmp + path_len, ".tmp", sizeof(".tmp"));
  st = write_file(client, path, tmp, header, header_len, tensors, n);
  free(header);
  if (st == TT_OK && rename(tmp, path) != 0) st = io_fail(client, path, "cannot rename", tmp, errno);
  if (st != TT_OK) {
    unlink(tmp); /* nothing to do if it was never created */
  } else if (sync_parent_dir(path) != 0) {
    st = io_fail(client, path, "cannot sync the folder of", path, errno);
  }
  free(tmp);
  return st;
}

/* ---- reading ---- */

/* Records "checkpoint 'path': <message>" as DATA_LOSS. */
static tt_status __attribute__((format(printf, 2, 3))) corrupt(const tt_safetensors *f, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  return tt_client_fail(f->client, TT_DATA_LOSS, "checkpoint '%s' is not a valid safetensors file: %s", f->path, msg);
}

static int read_all_at(int fd, void *buf, uint64_t len, uint64_t offset) {
  char *p = buf;
  while (len > 0) {
    size_t want = len > IO_CHUNK ? IO_CHUNK : (size_t)len;
    ssize_t n = pread(fd, p, want, (off_t)offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    if (n == 0) {
      errno = 0; /* end of file */
      return -1;
    }
    p += n;
    len -= (uint64_t)n;
    offset += (uint64_t)n;
  }
  return 0;
}

/* A non-negative JSON integer, or -1. */
static int64_t json_uint(const json_t *value) {
  if (!json_is_integer(value)) return -1;
  json_int_t v = json_integer_value(value);
  return v < 0 ? -1 : (int64_t)v;
}

/* Checks one tensor's description and fills e. */
static tt_status parse_entry(const tt_safetensors *f, const char *name, json_t *desc, st_entry *e) {
  e->name = name;
  if (!*name) return corrupt(f, "a tensor has an empty name");
  if (!json_is_object(desc)) return corrupt(f, "the entry of tensor '%s' is not a JSON object", name);
  json_t *dtype = json_object_get(desc, "dtype");
  json_t *shape = json_object_get(desc, "shape");
  json_t *offsets = json_object_get(desc, "data_offsets");
  if (!json_is_string(dtype)) return corrupt(f, "tensor '%s' has no \"dtype\" string", name);
  if (!json_is_array(shape)) return corrupt(f, "tensor '%s' has no \"shape\" array", name);
  if (!json_is_array(offsets)) return corrupt(f, "tensor '%s' has no \"data_offsets\" array", name);
  e->dtype_name = json_string_value(dtype);
  unsigned bits = 0;
  for (size_t i = 0; i < sizeof(dtype_table) / sizeof(dtype_table[0]); i++) {
    if (strcmp(dtype_table[i].name, e->dtype_name) == 0) {
      bits = dtype_table[i].bits;
      e->dtype = dtype_table[i].tt;
    }
  }
  if (bits == 0) {
    return corrupt(f, "tensor '%s' has dtype \"%s\", which safetensors does not define (F32, BF16, I32, F16, I64, ...)",
                   name, e->dtype_name);
  }
  size_t ndim = json_array_size(shape);
  if (ndim > 1024) return corrupt(f, "tensor '%s' has %zu dims", name, ndim);
  e->ndim = (int)ndim;
  uint64_t numel = 1;
  for (size_t d = 0; d < ndim; d++) {
    int64_t dim = json_uint(json_array_get(shape, d));
    if (dim < 0) return corrupt(f, "dim %zu of the shape of tensor '%s' is not a non-negative integer", d, name);
    if (d < TT_MAX_DIMS) e->shape[d] = dim;
    if (__builtin_mul_overflow(numel, (uint64_t)dim, &numel)) {
      return corrupt(f, "the shape of tensor '%s' overflows 64 bits (at dim %zu)", name, d);
    }
  }
  uint64_t total_bits;
  if (__builtin_mul_overflow(numel, (uint64_t)bits, &total_bits)) {
    return corrupt(f, "the byte size of tensor '%s' (%" PRIu64 " elements of %s) overflows 64 bits", name, numel,
                   e->dtype_name);
  }
  if (total_bits % 8 != 0) {
    return corrupt(f, "tensor '%s' has %" PRIu64 " %u-bit elements, not a whole number of bytes", name, numel, bits);
  }
  int64_t begin = json_array_size(offsets) == 2 ? json_uint(json_array_get(offsets, 0)) : -1;
  int64_t end = json_array_size(offsets) == 2 ? json_uint(json_array_get(offsets, 1)) : -1;
  if (begin < 0 || end < 0) return corrupt(f, "\"data_offsets\" of tensor '%s' is not [begin, end] in bytes", name);
  if (begin > end) {
    return corrupt(f, "\"data_offsets\" of tensor '%s' are [%" PRId64 ", %" PRId64 "]: begin is past end", name, begin,
                   end);
  }
  e->begin = (uint64_t)begin;
  e->end = (uint64_t)end;
  if (e->end - e->begin != total_bits / 8) {
    return corrupt(f,
                   "tensor '%s' (%s, %" PRIu64 " elements) needs %" PRIu64 " bytes but its data_offsets [%" PRIu64
                   ", %" PRIu64 "] hold %" PRIu64,
                   name, e->dtype_name, numel, total_bits / 8, e->begin, e->end, e->end - e->begin);
  }
  return TT_OK;
}

static int cmp_offsets(const void *a, const void *b) {
  const st_entry *x = *(st_entry *const *)a, *y = *(st_entry *const *)b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return 0;
}

static int cmp_names(const void *a, const void *b) {
  return strcmp((*(st_entry *const *)a)->name, (*(st_entry *const *)b)->name);
}

/* The tensors must tile [0, data_len) exactly: in range, no overlap, no gap, nothing after.
 * order: the entries sorted by offsets. */
static tt_status check_layout(const tt_safetensors *f, st_entry *const *order, uint64_t data_len) {
  for (int i = 0; i < f->count; i++) {
    const st_entry *e = &f->entries[i];
    if (e->end > data_len) {
      return corrupt(f,
                     "tensor '%s' has data_offsets [%" PRIu64 ", %" PRIu64 "], past the end of the %" PRIu64
                     "-byte data buffer (offsets out of range, or the file is truncated)",
                     e->name, e->begin, e->end, data_len);
    }
  }
  if (f->count == 0) {
    return data_len == 0 ? TT_OK : corrupt(f, "%" PRIu64 " data bytes follow a header with no tensors", data_len);
  }
  uint64_t covered = 0;
  const st_entry *prev = NULL;
  for (int i = 0; i < f->count; i++) {
    const st_entry *e = order[i];
    if (e->begin < covered) {
      return corrupt(f, "tensors '%s' [%" PRIu64 ", %" PRIu64 ") and '%s' [%" PRIu64 ", %" PRIu64 ") overlap",
                     prev->name, prev->begin, prev->end, e->name, e->begin, e->end);
    }
    if (e->begin > covered) {
      return corrupt(f, "bytes [%" PRIu64 ", %" PRIu64 ") of the data buffer belong to no tensor", covered, e->begin);
    }
    covered = e->end;
    prev = e;
  }
  if (covered != data_len) {
    return corrupt(f, "%" PRIu64 " bytes after the last tensor ('%s' ends at %" PRIu64 " of %" PRIu64 ")",
                   data_len - covered, prev->name, covered, data_len);
  }
  return TT_OK;
}

static tt_status check_metadata(const tt_safetensors *f, json_t *metadata) {
  if (!json_is_object(metadata)) return corrupt(f, "\"" METADATA_KEY "\" is not a JSON object");
  const char *key;
  json_t *value;
  json_object_foreach(metadata, key, value) {
    if (!json_is_string(value)) return corrupt(f, "\"" METADATA_KEY "\" value of '%s' is not a string", key);
  }
  return TT_OK;
}

/* Reads and checks the header; fills f's entries. */
static tt_status load_header(tt_safetensors *f) {
  struct stat sb;
  if (fstat(f->fd, &sb) != 0) {
    return tt_client_fail(f->client, TT_UNAVAILABLE, "cannot stat checkpoint '%s': %s", f->path, strerror(errno));
  }
  if (!S_ISREG(sb.st_mode)) {
    return tt_client_fail(f->client, TT_INVALID_ARGUMENT, "checkpoint '%s' is not a regular file", f->path);
  }
  uint64_t size = (uint64_t)sb.st_size;
  unsigned char prefix[8];
  if (size < 8) return corrupt(f, "the file has %" PRIu64 " bytes, fewer than the 8-byte header length", size);
  if (read_all_at(f->fd, prefix, 8, 0) != 0) {
    return tt_client_fail(f->client, TT_UNAVAILABLE, "cannot read checkpoint '%s': %s", f->path,
                          errno ? strerror(errno) : "it shrank while being read");
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = (n << 8) | prefix[i];
  if (n > size - 8) {
    return corrupt(f, "the header length is %" PRIu64 " bytes, past the end of the %" PRIu64 "-byte file", n, size);
  }
  if (n > MAX_HEADER_BYTES) return corrupt(f, "the header length is %" PRIu64 " bytes, over the 100 MB limit", n);
  char *text = malloc(n ? (size_t)n : 1);
  if (!text) return tt_client_fail(f->client, TT_RESOURCE_EXHAUSTED, "out of host memory for a checkpoint header");
  if (read_all_at(f->fd, text, n, 8) != 0) {
    int err = errno;
    free(text);
    return tt_client_fail(f->client, TT_UNAVAILABLE, "cannot read checkpoint '%s': %s", f->path,
                          err ? strerror(err) : "it shrank while being read");
  }
  json_error_t jerr;
  f->header = json_loadb(text, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
  free(text);
  if (!f->header) return corrupt(f, "the header is not valid JSON: %s (at byte %d of it)", jerr.text, jerr.position);
  if (!json_is_object(f->header)) return corrupt(f, "the header is JSON but not an object");
  f->data_start = 8 + n;
  size_t keys = json_object_size(f->header);
  f->entries = calloc(keys ? keys : 1, sizeof(*f->entries));
  f->by_name = calloc(keys ? keys : 1, sizeof(*f->by_name));
  if (!f->entries || !f->by_name) return tt_client_fail(f->client, TT_RESOURCE_EXHAUSTED, "out of host memory");
  const char *name;
  json_t *desc;
  json_object_foreach(f->header, name, desc) {
    tt_status st;
    if (strcmp(name, METADATA_KEY) == 0) {
      st = check_metadata(f, desc);
    } else {
      st = parse_entry(f, name, desc, &f->entries[f->count]);
      f->by_name[f->count] = &f->entries[f->count];
      f->count++;
    }
    if (st != TT_OK) return st;
  }
  qsort(f->by_name, (size_t)f->count, sizeof(*f->by_name), cmp_offsets);
  tt_status st = check_layout(f, f->by_name, size - f->data_start);
  qsort(f->by_name, (size_t)f->count, sizeof(*f->by_name), cmp_names);
  return st;
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

int tt_safetensors_count(const tt_safetensors *file) { return file ? file->count : 0; }

const char *tt_safetensors_metadata(const tt_safetensors *file, const char *key) {
  return file && key ? json_string_value(json_object_get(json_object_get(file->header, METADATA_KEY), key)) : NULL;
}

const char *tt_safetensors_name(const tt_safetensors *file, int index) {
  if (!file || index < 0 || index >= file->count) return NULL;
  return file->entries[index].name;
}

tt_tensor *tt_safetensors_get(tt_safetensors *file, const char *name) {
  if (!file) return NULL;
  if (!name) {
    tt_client_fail(file->client, TT_INVALID_ARGUMENT, "tt_safetensors_get needs a tensor name");
    return NULL;
  }
  st_entry key = {.name = name}, *keyp = &key;
  st_entry **found = bsearch(&keyp, file->by_name, (size_t)file->count, sizeof(*file->by_name), cmp_names);
  if (!found) {
    tt_client_fail(file->client, TT_NOT_FOUND, "checkpoint '%s' has no tensor '%s'", file->path, name);
    return NULL;
  }
  const st_entry *e = *found;
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
  tt_tensor *t = tt_tensor_from_host(file->client, NULL, e->dtype, e->shape, e->ndim);
  if (!t) return NULL;
  if (read_all_at(file->fd, tt_tensor_data(t), e->end - e->begin, file->data_start + e->begin) != 0) {
    int err = errno;
    tt_tensor_free(t);
    if (err == 0) {
      tt_client_fail(file->client, TT_DATA_LOSS, "checkpoint '%s' ended inside tensor '%s'; it shrank after opening",
                     file->path, name);
    } else {
      tt_client_fail(file->client, TT_UNAVAILABLE, "cannot read tensor '%s' of checkpoint '%s': %s", name, file->path,
                     strerror(err));
    }
    return NULL;
  }
  return t;
}

void tt_safetensors_close(tt_safetensors *file) {
  if (!file) return;
  if (file->fd >= 0) close(file->fd);
  json_decref(file->header);
  free(file->entries);
  free(file->by_name);
  free(file->path);
  free(file);
}
