/* IDX datasets (the MNIST file format), gzip-compressed or plain: tt_dataset_load_idx,
 * tt_dataset_load_fashion_mnist, tt_dataset_free.
 *
 * An IDX file is a big-endian header (magic 0x000008NN: unsigned bytes, NN dimensions; then
 * one uint32 per dimension) followed by the bytes in row-major order. Every field is
 * checked before anything is allocated for it, and the payload buffer grows only as data
 * actually arrives, so a garbage or truncated file costs at most twice its real size. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "ttclient.h"

#define IDX_MAGIC_IMAGES 0x00000803u /* unsigned bytes, 3 dimensions */
#define IDX_MAGIC_LABELS 0x00000801u /* unsigned bytes, 1 dimension */
#define IDX_MAX_SIDE 4096u
#define IDX_MAX_PIXELS (UINT64_C(1) << 31)
#define IDX_FIRST_CHUNK (1u << 20)
#define FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"

/* One open IDX file and where to report what goes wrong with it. */
typedef struct idx_file {
  const char *path;
  gzFile gz;
  char *err;
  size_t err_len;
} idx_file;

static tt_status fail(char *err, size_t err_len, tt_status code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static tt_status fail(char *err, size_t err_len, tt_status code, const char *fmt, ...) {
  if (err && err_len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
  }
  return code;
}

static uint32_t read_be32(const unsigned char *b) {
  return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | (uint32_t)b[3];
}

/* An IDX magic of signed byte, short, int, float or double elements. */
static int is_other_idx_type(uint32_t magic) {
  uint32_t type = magic >> 8 & 0xffu;
  return (magic & 0xffff0000u) == 0 && (type == 0x09 || (type >= 0x0b && type <= 0x0e));
}

/* What zlib or the system said about the last failed read. */
static const char *read_error(idx_file *f, int *out_is_io) {
  int zerr = Z_OK;
  const char *msg = gzerror(f->gz, &zerr);
  *out_is_io = zerr == Z_ERRNO;
  if (zerr == Z_ERRNO) return strerror(errno);
  return msg && *msg ? msg : "end of file";
}

static tt_status idx_open(idx_file *f, const char *path, char *err, size_t err_len) {
  f->path = path;
  f->gz = NULL;
  f->err = err;
  f->err_len = err_len;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    tt_status code = (e == ENOENT || e == ENOTDIR) ? TT_NOT_FOUND : e == EACCES ? TT_PERMISSION_DENIED : TT_UNKNOWN;
    return fail(err, err_len, code, "%s: cannot open: %s", path, strerror(e));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || S_ISDIR(st.st_mode)) {
    close(fd);
    return fail(err, err_len, TT_INVALID_ARGUMENT, "%s: is a directory, not an IDX file", path);
  }
  f->gz = gzdopen(fd, "rb"); /* reads plain files unchanged */
  if (!f->gz) {
    close(fd);
    return fail(err, err_len, TT_RESOURCE_EXHAUSTED, "%s: out of memory opening it", path);
  }
  gzbuffer(f->gz, 1u << 17);
  return TT_OK;
}

static void idx_close(idx_file *f) {
  if (f->gz) gzclose(f->gz);
  f->gz = NULL;
}

/* Reads up to n bytes; *out_got says how many came. Fails only on a read error. */
static tt_status idx_read(idx_file *f, void *buf, size_t n, size_t *out_got) {
  size_t got = 0;
  while (got < n) {
    size_t want = n - got;
    if (want > (1u << 30)) want = 1u << 30;
    int r = gzread(f->gz, (unsigned char *)buf + got, (unsigned)want);
    if (r < 0) {
      int is_io;
      const char *why = read_error(f, &is_io);
      *out_got = got;
      if (is_io) return fail(f->err, f->err_len, TT_UNKNOWN, "%s: read error: %s", f->path, why);
      return fail(f->err, f->err_len, TT_DATA_LOSS, "%s: corrupt gzip data: %s", f->path, why);
    }
    if (r == 0) break;
    got += (size_t)r;
  }
  *out_got = got;
  return TT_OK;
}

