/* runtime/wire/safetensors.h, the format code ttd and libttclient share, without a daemon:
 * headers built and read back (offsets, metadata, F32/BF16/I32, the atomic file write), and
 * every refusal of a bad header or a bad entry to build. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file_io.h"
#include "suites.h"
#include "wire/safetensors.h"

static char dir[64];

static void setup(void) {
  snprintf(dir, sizeof(dir), "/tmp/ttd-sth-XXXXXX");
  ck_assert_msg(mkdtemp(dir) != NULL, "mkdtemp: %s", strerror(errno));
}

static void teardown(void) {
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  if (system(cmd) != 0) { /* best effort */
  }
}

/* dir/name in a static buffer; the last two results stay valid. */
static const char *in_dir(const char *name) {
  static char paths[2][256];
  static int next;
  char *path = paths[next++ % 2];
  snprintf(path, sizeof(paths[0]), "%s/%s", dir, name);
  return path;
}

/* A new file at path holding len bytes of data. */
static void write_bytes(const char *path, const void *data, size_t len) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ck_assert_msg(fd >= 0, "open %s: %s", path, strerror(errno));
  ttd_status_t status = ttd_write_all(fd, data, len);
  ck_assert_msg(status == TTD_OK, "write %s: %s", path, ttd_status_message(status));
  ck_assert_int_eq(close(fd), 0);
}

/* Reads the header of path as if the file had file_size bytes (0: its real size). */
static ttd_status_t read_path(const char *path, uint64_t file_size, ttd_st_header *out) {
  int fd = open(path, O_RDONLY);
  ck_assert_msg(fd >= 0, "open %s: %s", path, strerror(errno));
  struct stat sb;
  ck_assert_int_eq(fstat(fd, &sb), 0);
  ttd_status_t status = ttd_safetensors_read_header(fd, file_size ? file_size : (uint64_t)sb.st_size, out);
  close(fd);
  return status;
}

/* Reading path (as read_path) fails with code and a message holding want; returns whether
 * the message starts "not a valid safetensors file: ". */
static int expect_read_fails(const char *path, uint64_t file_size, ttd_code code, const char *want) {
  ttd_st_header h;
  ttd_status_t status = read_path(path, file_size, &h);
  ck_assert_msg(status != TTD_OK, "%s was accepted", path);
  const char *msg = ttd_status_message(status);
  ck_assert_msg(ttd_status_code(status) == code, "code %s, message '%s'", ttd_code_name(ttd_status_code(status)), msg);
  ck_assert_msg(strstr(msg, want) != NULL, "message '%s' lacks '%s'", msg, want);
  int prefixed = strncmp(msg, "not a valid safetensors file: ", 30) == 0;
  ttd_status_free(status);
  ttd_safetensors_header_clear(&h);
  return prefixed;
}

/* Reading a file of the 8-byte length of json, json, then data_len zero bytes fails with
 * DATA_LOSS "not a valid safetensors file: ..." holding want. */
static void expect_corrupt(const char *json, size_t data_len, const char *want) {
  size_t hlen = strlen(json);
  unsigned char *buf = calloc(1, 8 + hlen + data_len);
  for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
  memcpy(buf + 8, json, hlen);
  const char *path = in_dir("bad.safetensors");
  write_bytes(path, buf, 8 + hlen + data_len);
  free(buf);
  ck_assert(expect_read_fails(path, 0, GRPC_STATUS_DATA_LOSS, want));
}

/* Building entries fails with INVALID_ARGUMENT holding want, and hands out no buffer. */
static void expect_build_fails(ttd_st_entry *entries, int n, const char *const *metadata, int n_metadata,
                               const char *want) {
  char *header = (char *)0x1;
  size_t len = 7;
  ttd_status_t status = ttd_safetensors_build_header(entries, n, metadata, n_metadata, &header, &len);
  ck_assert_int_eq(ttd_status_code(status), GRPC_STATUS_INVALID_ARGUMENT);
  ck_assert_msg(strstr(ttd_status_message(status), want) != NULL, "message '%s' lacks '%s'",
                ttd_status_message(status), want);
  ck_assert_ptr_null(header);
  ck_assert_uint_eq(len, 0);
  ttd_status_free(status);
}

/* The format's names of ttd's dtypes, and none for the rest. */
START_TEST(test_dtype_names) {
  ck_assert_str_eq(ttd_safetensors_dtype_name(TTD_DTYPE_FLOAT32), "F32");
  ck_assert_str_eq(ttd_safetensors_dtype_name(TTD_DTYPE_BFLOAT16), "BF16");
  ck_assert_str_eq(ttd_safetensors_dtype_name(TTD_DTYPE_INT32), "I32");
  ck_assert_ptr_null(ttd_safetensors_dtype_name(TTD_DTYPE_INVALID));
  ck_assert_ptr_null(ttd_safetensors_dtype_name((ttd_dtype)99));
}
END_TEST

