/* Safetensors checkpoints (client/data/safetensors.c): round trips of every dtype, the exact bytes
 * of a small file, files written and read by Debian's python3 with only struct and json, every
 * kind of malformed file, and the save errors. Host tensors need a client, so a real ttd runs. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "suites.h"
#include "ttd_harness.h"

#define PYTHON "/usr/bin/python3"

static ttd_proc proc;
static tt_client *client;
static char dir[64];

static void setup(void) {
  ttd_proc_start(&proc, NULL);
  client = harness_connect(&proc, 1);
  snprintf(dir, sizeof(dir), "/tmp/ttd-st-XXXXXX");
  ck_assert_msg(mkdtemp(dir) != NULL, "mkdtemp: %s", strerror(errno));
}

static void teardown(void) {
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  if (system(cmd) != 0) { /* best effort */
  }
  tt_disconnect(client);
  ck_assert_int_eq(ttd_proc_stop(&proc), 0);
}

/* dir/name in a static buffer; the last four results stay valid. */
static const char *in_dir(const char *name) {
  static char paths[4][256];
  static int next;
  char *path = paths[next++ % 4];
  snprintf(path, sizeof(paths[0]), "%s/%s", dir, name);
  return path;
}

static void write_bytes(const char *path, const void *data, size_t len) {
  FILE *f = fopen(path, "wb");
  ck_assert_msg(f != NULL, "fopen %s: %s", path, strerror(errno));
  ck_assert_uint_eq(fwrite(data, 1, len, f), len);
  ck_assert_int_eq(fclose(f), 0);
}

/* The whole file into a new buffer (free it); its length in *out_len. */
static unsigned char *read_bytes(const char *path, size_t *out_len) {
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "fopen %s: %s", path, strerror(errno));
  static unsigned char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof(buf), f);
  fclose(f);
  unsigned char *copy = malloc(n ? n : 1);
  memcpy(copy, buf, n);
  *out_len = n;
  return copy;
}

/* A file of the 8-byte length of header, header, then data_len bytes of 0xAB. */
static void write_raw(const char *path, const char *header, size_t data_len) {
  size_t hlen = strlen(header);
  unsigned char *buf = malloc(8 + hlen + data_len);
  for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
  memcpy(buf + 8, header, hlen);
  memset(buf + 8 + hlen, 0xAB, data_len);
  write_bytes(path, buf, 8 + hlen + data_len);
  free(buf);
}

/* Opening path fails with code and a message holding want. */
static void expect_open_fails(const char *path, tt_status code, const char *want) {
  tt_safetensors *file = (tt_safetensors *)0x1;
  tt_status st = tt_safetensors_open(client, path, &file);
  ck_assert_msg(st == code, "open %s: got %s (%s), want %s", path, tt_status_name(st), tt_last_error(client),
                tt_status_name(code));
  ck_assert_ptr_null(file);
  ck_assert_int_eq(tt_errcode(client), code);
  ck_assert_msg(strstr(tt_last_error(client), want) != NULL, "message '%s' lacks '%s'", tt_last_error(client), want);
}

/* A header that must be refused as DATA_LOSS, with data_len bytes of data after it. */
static void expect_malformed(const char *header, size_t data_len, const char *want) {
  const char *path = in_dir("bad.safetensors");
  write_raw(path, header, data_len);
  expect_open_fails(path, TT_DATA_LOSS, want);
}

/* Runs python3 -c script path; returns its exit status (output goes to the test's). */
static int run_python(const char *script, const char *path) {
  ck_assert_msg(access(PYTHON, X_OK) == 0, "%s is needed: %s", PYTHON, strerror(errno));
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    execl(PYTHON, PYTHON, "-c", script, path, (char *)NULL);
    _exit(127);
  }
  int status;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static tt_tensor *host(tt_dtype dtype, const void *data, const int64_t *shape, int ndim) {
  tt_tensor *t = tt_tensor_from_host(client, data, dtype, shape, ndim);
  ck_assert_msg(t != NULL, "%s", tt_last_error(client));
  return t;
}

static tt_safetensors *open_ok(const char *path) {
  tt_safetensors *file = NULL;
  tt_status st = tt_safetensors_open(client, path, &file);
  ck_assert_msg(st == TT_OK, "open %s: %s %s", path, tt_status_name(st), tt_last_error(client));
  ck_assert_ptr_nonnull(file);
  return file;
}

