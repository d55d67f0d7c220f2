/* client/data/dataset_idx.c: IDX files written here with zlib (gzip and plain) read back exactly;
 * every malformed input (missing, bad magic, truncated header or data, trailing bytes,
 * corrupt gzip, mismatched counts, absurd dimensions) is an error with a message naming the
 * file; and the installed Fashion-MNIST loads with its known counts. */
#include <check.h>
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "ttclient.h"
#include "suites.h"

#define FASHION_DIR "/usr/share/datasets/fashion-mnist"

static char tmp_dir[256];

/* A fresh directory under $TMPDIR (default /tmp) for each test's files. */
static void setup(void) {
  const char *base = getenv("TMPDIR");
  int n = snprintf(tmp_dir, sizeof(tmp_dir), "%s/check_dataset.XXXXXX", base && *base ? base : "/tmp");
  ck_assert_int_lt(n, (int)sizeof(tmp_dir) - 64);
  ck_assert_ptr_nonnull(mkdtemp(tmp_dir));
}

static void teardown(void) {
  DIR *d = opendir(tmp_dir);
  if (!d) return;
  struct dirent *e;
  char path[512];
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    snprintf(path, sizeof(path), "%s/%s", tmp_dir, e->d_name);
    if (rmdir(path) != 0) unlink(path);
  }
  closedir(d);
  rmdir(tmp_dir);
}

/* The full path of name in the temporary directory (a static buffer per slot). */
static const char *tmp_path(int slot, const char *name) {
  static char paths[4][384];
  snprintf(paths[slot], sizeof(paths[slot]), "%s/%s", tmp_dir, name);
  return paths[slot];
}

/* Writes n bytes to name, gzip-compressed or plain; returns the path (slot as tmp_path). */
static const char *write_file(int slot, const char *name, const unsigned char *bytes, size_t n, int gzip) {
  const char *path = tmp_path(slot, name);
  if (gzip) {
    gzFile gz = gzopen(path, "wb");
    ck_assert_ptr_nonnull(gz);
    if (n) ck_assert_int_eq(gzwrite(gz, bytes, (unsigned)n), (int)n);
    ck_assert_int_eq(gzclose(gz), Z_OK);
  } else {
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    if (n) ck_assert_uint_eq(fwrite(bytes, 1, n, f), n);
    ck_assert_int_eq(fclose(f), 0);
  }
  return path;
}

static void put_be32(unsigned char *b, uint32_t v) {
  b[0] = (unsigned char)(v >> 24);
  b[1] = (unsigned char)(v >> 16);
  b[2] = (unsigned char)(v >> 8);
  b[3] = (unsigned char)v;
}

/* The pixel value of image i at (r, c) in the small test files: covers 0 and 255. */
static unsigned char pixel_at(uint32_t i, uint32_t r, uint32_t c, uint32_t cols) {
  uint32_t k = (i * 7 + r) * cols + c;
  return k == 0 ? 0 : k == 1 ? 255 : (unsigned char)(k * 37 + 11);
}

/* An IDX3 image file in memory (free it): header with magic, then count*rows*cols pixels
 * (pixel_at), of which only data_bytes are kept when data_bytes >= 0. */
static unsigned char *make_images(uint32_t magic, uint32_t count, uint32_t rows, uint32_t cols, long data_bytes,
                                  size_t *out_n) {
  size_t pixels = (size_t)count * rows * cols;
  size_t keep = data_bytes >= 0 ? (size_t)data_bytes : pixels;
  unsigned char *b = calloc(16 + keep + 1, 1);
  ck_assert_ptr_nonnull(b);
  put_be32(b, magic);
  put_be32(b + 4, count);
  put_be32(b + 8, rows);
  put_be32(b + 12, cols);
  size_t k = 0;
  for (uint32_t i = 0; i < count && k < keep; i++)
    for (uint32_t r = 0; r < rows && k < keep; r++)
      for (uint32_t c = 0; c < cols && k < keep; c++) b[16 + k++] = pixel_at(i, r, c, cols);
  *out_n = 16 + keep;
  return b;
}

