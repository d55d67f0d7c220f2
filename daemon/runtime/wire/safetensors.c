/* The safetensors format: building a header, reading one back and checking it whole, and
 * writing a file atomically. The JSON is built and parsed by jansson. */
#include "wire/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file_io.h"

#define METADATA_KEY "__metadata__"

/* Every dtype name the safetensors format defines, with its bits per element, so that a file
 * holding types ttd cannot load (an int64 position_ids buffer, say) still opens and only the
 * reads of those tensors fail. dtype is 0 where ttd has no such type. */
static const struct {
  const char *name;
  unsigned bits;
  ttd_dtype dtype;
} dtype_table[] = {
    {"F32", 32, TTD_DTYPE_FLOAT32}, {"BF16", 16, TTD_DTYPE_BFLOAT16}, {"I32", 32, TTD_DTYPE_INT32},
    {"BOOL", 8, 0},                 {"U8", 8, 0},                     {"I8", 8, 0},
    {"F8_E5M2", 8, 0},              {"F8_E4M3", 8, 0},                {"F8_E8M0", 8, 0},
    {"I16", 16, 0},                 {"U16", 16, 0},                   {"F16", 16, 0},
    {"U32", 32, 0},                 {"F64", 64, 0},                   {"I64", 64, 0},
    {"U64", 64, 0},                 {"C64", 64, 0},                   {"F4", 4, 0},
    {"F6_E2M3", 6, 0},              {"F6_E3M2", 6, 0},
};
#define N_DTYPES (sizeof(dtype_table) / sizeof(dtype_table[0]))

const char *ttd_safetensors_dtype_name(ttd_dtype dtype) {
  for (size_t i = 0; i < N_DTYPES; i++) {
    if (dtype_table[i].dtype == dtype && dtype != 0) return dtype_table[i].name;
  }
  return NULL;
}

static ttd_status_t out_of_memory(void) {
  return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "out of host memory for a safetensors header");
}

/* ---- building ---- */

static ttd_status_t add_metadata(json_t *root, const char *const *metadata, int n_metadata) {
  if (n_metadata == 0) return TTD_OK;
  json_t *object = json_object();
  if (!object || json_object_set_new(root, METADATA_KEY, object) != 0) return out_of_memory();
  for (int i = 0; i < n_metadata; i++) {
    const char *key = metadata[2 * i], *value = metadata[2 * i + 1];
    if (!key || !value) {
      return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "metadata pair %d has a NULL %s", i, key ? "value" : "key");
    }
    json_t *string = json_string(value); /* NULL for a value that is not UTF-8 */
    if (!string) {
      return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "the metadata value of '%s' is not valid UTF-8", key);
    }
    if (json_object_set_new(object, key, string) != 0) {
      return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "metadata key %d is not valid UTF-8", i);
    }
  }
  return TTD_OK;
}

/* Checks entry e (index i), gives it the bytes from *offset on and adds it to root. */
static ttd_status_t add_entry(json_t *root, ttd_st_entry *e, int i, uint64_t *offset) {
  const char *name = e->name;
  if (!name || !*name) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "name %d is %s; every tensor needs a non-empty name", i,
                           name ? "empty" : "NULL");
  }
  if (strcmp(name, METADATA_KEY) == 0) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                           "name %d is '%s', which safetensors reserves; rename the tensor", i, name);
  }
  if (json_object_get(root, name)) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                           "tensor name '%s' is given twice (at %d); names must be unique", name, i);
  }
  const char *dtype_name = ttd_safetensors_dtype_name(e->dtype);
  if (!dtype_name) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "tensor '%s' has dtype %d, which has no safetensors name",
                           name, (int)e->dtype);
  }
  if (e->ndim < 0 || e->ndim > TTD_SAFETENSORS_MAX_DIMS) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "tensor '%s' has %d dims; 0 to %d can be written", name,
                           e->ndim, TTD_SAFETENSORS_MAX_DIMS);
  }
  uint64_t nbytes = ttd_dtype_size(e->dtype);
  json_t *shape = json_array();
  if (!shape) return out_of_memory();
  for (int d = 0; d < e->ndim; d++) {
    if (e->shape[d] < 0) {
      json_decref(shape);
      return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "dim %d of tensor '%s' is %" PRId64 ", below 0", d, name,
                             e->shape[d]);
    }
    if (__builtin_mul_overflow(nbytes, (uint64_t)e->shape[d], &nbytes)) nbytes = UINT64_MAX;
    if (json_array_append_new(shape, json_integer(e->shape[d])) != 0) {
      json_decref(shape);
      return out_of_memory();
    }
  }
  uint64_t end;
  if (__builtin_add_overflow(*offset, nbytes, &end) || end > (uint64_t)INT64_MAX) {
    json_decref(shape);
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "the tensors add up to more than 2^63 bytes (at '%s')", name);
  }
  e->begin = *offset;
  e->end = end;
  *offset = end;
  json_t *desc = json_pack("{s:s, s:o, s:[I,I]}", "dtype", dtype_name, "shape", shape, "data_offsets",
                           (json_int_t)e->begin, (json_int_t)e->end);
  if (!desc) return out_of_memory(); /* json_pack took shape */
  if (json_object_set_new(root, name, desc) != 0) {
    /* jansson refuses keys that are not UTF-8 */
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "tensor name %d is not valid UTF-8", i);
  }
  return TTD_OK;
}