/* Reads the header: the magic (checked against want_magic) and ndims sizes into dims. */
static tt_status idx_read_header(idx_file *f, uint32_t want_magic, const char *kind, uint32_t *dims, int ndims) {
  unsigned char head[16];
  size_t n = 4 + 4 * (size_t)ndims, got;
  tt_status st = idx_read(f, head, n, &got);
  if (st != TT_OK) return st;
  if (got < 4)
    return fail(f->err, f->err_len, TT_DATA_LOSS, "%s: truncated header: %zu of %zu bytes", f->path, got, n);
  uint32_t magic = read_be32(head);
  if (magic != want_magic) {
    const char *hint = "";
    if (magic == IDX_MAGIC_IMAGES) hint = " (this is an image file)";
    else if (magic == IDX_MAGIC_LABELS) hint = " (this is a label file)";
    else if ((magic >> 16) == 0x1f8b) hint = " (a damaged gzip file?)";
    else if (is_other_idx_type(magic))
      hint = " (IDX of signed, short, int or float elements; only unsigned bytes are read)";
    return fail(f->err, f->err_len, TT_DATA_LOSS, "%s: bad magic 0x%08" PRIx32 ", want 0x%08" PRIx32 " (IDX %s)%s",
                f->path, magic, want_magic, kind, hint);
  }
  if (got < n)
    return fail(f->err, f->err_len, TT_DATA_LOSS, "%s: truncated header: %zu of %zu bytes", f->path, got, n);
  for (int i = 0; i < ndims; i++) dims[i] = read_be32(head + 4 + 4 * i);
  return TT_OK;
}

/* Reads exactly n payload bytes into a new buffer (*out_bytes, free it), growing it as data
 * arrives, then checks that nothing follows them. */
static tt_status idx_read_payload(idx_file *f, uint64_t n, const char *what, unsigned char **out_bytes) {
  *out_bytes = NULL;
  size_t cap = n < IDX_FIRST_CHUNK ? (size_t)n : IDX_FIRST_CHUNK, got = 0;
  unsigned char *buf = malloc(cap ? cap : 1);
  if (!buf) return fail(f->err, f->err_len, TT_RESOURCE_EXHAUSTED, "%s: out of memory", f->path);
  while (got < n) {
    if (got == cap) {
      size_t next = cap * 2 < n ? cap * 2 : (size_t)n;
      unsigned char *grown = realloc(buf, next);
      if (!grown) {
        free(buf);
        return fail(f->err, f->err_len, TT_RESOURCE_EXHAUSTED, "%s: out of memory for %zu bytes", f->path, next);
      }
      buf = grown;
      cap = next;
    }
    size_t chunk;
    tt_status st = idx_read(f, buf + got, cap - got, &chunk);
    if (st != TT_OK) {
      free(buf);
      return st;
    }
    got += chunk;
    if (got < cap) break; /* end of file */
  }
  if (got < n) {
    int is_io;
    const char *why = read_error(f, &is_io);
    free(buf);
    return fail(f->err, f->err_len, TT_DATA_LOSS, "%s: truncated: %zu of %" PRIu64 " bytes of %s (%s)", f->path, got,
                n, what, why);
  }
  unsigned char extra[64];
  size_t more;
  tt_status st = idx_read(f, extra, sizeof(extra), &more); /* also checks the gzip trailer */
  if (st != TT_OK) {
    free(buf);
    return st;
  }
  if (more) {
    free(buf);
    return fail(f->err, f->err_len, TT_DATA_LOSS, "%s: unexpected bytes after the %" PRIu64 " bytes of %s", f->path, n,
                what);
  }
  int zerr = Z_OK;
  gzerror(f->gz, &zerr);
  if (zerr == Z_BUF_ERROR) { /* all data there, but the gzip stream stops before its end */
    free(buf);
    return fail(f->err, f->err_len, TT_DATA_LOSS, "%s: truncated gzip stream (its checksum is missing)", f->path);
  }
  *out_bytes = buf;
  return TT_OK;
}

/* Opens an image file and checks its header; on success f stays open. */
static tt_status open_images(idx_file *f, const char *path, uint32_t *out_count, uint32_t *out_rows, uint32_t *out_cols,
                             char *err, size_t err_len) {
  tt_status st = idx_open(f, path, err, err_len);
  if (st != TT_OK) return st;
  uint32_t dims[3];
  st = idx_read_header(f, IDX_MAGIC_IMAGES, "images", dims, 3);
  if (st != TT_OK) return st;
  if (dims[1] < 1 || dims[1] > IDX_MAX_SIDE || dims[2] < 1 || dims[2] > IDX_MAX_SIDE)
    return fail(err, err_len, TT_DATA_LOSS, "%s: malformed: images of %" PRIu32 "x%" PRIu32 " (each side must be 1..%u)",
                path, dims[1], dims[2], IDX_MAX_SIDE);
  uint64_t pixels = (uint64_t)dims[0] * dims[1] * dims[2]; /* < 2^56: no overflow */
  if (pixels > IDX_MAX_PIXELS)
    return fail(err, err_len, TT_DATA_LOSS,
                "%s: malformed: %" PRIu32 " images of %" PRIu32 "x%" PRIu32 " is %" PRIu64
                " pixels, more than the limit of 2^31",
                path, dims[0], dims[1], dims[2], pixels);
  *out_count = dims[0];
  *out_rows = dims[1];
  *out_cols = dims[2];
  return TT_OK;
}