/* An IDX1 label file in memory (free it): labels[i] = (i * 3 + 7) % 256 except label 1 = 255. */
static unsigned char *make_labels(uint32_t magic, uint32_t count, long data_bytes, size_t *out_n) {
  size_t keep = data_bytes >= 0 ? (size_t)data_bytes : count;
  unsigned char *b = calloc(8 + keep + 1, 1);
  ck_assert_ptr_nonnull(b);
  put_be32(b, magic);
  put_be32(b + 4, count);
  for (size_t i = 0; i < keep; i++) b[8 + i] = i == 1 ? 255 : (unsigned char)(i * 3 + 7);
  *out_n = 8 + keep;
  return b;
}

static int32_t label_at(size_t i) { return i == 1 ? 255 : (int32_t)((i * 3 + 7) % 256); }

/* Writes an image file and a label file (gzip or plain each) of count images rows x cols. */
static void write_pair(uint32_t count, uint32_t rows, uint32_t cols, int gzip_images, int gzip_labels,
                       const char **out_images, const char **out_labels) {
  size_t n;
  unsigned char *b = make_images(0x803, count, rows, cols, -1, &n);
  *out_images = write_file(0, "images", b, n, gzip_images);
  free(b);
  b = make_labels(0x801, count, -1, &n);
  *out_labels = write_file(1, "labels", b, n, gzip_labels);
  free(b);
}

/* Every pixel is its byte / 255.0f exactly and every label its byte. */
static void assert_contents(const tt_dataset *ds, uint32_t count, uint32_t rows, uint32_t cols) {
  ck_assert_int_eq(ds->count, count);
  ck_assert_int_eq(ds->rows, rows);
  ck_assert_int_eq(ds->cols, cols);
  ck_assert_ptr_nonnull(ds->images);
  ck_assert_ptr_nonnull(ds->labels);
  /* Counted, then asserted once: a Check assertion per pixel would take seconds. */
  size_t k = 0, bad_pixels = 0, first_bad = 0, bad_labels = 0;
  for (uint32_t i = 0; i < count; i++) {
    for (uint32_t r = 0; r < rows; r++)
      for (uint32_t c = 0; c < cols; c++, k++)
        if (ds->images[k] != (float)pixel_at(i, r, c, cols) / 255.0f && bad_pixels++ == 0) first_bad = k;
    bad_labels += ds->labels[i] != label_at(i);
  }
  ck_assert_msg(bad_pixels == 0, "%zu wrong pixels, the first at %zu: %.9g", bad_pixels, first_bad,
                bad_pixels ? ds->images[first_bad] : 0.0f);
  ck_assert_uint_eq(bad_labels, 0);
}

/* Loads a pair expecting failure with code; the message must contain each non-NULL needle. */
static void expect_error(const char *images, const char *labels, tt_status code, const char *needle1,
                         const char *needle2) {
  tt_dataset *ds = (tt_dataset *)(uintptr_t)1;
  char err[512] = "stale";
  tt_status st = tt_dataset_load_idx(images, labels, &ds, err, sizeof(err));
  ck_assert_msg(st == code, "status %s (%s), want %s", tt_status_name(st), err, tt_status_name(code));
  ck_assert_ptr_null(ds);
  if (needle1) ck_assert_msg(strstr(err, needle1) != NULL, "message \"%s\" lacks \"%s\"", err, needle1);
  if (needle2) ck_assert_msg(strstr(err, needle2) != NULL, "message \"%s\" lacks \"%s\"", err, needle2);
}

/* Gzip files of 5 images of 3x4 read back with exact /255 pixels, labels, and an empty err. */
START_TEST(test_gzip_roundtrip) {
  const char *images, *labels;
  write_pair(5, 3, 4, 1, 1, &images, &labels);
  tt_dataset *ds = NULL;
  char err[256] = "stale";
  ck_assert_int_eq(tt_dataset_load_idx(images, labels, &ds, err, sizeof(err)), TT_OK);
  ck_assert_str_eq(err, "");
  assert_contents(ds, 5, 3, 4);
  ck_assert(ds->images[0] == 0.0f);
  ck_assert(ds->images[1] == 1.0f);
  ck_assert_int_eq(ds->labels[1], 255);
  tt_dataset_free(ds);
}
END_TEST

/* Plain (uncompressed) files, and a plain/gzip mix, read the same as gzip ones. */
START_TEST(test_plain_and_mixed) {
  const char *images, *labels;
  tt_dataset *ds = NULL;
  write_pair(4, 2, 5, 0, 0, &images, &labels);
  ck_assert_int_eq(tt_dataset_load_idx(images, labels, &ds, NULL, 0), TT_OK);
  assert_contents(ds, 4, 2, 5);
  tt_dataset_free(ds);
  write_pair(6, 1, 1, 0, 1, &images, &labels);
  ck_assert_int_eq(tt_dataset_load_idx(images, labels, &ds, NULL, 0), TT_OK);
  assert_contents(ds, 6, 1, 1);
  tt_dataset_free(ds);
}
END_TEST