ttd_status_t ttd_safetensors_build_header(ttd_st_entry *entries, int n, const char *const *metadata, int n_metadata,
                                          char **out_header, size_t *out_len) {
  *out_header = NULL;
  *out_len = 0;
  if (n < 0 || (n > 0 && !entries)) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "%d tensors%s; give n >= 0 entries", n,
                           n > 0 ? " but no entries" : "");
  }
  if (n_metadata < 0 || (n_metadata > 0 && !metadata)) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "%d metadata pairs%s; give n_metadata >= 0 pairs", n_metadata,
                           n_metadata > 0 ? " but no metadata" : "");
  }
  json_t *root = json_object();
  if (!root) return out_of_memory();
  ttd_status_t status = add_metadata(root, metadata, n_metadata);
  uint64_t offset = 0;
  for (int i = 0; i < n && !status; i++) status = add_entry(root, &entries[i], i, &offset);
  char *text = NULL;
  if (!status && !(text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER))) status = out_of_memory();
  json_decref(root);
  if (status) return status;
  size_t len = strlen(text);
  size_t padded = (len + 7) & ~(size_t)7; /* the data starts 8-byte aligned */
  if (padded > TTD_SAFETENSORS_MAX_HEADER) {
    free(text);
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                           "the header would be %zu bytes, over the %u-byte limit of safetensors readers", padded,
                           TTD_SAFETENSORS_MAX_HEADER);
  }
  char *buf = malloc(8 + padded);
  if (!buf) {
    free(text);
    return out_of_memory();
  }
  for (int i = 0; i < 8; i++) buf[i] = (char)(unsigned char)((uint64_t)padded >> (8 * i));
  memcpy(buf + 8, text, len);
  memset(buf + 8 + len, ' ', padded - len);
  free(text);
  *out_header = buf;
  *out_len = 8 + padded;
  return TTD_OK;
}

/* ---- reading ---- */

/* DATA_LOSS "not a valid safetensors file: <message>". */
static ttd_status_t __attribute__((format(printf, 1, 2))) corrupt(const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  return ttd_make_status(GRPC_STATUS_DATA_LOSS, "not a valid safetensors file: %s", msg);
}

/* UNAVAILABLE for a failed read of the header (status from ttd_read_all_at, freed). */
static ttd_status_t read_failed(ttd_status_t status) {
  int shrank = ttd_status_code(status) == GRPC_STATUS_OUT_OF_RANGE;
  const char *why = shrank ? "the file shrank while being read" : ttd_status_message(status);
  ttd_status_t out = ttd_make_status(GRPC_STATUS_UNAVAILABLE, "cannot read the header: %s", why);
  ttd_status_free(status);
  return out;
}

/* A non-negative JSON integer, or -1. */
static int64_t json_uint(const json_t *value) {
  if (!json_is_integer(value)) return -1;
  json_int_t v = json_integer_value(value);
  return v < 0 ? -1 : (int64_t)v;
}