/* Build then read: the offsets tile the data in order, the JSON is padded to 8 bytes, and
 * names, dtypes, shapes, offsets and metadata come back; find and metadata look up by name. */
START_TEST(test_build_read_round_trip) {
  ttd_st_entry entries[3] = {
      {.name = "layer.w", .dtype = TTD_DTYPE_FLOAT32, .ndim = 2, .shape = {2, 3}},
      {.name = "layer.b", .dtype = TTD_DTYPE_BFLOAT16, .ndim = 1, .shape = {5}},
      {.name = "step", .dtype = TTD_DTYPE_INT32, .ndim = 0},
  };
  const char *metadata[] = {"format", "pt", "epoch", "3"};
  char *header = NULL;
  size_t len = 0;
  ttd_status_t status = ttd_safetensors_build_header(entries, 3, metadata, 2, &header, &len);
  ck_assert_msg(status == TTD_OK, "%s", ttd_status_message(status));
  ck_assert_uint_eq(entries[0].begin, 0);
  ck_assert_uint_eq(entries[0].end, 24);
  ck_assert_uint_eq(entries[1].begin, 24);
  ck_assert_uint_eq(entries[1].end, 34);
  ck_assert_uint_eq(entries[2].begin, 34);
  ck_assert_uint_eq(entries[2].end, 38);
  ck_assert_uint_eq(len % 8, 0);
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = (n << 8) | (unsigned char)header[i];
  ck_assert_uint_eq(n, len - 8);
  ck_assert_int_eq(header[8], '{');
  ck_assert_int_eq(header[len - 1] == ' ' || header[len - 1] == '}', 1);

  unsigned char data[38];
  for (size_t i = 0; i < sizeof(data); i++) data[i] = (unsigned char)i;
  unsigned char *file = malloc(len + sizeof(data));
  memcpy(file, header, len);
  memcpy(file + len, data, sizeof(data));
  free(header);
  const char *path = in_dir("ok.safetensors");
  write_bytes(path, file, len + sizeof(data));
  free(file);

  ttd_st_header h;
  status = read_path(path, 0, &h);
  ck_assert_msg(status == TTD_OK, "%s", ttd_status_message(status));
  ck_assert_int_eq(h.count, 3);
  ck_assert_uint_eq(h.data_start, len);
  for (int i = 0; i < 3; i++) {
    ck_assert_str_eq(h.entries[i].name, entries[i].name);
    ck_assert_int_eq(h.entries[i].dtype, entries[i].dtype);
    ck_assert_str_eq(h.entries[i].dtype_name, ttd_safetensors_dtype_name(entries[i].dtype));
    ck_assert_int_eq(h.entries[i].ndim, entries[i].ndim);
    for (int d = 0; d < entries[i].ndim; d++) ck_assert_int_eq(h.entries[i].shape[d], entries[i].shape[d]);
    ck_assert_uint_eq(h.entries[i].begin, entries[i].begin);
    ck_assert_uint_eq(h.entries[i].end, entries[i].end);
    ck_assert_ptr_eq(ttd_safetensors_find(&h, entries[i].name), &h.entries[i]);
  }
  ck_assert_ptr_null(ttd_safetensors_find(&h, "layer"));
  ck_assert_ptr_null(ttd_safetensors_find(&h, NULL));
  ck_assert_str_eq(ttd_safetensors_metadata(&h, "format"), "pt");
  ck_assert_str_eq(ttd_safetensors_metadata(&h, "epoch"), "3");
  ck_assert_ptr_null(ttd_safetensors_metadata(&h, "absent"));

  int fd = open(path, O_RDONLY);
  unsigned char got[10];
  status = ttd_read_all_at(fd, got, 10, h.data_start + h.entries[1].begin);
  ck_assert_msg(status == TTD_OK, "%s", ttd_status_message(status));
  ck_assert_mem_eq(got, data + 24, 10);
  close(fd);
  ttd_safetensors_header_clear(&h);
  ck_assert_ptr_null(h.json);
  ttd_safetensors_header_clear(&h); /* twice is fine */
  ttd_safetensors_header_clear(NULL);
}
END_TEST