/* The named tensor of file has dtype, shape and exactly the bytes want. */
static void expect_tensor(tt_safetensors *file, const char *name, tt_dtype dtype, const int64_t *shape, int ndim,
                          const void *want, size_t bytes) {
  tt_tensor *t = tt_safetensors_get(file, name);
  ck_assert_msg(t != NULL, "get %s: %s", name, tt_last_error(client));
  ck_assert_int_eq(tt_tensor_is_host(t), 1);
  ck_assert_ptr_eq(tt_tensor_client(t), client);
  ck_assert_int_eq(tt_tensor_dtype(t), dtype);
  ck_assert_int_eq(tt_tensor_ndim(t), ndim);
  for (int d = 0; d < ndim; d++) ck_assert_int_eq(tt_tensor_shape(t)[d], shape[d]);
  ck_assert_uint_eq(tt_tensor_nbytes(t), bytes);
  ck_assert_msg(bytes == 0 || memcmp(tt_tensor_data(t), want, bytes) == 0, "data of '%s' differs", name);
  tt_tensor_free(t);
}

/* float32 (random bits: NaNs, infinities, denormals), bfloat16, int32, an 8-d tensor, a 0-d
 * scalar and two empty tensors survive save and open bit for bit, listed in the order given. */
START_TEST(test_round_trip) {
  enum { N = 7 };
  float f32[3 * 5 * 7];
  uint16_t bf16[4 * 2];
  int32_t i32[10] = {0, 1, -1, INT32_MAX, INT32_MIN, 42, -42, 1 << 20, 7, 8};
  float eight[16];
  float scalar = 3.25f;
  harness_fill_random(f32, sizeof(f32), 1);
  harness_fill_random(bf16, sizeof(bf16), 2);
  harness_fill_random(eight, sizeof(eight), 3);
  const int64_t s_f32[] = {3, 5, 7}, s_bf16[] = {4, 2}, s_i32[] = {10}, s_eight[] = {1, 2, 1, 2, 1, 2, 1, 2},
                s_empty[] = {2, 0, 3}, s_empty_bf[] = {0};
  const char *names[N] = {"layers.1.weight", "emb", "layers.0.bias", "eight_d", "step", "empty", "a_empty_bf16"};
  tt_tensor *tensors[N] = {
      host(TT_FLOAT32, f32, s_f32, 3),  host(TT_BFLOAT16, bf16, s_bf16, 2),  host(TT_INT32, i32, s_i32, 1),
      host(TT_FLOAT32, eight, s_eight, 8), host(TT_FLOAT32, &scalar, NULL, 0), host(TT_INT32, NULL, s_empty, 3),
      host(TT_BFLOAT16, NULL, s_empty_bf, 1),
  };
  const char *path = in_dir("round.safetensors");
  tt_status st = tt_safetensors_save(client, path, names, tensors, N);
  ck_assert_msg(st == TT_OK, "save: %s %s", tt_status_name(st), tt_last_error(client));
  ck_assert_int_eq(access(in_dir("round.safetensors.tmp"), F_OK), -1);
  for (int i = 0; i < N; i++) tt_tensor_free(tensors[i]);

  tt_safetensors *file = open_ok(path);
  ck_assert_int_eq(tt_safetensors_count(file), N);
  for (int i = 0; i < N; i++) ck_assert_str_eq(tt_safetensors_name(file, i), names[i]);
  ck_assert_ptr_null(tt_safetensors_name(file, N));
  ck_assert_ptr_null(tt_safetensors_name(file, -1));
  expect_tensor(file, "layers.1.weight", TT_FLOAT32, s_f32, 3, f32, sizeof(f32));
  expect_tensor(file, "emb", TT_BFLOAT16, s_bf16, 2, bf16, sizeof(bf16));
  expect_tensor(file, "layers.0.bias", TT_INT32, s_i32, 1, i32, sizeof(i32));
  expect_tensor(file, "eight_d", TT_FLOAT32, s_eight, 8, eight, sizeof(eight));
  expect_tensor(file, "step", TT_FLOAT32, NULL, 0, &scalar, sizeof(scalar));
  expect_tensor(file, "empty", TT_INT32, s_empty, 3, NULL, 0);
  expect_tensor(file, "a_empty_bf16", TT_BFLOAT16, s_empty_bf, 1, NULL, 0);
  /* a tensor may be read twice, and stays valid after close */
  tt_tensor *again = tt_safetensors_get(file, "layers.0.bias");
  tt_safetensors_close(file);
  ck_assert_int_eq(((int32_t *)tt_tensor_data(again))[4], INT32_MIN);
  tt_tensor_free(again);
}
END_TEST