/* Checks one tensor's description and fills e. */
static ttd_status_t parse_entry(const char *name, json_t *desc, ttd_st_entry *e) {
  e->name = name;
  if (!*name) return corrupt("a tensor has an empty name");
  if (!json_is_object(desc)) return corrupt("the entry of tensor '%s' is not a JSON object", name);
  json_t *dtype = json_object_get(desc, "dtype");
  json_t *shape = json_object_get(desc, "shape");
  json_t *offsets = json_object_get(desc, "data_offsets");
  if (!json_is_string(dtype)) return corrupt("tensor '%s' has no \"dtype\" string", name);
  if (!json_is_array(shape)) return corrupt("tensor '%s' has no \"shape\" array", name);
  if (!json_is_array(offsets)) return corrupt("tensor '%s' has no \"data_offsets\" array", name);
  e->dtype_name = json_string_value(dtype);
  unsigned bits = 0;
  for (size_t i = 0; i < N_DTYPES; i++) {
    if (strcmp(dtype_table[i].name, e->dtype_name) == 0) {
      bits = dtype_table[i].bits;
      e->dtype = dtype_table[i].dtype;
    }
  }
  if (bits == 0) {
    return corrupt("tensor '%s' has dtype \"%s\", which safetensors does not define (F32, BF16, I32, F16, I64, ...)",
                   name, e->dtype_name);
  }
  size_t ndim = json_array_size(shape);
  if (ndim > 1024) return corrupt("tensor '%s' has %zu dims", name, ndim);
  e->ndim = (int)ndim;
  uint64_t numel = 1;
  for (size_t d = 0; d < ndim; d++) {
    int64_t dim = json_uint(json_array_get(shape, d));
    if (dim < 0) return corrupt("dim %zu of the shape of tensor '%s' is not a non-negative integer", d, name);
    if (d < TTD_SAFETENSORS_MAX_DIMS) e->shape[d] = dim;
    if (__builtin_mul_overflow(numel, (uint64_t)dim, &numel)) {
      return corrupt("the shape of tensor '%s' overflows 64 bits (at dim %zu)", name, d);
    }
  }
  uint64_t total_bits;
  if (__builtin_mul_overflow(numel, (uint64_t)bits, &total_bits)) {
    return corrupt("the byte size of tensor '%s' (%" PRIu64 " elements of %s) overflows 64 bits", name, numel,
                   e->dtype_name);
  }
  if (total_bits % 8 != 0) {
    return corrupt("tensor '%s' has %" PRIu64 " %u-bit elements, not a whole number of bytes", name, numel, bits);
  }
  int64_t begin = json_array_size(offsets) == 2 ? json_uint(json_array_get(offsets, 0)) : -1;
  int64_t end = json_array_size(offsets) == 2 ? json_uint(json_array_get(offsets, 1)) : -1;
  if (begin < 0 || end < 0) return corrupt("\"data_offsets\" of tensor '%s' is not [begin, end] in bytes", name);
  if (begin > end) {
    return corrupt("\"data_offsets\" of tensor '%s' are [%" PRId64 ", %" PRId64 "]: begin is past end", name, begin,
                   end);
  }
  e->begin = (uint64_t)begin;
  e->end = (uint64_t)end;
  if (e->end - e->begin != total_bits / 8) {
    return corrupt("tensor '%s' (%s, %" PRIu64 " elements) needs %" PRIu64 " bytes but its data_offsets [%" PRIu64
                   ", %" PRIu64 "] hold %" PRIu64,
                   name, e->dtype_name, numel, total_bits / 8, e->begin, e->end, e->end - e->begin);
  }
  return TTD_OK;
}

static int cmp_offsets(const void *a, const void *b) {
  const ttd_st_entry *x = *(ttd_st_entry *const *)a, *y = *(ttd_st_entry *const *)b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return 0;
}

static int cmp_names(const void *a, const void *b) {
  return strcmp((*(ttd_st_entry *const *)a)->name, (*(ttd_st_entry *const *)b)->name);
}