/* No tensors and no metadata: "{}" padded, which reads back empty. */
START_TEST(test_empty_round_trip) {
  char *header = NULL;
  size_t len = 0;
  ck_assert_ptr_null(ttd_safetensors_build_header(NULL, 0, NULL, 0, &header, &len));
  ck_assert_uint_eq(len, 16);
  ck_assert_mem_eq(header + 8, "{}      ", 8);
  const char *path = in_dir("empty.safetensors");
  write_bytes(path, header, len);
  free(header);
  ttd_st_header h;
  ck_assert_ptr_null(read_path(path, 0, &h));
  ck_assert_int_eq(h.count, 0);
  ck_assert_ptr_null(ttd_safetensors_find(&h, "x"));
  ck_assert_ptr_null(ttd_safetensors_metadata(&h, "x"));
  ttd_safetensors_header_clear(&h);
}
END_TEST

/* write_file puts header and data at path, leaves no PATH.tmp, and replaces an old file. */
START_TEST(test_write_file) {
  const char *path = in_dir("w.safetensors");
  write_bytes(path, "old", 3);
  float w[2] = {1.5f, -2.0f};
  uint16_t bf[3] = {0x3f80, 0x4000, 0xc040};
  int32_t idx[1] = {7};
  ttd_st_entry entries[3] = {
      {.name = "w", .dtype = TTD_DTYPE_FLOAT32, .ndim = 1, .shape = {2}},
      {.name = "bf", .dtype = TTD_DTYPE_BFLOAT16, .ndim = 2, .shape = {1, 3}},
      {.name = "idx", .dtype = TTD_DTYPE_INT32, .ndim = 1, .shape = {1}},
  };
  const void *data[] = {w, bf, idx};
  const char *metadata[] = {"k", "v"};
  ttd_status_t status = ttd_safetensors_write_file(path, entries, 3, metadata, 1, data);
  ck_assert_msg(status == TTD_OK, "%s", ttd_status_message(status));
  ck_assert_int_eq(access(in_dir("w.safetensors.tmp"), F_OK), -1);
  ttd_st_header h;
  status = read_path(path, 0, &h);
  ck_assert_msg(status == TTD_OK, "%s", ttd_status_message(status));
  ck_assert_int_eq(h.count, 3);
  ck_assert_str_eq(ttd_safetensors_metadata(&h, "k"), "v");
  const ttd_st_entry *e = ttd_safetensors_find(&h, "bf");
  ck_assert_ptr_nonnull(e);
  ck_assert_str_eq(e->dtype_name, "BF16");
  uint16_t got_bf[3];
  int32_t got_idx;
  int fd = open(path, O_RDONLY);
  ck_assert_ptr_null(ttd_read_all_at(fd, got_bf, sizeof(got_bf), h.data_start + e->begin));
  ck_assert_mem_eq(got_bf, bf, sizeof(bf));
  e = ttd_safetensors_find(&h, "idx");
  ck_assert_ptr_null(ttd_read_all_at(fd, &got_idx, 4, h.data_start + e->begin));
  ck_assert_int_eq(got_idx, 7);
  close(fd);
  ttd_safetensors_header_clear(&h);
}
END_TEST

/* write_file into a missing folder is UNAVAILABLE naming PATH.tmp and the errno text; a
 * refused entry writes nothing. */
START_TEST(test_write_file_fails) {
  ttd_st_entry e = {.name = "x", .dtype = TTD_DTYPE_INT32, .ndim = 0};
  int32_t v = 1;
  const void *data[] = {&v};
  ttd_status_t status = ttd_safetensors_write_file(in_dir("no/such.safetensors"), &e, 1, NULL, 0, data);
  ck_assert_int_eq(ttd_status_code(status), GRPC_STATUS_UNAVAILABLE);
  ck_assert_ptr_nonnull(strstr(ttd_status_message(status), "cannot create '"));
  ck_assert_ptr_nonnull(strstr(ttd_status_message(status), "no/such.safetensors.tmp"));
  ck_assert_ptr_nonnull(strstr(ttd_status_message(status), strerror(ENOENT)));
  ttd_status_free(status);
  e.dtype = TTD_DTYPE_INVALID;
  status = ttd_safetensors_write_file(in_dir("x.safetensors"), &e, 1, NULL, 0, data);
  ck_assert_int_eq(ttd_status_code(status), GRPC_STATUS_INVALID_ARGUMENT);
  ttd_status_free(status);
  ck_assert_int_eq(access(in_dir("x.safetensors"), F_OK), -1);
  ck_assert_int_eq(access(in_dir("x.safetensors.tmp"), F_OK), -1);
}
END_TEST