/* A larger gzip file (3000 images of 28x28, more than the first read chunk) reads back exactly. */
START_TEST(test_large_roundtrip) {
  const char *images, *labels;
  write_pair(3000, 28, 28, 1, 1, &images, &labels);
  tt_dataset *ds = NULL;
  ck_assert_int_eq(tt_dataset_load_idx(images, labels, &ds, NULL, 0), TT_OK);
  assert_contents(ds, 3000, 28, 28);
  tt_dataset_free(ds);
}
END_TEST

/* Zero examples is a valid file: count 0, non-NULL arrays. */
START_TEST(test_zero_count) {
  const char *images, *labels;
  write_pair(0, 28, 28, 1, 1, &images, &labels);
  tt_dataset *ds = NULL;
  ck_assert_int_eq(tt_dataset_load_idx(images, labels, &ds, NULL, 0), TT_OK);
  ck_assert_int_eq(ds->count, 0);
  ck_assert_int_eq(ds->rows, 28);
  ck_assert_ptr_nonnull(ds->images);
  ck_assert_ptr_nonnull(ds->labels);
  tt_dataset_free(ds);
}
END_TEST

/* A missing image or label file is NOT_FOUND, naming that file. */
START_TEST(test_missing_file) {
  const char *images, *labels;
  write_pair(2, 2, 2, 1, 1, &images, &labels);
  const char *nope = tmp_path(2, "nope.gz");
  expect_error(nope, labels, TT_NOT_FOUND, nope, "cannot open");
  expect_error(images, nope, TT_NOT_FOUND, nope, "cannot open");
  const char *deep = tmp_path(3, "no-such-dir/x.gz");
  expect_error(deep, labels, TT_NOT_FOUND, deep, NULL);
}
END_TEST

/* A directory given as a file is INVALID_ARGUMENT. */
START_TEST(test_directory) {
  const char *images, *labels;
  write_pair(2, 2, 2, 1, 1, &images, &labels);
  expect_error(tmp_dir, labels, TT_INVALID_ARGUMENT, tmp_dir, "directory");
}
END_TEST

/* A wrong magic (files swapped, another IDX type, garbage) is DATA_LOSS naming the magic. */
START_TEST(test_wrong_magic) {
  const char *images, *labels;
  write_pair(2, 2, 2, 1, 1, &images, &labels);
  expect_error(labels, images, TT_DATA_LOSS, "bad magic 0x00000801", "label file");
  size_t n;
  unsigned char *b = make_images(0x00000d03, 2, 2, 2, -1, &n); /* IDX of floats */
  const char *floats = write_file(2, "floats", b, n, 1);
  expect_error(floats, labels, TT_DATA_LOSS, "bad magic 0x00000d03", "unsigned bytes");
  free(b);
  unsigned char garbage[64];
  for (size_t i = 0; i < sizeof(garbage); i++) garbage[i] = (unsigned char)(i * 91 + 13);
  const char *g = write_file(2, "garbage", garbage, sizeof(garbage), 0);
  expect_error(g, labels, TT_DATA_LOSS, g, "bad magic");
  expect_error(images, g, TT_DATA_LOSS, g, "bad magic");
}
END_TEST

/* Headers cut short (empty file, part of the magic, part of the sizes) are DATA_LOSS. */
START_TEST(test_truncated_header) {
  const char *images, *labels;
  write_pair(2, 2, 2, 1, 1, &images, &labels);
  size_t n;
  unsigned char *b = make_images(0x803, 2, 2, 2, -1, &n);
  const char *short_images[] = {write_file(2, "empty", b, 0, 0), write_file(3, "three", b, 3, 1)};
  for (int i = 0; i < 2; i++) expect_error(short_images[i], labels, TT_DATA_LOSS, short_images[i], "truncated header");
  const char *ten = write_file(2, "ten", b, 10, 1);
  expect_error(ten, labels, TT_DATA_LOSS, ten, "truncated header: 10 of 16 bytes");
  free(b);
  b = make_labels(0x801, 2, -1, &n);
  const char *six = write_file(2, "six", b, 6, 0);
  expect_error(images, six, TT_DATA_LOSS, six, "truncated header: 6 of 8 bytes");
  free(b);
}
END_TEST

