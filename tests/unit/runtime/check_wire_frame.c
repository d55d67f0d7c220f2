/* runtime/wire/wire_frame.h: the hand-written protobuf walker and framer, as hostile input
 * deserves. Every message is walked in one slice, cut at every byte boundary (with an
 * empty slice there too) and in slices of 1..4 bytes, each slice its own heap block so
 * that ASan sees a read past one; results must be identical. Round trips are checked
 * against protobuf-c's own pack and unpack of UploadRequest and DownloadResponse. */
#include <check.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/slice.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ttd/v1/ttd.pb-c.h"
#include "wire/wire_frame.h"
#include "suites.h"

enum { VARINT = 0, I64 = 1, LEN = 2, I32 = 5 };

/* ---- byte buffers cut into slices ---- */

/* A slice holding a private heap copy of data[0, len) (an empty slice for len 0). */
static grpc_slice heap_slice(const uint8_t *data, size_t len) {
  if (len == 0) return grpc_empty_slice();
  void *copy = malloc(len);
  ck_assert_ptr_nonnull(copy);
  memcpy(copy, data, len);
  return grpc_slice_new(copy, len, free);
}

/* A byte buffer of data cut before each of cuts[0..ncuts) (ascending; a repeated cut makes
 * an empty slice). */
static grpc_byte_buffer *bb_cut(const uint8_t *data, size_t len, const size_t *cuts, size_t ncuts) {
  grpc_slice *slices = malloc((ncuts + 1) * sizeof(*slices));
  ck_assert_ptr_nonnull(slices);
  size_t from = 0;
  for (size_t i = 0; i <= ncuts; i++) {
    size_t to = i < ncuts ? cuts[i] : len;
    ck_assert_uint_ge(to, from);
    slices[i] = heap_slice(data + from, to - from);
    from = to;
  }
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(slices, ncuts + 1);
  for (size_t i = 0; i <= ncuts; i++) grpc_slice_unref(slices[i]);
  free(slices);
  return bb;
}

static grpc_byte_buffer *bb_one(const uint8_t *data, size_t len) { return bb_cut(data, len, NULL, 0); }

/* A byte buffer of data in slices of step bytes. */
static grpc_byte_buffer *bb_steps(const uint8_t *data, size_t len, size_t step) {
  size_t n = len ? (len - 1) / step : 0;
  size_t *cuts = malloc((n + 1) * sizeof(*cuts));
  ck_assert_ptr_nonnull(cuts);
  for (size_t i = 0; i < n; i++) cuts[i] = (i + 1) * step;
  grpc_byte_buffer *bb = bb_cut(data, len, cuts, n);
  free(cuts);
  return bb;
}

/* All bytes of bb in one malloc'd block; *out_len its length. */
static uint8_t *bb_flatten(grpc_byte_buffer *bb, size_t *out_len) {
  grpc_byte_buffer_reader reader;
  ck_assert(grpc_byte_buffer_reader_init(&reader, bb));
  grpc_slice all = grpc_byte_buffer_reader_readall(&reader);
  grpc_byte_buffer_reader_destroy(&reader);
  *out_len = GRPC_SLICE_LENGTH(all);
  uint8_t *out = malloc(*out_len + 1);
  ck_assert_ptr_nonnull(out);
  memcpy(out, GRPC_SLICE_START_PTR(all), *out_len);
  grpc_slice_unref(all);
  return out;
}

/* ---- encoding ---- */

static size_t put_varint(uint8_t *out, uint64_t v) {
  size_t n = 0;
  for (; v >= 0x80; v >>= 7) out[n++] = (uint8_t)(v | 0x80);
  out[n++] = (uint8_t)v;
  return n;
}

/* One field of a message built by hand: value for VARINT, I64 and I32; data for LEN. */
typedef struct wfield {
  uint32_t field;
  int type;
  uint64_t value;
  const uint8_t *data;
  size_t len;
} wfield;

static size_t put_field(uint8_t *out, const wfield *f) {
  size_t n = put_varint(out, ((uint64_t)f->field << 3) | (uint64_t)f->type);
  if (f->type == VARINT) return n + put_varint(out + n, f->value);
  if (f->type == LEN) {
    n += put_varint(out + n, f->len);
    if (f->len) memcpy(out + n, f->data, f->len);
    return n + f->len;
  }
  for (int i = 0; i < (f->type == I64 ? 8 : 4); i++) out[n++] = (uint8_t)(f->value >> (8 * i));
  return n;
}

/* Length-delimited fields are shown in hex up to this many bytes, longer ones as their
 * length and FNV-1a hash ("3:#2097152:0123456789abcdef"). */
#define SHOW_HEX_MAX 64
#define FNV_INIT 0xcbf29ce484222325ull