/* The tensors must tile [0, data_len) exactly: in range, no overlap, no gap, nothing after.
 * order: the entries sorted by offsets. */
static ttd_status_t check_layout(const ttd_st_header *h, ttd_st_entry *const *order, uint64_t data_len) {
  for (int i = 0; i < h->count; i++) {
    const ttd_st_entry *e = &h->entries[i];
    if (e->end > data_len) {
      return corrupt("tensor '%s' has data_offsets [%" PRIu64 ", %" PRIu64 "], past the end of the %" PRIu64
                     "-byte data buffer (offsets out of range, or the file is truncated)",
                     e->name, e->begin, e->end, data_len);
    }
  }
  if (h->count == 0) {
    return data_len == 0 ? TTD_OK : corrupt("%" PRIu64 " data bytes follow a header with no tensors", data_len);
  }
  uint64_t covered = 0;
  const ttd_st_entry *prev = NULL;
  for (int i = 0; i < h->count; i++) {
    const ttd_st_entry *e = order[i];
    if (e->begin < covered) {
      return corrupt("tensors '%s' [%" PRIu64 ", %" PRIu64 ") and '%s' [%" PRIu64 ", %" PRIu64 ") overlap", prev->name,
                     prev->begin, prev->end, e->name, e->begin, e->end);
    }
    if (e->begin > covered) {
      return corrupt("bytes [%" PRIu64 ", %" PRIu64 ") of the data buffer belong to no tensor", covered, e->begin);
    }
    covered = e->end;
    prev = e;
  }
  if (covered != data_len) {
    return corrupt("%" PRIu64 " bytes after the last tensor ('%s' ends at %" PRIu64 " of %" PRIu64 ")",
                   data_len - covered, prev->name, covered, data_len);
  }
  return TTD_OK;
}

static ttd_status_t check_metadata(json_t *metadata) {
  if (!json_is_object(metadata)) return corrupt("\"" METADATA_KEY "\" is not a JSON object");
  const char *key;
  json_t *value;
  json_object_foreach(metadata, key, value) {
    if (!json_is_string(value)) return corrupt("\"" METADATA_KEY "\" value of '%s' is not a string", key);
  }
  return TTD_OK;
}