/* Data one byte short, labels short, and a gzip stream cut in half are DATA_LOSS. */
START_TEST(test_truncated_data) {
  const char *images, *labels;
  write_pair(4, 3, 3, 1, 1, &images, &labels);
  size_t n;
  unsigned char *b = make_images(0x803, 4, 3, 3, 35, &n);
  const char *short_images = write_file(2, "short_images", b, n, 1);
  expect_error(short_images, labels, TT_DATA_LOSS, short_images, "truncated: 35 of 36 bytes");
  free(b);
  b = make_labels(0x801, 4, 2, &n);
  const char *short_labels = write_file(2, "short_labels", b, n, 0);
  expect_error(images, short_labels, TT_DATA_LOSS, short_labels, "truncated: 2 of 4 bytes");
  free(b);

  /* A compressed file cut in the middle of its deflate stream. */
  b = make_images(0x803, 400, 28, 28, -1, &n);
  const char *whole = write_file(2, "whole.gz", b, n, 1);
  free(b);
  b = make_labels(0x801, 400, -1, &n);
  const char *labels400 = write_file(3, "labels400", b, n, 1);
  free(b);
  FILE *f = fopen(whole, "rb");
  ck_assert_ptr_nonnull(f);
  unsigned char gz[1 << 18];
  size_t gz_n = fread(gz, 1, sizeof(gz), f);
  fclose(f);
  ck_assert_uint_gt(gz_n, 100);
  ck_assert_uint_lt(gz_n, sizeof(gz));
  const char *cut = write_file(0, "cut.gz", gz, gz_n / 2, 0);
  expect_error(cut, labels400, TT_DATA_LOSS, cut, NULL);
  /* and one with only its 8-byte gzip trailer (CRC, size) missing */
  const char *no_trailer = write_file(0, "no_trailer.gz", gz, gz_n - 8, 0);
  expect_error(no_trailer, labels400, TT_DATA_LOSS, no_trailer, "checksum is missing");
}
END_TEST

/* Bytes after the announced data, and a gzip file whose CRC is wrong, are DATA_LOSS. */
START_TEST(test_trailing_and_corrupt) {
  const char *images, *labels;
  write_pair(3, 2, 2, 1, 1, &images, &labels);
  size_t n;
  unsigned char *b = make_images(0x803, 3, 2, 2, 13, &n); /* 12 pixels + 1 extra byte */
  const char *extra = write_file(2, "extra", b, n, 1);
  expect_error(extra, labels, TT_DATA_LOSS, extra, "unexpected bytes after the 12 bytes");
  free(b);

  b = make_images(0x803, 3, 2, 2, -1, &n);
  const char *good = write_file(2, "good.gz", b, n, 1);
  free(b);
  FILE *f = fopen(good, "rb");
  ck_assert_ptr_nonnull(f);
  unsigned char gz[256];
  size_t gz_n = fread(gz, 1, sizeof(gz), f);
  fclose(f);
  gz[gz_n - 8] ^= 0x55; /* the CRC-32 */
  const char *bad_crc = write_file(2, "bad_crc.gz", gz, gz_n, 0);
  expect_error(bad_crc, labels, TT_DATA_LOSS, bad_crc, "corrupt gzip");

  unsigned char fake[40] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3};
  for (size_t i = 10; i < sizeof(fake); i++) fake[i] = 0xff; /* an invalid deflate block */
  const char *broken = write_file(2, "broken.gz", fake, sizeof(fake), 0);
  expect_error(broken, labels, TT_DATA_LOSS, broken, NULL);
}
END_TEST

/* A label count different from the image count is INVALID_ARGUMENT naming both counts. */
START_TEST(test_count_mismatch) {
  size_t n;
  unsigned char *b = make_images(0x803, 3, 2, 2, -1, &n);
  const char *images = write_file(0, "images", b, n, 1);
  free(b);
  b = make_labels(0x801, 2, -1, &n);
  const char *labels = write_file(1, "labels", b, n, 1);
  free(b);
  expect_error(images, labels, TT_INVALID_ARGUMENT, "has 3 images", "has 2 labels");
}
END_TEST

/* Sides of 0 or over 4096, and counts making more than 2^31 pixels, fail fast as DATA_LOSS;
 * exactly 2^31 pixels announced in a header-only file fails as truncated, without
 * allocating gigabytes. */