static uint64_t fnv(uint64_t h, const uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

/* What the walker reports for a field: "F=V", "F:hex" or "F:#len:hash". */
static size_t show_field(char *out, size_t size, const wfield *f) {
  if (f->type != LEN) {
    uint64_t v = f->type == I32 ? (uint32_t)f->value : f->value;
    return (size_t)snprintf(out, size, "%" PRIu32 "=%" PRIu64, f->field, v);
  }
  if (f->len > SHOW_HEX_MAX) {
    return (size_t)snprintf(out, size, "%" PRIu32 ":#%zu:%016" PRIx64, f->field, f->len, fnv(FNV_INIT, f->data, f->len));
  }
  size_t n = (size_t)snprintf(out, size, "%" PRIu32 ":", f->field);
  for (size_t i = 0; i < f->len; i++) n += (size_t)snprintf(out + n, size - n, "%02x", f->data[i]);
  return n;
}

/* A message of fields built by hand: its bytes (malloc'd), ends[i] the offset where field i
 * ends and shown[i] the walker's report of fields 0..i. */
typedef struct built {
  uint8_t *bytes;
  size_t len;
  size_t ends[16];
  char shown[16][1024];
} built;

static void build(built *b, const wfield *fields, size_t n) {
  ck_assert_uint_le(n, 16);
  size_t cap = 64;
  for (size_t i = 0; i < n; i++) cap += 32 + fields[i].len;
  b->bytes = malloc(cap);
  ck_assert_ptr_nonnull(b->bytes);
  b->len = 0;
  for (size_t i = 0; i < n; i++) {
    b->len += put_field(b->bytes + b->len, &fields[i]);
    b->ends[i] = b->len;
    size_t at = i ? (size_t)snprintf(b->shown[i], sizeof(b->shown[i]), "%s ", b->shown[i - 1]) : 0;
    show_field(b->shown[i] + at, sizeof(b->shown[i]) - at, &fields[i]);
  }
}

static size_t unhex(const char *hex, uint8_t *out) {
  size_t n = 0;
  for (const char *p = hex; *p;) {
    if (*p == ' ') {
      p++;
      continue;
    }
    unsigned v;
    ck_assert_int_eq(sscanf(p, "%2x", &v), 1);
    out[n++] = (uint8_t)v;
    p += 2;
  }
  return n;
}

/* ---- a visitor that records what it is told ---- */

typedef struct recorder {
  char text[4096]; /* "1=150 2:616263 2:" */
  size_t n;
  bool in_bytes;   /* a length-delimited field is open */
  uint32_t field;
  uint64_t at, total, hash;
  int calls, stop_at, stop_rc; /* return stop_rc from call number stop_at (1-based; 0: never) */
} recorder;

static void rec_append(recorder *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void rec_append(recorder *r, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(r->text + r->n, sizeof(r->text) - r->n, fmt, ap);
  va_end(ap);
  ck_assert(n >= 0 && (size_t)n < sizeof(r->text) - r->n);
  r->n += (size_t)n;
}

static int rec_result(recorder *r) { return ++r->calls == r->stop_at ? r->stop_rc : 0; }

static int rec_number(void *ctx, uint32_t field, uint64_t value) {
  recorder *r = ctx;
  ck_assert_msg(!r->in_bytes, "a number between the parts of field %u", r->field);
  rec_append(r, "%s%" PRIu32 "=%" PRIu64, r->n ? " " : "", field, value);
  return rec_result(r);
}

/* Parts of a field must come in order, cover it exactly and never be empty unless it is. */
static int rec_bytes(void *ctx, uint32_t field, const uint8_t *data, size_t len, uint64_t at, uint64_t total) {
  recorder *r = ctx;
  if (at == 0) {
    ck_assert_msg(!r->in_bytes, "field %u restarted before its end", r->field);
    rec_append(r, "%s%" PRIu32 ":", r->n ? " " : "", field);
    r->in_bytes = true;
    r->field = field;
    r->total = total;
    r->hash = FNV_INIT;
  } else {
    ck_assert(r->in_bytes);
    ck_assert_uint_eq(field, r->field);
    ck_assert_uint_eq(total, r->total);
  }
  ck_assert_uint_eq(at, r->at);
  ck_assert_msg(len > 0 || total == 0, "an empty part of a %" PRIu64 "-byte field", total);
  ck_assert_uint_le(at + len, total);
  if (len) ck_assert_ptr_nonnull(data);
  if (total > SHOW_HEX_MAX) r->hash = fnv(r->hash, data, len);
  else for (size_t i = 0; i < len; i++) rec_append(r, "%02x", data[i]);
  r->at = at + len;
  if (r->at == total) {
    if (total > SHOW_HEX_MAX) rec_append(r, "#%" PRIu64 ":%016" PRIx64, total, r->hash);
    r->in_bytes = false;
    r->at = 0;
  }
  return rec_result(r);
}

static const ttd_wire_visitor recording = {rec_number, rec_bytes};

/* Walks bb (and destroys it); *r gets what was reported. */
static int walk(grpc_byte_buffer *bb, recorder *r) {
  memset(r, 0, sizeof(*r));
  int rc = ttd_wire_walk(bb, &recording, r);
  grpc_byte_buffer_destroy(bb);
  if (rc == 0) ck_assert_msg(!r->in_bytes, "walk ended inside field %u", r->field);
  return rc;
}

static void expect_walk(grpc_byte_buffer *bb, int want_rc, const char *want, const char *how) {
  recorder r;
  int rc = walk(bb, &r);
  ck_assert_msg(rc == want_rc && strcmp(r.text, want) == 0, "%s: got rc %d \"%s\", want rc %d \"%s\"", how, rc,
                r.text, want_rc, want);
}

/* The walk of msg gives want_rc and want however its bytes are cut into slices. */
static void expect_walk_any_slicing(const char *what, const uint8_t *msg, size_t len, int want_rc, const char *want) {
  char how[256];
  snprintf(how, sizeof(how), "%s, in one slice", what);
  expect_walk(bb_one(msg, len), want_rc, want, how);
  for (size_t p = 0; p <= len; p++) {
    size_t cuts[2] = {p, p};
    snprintf(how, sizeof(how), "%s, cut at %zu", what, p);
    expect_walk(bb_cut(msg, len, cuts, 1), want_rc, want, how);
    snprintf(how, sizeof(how), "%s, cut at %zu with an empty slice there", what, p);
    expect_walk(bb_cut(msg, len, cuts, 2), want_rc, want, how);
  }
  for (size_t step = 1; step <= 4; step++) {
    snprintf(how, sizeof(how), "%s, in slices of %zu bytes", what, step);
    expect_walk(bb_steps(msg, len, step), want_rc, want, how);
  }
}

/* ---- hostile and edge-case inputs, one row each ---- */

static const struct row {
  const char *what, *hex;
  int rc;
  const char *shown;
} rows[] = {
    {"an empty message has no fields", "", 0, ""},
    {"a one-byte varint", "08 00", 0, "1=0"},
    {"a two-byte varint", "08 96 01", 0, "1=150"},
    {"a ten-byte varint holds 2^64 - 1", "08 ff ff ff ff ff ff ff ff ff 01", 0, "1=18446744073709551615"},
    {"an eleven-byte (overlong) varint is malformed", "08 80 80 80 80 80 80 80 80 80 80 00", -1, ""},
    {"a ten-byte varint whose last byte continues is malformed", "08 ff ff ff ff ff ff ff ff ff ff", -1, ""},
    {"a non-minimal varint is read (protobuf allows padding)", "08 96 81 80 00", 0, "1=150"},
    {"a non-minimal key is read", "88 80 00 07", 0, "1=7"},
    {"a varint cut short is malformed", "08 96", -1, ""},
    {"a key cut short is malformed", "96", -1, ""},
    {"fields before garbage are reported, then -1", "08 01 ff", -1, "1=1"},
    {"field number 0 is malformed", "00 01", -1, ""},
    {"field number 2^29 - 1 is the largest", "f8 ff ff ff 0f 05", 0, "536870911=5"},
    {"field number 2^29 is malformed", "80 80 80 80 10 05", -1, ""},
    {"a key past 32 bits is malformed", "80 80 80 80 80 01 05", -1, ""},
    {"fixed64 is little-endian", "09 01 02 03 04 05 06 07 08", 0, "1=578437695752307201"},
    {"fixed32 is little-endian", "0d 01 02 03 04", 0, "1=67305985"},
    {"fixed64 all ones", "09 ff ff ff ff ff ff ff ff", 0, "1=18446744073709551615"},
    {"fixed64 cut short is malformed", "09 01 02 03 04 05 06 07", -1, ""},
    {"fixed32 cut short is malformed", "0d 01 02 03", -1, ""},
    {"a length-delimited field", "12 03 61 62 63", 0, "2:616263"},
    {"a zero-length field is reported once, empty", "12 00", 0, "2:"},
    {"a length past the end is malformed before any part is reported", "12 05 61 62 63 64", -1, ""},
    {"a length past the end by a ten-byte varint", "12 ff ff ff ff ff ff ff ff ff 01 61", -1, ""},
    {"a length cut short is malformed", "12 80", -1, ""},
    {"a length missing is malformed", "12", -1, ""},
    {"a bytes field twice is reported twice, in order", "12 01 61 12 01 62", 0, "2:61 2:62"},
    {"a known bytes field as a varint is reported as a number", "10 05", 0, "2=5"},
    {"a known message field as fixed32 is reported as a number", "0d 01 00 00 00", 0, "1=1"},
    {"start group (type 3) is refused", "0b 0c", -1, ""},
    {"end group (type 4) is refused", "0c", -1, ""},
    {"wire type 6 is refused", "0e 00", -1, ""},
    {"wire type 7 is refused", "0f 00", -1, ""},
    {"fields after a refused wire type are not reported", "08 01 0b 08 02", -1, "1=1"},
    {"every wire type in one message",
     "08 2a 11 01 00 00 00 00 00 00 80 1a 02 68 69 25 ff ff ff ff 2a 00", 0,
     "1=42 2=9223372036854775809 3:6869 4=4294967295 5:"},
};

/* One row: its bytes give its rc and fields, however they are cut into slices. */
START_TEST(test_walk_row) {
  const struct row *row = &rows[_i];
  uint8_t msg[64];
  size_t len = unhex(row->hex, msg);
  expect_walk_any_slicing(row->what, msg, len, row->rc, row->shown);
}
END_TEST

/* A varint of each length 1..10 (smallest and largest value) reads as protobuf-c reads it. */
START_TEST(test_varint_every_length) {
  for (int bytes = 1; bytes <= 10; bytes++) {
    uint64_t lo = bytes == 1 ? 0 : (uint64_t)1 << (7 * (bytes - 1));
    uint64_t hi = bytes == 10 ? UINT64_MAX : ((uint64_t)1 << (7 * bytes)) - 1;
    for (int k = 0; k < 2; k++) {
      uint64_t v = k ? hi : lo;
      Ttd__V1__DownloadResponse m = TTD__V1__DOWNLOAD_RESPONSE__INIT;
      m.total_bytes = v;
      uint8_t packed[16];
      size_t len = ttd__v1__download_response__pack(&m, packed);
      built b;
      build(&b, &(wfield){.field = 2, .type = VARINT, .value = v}, 1);
      ck_assert_uint_eq(b.len, 1 + (size_t)bytes);
      if (v) ck_assert_mem_eq(b.bytes, packed, len); /* proto3 leaves a 0 out */
      expect_walk_any_slicing("a varint value", b.bytes, b.len, 0, b.shown[0]);
      Ttd__V1__DownloadResponse *back = ttd__v1__download_response__unpack(NULL, b.len, b.bytes);
      ck_assert_ptr_nonnull(back);
      ck_assert_uint_eq(back->total_bytes, v);
      ttd__v1__download_response__free_unpacked(back, NULL);
      free(b.bytes);
    }
  }
}
END_TEST

/* Keys of 1..5 bytes (fields 1, 15, 16, 2047, 2048, 2^18-1, 2^18, 2^29-1) give their field. */
START_TEST(test_key_every_length) {
  static const uint32_t fields[] = {1, 15, 16, 2047, 2048, 262143, 262144, 536870911};
  for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
    built b;
    build(&b, (wfield[]){{.field = fields[i], .type = LEN, .data = (const uint8_t *)"x", .len = 1},
                         {.field = fields[i], .type = I32, .value = 7}},
          2);
    expect_walk_any_slicing("a long key", b.bytes, b.len, 0, b.shown[1]);
    free(b.bytes);
  }
}
END_TEST

/* A packed TensorInfo (field 1 of DownloadResponse). */
static size_t pack_info(uint8_t *out) {
  int64_t shape[] = {2, 3};
  Ttd__V1__TensorSpec spec = TTD__V1__TENSOR_SPEC__INIT;
  spec.dtype = TTD__V1__DTYPE__DTYPE_FLOAT32;
  spec.n_shape = 2;
  spec.shape = shape;
  spec.device = "tt:1";
  spec.location = TTD__V1__MEMORY_LOCATION__MEMORY_LOCATION_L1;
  Ttd__V1__TensorInfo info = TTD__V1__TENSOR_INFO__INIT;
  info.handle = 0x0123456789abcdefull;
  info.spec = &spec;
  info.nbytes = 24;
  return ttd__v1__tensor_info__pack(&info, out);
}

/* Checks a DownloadResponse unpacked by protobuf-c: the TensorInfo of pack_info, total, data. */
static void expect_download(const Ttd__V1__DownloadResponse *m, uint64_t total, const uint8_t *data, size_t len) {
  ck_assert_ptr_nonnull(m);
  ck_assert_ptr_nonnull(m->tensor);
  ck_assert_uint_eq(m->tensor->handle, 0x0123456789abcdefull);
  ck_assert_ptr_nonnull(m->tensor->spec);
  ck_assert_str_eq(m->tensor->spec->device, "tt:1");
  ck_assert_uint_eq(m->tensor->spec->n_shape, 2);
  ck_assert_uint_eq(m->total_bytes, total);
  ck_assert_uint_eq(m->data.len, len);
  if (len) ck_assert_mem_eq(m->data.data, data, len);
}

/* Unknown fields of every wire type, before, between and after the known ones, are stepped
 * over exactly: the known fields read the same as protobuf-c reads them. */
START_TEST(test_unknown_fields_skipped) {
  uint8_t info[64], data[40];
  size_t info_len = pack_info(info);
  for (size_t i = 0; i < sizeof(data); i++) data[i] = (uint8_t)(i * 37 + 1);
  const wfield fields[] = {
      {.field = 100, .type = VARINT, .value = UINT64_MAX},
      {.field = 1, .type = LEN, .data = info, .len = info_len},
      {.field = 101, .type = I64, .value = 0x8000000000000001ull},
      {.field = 2, .type = VARINT, .value = 40},
      {.field = 102, .type = I32, .value = 0x80000001u},
      {.field = 103, .type = LEN, .data = (const uint8_t *)"\x12\x05", .len = 2}, /* looks like a field */
      {.field = 3, .type = LEN, .data = data, .len = sizeof(data)},
      {.field = 104, .type = LEN, .data = NULL, .len = 0},
      {.field = 536870911, .type = VARINT, .value = 1},
  };
  size_t n = sizeof(fields) / sizeof(fields[0]);
  built b;
  build(&b, fields, n);
  expect_walk_any_slicing("unknown fields", b.bytes, b.len, 0, b.shown[n - 1]);
  Ttd__V1__DownloadResponse *m = ttd__v1__download_response__unpack(NULL, b.len, b.bytes);
  expect_download(m, 40, data, sizeof(data));
  ck_assert_uint_eq(m->base.n_unknown_fields, 6);
  ttd__v1__download_response__free_unpacked(m, NULL);
  free(b.bytes);
}
END_TEST

/* A message cut at every byte offset: whole fields before the cut are reported, and the walk
 * is 0 exactly where a field ends (protobuf-c agrees), -1 anywhere else. */
START_TEST(test_truncated_every_offset) {
  uint8_t info[64], data[40];
  size_t info_len = pack_info(info);
  for (size_t i = 0; i < sizeof(data); i++) data[i] = (uint8_t)(0xa0 ^ i);
  const wfield fields[] = {
      {.field = 1, .type = LEN, .data = info, .len = info_len},
      {.field = 2, .type = VARINT, .value = (uint64_t)1 << 63},
      {.field = 9, .type = I64, .value = 0x0102030405060708ull},
      {.field = 10, .type = I32, .value = 0x0a0b0c0du},
      {.field = 3, .type = LEN, .data = data, .len = sizeof(data)},
  };
  size_t n = sizeof(fields) / sizeof(fields[0]);
  built b;
  build(&b, fields, n);
  for (size_t p = 0; p <= b.len; p++) {
    size_t whole = 0;
    while (whole < n && b.ends[whole] <= p) whole++;
    bool at_end = whole ? b.ends[whole - 1] == p : p == 0;
    const char *want = whole ? b.shown[whole - 1] : "";
    char how[64];
    snprintf(how, sizeof(how), "prefix of %zu of %zu bytes", p, b.len);
    expect_walk(bb_one(b.bytes, p), at_end ? 0 : -1, want, how);
    expect_walk(bb_steps(b.bytes, p, 1), at_end ? 0 : -1, want, how);
    Ttd__V1__DownloadResponse *m = ttd__v1__download_response__unpack(NULL, p, b.bytes);
    ck_assert_msg((m != NULL) == at_end, "%s: protobuf-c %s it", how, m ? "accepts" : "refuses");
    ttd__v1__download_response__free_unpacked(m, NULL);
  }
  free(b.bytes);
}
END_TEST

/* The same bytes as a DownloadResponse, walked and unpacked by protobuf-c: both read
 * varints alike (padding, bits past 64, overlong); where protobuf-c keeps only the last of
 * a repeated bytes field or refuses a known field of the wrong wire type, the walker
 * reports every field as it is and leaves the choice to its visitor. */
static const struct pbc_row {
  const char *hex;
  int rc;
  const char *shown;
  bool accepted;
  uint64_t total_bytes;
  const char *data;
} pbc_rows[] = {
    {"10 96 81 80 00", 0, "2=150", true, 150, ""},
    {"10 ff ff ff ff ff ff ff ff ff 7f", 0, "2=18446744073709551615", true, UINT64_MAX, ""},
    {"10 80 80 80 80 80 80 80 80 80 80 00", -1, "", false, 0, ""},
    {"1a 01 61 1a 01 62", 0, "3:61 3:62", true, 0, "b"},
    {"18 05", 0, "3=5", false, 0, ""},
    {"12 00", 0, "2:", false, 0, ""},
};

START_TEST(test_same_bytes_in_protobuf_c) {
  const struct pbc_row *row = &pbc_rows[_i];
  uint8_t msg[32];
  size_t len = unhex(row->hex, msg);
  expect_walk_any_slicing(row->hex, msg, len, row->rc, row->shown);
  Ttd__V1__DownloadResponse *m = ttd__v1__download_response__unpack(NULL, len, msg);
  ck_assert_msg((m != NULL) == row->accepted, "protobuf-c %s %s", m ? "accepts" : "refuses", row->hex);
  if (!m) return;
  ck_assert_uint_eq(m->total_bytes, row->total_bytes);
  ck_assert_uint_eq(m->data.len, strlen(row->data));
  ck_assert_mem_eq(m->data.data ? m->data.data : (const uint8_t *)"", row->data, m->data.len);
  ttd__v1__download_response__free_unpacked(m, NULL);
}
END_TEST

/* A visitor's nonzero result stops the walk at once and is what the walk returns. */
START_TEST(test_visitor_stops_walk) {
  uint8_t msg[32];
  size_t len = unhex("08 01 12 04 61 62 63 64 08 02", msg);
  static const struct {
    int stop_at, stop_rc;
    const char *shown;
  } stops[] = {{1, 7, "1=1"}, {2, -5, "1=1 2:61"}, {3, 1, "1=1 2:6162"}, {6, 2, "1=1 2:61626364 1=2"}};
  for (size_t i = 0; i < sizeof(stops) / sizeof(stops[0]); i++) {
    recorder r;
    memset(&r, 0, sizeof(r));
    r.stop_at = stops[i].stop_at;
    r.stop_rc = stops[i].stop_rc;
    grpc_byte_buffer *bb = bb_steps(msg, len, 1); /* the bytes field comes in 1-byte parts */
    int rc = ttd_wire_walk(bb, &recording, &r);
    grpc_byte_buffer_destroy(bb);
    ck_assert_int_eq(rc, stops[i].stop_rc);
    ck_assert_str_eq(r.text, stops[i].shown);
    ck_assert_int_eq(r.calls, stops[i].stop_at);
  }
}
END_TEST

/* A visitor without callbacks walks valid messages to 0 and malformed ones to -1. */
START_TEST(test_visitor_without_callbacks) {
  static const ttd_wire_visitor none = {NULL, NULL};
  static const struct {
    const char *hex;
    int rc;
  } cases[] = {{"08 01 11 01 02 03 04 05 06 07 08 12 00 1a 02 61 62 25 01 02 03 04", 0}, {"08 01 12 05 61", -1},
               {"0b", -1}};
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    uint8_t msg[64];
    size_t len = unhex(cases[i].hex, msg);
    grpc_byte_buffer *bb = bb_steps(msg, len, 3);
    ck_assert_int_eq(ttd_wire_walk(bb, &none, NULL), cases[i].rc);
    grpc_byte_buffer_destroy(bb);
  }
}
END_TEST