/* Empty, NULL, repeated, reserved and non-UTF-8 names are refused naming the entry. */
START_TEST(test_build_refuses_names) {
  ttd_st_entry two[2] = {{.name = "a", .dtype = TTD_DTYPE_FLOAT32}, {.name = "a", .dtype = TTD_DTYPE_FLOAT32}};
  expect_build_fails(two, 2, NULL, 0, "'a' is given twice (at 1)");
  two[1].name = "";
  expect_build_fails(two, 2, NULL, 0, "name 1 is empty");
  two[0].name = NULL;
  expect_build_fails(two, 2, NULL, 0, "name 0 is NULL");
  two[0].name = "__metadata__";
  expect_build_fails(two, 2, NULL, 0, "reserves");
  two[0].name = "ok";
  two[1].name = "\xff";
  expect_build_fails(two, 2, NULL, 0, "tensor name 1 is not valid UTF-8");
}
END_TEST

/* A dtype without a name, a negative dim, too many dims, bad metadata and bad counts are refused. */
START_TEST(test_build_refuses_entries) {
  ttd_st_entry e = {.name = "x", .dtype = TTD_DTYPE_INVALID};
  expect_build_fails(&e, 1, NULL, 0, "has dtype 0, which has no safetensors name");
  e.dtype = (ttd_dtype)42;
  expect_build_fails(&e, 1, NULL, 0, "has dtype 42");
  e.dtype = TTD_DTYPE_FLOAT32;
  e.ndim = 2;
  e.shape[0] = 3;
  e.shape[1] = -1;
  expect_build_fails(&e, 1, NULL, 0, "dim 1 of tensor 'x' is -1");
  e.ndim = TTD_SAFETENSORS_MAX_DIMS + 1;
  expect_build_fails(&e, 1, NULL, 0, "has 9 dims");
  e.ndim = 2;
  e.shape[0] = e.shape[1] = INT64_MAX / 2;
  expect_build_fails(&e, 1, NULL, 0, "more than 2^63 bytes");
  e.ndim = 0;
  const char *bad_value[] = {"k", "\xfe"};
  expect_build_fails(&e, 1, bad_value, 1, "metadata value of 'k' is not valid UTF-8");
  const char *null_key[] = {NULL, "v"};
  expect_build_fails(&e, 1, null_key, 1, "NULL key");
  expect_build_fails(&e, -1, NULL, 0, "n >= 0");
  expect_build_fails(NULL, 1, NULL, 0, "no entries");
  expect_build_fails(&e, 1, NULL, 1, "no metadata");
}
END_TEST

/* Files shorter than the length prefix, or whose header length passes the file's end or the
 * 100,000,000-byte cap, are DATA_LOSS; a file shorter than its size said (it shrank while
 * being read) is UNAVAILABLE. */
START_TEST(test_read_refuses_lengths) {
  const char *path = in_dir("short.safetensors");
  write_bytes(path, "\x02\0\0", 3);
  ck_assert(expect_read_fails(path, 0, GRPC_STATUS_DATA_LOSS, "3 bytes, fewer than the 8-byte header length"));
  unsigned char prefix[10] = {0xe8, 0x03}; /* 1000 */
  write_bytes(path, prefix, sizeof(prefix));
  ck_assert(expect_read_fails(path, 0, GRPC_STATUS_DATA_LOSS, "1000 bytes, past the end of the 10-byte file"));
  /* 100,000,001 bytes, with a file size said to be large enough: refused before reading */
  uint64_t n = TTD_SAFETENSORS_MAX_HEADER + 1ull;
  for (int i = 0; i < 8; i++) prefix[i] = (unsigned char)(n >> (8 * i));
  write_bytes(path, prefix, 8);
  ck_assert(expect_read_fails(path, 8 + n + 100, GRPC_STATUS_DATA_LOSS, "100000001 bytes, over the 100000000-byte"));
  /* says 16 bytes of header in a file said to have 24, which has 8 */
  write_bytes(path, (unsigned char[8]){16}, 8);
  ck_assert(!expect_read_fails(path, 24, GRPC_STATUS_UNAVAILABLE, "shrank"));
}
END_TEST

/* Headers the reader refuses as DATA_LOSS, and what the message says: bad JSON, entries or
 * metadata of the wrong shape, unknown dtypes, sizes that disagree with shapes, and byte
 * ranges that do not tile the data (overlap, gap, trailing bytes, truncated data). */
#define I32_AT(NAME, N, BEGIN, END) \
  "\"" NAME "\":{\"dtype\":\"I32\",\"shape\":[" #N "],\"data_offsets\":[" #BEGIN "," #END "]}"