ttd_status_t ttd_safetensors_read_header(int fd, uint64_t file_size, ttd_st_header *out) {
  memset(out, 0, sizeof(*out));
  if (file_size < 8) return corrupt("the file has %" PRIu64 " bytes, fewer than the 8-byte header length", file_size);
  unsigned char prefix[8];
  ttd_status_t status = ttd_read_all_at(fd, prefix, 8, 0);
  if (status) return read_failed(status);
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = (n << 8) | prefix[i];
  if (n > file_size - 8) {
    return corrupt("the header length is %" PRIu64 " bytes, past the end of the %" PRIu64 "-byte file", n, file_size);
  }
  if (n > TTD_SAFETENSORS_MAX_HEADER) {
    return corrupt("the header length is %" PRIu64 " bytes, over the %u-byte limit", n, TTD_SAFETENSORS_MAX_HEADER);
  }
  char *text = malloc(n ? (size_t)n : 1);
  if (!text) return out_of_memory();
  status = ttd_read_all_at(fd, text, n, 8);
  if (status) {
    free(text);
    return read_failed(status);
  }
  json_error_t jerr;
  json_t *root = json_loadb(text, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
  free(text);
  out->json = root;
  if (!root) return corrupt("the header is not valid JSON: %s (at byte %d of it)", jerr.text, jerr.position);
  if (!json_is_object(root)) return corrupt("the header is JSON but not an object");
  out->data_start = 8 + n;
  size_t keys = json_object_size(root);
  out->entries = calloc(keys ? keys : 1, sizeof(*out->entries));
  out->by_name = calloc(keys ? keys : 1, sizeof(*out->by_name));
  if (!out->entries || !out->by_name) return out_of_memory();
  const char *name;
  json_t *desc;
  json_object_foreach(root, name, desc) {
    if (strcmp(name, METADATA_KEY) == 0) {
      status = check_metadata(desc);
    } else {
      status = parse_entry(name, desc, &out->entries[out->count]);
      out->by_name[out->count] = &out->entries[out->count];
      out->count++;
    }
    if (status) return status;
  }
  qsort(out->by_name, (size_t)out->count, sizeof(*out->by_name), cmp_offsets);
  status = check_layout(out, out->by_name, file_size - out->data_start);
  qsort(out->by_name, (size_t)out->count, sizeof(*out->by_name), cmp_names);
  return status;
}

const ttd_st_entry *ttd_safetensors_find(const ttd_st_header *header, const char *name) {
  if (!header || !name || header->count == 0) return NULL;
  ttd_st_entry key = {.name = name}, *keyp = &key;
  ttd_st_entry **found = bsearch(&keyp, header->by_name, (size_t)header->count, sizeof(*header->by_name), cmp_names);
  return found ? *found : NULL;
}

const char *ttd_safetensors_metadata(const ttd_st_header *header, const char *key) {
  if (!header || !key) return NULL;
  return json_string_value(json_object_get(json_object_get(header->json, METADATA_KEY), key));
}

void ttd_safetensors_header_clear(ttd_st_header *header) {
  if (!header) return;
  json_decref(header->json);
  free(header->entries);
  free(header->by_name);
  memset(header, 0, sizeof(*header));
}

/* ---- writing a file ---- */

/* UNAVAILABLE "cannot <what> '<file>': <strerror>" (status from base/file_io, freed). */
static ttd_status_t io_failed(const char *what, const char *file, ttd_status_t status) {
  ttd_status_t out = ttd_make_status(ttd_status_code(status), "cannot %s '%s': %s", what, file,
                                     ttd_status_message(status));
  ttd_status_free(status);
  return out;
}

static ttd_status_t errno_failed(const char *what, const char *file, int err) {
  return ttd_make_status(GRPC_STATUS_UNAVAILABLE, "cannot %s '%s': %s", what, file, strerror(err));
}

/* Writes header and data into tmp, synced. */
static ttd_status_t write_tmp(const char *tmp, const char *header, size_t header_len, const ttd_st_entry *entries,
                              int n, const void *const *data) {
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno_failed("create", tmp, errno);
  ttd_status_t status = ttd_write_all(fd, header, header_len);
  for (int i = 0; i < n && !status; i++) status = ttd_write_all(fd, data[i], entries[i].end - entries[i].begin);
  if (status) {
    close(fd);
    return io_failed("write", tmp, status);
  }
  if (fsync(fd) != 0) {
    int err = errno;
    close(fd);
    return errno_failed("sync", tmp, err);
  }
  if (close(fd) != 0) return errno_failed("close", tmp, errno);
  return TTD_OK;
}

ttd_status_t ttd_safetensors_write_file(const char *path, ttd_st_entry *entries, int n, const char *const *metadata,
                                        int n_metadata, const void *const *data) {
  if (!path || !*path) return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "the safetensors path is NULL or empty");
  if (n > 0 && !data) return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "data is NULL with %d tensors", n);
  char *header = NULL;
  size_t header_len = 0;
  TTD_RETURN_IF_ERROR(ttd_safetensors_build_header(entries, n, metadata, n_metadata, &header, &header_len));
  for (int i = 0; i < n; i++) {
    if (!data[i] && entries[i].end > entries[i].begin) {
      free(header);
      return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "the data of tensor '%s' is NULL", entries[i].name);
    }
  }
  size_t path_len = strlen(path);
  char *tmp = malloc(path_len + sizeof(".tmp"));
  if (!tmp) {
    free(header);
    return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "out of host memory");
  }
  memcpy(tmp, path, path_len);
  memcpy(tmp + path_len, ".tmp", sizeof(".tmp"));
  ttd_status_t status = write_tmp(tmp, header, header_len, entries, n, data);
  free(header);
  if (!status && rename(tmp, path) != 0) status = errno_failed("rename", tmp, errno);
  if (status) {
    unlink(tmp); /* nothing to do if it was never created */
  } else {
    ttd_status_t synced = ttd_sync_parent_dir(path);
    if (synced) status = io_failed("sync the folder of", path, synced);
  }
  free(tmp);
  return status;
}