/* ---- framing ---- */

static int destroyed;
static void count_destroy(void *p) {
  destroyed++;
  free(p);
}

/* A slice over a fresh copy of data that counts its destruction in `destroyed`. */
static grpc_slice counted_slice(const uint8_t *data, size_t len) {
  uint8_t *copy = malloc(len ? len : 1);
  ck_assert_ptr_nonnull(copy);
  if (len) memcpy(copy, data, len);
  return grpc_slice_new_with_user_data(copy, len, count_destroy, copy);
}

static uint8_t *pattern(size_t len) {
  uint8_t *p = malloc(len ? len : 1);
  ck_assert_ptr_nonnull(p);
  for (size_t i = 0; i < len; i++) p[i] = (uint8_t)((i * 131) ^ (i >> 9));
  return p;
}

/* The walk of bb gives field 1 as head_field (bytes), then field `field` as data. */
static void expect_framed_walk(grpc_byte_buffer *bb, const uint8_t *head_field, size_t head_len, uint32_t field,
                               const uint8_t *data, size_t len) {
  built b;
  const wfield fields[] = {{.field = 1, .type = LEN, .data = head_field, .len = head_len},
                           {.field = field, .type = LEN, .data = data, .len = len}};
  build(&b, head_field ? fields : fields + 1, head_field ? 2 : 1);
  expect_walk(bb, 0, b.shown[head_field ? 1 : 0], "framed message");
  free(b.bytes);
}