static const struct {
  const char *json;
  size_t data_len;
  const char *want;
} corrupt_cases[] = {
    {"{\"a\": ", 0, "the header is not valid JSON"},
    {"[1, 2]", 0, "JSON but not an object"},
    {"{" I32_AT("a", 1, 0, 4) "," I32_AT("a", 1, 4, 8) "}", 8, "not valid JSON"}, /* duplicate key */
    {"{" I32_AT("", 1, 0, 4) "}", 4, "empty name"},
    {"{\"a\":5}", 0, "'a' is not a JSON object"},
    {"{\"a\":{\"shape\":[],\"data_offsets\":[0,4]}}", 4, "no \"dtype\" string"},
    {"{" I32_AT("a", -1, 0, 4) "}", 4, "dim 0 of the shape"},
    {"{\"a\":{\"dtype\":\"I32\",\"shape\":[],\"data_offsets\":[4]}}", 4, "not [begin, end]"},
    {"{" I32_AT("a", 0, 4, 0) "}", 4, "begin is past end"},
    {"{\"__metadata__\":[]}", 0, "\"__metadata__\" is not a JSON object"},
    {"{\"__metadata__\":{\"k\":1}}", 0, "value of 'k' is not a string"},
    {"{\"a\":{\"dtype\":\"Q7\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
     "dtype \"Q7\", which safetensors does not define"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
     "'a' (F32, 3 elements) needs 12 bytes but its data_offsets [0, 8] hold 8"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 8,
     "overflows 64 bits"},
    {"{" I32_AT("a", 2, 0, 8) "," I32_AT("b", 2, 4, 12) "}", 12, "tensors 'a' [0, 8) and 'b' [4, 12) overlap"},
    {"{" I32_AT("a", 1, 0, 4) "," I32_AT("b", 1, 8, 12) "}", 12, "bytes [4, 8) of the data buffer belong to no tensor"},
    {"{" I32_AT("a", 1, 0, 4) "}", 6, "2 bytes after the last tensor ('a' ends at 4 of 6)"},
    {"{" I32_AT("a", 2, 0, 8) "}", 5, "past the end of the 5-byte data buffer"},
    {"{}", 3, "3 data bytes follow a header with no tensors"},
};

/* One malformed header of corrupt_cases is refused saying what is wrong. */
START_TEST(test_read_refuses_corrupt) {
  expect_corrupt(corrupt_cases[_i].json, corrupt_cases[_i].data_len, corrupt_cases[_i].want);
}
END_TEST

/* Types ttd does not load open with dtype 0, and more than 8 dims keep the count. */
START_TEST(test_read_foreign_dtype_and_dims) {
  const char *json = "{\"pos\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]},"
                     "\"deep\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1,2],\"data_offsets\":[16,18]}}";
  size_t hlen = strlen(json);
  unsigned char buf[512] = {0};
  for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
  memcpy(buf + 8, json, hlen);
  const char *path = in_dir("foreign.safetensors");
  write_bytes(path, buf, 8 + hlen + 18);
  ttd_st_header h;
  ttd_status_t status = read_path(path, 0, &h);
  ck_assert_msg(status == TTD_OK, "%s", ttd_status_message(status));
  const ttd_st_entry *e = ttd_safetensors_find(&h, "pos");
  ck_assert_int_eq(e->dtype, TTD_DTYPE_INVALID);
  ck_assert_str_eq(e->dtype_name, "I64");
  e = ttd_safetensors_find(&h, "deep");
  ck_assert_int_eq(e->ndim, 10);
  ck_assert_int_eq(e->shape[7], 1);
  ttd_safetensors_header_clear(&h);
}
END_TEST

Suite *safetensors_header_suite(void) {
  Suite *s = suite_create("safetensors_header");
  TCase *tc = tcase_create("build_read");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_dtype_names);
  tcase_add_test(tc, test_build_read_round_trip);
  tcase_add_test(tc, test_empty_round_trip);
  tcase_add_test(tc, test_write_file);
  tcase_add_test(tc, test_write_file_fails);
  suite_add_tcase(s, tc);
  tc = tcase_create("refusals");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_build_refuses_names);
  tcase_add_test(tc, test_build_refuses_entries);
  tcase_add_test(tc, test_read_refuses_lengths);
  tcase_add_loop_test(tc, test_read_refuses_corrupt, 0, (int)(sizeof(corrupt_cases) / sizeof(corrupt_cases[0])));
  tcase_add_test(tc, test_read_foreign_dtype_and_dims);
  suite_add_tcase(s, tc);
  return s;
}