/* A two-tensor file is byte for byte the hand-written safetensors encoding: length, compact
 * JSON in the given order, space padding to 8 bytes, little-endian data. */
START_TEST(test_exact_bytes) {
  static const char expected[] =
      "\x70\0\0\0\0\0\0\0" /* header length 112, little-endian u64 */
      "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "\"n\":{\"dtype\":\"I32\",\"shape\":[],\"data_offsets\":[8,12]}}"
      "     "                                  /* 107 JSON bytes padded to 112 */
      "\x00\x00\x80\x3f" "\x00\x00\x00\xc0" /* 1.0f, -2.0f */
      "\x07\x00\x00\x00";                     /* 7 */
  float x[2] = {1.0f, -2.0f};
  int32_t seven = 7;
  const int64_t shape[1] = {2};
  const char *names[2] = {"x", "n"};
  tt_tensor *tensors[2] = {host(TT_FLOAT32, x, shape, 1), host(TT_INT32, &seven, NULL, 0)};
  const char *path = in_dir("tiny.safetensors");
  ck_assert_int_eq(tt_safetensors_save(NULL, path, names, tensors, 2), TT_OK);
  tt_tensor_free(tensors[0]);
  tt_tensor_free(tensors[1]);
  size_t len;
  unsigned char *got = read_bytes(path, &len);
  ck_assert_uint_eq(len, sizeof(expected) - 1);
  ck_assert_uint_eq(len, 8 + 112 + 12);
  for (size_t i = 0; i < len; i++) {
    ck_assert_msg(got[i] == (unsigned char)expected[i], "byte %zu is 0x%02x, want 0x%02x", i, got[i],
                  (unsigned char)expected[i]);
  }
  free(got);
}
END_TEST

/* Saving no tensors (client passed explicitly) writes the 16-byte file "{}" + 6 spaces, which
 * opens with count 0. */
START_TEST(test_empty_checkpoint) {
  const char *path = in_dir("none.safetensors");
  ck_assert_int_eq(tt_safetensors_save(client, path, NULL, NULL, 0), TT_OK);
  size_t len;
  unsigned char *got = read_bytes(path, &len);
  ck_assert_uint_eq(len, 16);
  ck_assert_int_eq(memcmp(got, "\x08\0\0\0\0\0\0\0{}      ", 16), 0);
  free(got);
  tt_safetensors *file = open_ok(path);
  ck_assert_int_eq(tt_safetensors_count(file), 0);
  ck_assert_ptr_null(tt_safetensors_name(file, 0));
  tt_safetensors_close(file);
}
END_TEST

/* Writes a file with only struct and json, following the spec: "__metadata__" first, Python's
 * default ", "/": " separators, space padding, and data laid out in another order than the keys. */
static const char python_writer[] =
    "import json, struct, sys\n"
    "w = struct.pack('<4f', 1.5, -2.25, 3.0, 0.125)\n"
    "idx = struct.pack('<3i', -7, 0, 2147483647)\n"
    "bf = struct.pack('<2H', 0x3f80, 0xc010)\n"
    "header = {'__metadata__': {'format': 'pt', 'note': 'written by python'},\n"
    "          'model.w': {'dtype': 'F32', 'shape': [2, 2], 'data_offsets': [4, 20]},\n"
    "          'model.idx': {'dtype': 'I32', 'shape': [3], 'data_offsets': [20, 32]},\n"
    "          'model.bf': {'dtype': 'BF16', 'shape': [2], 'data_offsets': [0, 4]},\n"
    "          'model.none': {'dtype': 'F32', 'shape': [0, 4], 'data_offsets': [32, 32]}}\n"
    "h = json.dumps(header).encode('utf-8')\n"
    "h += b' ' * (-len(h) % 8)\n"
    "with open(sys.argv[1], 'wb') as f:\n"
    "    f.write(struct.pack('<Q', len(h)) + h + bf + w + idx)\n";

/* A file written by Debian's python3 (struct and json only) opens and every tensor reads back
 * with the values Python packed; names come in the header's order, "__metadata__" left out. */