/* Data sizes whose length varint takes 1..4 bytes, around each boundary. */
static const size_t frame_sizes[] = {1, 127, 128, 1000, 16383, 16384, (size_t)1 << 21};

/* A framed DownloadResponse is byte for byte protobuf-c's packing of the whole message,
 * unpacks to it, and its data slice is the caller's memory (zero copy). */
START_TEST(test_frame_download_matches_pack) {
  uint8_t info_bytes[64];
  size_t info_len = pack_info(info_bytes);
  Ttd__V1__TensorInfo *info = ttd__v1__tensor_info__unpack(NULL, info_len, info_bytes);
  ck_assert_ptr_nonnull(info);
  for (size_t i = 0; i < sizeof(frame_sizes) / sizeof(frame_sizes[0]); i++) {
    size_t len = frame_sizes[i];
    uint8_t *data = pattern(len);
    Ttd__V1__DownloadResponse head = TTD__V1__DOWNLOAD_RESPONSE__INIT;
    head.tensor = info;
    head.total_bytes = len;
    grpc_slice slice = counted_slice(data, len);
    const uint8_t *at = GRPC_SLICE_START_PTR(slice);
    destroyed = 0;
    grpc_byte_buffer *bb = ttd_wire_frame(&head.base, 3, slice);
    ck_assert_int_eq(destroyed, 0); /* the caller's reference is the buffer's now */
    ck_assert_uint_eq(bb->data.raw.slice_buffer.count, 2);
    ck_assert_ptr_eq(GRPC_SLICE_START_PTR(bb->data.raw.slice_buffer.slices[1]), at);

    Ttd__V1__DownloadResponse whole = head;
    whole.data.data = data;
    whole.data.len = len;
    size_t want_len = ttd__v1__download_response__get_packed_size(&whole);
    uint8_t *want = malloc(want_len);
    ck_assert_uint_eq(ttd__v1__download_response__pack(&whole, want), want_len);
    size_t got_len;
    uint8_t *got = bb_flatten(bb, &got_len);
    ck_assert_uint_eq(got_len, want_len);
    ck_assert_mem_eq(got, want, want_len);
    Ttd__V1__DownloadResponse *back = ttd__v1__download_response__unpack(NULL, got_len, got);
    expect_download(back, len, data, len);
    ttd__v1__download_response__free_unpacked(back, NULL);
    grpc_byte_buffer_destroy(bb);
    ck_assert_int_eq(destroyed, 1);
    free(got);
    free(want);
    free(data);
  }
  ttd__v1__tensor_info__free_unpacked(info, NULL);
}
END_TEST