tt_status tt_dataset_load_idx(const char *images_path, const char *labels_path, tt_dataset **out_dataset, char *err,
                              size_t err_len) {
  if (err && err_len) err[0] = '\0';
  if (!out_dataset) return fail(err, err_len, TT_INVALID_ARGUMENT, "tt_dataset_load_idx: out_dataset is NULL");
  *out_dataset = NULL;
  if (!images_path || !labels_path)
    return fail(err, err_len, TT_INVALID_ARGUMENT, "tt_dataset_load_idx: %s path is NULL",
                images_path ? "labels" : "images");

  idx_file images = {0}, labels = {0};
  unsigned char *pixel_bytes = NULL, *label_bytes = NULL;
  tt_dataset *ds = NULL;
  uint32_t count = 0, rows = 0, cols = 0, n_labels = 0;
  tt_status st = open_images(&images, images_path, &count, &rows, &cols, err, err_len);
  if (st != TT_OK) goto done;
  st = idx_open(&labels, labels_path, err, err_len);
  if (st != TT_OK) goto done;
  st = idx_read_header(&labels, IDX_MAGIC_LABELS, "labels", &n_labels, 1);
  if (st != TT_OK) goto done;
  if (n_labels != count) {
    st = fail(err, err_len, TT_INVALID_ARGUMENT, "%s has %" PRIu32 " images but %s has %" PRIu32 " labels", images_path,
              count, labels_path, n_labels);
    goto done;
  }
  uint64_t pixels = (uint64_t)count * rows * cols;
  st = idx_read_payload(&images, pixels, "pixels", &pixel_bytes);
  if (st != TT_OK) goto done;
  st = idx_read_payload(&labels, count, "labels", &label_bytes);
  if (st != TT_OK) goto done;

  ds = calloc(1, sizeof(*ds));
  if (ds) {
    ds->images = malloc(pixels ? (size_t)pixels * sizeof(float) : sizeof(float));
    ds->labels = malloc(count ? (size_t)count * sizeof(int32_t) : sizeof(int32_t));
  }
  if (!ds || !ds->images || !ds->labels) {
    st = fail(err, err_len, TT_RESOURCE_EXHAUSTED, "%s: out of memory for %" PRIu64 " pixels", images_path, pixels);
    goto done;
  }
  float scale[256];
  for (int v = 0; v < 256; v++) scale[v] = (float)v / 255.0f;
  for (uint64_t i = 0; i < pixels; i++) ds->images[i] = scale[pixel_bytes[i]];
  for (uint32_t i = 0; i < count; i++) ds->labels[i] = label_bytes[i];
  ds->count = count;
  ds->rows = (int)rows;
  ds->cols = (int)cols;
  *out_dataset = ds;
  ds = NULL;

done:
  tt_dataset_free(ds);
  free(pixel_bytes);
  free(label_bytes);
  idx_close(&images);
  idx_close(&labels);
  return st;
}

tt_status tt_dataset_load_fashion_mnist(const char *dir, int train, tt_dataset **out_dataset, char *err,
                                        size_t err_len) {
  if (err && err_len) err[0] = '\0';
  if (!out_dataset)
    return fail(err, err_len, TT_INVALID_ARGUMENT, "tt_dataset_load_fashion_mnist: out_dataset is NULL");
  *out_dataset = NULL;
  if (!dir) dir = FASHION_MNIST_DIR;
  const char *prefix = train ? "train" : "t10k";
  char images_path[4096], labels_path[4096];
  int a = snprintf(images_path, sizeof(images_path), "%s/%s-images-idx3-ubyte.gz", dir, prefix);
  int b = snprintf(labels_path, sizeof(labels_path), "%s/%s-labels-idx1-ubyte.gz", dir, prefix);
  if (a < 0 || b < 0 || (size_t)a >= sizeof(images_path) || (size_t)b >= sizeof(labels_path))
    return fail(err, err_len, TT_INVALID_ARGUMENT, "tt_dataset_load_fashion_mnist: directory name too long");
  return tt_dataset_load_idx(images_path, labels_path, out_dataset, err, err_len);
}

void tt_dataset_free(tt_dataset *dataset) {
  if (!dataset) return;
  free(dataset->images);
  free(dataset->labels);
  free(dataset);
}