START_TEST(test_reads_python_file) {
  const char *path = in_dir("python.safetensors");
  ck_assert_int_eq(run_python(python_writer, path), 0);
  tt_safetensors *file = open_ok(path);
  ck_assert_int_eq(tt_safetensors_count(file), 4);
  ck_assert_str_eq(tt_safetensors_name(file, 0), "model.w");
  ck_assert_str_eq(tt_safetensors_name(file, 1), "model.idx");
  ck_assert_str_eq(tt_safetensors_name(file, 2), "model.bf");
  ck_assert_str_eq(tt_safetensors_name(file, 3), "model.none");
  const float w[4] = {1.5f, -2.25f, 3.0f, 0.125f};
  const int32_t idx[3] = {-7, 0, INT32_MAX};
  const uint16_t bf[2] = {0x3f80, 0xc010};
  const int64_t s_w[] = {2, 2}, s_idx[] = {3}, s_bf[] = {2}, s_none[] = {0, 4};
  expect_tensor(file, "model.w", TT_FLOAT32, s_w, 2, w, sizeof(w));
  expect_tensor(file, "model.idx", TT_INT32, s_idx, 1, idx, sizeof(idx));
  expect_tensor(file, "model.bf", TT_BFLOAT16, s_bf, 1, bf, sizeof(bf));
  expect_tensor(file, "model.none", TT_FLOAT32, s_none, 2, NULL, 0);
  tt_safetensors_close(file);
}
END_TEST

/* Checks, with only struct and json, the file test_python_reads_ours saved. */
static const char python_reader[] =
    "import json, struct, sys\n"
    "data = open(sys.argv[1], 'rb').read()\n"
    "(n,) = struct.unpack('<Q', data[:8])\n"
    "assert n % 8 == 0 and 8 + n <= len(data), n\n"
    "header = json.loads(data[8:8 + n].decode('utf-8'))\n"
    "buf = data[8 + n:]\n"
    "assert list(header) == ['w', 'h', 'k', 'e'], list(header)\n"
    "def get(name, dtype, shape, fmt):\n"
    "    e = header[name]\n"
    "    assert e['dtype'] == dtype and e['shape'] == shape, e\n"
    "    b, end = e['data_offsets']\n"
    "    return struct.unpack(fmt, buf[b:end])\n"
    "assert get('w', 'F32', [2, 3], '<6f') == (-1.0, -0.5, 0.0, 0.5, 1.0, 1.5)\n"
    "assert get('h', 'BF16', [2], '<2H') == (0x3f80, 0xbf80)\n"
    "assert get('k', 'I32', [], '<i') == (42,)\n"
    "assert get('e', 'F32', [0], '<0f') == ()\n"
    "spans = sorted(tuple(e['data_offsets']) for e in header.values())\n"
    "assert spans[0][0] == 0 and spans[-1][1] == len(buf), (spans, len(buf))\n"
    "assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])), spans\n"
    "print('python read ok')\n";

/* Debian's python3 with only struct and json reads a file we saved: layout, names in order,
 * dtypes, shapes, values. */
START_TEST(test_python_reads_ours) {
  float w[6] = {-1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 1.5f};
  uint16_t h[2] = {0x3f80, 0xbf80};
  int32_t k = 42;
  const int64_t s_w[] = {2, 3}, s_h[] = {2}, s_e[] = {0};
  const char *names[] = {"w", "h", "k", "e"};
  tt_tensor *tensors[] = {host(TT_FLOAT32, w, s_w, 2), host(TT_BFLOAT16, h, s_h, 1), host(TT_INT32, &k, NULL, 0),
                          host(TT_FLOAT32, NULL, s_e, 1)};
  const char *path = in_dir("ours.safetensors");
  ck_assert_int_eq(tt_safetensors_save(client, path, names, tensors, 4), TT_OK);
  for (int i = 0; i < 4; i++) tt_tensor_free(tensors[i]);
  ck_assert_int_eq(run_python(python_reader, path), 0);
}
END_TEST

/* A path that does not exist is TT_NOT_FOUND naming the path; so is one under a regular file. */
START_TEST(test_missing_file) {
  expect_open_fails(in_dir("absent.safetensors"), TT_NOT_FOUND, "absent.safetensors");
  write_bytes(in_dir("plain"), "x", 1);
  expect_open_fails(in_dir("plain/x.safetensors"), TT_NOT_FOUND, "plain/x.safetensors");
}
END_TEST

/* A folder is not a checkpoint: TT_INVALID_ARGUMENT. */
START_TEST(test_open_folder) { expect_open_fails(dir, TT_INVALID_ARGUMENT, "not a regular file"); }
END_TEST