/* A framed UploadRequest (header, then data as field 2) walks back to the same header and
 * data, in the two slices the frame made and cut anywhere; protobuf-c unpacks it. */
START_TEST(test_frame_upload_round_trip) {
  int64_t shape[] = {4, 25};
  Ttd__V1__TensorSpec spec = TTD__V1__TENSOR_SPEC__INIT;
  spec.dtype = TTD__V1__DTYPE__DTYPE_BFLOAT16;
  spec.n_shape = 2;
  spec.shape = shape;
  spec.device = "tt:0";
  Ttd__V1__ShmRange shm = TTD__V1__SHM_RANGE__INIT;
  shm.segment = 0xfeedfacecafebeefull;
  Ttd__V1__UploadHeader header = TTD__V1__UPLOAD_HEADER__INIT;
  header.target_case = TTD__V1__UPLOAD_HEADER__TARGET_SPEC;
  header.spec = &spec;
  header.source_dtype = TTD__V1__DTYPE__DTYPE_FLOAT32;
  header.shm = &shm;
  uint8_t header_bytes[128];
  size_t header_len = ttd__v1__upload_header__pack(&header, header_bytes);
  Ttd__V1__UploadRequest req = TTD__V1__UPLOAD_REQUEST__INIT;
  req.header = &header;
  for (size_t i = 0; i < sizeof(frame_sizes) / sizeof(frame_sizes[0]); i++) {
    size_t len = frame_sizes[i];
    uint8_t *data = pattern(len);
    expect_framed_walk(ttd_wire_frame(&req.base, 2, counted_slice(data, len)), header_bytes, header_len, 2, data, len);
    size_t flat_len;
    grpc_byte_buffer *bb = ttd_wire_frame(&req.base, 2, counted_slice(data, len));
    uint8_t *flat = bb_flatten(bb, &flat_len);
    grpc_byte_buffer_destroy(bb);
    Ttd__V1__UploadRequest *back = ttd__v1__upload_request__unpack(NULL, flat_len, flat);
    ck_assert_ptr_nonnull(back);
    ck_assert_ptr_nonnull(back->header);
    ck_assert_uint_eq(back->header->spec->dtype, TTD__V1__DTYPE__DTYPE_BFLOAT16);
    ck_assert_uint_eq(back->header->shm->segment, 0xfeedfacecafebeefull);
    ck_assert_uint_eq(back->data.len, len);
    ck_assert_mem_eq(back->data.data, data, len);
    ttd__v1__upload_request__free_unpacked(back, NULL);
    if (len < 200) { /* every cut of the whole message */
      built b;
      build(&b, (wfield[]){{.field = 1, .type = LEN, .data = header_bytes, .len = header_len},
                           {.field = 2, .type = LEN, .data = data, .len = len}},
            2);
      ck_assert_uint_eq(b.len, flat_len);
      ck_assert_mem_eq(b.bytes, flat, flat_len);
      expect_walk_any_slicing("a framed UploadRequest", flat, flat_len, 0, b.shown[1]);
      free(b.bytes);
    }
    free(flat);
    free(data);
  }
}
END_TEST

