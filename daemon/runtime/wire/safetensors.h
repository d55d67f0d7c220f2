/* The safetensors file format (what Hugging Face's safetensors reads and writes), shared by
 * libttclient's checkpoints and ttd's saved state: an 8-byte little-endian header length N,
 * N bytes of UTF-8 JSON padded with spaces to a multiple of 8, then the data buffer. The JSON
 * maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (byte offsets
 * into the data buffer, which the tensors tile exactly) plus an optional "__metadata__"
 * object of strings. Only the header is handled here; callers move the data. */
#ifndef TTD_SAFETENSORS_H
#define TTD_SAFETENSORS_H

#include <stdint.h>

#include "base/status.h"
#include "dtype.h"

#define TTD_SAFETENSORS_MAX_DIMS 8
#define TTD_SAFETENSORS_MAX_HEADER 100000000u /* JSON bytes; the limit Hugging Face's reader enforces */

typedef struct ttd_st_entry {
  const char *name;       /* building: the caller's string; reading: owned by the header */
  const char *dtype_name; /* "F32", "BF16", "I32", ...: every name the format defines */
  ttd_dtype dtype;        /* reading: 0 for a type ttd does not load (I64, F16, ...) */
  int ndim;               /* reading: may exceed TTD_SAFETENSORS_MAX_DIMS; shape holds the first */
  int64_t shape[TTD_SAFETENSORS_MAX_DIMS];
  uint64_t begin, end;    /* byte range in the data buffer; building fills them, in order */
} ttd_st_entry;

/* The name the format gives dtype ("F32", "BF16", "I32"), or NULL. */
const char *ttd_safetensors_dtype_name(ttd_dtype dtype);

/* The file's first bytes for entries[0..n) in that order (their dtype and shape set; the
 * data follows in the same order): length prefix and padded JSON, in a new buffer
 * (*out_header, *out_len bytes, free()). Fills each entry's begin and end. metadata holds
 * n_metadata key, value pairs. INVALID_ARGUMENT names an entry whose name is empty,
 * repeated, "__metadata__" or not UTF-8, or whose dtype has no name. */
ttd_status_t ttd_safetensors_build_header(ttd_st_entry *entries, int n, const char *const *metadata, int n_metadata,
                                          char **out_header, size_t *out_len);

/* A file's header, read and checked. */
typedef struct ttd_st_header {
  void *json;            /* the parsed JSON (owns the names) */
  int count;
  ttd_st_entry *entries; /* in the header's order */
  ttd_st_entry **by_name;
  uint64_t data_start;   /* file offset of the data buffer: 8 + N */
} ttd_st_header;

/* Reads the header of the open file fd, of file_size bytes, and checks it whole: JSON of the
 * format, known dtypes, sizes that match shapes, tensors that tile the data to the file's
 * end. DATA_LOSS saying what is wrong ("not a valid safetensors file: ..."); the caller
 * names the file. Clear *out with ttd_safetensors_header_clear, on error too. */
ttd_status_t ttd_safetensors_read_header(int fd, uint64_t file_size, ttd_st_header *out);

/* The entry named name, or NULL. */
const ttd_st_entry *ttd_safetensors_find(const ttd_st_header *header, const char *name);

/* The value of key in "__metadata__" (owned by header), or NULL. */
const char *ttd_safetensors_metadata(const ttd_st_header *header, const char *key);

void ttd_safetensors_header_clear(ttd_st_header *header);

/* Writes a whole file at path atomically: the header of ttd_safetensors_build_header (which
 * fills each entry's begin and end) and data[i], entries[i]'s end - begin bytes each, go to
 * PATH.tmp, which is synced, renamed over path, and the folder synced. A failure before the
 * rename leaves what was at path untouched and no PATH.tmp. Errors: those of build_header; INVALID_ARGUMENT
 * for a NULL or empty path or NULL data; UNAVAILABLE "cannot <create|write|sync|close|rename>
 * 'FILE': <strerror>", for the caller to prefix with what it was saving. */
ttd_status_t ttd_safetensors_write_file(const char *path, ttd_st_entry *entries, int n, const char *const *metadata,
                                        int n_metadata, const void *const *data);

#endif