/* A file shorter than the 8-byte length, and a header length past the end of the file, are
 * DATA_LOSS; so is a length of 2^64 - 1 (no overflow in the bounds check). */
START_TEST(test_header_length_past_end) {
  const char *path = in_dir("short.safetensors");
  write_bytes(path, "\x02\0\0", 3);
  expect_open_fails(path, TT_DATA_LOSS, "fewer than the 8-byte header length");
  write_bytes(path, "\xe8\x03\0\0\0\0\0\0{}", 10); /* says 1000 bytes, has 2 */
  expect_open_fails(path, TT_DATA_LOSS, "header length is 1000 bytes, past the end of the 10-byte file");
  write_bytes(path, "\xff\xff\xff\xff\xff\xff\xff\xff{}", 10);
  expect_open_fails(path, TT_DATA_LOSS, "past the end");
}
END_TEST

/* Headers that are not JSON, not UTF-8, not an object, or repeat a key are DATA_LOSS. */
START_TEST(test_not_json) {
  expect_malformed("{not json}", 0, "not valid JSON");
  expect_malformed("", 0, "not valid JSON");
  expect_malformed("{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}} xx", 4, "not valid JSON");
  expect_malformed("{\"\xff\xfe\":{}}", 0, "not valid JSON");
  expect_malformed("[1, 2]  ", 0, "not an object");
  expect_malformed("{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
                   "\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[4,8]}}",
                   8, "duplicate");
}
END_TEST

/* A dtype string safetensors does not define ("F33", "float32", a number) is DATA_LOSS naming it. */
START_TEST(test_wrong_dtype) {
  expect_malformed("{\"w\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "\"F33\"");
  expect_malformed("{\"w\":{\"dtype\":\"float32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "\"float32\"");
  expect_malformed("{\"w\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "no \"dtype\" string");
}
END_TEST

/* Entries missing a field, with a negative or fractional dim, or offsets not a pair, are DATA_LOSS;
 * "__metadata__" must map strings to strings. */