/* Without a head the frame is the bytes field alone: protobuf-c's packing of a message
 * holding only data. */
START_TEST(test_frame_without_head) {
  uint8_t *data = pattern(300);
  destroyed = 0;
  grpc_byte_buffer *bb = ttd_wire_frame(NULL, 3, counted_slice(data, 300));
  Ttd__V1__DownloadResponse whole = TTD__V1__DOWNLOAD_RESPONSE__INIT;
  whole.data.data = data;
  whole.data.len = 300;
  uint8_t want[320];
  size_t want_len = ttd__v1__download_response__pack(&whole, want);
  size_t got_len;
  uint8_t *got = bb_flatten(bb, &got_len);
  ck_assert_uint_eq(got_len, want_len);
  ck_assert_mem_eq(got, want, want_len);
  expect_framed_walk(bb, NULL, 0, 3, data, 300);
  ck_assert_int_eq(destroyed, 1);
  free(got);
  free(data);
}
END_TEST

/* Empty data: one slice, the field written with length 0 (reported once, empty), the data
 * slice's reference dropped at once; protobuf-c reads an empty field. */
START_TEST(test_frame_empty_data) {
  Ttd__V1__DownloadResponse head = TTD__V1__DOWNLOAD_RESPONSE__INIT;
  head.total_bytes = 5;
  destroyed = 0;
  grpc_byte_buffer *bb = ttd_wire_frame(&head.base, 3, counted_slice(NULL, 0));
  ck_assert_int_eq(destroyed, 1);
  ck_assert_uint_eq(bb->data.raw.slice_buffer.count, 1);
  size_t len;
  uint8_t *got = bb_flatten(bb, &len);
  uint8_t want[8];
  ck_assert_uint_eq(len, unhex("10 05 1a 00", want));
  ck_assert_mem_eq(got, want, len);
  Ttd__V1__DownloadResponse *back = ttd__v1__download_response__unpack(NULL, len, got);
  ck_assert_ptr_nonnull(back);
  ck_assert_uint_eq(back->total_bytes, 5);
  ck_assert_uint_eq(back->data.len, 0);
  ttd__v1__download_response__free_unpacked(back, NULL);
  expect_walk(bb, 0, "2=5 3:", "framed empty data");
  free(got);
}
END_TEST