START_TEST(test_absurd_dims) {
  struct {
    uint32_t count, rows, cols;
    const char *needle;
  } cases[] = {
      {10, 0, 28, "each side must be 1..4096"},         {10, 28, 0, "each side must be 1..4096"},
      {10, 4097, 28, "each side must be 1..4096"},      {10, 28, 0xffffffffu, "each side must be 1..4096"},
      {0xffffffffu, 28, 28, "more than the limit"},     {0xffffffffu, 4096, 4096, "more than the limit"},
      {(1u << 31) / 784 + 1, 28, 28, "more than the limit"},
  };
  size_t n;
  unsigned char *b = make_labels(0x801, 10, -1, &n);
  const char *labels = write_file(1, "labels", b, n, 1);
  free(b);
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    b = make_images(0x803, cases[i].count, cases[i].rows, cases[i].cols, 0, &n);
    const char *images = write_file(0, "images", b, n, i % 2);
    free(b);
    expect_error(images, labels, TT_DATA_LOSS, images, cases[i].needle);
  }
  /* in range but absent: labels and images agree on 2^19 examples of 64x64 */
  b = make_images(0x803, 1u << 19, 64, 64, 0, &n);
  const char *images = write_file(0, "images", b, n, 1);
  free(b);
  b = make_labels(0x801, 1u << 19, -1, &n);
  labels = write_file(1, "labels", b, n, 1);
  free(b);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  expect_error(images, labels, TT_DATA_LOSS, images, "truncated: 0 of 2147483648 bytes");
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double seconds = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
  ck_assert_double_lt(seconds, 2.0);
}
END_TEST

/* NULL arguments are INVALID_ARGUMENT; err may be NULL or short (then truncated, terminated);
 * tt_dataset_free(NULL) is a no-op. */
START_TEST(test_null_and_short_err) {
  const char *images, *labels;
  write_pair(2, 2, 2, 1, 1, &images, &labels);
  char err[128];
  ck_assert_int_eq(tt_dataset_load_idx(images, labels, NULL, err, sizeof(err)), TT_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err, "out_dataset"));
  tt_dataset *ds = (tt_dataset *)(uintptr_t)1;
  ck_assert_int_eq(tt_dataset_load_idx(NULL, labels, &ds, err, sizeof(err)), TT_INVALID_ARGUMENT);
  ck_assert_ptr_null(ds);
  ck_assert_ptr_nonnull(strstr(err, "images path is NULL"));
  ck_assert_int_eq(tt_dataset_load_idx(images, NULL, &ds, NULL, 0), TT_INVALID_ARGUMENT);
  ck_assert_int_eq(tt_dataset_load_fashion_mnist(tmp_dir, 1, NULL, NULL, 0), TT_INVALID_ARGUMENT);
  char tiny[8];
  memset(tiny, 'x', sizeof(tiny));
  ck_assert_int_eq(tt_dataset_load_idx(tmp_path(2, "absent"), labels, &ds, tiny, sizeof(tiny)), TT_NOT_FOUND);
  ck_assert_uint_eq(strlen(tiny), sizeof(tiny) - 1);
  ck_assert_int_eq(strncmp(tiny, tmp_dir, sizeof(tiny) - 1), 0);
  memset(tiny, 'x', sizeof(tiny));
  ck_assert_int_eq(tt_dataset_load_idx(tmp_path(2, "absent"), labels, &ds, tiny, 0), TT_NOT_FOUND);
  ck_assert_int_eq(tiny[0], 'x');
  tt_dataset_free(NULL);
}
END_TEST

/* tt_dataset_load_fashion_mnist reads train-* or t10k-* files from a given directory, and a
 * directory without them is NOT_FOUND naming the file. */