START_TEST(test_bad_fields) {
  expect_malformed("{\"w\":[1,2]}", 0, "not a JSON object");
  expect_malformed("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "no \"shape\" array");
  expect_malformed("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "no \"data_offsets\" array");
  expect_malformed("{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "dim 0 of the shape");
  expect_malformed("{\"w\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}", 4, "dim 0 of the shape");
  expect_malformed("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, "not [begin, end]");
  expect_malformed("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 4, "not [begin, end]");
  expect_malformed("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 4, "not [begin, end]");
  expect_malformed("{\"__metadata__\":{\"epoch\":3}}", 0, "\"__metadata__\" value of 'epoch' is not a string");
  expect_malformed("{\"__metadata__\":\"x\"}", 0, "\"__metadata__\" is not a JSON object");
}
END_TEST

/* A shape whose byte size disagrees with its data_offsets is DATA_LOSS saying both sizes. */
START_TEST(test_shape_offset_mismatch) {
  expect_malformed("{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
                   "needs 12 bytes but its data_offsets [0, 8] hold 8");
  expect_malformed("{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 16,
                   "needs 8 bytes but its data_offsets [0, 16] hold 16");
}
END_TEST

/* Overlapping byte ranges are DATA_LOSS naming both tensors. */
START_TEST(test_overlapping_offsets) {
  expect_malformed("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                   12, "tensors 'a' [0, 8) and 'b' [4, 12) overlap");
  /* the same range twice */
  expect_malformed("{\"a\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                   "\"b\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                   4, "overlap");
}
END_TEST

/* Offsets past the data buffer, begin after end, a gap, and bytes after the last tensor are
 * DATA_LOSS. */
START_TEST(test_out_of_range_offsets) {
  expect_malformed("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[100,108]}}", 8,
                   "'a' has data_offsets [100, 108], past the end of the 8-byte data buffer");
  expect_malformed("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[9223372036854775799,"
                   "9223372036854775807]}}",
                   8, "past the end of the 8-byte data buffer");
  expect_malformed("{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]}}", 8, "begin is past end");
  expect_malformed("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
                   "bytes [0, 4) of the data buffer belong to no tensor");
  expect_malformed("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8,
                   "4 bytes after the last tensor");
  expect_malformed("{}", 8, "8 data bytes follow a header with no tensors");
}
END_TEST

/* A valid file cut short inside its data is DATA_LOSS naming the tensor that runs past the end. */
START_TEST(test_truncated_data) {
  float w[4] = {1, 2, 3, 4};
  int32_t k[2] = {5, 6};
  const int64_t s_w[] = {4}, s_k[] = {2};
  const char *names[] = {"w", "k"};
  tt_tensor *tensors[] = {host(TT_FLOAT32, w, s_w, 1), host(TT_INT32, k, s_k, 1)};
  const char *path = in_dir("cut.safetensors");
  ck_assert_int_eq(tt_safetensors_save(client, path, names, tensors, 2), TT_OK);
  tt_tensor_free(tensors[0]);
  tt_tensor_free(tensors[1]);
  struct stat sb;
  ck_assert_int_eq(stat(path, &sb), 0);
  ck_assert_int_eq(truncate(path, sb.st_size - 3), 0);
  expect_open_fails(path, TT_DATA_LOSS, "'k' has data_offsets [16, 24], past the end of the 21-byte data buffer");
  ck_assert_int_eq(truncate(path, sb.st_size - 24), 0); /* no data at all */
  expect_open_fails(path, TT_DATA_LOSS, "past the end of the 0-byte data buffer");
}
END_TEST

/* Shapes whose element count or byte size overflows 64 bits are DATA_LOSS, not a wrapped size. */
START_TEST(test_overflowing_shape) {
  expect_malformed("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,0]}}",
                   0, "the shape of tensor 'a' overflows 64 bits (at dim 1)");
  /* 2^62 elements of 4 bytes: the count fits, the byte size does not */
  expect_malformed("{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],\"data_offsets\":[0,0]}}", 0,
                   "byte size of tensor 'a'");
  /* wraps to exactly 0 bytes if multiplied unchecked: 2^32 * 2^32 */
  expect_malformed("{\"a\":{\"dtype\":\"I32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}", 0,
                   "overflows 64 bits");
  /* a dim past int64 is refused by the JSON parser */
  expect_malformed("{\"a\":{\"dtype\":\"I32\",\"shape\":[18446744073709551616],\"data_offsets\":[0,0]}}", 0,
                   "not valid JSON");
}
END_TEST

/* Types safetensors defines but tt tensors cannot hold (F16, I64) open fine; getting them is
 * TT_UNIMPLEMENTED, and the loadable tensors beside them still read. So is a 9-d tensor. */
START_TEST(test_unsupported_dtype_opens) {
  const char *path = in_dir("mixed.safetensors");
  write_raw(path,
            "{\"pos\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]},"
            "\"half\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[16,20]},"
            "\"nine\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[20,24]},"
            "\"w\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[24,28]}}",
            28);
  tt_safetensors *file = open_ok(path);
  ck_assert_int_eq(tt_safetensors_count(file), 4);
  ck_assert_ptr_null(tt_safetensors_get(file, "pos"));
  ck_assert_int_eq(tt_errcode(client), TT_UNIMPLEMENTED);
  ck_assert_ptr_nonnull(strstr(tt_last_error(client), "'pos'"));
  ck_assert_ptr_nonnull(strstr(tt_last_error(client), "I64"));
  ck_assert_ptr_null(tt_safetensors_get(file, "half"));
  ck_assert_int_eq(tt_errcode(client), TT_UNIMPLEMENTED);
  ck_assert_ptr_null(tt_safetensors_get(file, "nine"));
  ck_assert_int_eq(tt_errcode(client), TT_UNIMPLEMENTED);
  ck_assert_ptr_nonnull(strstr(tt_last_error(client), "9 dims"));
  const int32_t w = (int32_t)0xABABABABu;
  const int64_t s_w[] = {1};
  expect_tensor(file, "w", TT_INT32, s_w, 1, &w, 4);
  tt_safetensors_close(file);
}
END_TEST

/* Getting a name the file lacks is NULL with TT_NOT_FOUND naming it; NULL arguments are safe. */
START_TEST(test_get_absent_and_nulls) {
  int32_t k = 1;
  const char *names[] = {"k"};
  tt_tensor *t = host(TT_INT32, &k, NULL, 0);
  const char *path = in_dir("one.safetensors");
  ck_assert_int_eq(tt_safetensors_save(client, path, names, &t, 1), TT_OK);
  tt_tensor_free(t);
  tt_safetensors *file = open_ok(path);
  ck_assert_ptr_null(tt_safetensors_get(file, "missing.weight"));
  ck_assert_int_eq(tt_errcode(client), TT_NOT_FOUND);
  ck_assert_ptr_nonnull(strstr(tt_last_error(client), "no tensor 'missing.weight'"));
  ck_assert_ptr_null(tt_safetensors_get(file, NULL));
  ck_assert_int_eq(tt_errcode(client), TT_INVALID_ARGUMENT);
  tt_safetensors_close(file);
  tt_safetensors_close(NULL);
  ck_assert_ptr_null(tt_safetensors_get(NULL, "k"));
  ck_assert_int_eq(tt_safetensors_count(NULL), 0);
  ck_assert_ptr_null(tt_safetensors_name(NULL, 0));
  tt_safetensors *out = (tt_safetensors *)0x1;
  ck_assert_int_eq(tt_safetensors_open(NULL, path, &out), TT_INVALID_ARGUMENT);
  ck_assert_ptr_null(out);
  ck_assert_int_eq(tt_safetensors_open(client, path, NULL), TT_INVALID_ARGUMENT);
  ck_assert_int_eq(tt_safetensors_save(NULL, path, NULL, NULL, 0), TT_INVALID_ARGUMENT);
}
END_TEST

/* Saving a device tensor is TT_INVALID_ARGUMENT naming it and its device; no file is left. */
START_TEST(test_save_device_tensor) {
  const int64_t shape[] = {4};
  tt_tensor *dev = tt_tensor_empty(client, TT_FLOAT32, shape, 1, "tt");
  ck_assert_msg(dev != NULL, "%s", tt_last_error(client));
  tt_tensor *h = host(TT_FLOAT32, NULL, shape, 1);
  const char *names[] = {"host.w", "dev.w"};
  tt_tensor *tensors[] = {h, dev};
  const char *path = in_dir("dev.safetensors");
  ck_assert_int_eq(tt_safetensors_save(client, path, names, tensors, 2), TT_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(tt_last_error(client), "tensor 'dev.w' is on tt:0"));
  ck_assert_int_eq(access(path, F_OK), -1);
  ck_assert_int_eq(access(in_dir("dev.safetensors.tmp"), F_OK), -1);
  tt_tensor_free(dev);
  tt_tensor_free(h);
}
END_TEST

/* Duplicate, empty, NULL and reserved names are TT_INVALID_ARGUMENT saying which; a failed
 * save leaves the file already at the path untouched. */
START_TEST(test_save_bad_names) {
  int32_t one = 1, two = 2;
  tt_tensor *a = host(TT_INT32, &one, NULL, 0), *b = host(TT_INT32, &two, NULL, 0);
  tt_tensor *tensors[] = {a, b};
  const char *path = in_dir("names.safetensors");
  const char *good[] = {"a", "b"};
  ck_assert_int_eq(tt_safetensors_save(client, path, good, tensors, 2), TT_OK);

  const char *dup[] = {"layer.w", "layer.w"};
  ck_assert_int_eq(tt_safetensors_save(client, path, dup, tensors, 2), TT_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(tt_last_error(client), "'layer.w' is given twice"));
  const char *empty[] = {"a", ""};
  ck_assert_int_eq(tt_safetensors_save(client, path, empty, tensors, 2), TT_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(tt_last_error(client), "name 1 is empty"));
  const char *null_name[] = {NULL, "b"};
  ck_assert_int_eq(tt_safetensors_save(client, path, null_name, tensors, 2), TT_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(tt_last_error(client), "name 0 is NULL"));
  const char *reserved[] = {"__metadata__", "b"};
  ck_assert_int_eq(tt_safetensors_save(client, path, reserved, tensors, 2), TT_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(tt_last_error(client), "reserves"));
  const char *not_utf8[] = {"a", "\xff"};
  ck_assert_int_eq(tt_safetensors_save(client, path, not_utf8, tensors, 2), TT_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(tt_last_error(client), "UTF-8"));
  ck_assert_int_eq(tt_safetensors_save(client, path, good, tensors, -1), TT_INVALID_ARGUMENT);
  ck_assert_int_eq(tt_safetensors_save(client, path, NULL, tensors, 2), TT_INVALID_ARGUMENT);

  tt_safetensors *file = open_ok(path);
  ck_assert_int_eq(tt_safetensors_count(file), 2);
  ck_assert_str_eq(tt_safetensors_name(file, 0), "a");
  ck_assert_str_eq(tt_safetensors_name(file, 1), "b");
  tt_safetensors_close(file);
  ck_assert_int_eq(access(in_dir("names.safetensors.tmp"), F_OK), -1);
  tt_tensor_free(a);
  tt_tensor_free(b);
}
END_TEST

/* Saving where the file cannot be created is TT_UNAVAILABLE naming the path and the errno text. */
START_TEST(test_save_unwritable) {
  int32_t one = 1;
  tt_tensor *t = host(TT_INT32, &one, NULL, 0);
  const char *names[] = {"k"};
  char path[256];
  write_bytes(in_dir("plain"), "x", 1);
  snprintf(path, sizeof(path), "%s/plain/ckpt.safetensors", dir); /* under a regular file: ENOTDIR, even as root */
  ck_assert_int_eq(tt_safetensors_save(NULL, path, names, &t, 1), TT_UNAVAILABLE);
  ck_assert_int_eq(tt_errcode(client), TT_UNAVAILABLE);
  ck_assert_ptr_nonnull(strstr(tt_last_error(client), path));
  ck_assert_ptr_nonnull(strstr(tt_last_error(client), strerror(ENOTDIR)));
  snprintf(path, sizeof(path), "%s/no/such/dir/ckpt.safetensors", dir);
  ck_assert_int_eq(tt_safetensors_save(client, path, names, &t, 1), TT_UNAVAILABLE);
  ck_assert_ptr_nonnull(strstr(tt_last_error(client), path));
  ck_assert_ptr_nonnull(strstr(tt_last_error(client), strerror(ENOENT)));
  tt_tensor_free(t);
}
END_TEST

/* Saving over an existing checkpoint replaces it whole, even while the old one is open
 * (the open file keeps reading the old data); no .tmp remains. */
START_TEST(test_save_replaces_atomically) {
  float v1[3] = {1, 2, 3}, v2[2] = {9, 8};
  const int64_t s1[] = {3}, s2[] = {2};
  const char *path = in_dir("ckpt.safetensors");
  const char *n1[] = {"old"}, *n2[] = {"new"};
  tt_tensor *t1 = host(TT_FLOAT32, v1, s1, 1), *t2 = host(TT_FLOAT32, v2, s2, 1);
  ck_assert_int_eq(tt_safetensors_save(client, path, n1, &t1, 1), TT_OK);
  tt_safetensors *old = open_ok(path);
  ck_assert_int_eq(tt_safetensors_save(client, path, n2, &t2, 1), TT_OK);
  ck_assert_int_eq(access(in_dir("ckpt.safetensors.tmp"), F_OK), -1);
  expect_tensor(old, "old", TT_FLOAT32, s1, 1, v1, sizeof(v1));
  tt_safetensors_close(old);
  tt_safetensors *file = open_ok(path);
  ck_assert_int_eq(tt_safetensors_count(file), 1);
  ck_assert_str_eq(tt_safetensors_name(file, 0), "new");
  expect_tensor(file, "new", TT_FLOAT32, s2, 1, v2, sizeof(v2));
  tt_safetensors_close(file);
  tt_tensor_free(t1);
  tt_tensor_free(t2);
}
END_TEST

Suite *safetensors_suite(void) {
  Suite *s = suite_create("safetensors");
  TCase *tc = tcase_create("safetensors");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_round_trip);
  tcase_add_test(tc, test_exact_bytes);
  tcase_add_test(tc, test_empty_checkpoint);
  tcase_add_test(tc, test_reads_python_file);
  tcase_add_test(tc, test_python_reads_ours);
  tcase_add_test(tc, test_missing_file);
  tcase_add_test(tc, test_open_folder);
  tcase_add_test(tc, test_header_length_past_end);
  tcase_add_test(tc, test_not_json);
  tcase_add_test(tc, test_wrong_dtype);
  tcase_add_test(tc, test_bad_fields);
  tcase_add_test(tc, test_shape_offset_mismatch);
  tcase_add_test(tc, test_overlapping_offsets);
  tcase_add_test(tc, test_out_of_range_offsets);
  tcase_add_test(tc, test_truncated_data);
  tcase_add_test(tc, test_overflowing_shape);
  tcase_add_test(tc, test_unsupported_dtype_opens);
  tcase_add_test(tc, test_get_absent_and_nulls);
  tcase_add_test(tc, test_save_device_tensor);
  tcase_add_test(tc, test_save_bad_names);
  tcase_add_test(tc, test_save_unwritable);
  tcase_add_test(tc, test_save_replaces_atomically);
  suite_add_tcase(s, tc);
  return s;
}