/* The largest field number frames with a five-byte key that walks back to it. */
START_TEST(test_frame_largest_field) {
  destroyed = 0;
  grpc_byte_buffer *bb = ttd_wire_frame(NULL, 536870911, counted_slice((const uint8_t *)"ab", 2));
  expect_walk(bb, 0, "536870911:6162", "field 2^29 - 1");
  ck_assert_int_eq(destroyed, 1);
}
END_TEST

Suite *wire_frame_suite(void) {
  Suite *s = suite_create("wire_frame");
  TCase *tc = tcase_create("walk");
  tcase_add_loop_test(tc, test_walk_row, 0, (int)(sizeof(rows) / sizeof(rows[0])));
  tcase_add_test(tc, test_varint_every_length);
  tcase_add_test(tc, test_key_every_length);
  tcase_add_test(tc, test_unknown_fields_skipped);
  tcase_add_test(tc, test_truncated_every_offset);
  tcase_add_loop_test(tc, test_same_bytes_in_protobuf_c, 0, (int)(sizeof(pbc_rows) / sizeof(pbc_rows[0])));
  tcase_add_test(tc, test_visitor_stops_walk);
  tcase_add_test(tc, test_visitor_without_callbacks);
  suite_add_tcase(s, tc);

  tc = tcase_create("frame");
  tcase_add_test(tc, test_frame_download_matches_pack);
  tcase_add_test(tc, test_frame_upload_round_trip);
  tcase_add_test(tc, test_frame_without_head);
  tcase_add_test(tc, test_frame_empty_data);
  tcase_add_test(tc, test_frame_largest_field);
  suite_add_tcase(s, tc);
  return s;
}