START_TEST(test_fashion_custom_dir) {
  char err[512];
  tt_dataset *ds = NULL;
  ck_assert_int_eq(tt_dataset_load_fashion_mnist(tmp_dir, 1, &ds, err, sizeof(err)), TT_NOT_FOUND);
  ck_assert_ptr_nonnull(strstr(err, "train-images-idx3-ubyte.gz"));
  ck_assert_int_eq(tt_dataset_load_fashion_mnist(tmp_dir, 0, &ds, err, sizeof(err)), TT_NOT_FOUND);
  ck_assert_ptr_nonnull(strstr(err, "t10k-images-idx3-ubyte.gz"));

  size_t n;
  const char *names[2][2] = {{"t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"},
                             {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"}};
  for (int train = 0; train < 2; train++) {
    uint32_t count = train ? 7 : 3;
    unsigned char *b = make_images(0x803, count, 28, 28, -1, &n);
    write_file(0, names[train][0], b, n, 1);
    free(b);
    b = make_labels(0x801, count, -1, &n);
    write_file(1, names[train][1], b, n, 1);
    free(b);
  }
  ck_assert_int_eq(tt_dataset_load_fashion_mnist(tmp_dir, 1, &ds, err, sizeof(err)), TT_OK);
  assert_contents(ds, 7, 28, 28);
  tt_dataset_free(ds);
  ck_assert_int_eq(tt_dataset_load_fashion_mnist(tmp_dir, 0, &ds, err, sizeof(err)), TT_OK);
  assert_contents(ds, 3, 28, 28);
  tt_dataset_free(ds);
}
END_TEST

/* Checks a real Fashion-MNIST split: count examples of 28x28, labels 0..9 each count/10
 * times, pixels in [0, 1] reaching both ends, and not all images alike. */
static void check_fashion(int train, int64_t count) {
  struct stat st;
  if (stat(FASHION_DIR, &st) != 0) return; /* not installed: scripts/install-deps.sh installs it */
  tt_dataset *ds = NULL;
  char err[512];
  tt_status status = tt_dataset_load_fashion_mnist(NULL, train, &ds, err, sizeof(err));
  ck_assert_msg(status == TT_OK, "%s", err);
  ck_assert_int_eq(ds->count, count);
  ck_assert_int_eq(ds->rows, 28);
  ck_assert_int_eq(ds->cols, 28);
  int64_t per_class[10] = {0}, out_of_range = 0;
  for (int64_t i = 0; i < ds->count; i++) {
    if (ds->labels[i] >= 0 && ds->labels[i] <= 9) per_class[ds->labels[i]]++;
    else out_of_range++;
  }
  ck_assert_int_eq(out_of_range, 0);
  for (int c = 0; c < 10; c++) ck_assert_int_eq(per_class[c], count / 10);
  float lo = INFINITY, hi = -INFINITY;
  double sum = 0;
  size_t pixels = (size_t)count * 28 * 28;
  for (size_t i = 0; i < pixels; i++) {
    float v = ds->images[i];
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
    sum += v;
  }
  ck_assert(lo == 0.0f); /* so every pixel is in [0, 1] */
  ck_assert(hi == 1.0f);
  double mean = sum / (double)pixels; /* Fashion-MNIST's mean pixel is about 0.286 */
  ck_assert_double_gt(mean, 0.25);
  ck_assert_double_lt(mean, 0.32);
  ck_assert_int_ne(memcmp(ds->images, ds->images + 784, 784 * sizeof(float)), 0);
  tt_dataset_free(ds);
}

/* The installed training split: 60000 examples, 6000 per class. */
START_TEST(test_fashion_train) { check_fashion(1, 60000); }
END_TEST

/* The installed test split: 10000 examples, 1000 per class. */
START_TEST(test_fashion_test) { check_fashion(0, 10000); }
END_TEST

Suite *dataset_suite(void) {
  Suite *s = suite_create("dataset");
  TCase *tc = tcase_create("idx");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_gzip_roundtrip);
  tcase_add_test(tc, test_plain_and_mixed);
  tcase_add_test(tc, test_large_roundtrip);
  tcase_add_test(tc, test_zero_count);
  tcase_add_test(tc, test_fashion_custom_dir);
  suite_add_tcase(s, tc);

  tc = tcase_create("bad_input");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_missing_file);
  tcase_add_test(tc, test_directory);
  tcase_add_test(tc, test_wrong_magic);
  tcase_add_test(tc, test_truncated_header);
  tcase_add_test(tc, test_truncated_data);
  tcase_add_test(tc, test_trailing_and_corrupt);
  tcase_add_test(tc, test_count_mismatch);
  tcase_add_test(tc, test_absurd_dims);
  tcase_add_test(tc, test_null_and_short_err);
  suite_add_tcase(s, tc);

  tc = tcase_create("fashion_mnist");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_fashion_train);
  tcase_add_test(tc, test_fashion_test);
  suite_add_tcase(s, tc);
  return s;
}
