/* rpc/inline_tensor.h: inline tensors of Execute and Backward, on a core of two simulated
 * cards with a session holding one shared-memory segment: each check against the expected
 * dtype and shape with its exact INVALID_ARGUMENT message (the first problem named), the
 * 4 MiB limit on the total, and device tensors made from data or a segment range, charged
 * to the session, counted in the metrics and read back; failures leave nothing behind. */
#define _GNU_SOURCE /* memfd_create */
#include <check.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "rpc/inline_tensor.h"
#include "session/session.h"
#include "suites.h"

#define SEGMENT_BYTES 4096
#define CALL_DEVICE 1

static ttd_config config;
static ttd_core *core;
static ttd_session *session;
static ttd_shm_segment *segment; /* the test's own reference */
static uint64_t segment_id;
static ttd_call call;

static void setup(void) {
  ttd_config_defaults(&config);
  config.devices = 2;
  config.dram = 1u << 20;
  config.cores = 1;
  ttd_status_t s = ttd_core_create(&config, &core);
  ck_assert_msg(s == NULL, "%s", ttd_status_message(s));
  session = ttd_session_create(7, &(ttd_session_params){.client_name = "t", .tenant = "local"}, 0);
  ck_assert_ptr_nonnull(session);
  int fd = memfd_create("ttd-inline-test", MFD_ALLOW_SEALING);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(ftruncate(fd, SEGMENT_BYTES), 0);
  ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  s = ttd_shm_segment_map(fd, SEGMENT_BYTES, &segment);
  close(fd);
  ck_assert_msg(s == NULL, "%s", ttd_status_message(s));
  s = ttd_session_segment_add(session, ttd_shm_segment_retain(segment), getuid(), &segment_id);
  ck_assert_msg(s == NULL, "%s", ttd_status_message(s));
  memset(&call, 0, sizeof(call));
  ttd_call_init(&call, core, NULL);
  call.session = ttd_session_retain(session);
}

static uint64_t device_used(void) {
  ttd_device_info info;
  core->backend->vtable->device_info(core->backend, CALL_DEVICE, &info);
  return info.memory[0].used_bytes + info.memory[1].used_bytes;
}

static int segment_refs(void) { return atomic_load(&segment->refs); }
static uint64_t quota_used(void) { return atomic_load(&session->quota->used); }
static uint64_t to_device(void) { return atomic_load(&core->metrics.bytes_to_device); }
static uint64_t to_host(void) { return atomic_load(&core->metrics.bytes_to_host); }

static void teardown(void) {
  ttd_call_deinit(&call);
  ttd_session_release(session);
  ck_assert_int_eq(segment_refs(), 1); /* the session let go of it */
  ttd_shm_segment_release(segment);
  ck_assert_uint_eq(device_used(), 0);
  ttd_core_destroy(core);
  ttd_config_clear(&config);
}

/* s has code and exactly message; frees s. */
static void expect_status(ttd_status_t s, ttd_code code, const char *message, const char *what) {
  ck_assert_msg(ttd_status_code(s) == code, "%s: %s (%s), want %s", what, ttd_code_name(ttd_status_code(s)),
                ttd_status_message(s), ttd_code_name(code));
  ck_assert_msg(strcmp(ttd_status_message(s), message) == 0, "%s:\n  got  \"%s\"\n  want \"%s\"", what,
                ttd_status_message(s), message);
  ttd_status_free(s);
}

enum {
  F32 = TTD__V1__DTYPE__DTYPE_FLOAT32,
  BF16 = TTD__V1__DTYPE__DTYPE_BFLOAT16,
  I32 = TTD__V1__DTYPE__DTYPE_INT32,
  L1 = TTD__V1__MEMORY_LOCATION__MEMORY_LOCATION_L1,
  NO_SHM = -1,
};

/* An InlineTensor and the storage it points into. */
typedef struct inline_wire {
  Ttd__V1__InlineTensor t;
  Ttd__V1__TensorSpec spec;
  Ttd__V1__ShmRange shm;
  int64_t shape[TTD_MAX_DIMS + 1];
  uint8_t data[64];
} inline_wire;

/* What an inline tensor says: no_spec drops the spec; shm_len NO_SHM sends no range. */
typedef struct inline_desc {
  bool no_spec;
  int dtype;
  size_t ndim;
  int64_t shape[TTD_MAX_DIMS + 1];
  const char *device;
  int location;
  size_t data_len;
  int64_t shm_len;
} inline_desc;

static void make_inline(inline_wire *w, const inline_desc *d) {
  memset(w, 0, sizeof(*w));
  ttd__v1__inline_tensor__init(&w->t);
  ttd__v1__tensor_spec__init(&w->spec);
  ttd__v1__shm_range__init(&w->shm);
  memcpy(w->shape, d->shape, sizeof(w->shape));
  w->spec.dtype = (Ttd__V1__DType)d->dtype;
  w->spec.n_shape = d->ndim;
  w->spec.shape = w->shape;
  w->spec.device = (char *)(d->device ? d->device : "");
  w->spec.location = (Ttd__V1__MemoryLocation)d->location;
  for (size_t i = 0; i < sizeof(w->data); i++) w->data[i] = (uint8_t)(i * 7 + 3);
  ck_assert_uint_le(d->data_len, sizeof(w->data));
  w->t.spec = d->no_spec ? NULL : &w->spec;
  w->t.data.data = d->data_len ? w->data : NULL;
  w->t.data.len = d->data_len;
  if (d->shm_len != NO_SHM) {
    w->shm.segment = segment_id;
    w->shm.length = (uint64_t)d->shm_len;
    w->t.shm = &w->shm;
  }
}

/* float32 [2, 3]: what the program expects in the checks below. */
static const ttd_value_type want_2x3 = {.dtype = TTD_DTYPE_FLOAT32, .shape = {.ndim = 2, .d = {2, 3}}};

/* ---- ttd_inline_check ---- */

#define IN "inline input 0 ('x')"
#define NEEDS "; float32 [2, 3] needs exactly 24"

static const struct check_row {
  const char *what;
  inline_desc in;
  const char *message; /* NULL: OK */
} check_rows[] = {
    {"data of the right size", {.dtype = F32, .ndim = 2, .shape = {2, 3}, .data_len = 24, .shm_len = NO_SHM}, NULL},
    {"the call's device named", {.dtype = F32, .ndim = 2, .shape = {2, 3}, .device = "tt:1", .data_len = 24, .shm_len = NO_SHM},
     NULL},
    {"L1 asked (ignored: inline tensors live in DRAM)",
     {.dtype = F32, .ndim = 2, .shape = {2, 3}, .location = L1, .data_len = 24, .shm_len = NO_SHM}, NULL},
    {"a shared-memory range of the right size", {.dtype = F32, .ndim = 2, .shape = {2, 3}, .shm_len = 24}, NULL},
    {"no spec", {.no_spec = true, .data_len = 24, .shm_len = NO_SHM}, IN " has no spec; set its dtype and shape"},
    {"an unknown dtype", {.dtype = 9, .ndim = 2, .shape = {2, 3}, .data_len = 24, .shm_len = NO_SHM},
     IN ": dtype 9 is not supported; use DTYPE_FLOAT32, DTYPE_BFLOAT16 or DTYPE_INT32"},
    {"9 dims", {.dtype = F32, .ndim = 9, .shape = {2, 3, 1, 1, 1, 1, 1, 1, 1}, .data_len = 24, .shm_len = NO_SHM},
     IN ": shape has 9 dims; at most 8 are supported"},
    {"a negative dim", {.dtype = F32, .ndim = 2, .shape = {-2, -3}, .data_len = 24, .shm_len = NO_SHM},
     IN ": dim 0 of the shape is -2; dims must be >= 0"},
    {"an overflowing shape", {.dtype = F32, .ndim = 2, .shape = {INT64_MAX, 2}, .data_len = 24, .shm_len = NO_SHM},
     IN ": shape has more than 2^63 elements (overflow at dim 1)"},
    {"a device that does not exist", {.dtype = F32, .ndim = 2, .shape = {2, 3}, .device = "tt:7", .data_len = 24, .shm_len = NO_SHM},
     IN ": device 'tt:7' does not exist; this daemon has tt:0 .. tt:1"},
    {"an unknown location (the spec is checked whole)",
     {.dtype = F32, .ndim = 2, .shape = {2, 3}, .location = 5, .data_len = 24, .shm_len = NO_SHM},
     IN ": memory location 5 is unknown; use MEMORY_LOCATION_DRAM or MEMORY_LOCATION_L1"},
    {"another device", {.dtype = F32, .ndim = 2, .shape = {2, 3}, .device = "tt:0", .data_len = 24, .shm_len = NO_SHM},
     IN " names tt:0 but the call runs on tt:1; leave its device empty"},
    {"another dtype", {.dtype = I32, .ndim = 2, .shape = {2, 3}, .data_len = 24, .shm_len = NO_SHM},
     IN " must be float32 [2, 3], got int32 [2, 3]"},
    {"dims swapped", {.dtype = F32, .ndim = 2, .shape = {3, 2}, .data_len = 24, .shm_len = NO_SHM},
     IN " must be float32 [2, 3], got float32 [3, 2]"},
    {"flattened", {.dtype = F32, .ndim = 1, .shape = {6}, .data_len = 24, .shm_len = NO_SHM},
     IN " must be float32 [2, 3], got float32 [6]"},
    {"a trailing 1 dim", {.dtype = F32, .ndim = 3, .shape = {2, 3, 1}, .data_len = 24, .shm_len = NO_SHM},
     IN " must be float32 [2, 3], got float32 [2, 3, 1]"},
    {"0-d", {.dtype = F32, .ndim = 0, .data_len = 4, .shm_len = NO_SHM}, IN " must be float32 [2, 3], got float32 []"},
    {"both data and a range", {.dtype = F32, .ndim = 2, .shape = {2, 3}, .data_len = 24, .shm_len = 24},
     IN " has both data and a shared-memory range; send one of them"},
    {"a byte short", {.dtype = F32, .ndim = 2, .shape = {2, 3}, .data_len = 23, .shm_len = NO_SHM},
     IN " has 23 bytes of data" NEEDS},
    {"a byte over", {.dtype = F32, .ndim = 2, .shape = {2, 3}, .data_len = 25, .shm_len = NO_SHM},
     IN " has 25 bytes of data" NEEDS},
    {"no data at all", {.dtype = F32, .ndim = 2, .shape = {2, 3}, .shm_len = NO_SHM}, IN " has 0 bytes of data" NEEDS},
    {"a range a byte over", {.dtype = F32, .ndim = 2, .shape = {2, 3}, .shm_len = 25},
     IN " has 25 bytes of shared memory" NEEDS},
    {"an empty range", {.dtype = F32, .ndim = 2, .shape = {2, 3}, .shm_len = 0}, IN " has 0 bytes of shared memory" NEEDS},
    {"a huge range", {.dtype = F32, .ndim = 2, .shape = {2, 3}, .shm_len = INT64_MAX},
     IN " has 9223372036854775807 bytes of shared memory" NEEDS},
    /* the first problem is the one named */
    {"another device and dtype", {.dtype = I32, .ndim = 2, .shape = {2, 3}, .device = "tt:0", .data_len = 3, .shm_len = NO_SHM},
     IN " names tt:0 but the call runs on tt:1; leave its device empty"},
    {"another dtype and size", {.dtype = BF16, .ndim = 2, .shape = {2, 3}, .data_len = 12, .shm_len = 12},
     IN " must be float32 [2, 3], got bfloat16 [2, 3]"},
    {"both data and a range, of the wrong size", {.dtype = F32, .ndim = 2, .shape = {2, 3}, .data_len = 3, .shm_len = 5},
     IN " has both data and a shared-memory range; send one of them"},
};

/* An inline tensor passes only as the dtype and shape wanted, on the call's device, with
 * exactly their bytes; it then lands on the call's device in DRAM. */
START_TEST(test_check) {
  const struct check_row *row = &check_rows[_i];
  inline_wire w;
  make_inline(&w, &row->in);
  ttd_tensor_spec spec;
  ttd_status_t s = ttd_inline_check(core, &w.t, &want_2x3, "inline input", 0, "x", CALL_DEVICE, &spec);
  if (row->message) {
    expect_status(s, GRPC_STATUS_INVALID_ARGUMENT, row->message, row->what);
    return;
  }
  ck_assert_msg(s == NULL, "%s: %s", row->what, ttd_status_message(s));
  ck_assert_int_eq(spec.dtype, TTD_DTYPE_FLOAT32);
  ck_assert_int_eq(spec.ndim, 2);
  ck_assert_int_eq(spec.shape[0], 2);
  ck_assert_int_eq(spec.shape[1], 3);
  ck_assert_int_eq(spec.device, CALL_DEVICE);
  ck_assert_int_eq(spec.location, TTD_MEM_DRAM);
  ck_assert_uint_eq(spec.numel, 6);
  ck_assert_uint_eq(spec.nbytes, 24);
}
END_TEST

/* Messages name the tensor as told (what, index), its name cut at 128 characters. */
START_TEST(test_check_names_tensor) {
  char name[201], cut[129], want[512];
  memset(name, 'n', 200);
  name[200] = '\0';
  memcpy(cut, name, 128);
  cut[128] = '\0';
  static const inline_desc cases[] = {
      {.no_spec = true, .shm_len = NO_SHM},
      {.dtype = 0, .ndim = 2, .shape = {2, 3}, .shm_len = NO_SHM},
      {.dtype = F32, .ndim = 1, .shape = {2}, .shm_len = NO_SHM},
  };
  static const char *const tails[] = {
      " has no spec; set its dtype and shape",
      ": dtype 0 is not supported; use DTYPE_FLOAT32, DTYPE_BFLOAT16 or DTYPE_INT32",
      " must be float32 [2, 3], got float32 [2]",
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    inline_wire w;
    make_inline(&w, &cases[i]);
    ttd_tensor_spec spec;
    snprintf(want, sizeof(want), "inline gradient of output 3 ('%s')%s", cut, tails[i]);
    expect_status(ttd_inline_check(core, &w.t, &want_2x3, "inline gradient of output", 3, name, CALL_DEVICE, &spec),
                  GRPC_STATUS_INVALID_ARGUMENT, want, tails[i]);
  }
}
END_TEST

/* An empty tensor travels with no bytes at all, as data or as an empty range. */
START_TEST(test_check_empty_tensor) {
  static const ttd_value_type want = {.dtype = TTD_DTYPE_INT32, .shape = {.ndim = 2, .d = {0, 3}}};
  static const int64_t shm_lens[] = {NO_SHM, 0};
  for (int i = 0; i < 2; i++) {
    inline_wire w;
    make_inline(&w, &(inline_desc){.dtype = I32, .ndim = 2, .shape = {0, 3}, .shm_len = shm_lens[i]});
    ttd_tensor_spec spec;
    ttd_status_t s = ttd_inline_check(core, &w.t, &want, "inline input", 0, "x", CALL_DEVICE, &spec);
    ck_assert_msg(s == NULL, "%s", ttd_status_message(s));
    ck_assert_uint_eq(spec.nbytes, 0);
  }
}
END_TEST

/* ---- ttd_inline_check_total and ttd_value_type_nbytes ---- */

/* Up to TTD_INLINE_MAX_BYTES in all travel inline; a byte more is INVALID_ARGUMENT saying
 * whose bytes, the limit and what to do instead. */
START_TEST(test_check_total) {
  ck_assert_uint_eq(TTD_INLINE_MAX_BYTES, 4194304);
  ck_assert_ptr_null(ttd_inline_check_total(0, "inline inputs", "x"));
  ck_assert_ptr_null(ttd_inline_check_total(TTD_INLINE_MAX_BYTES, "inline inputs", "x"));
  expect_status(ttd_inline_check_total(TTD_INLINE_MAX_BYTES + 1, "inline inputs", "upload them"),
                GRPC_STATUS_INVALID_ARGUMENT,
                "inline inputs add up to 4194305 bytes; at most 4194304 (4 MiB) travel inline: upload them", "4 MiB + 1");
  expect_status(ttd_inline_check_total(UINT64_MAX, "the program's outputs", "ask for handles"),
                GRPC_STATUS_INVALID_ARGUMENT,
                "the program's outputs add up to 18446744073709551615 bytes; at most 4194304 (4 MiB) travel inline: "
                "ask for handles",
                "UINT64_MAX");
}
END_TEST

/* A program value's bytes: elements (1 for 0-d) times the dtype's size, 0 for a bad dtype. */
START_TEST(test_value_type_nbytes) {
  static const struct {
    ttd_value_type t;
    uint64_t want;
  } cases[] = {
      {{TTD_DTYPE_FLOAT32, {2, {2, 3}}}, 24},
      {{TTD_DTYPE_BFLOAT16, {0, {0}}}, 2},
      {{TTD_DTYPE_INT32, {2, {0, 5}}}, 0},
      {{TTD_DTYPE_FLOAT32, {8, {2, 2, 2, 2, 2, 2, 2, 2}}}, 1024},
      {{TTD_DTYPE_INVALID, {1, {4}}}, 0},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    ck_assert_uint_eq(ttd_value_type_nbytes(&cases[i].t), cases[i].want);
  }
}
END_TEST

/* ---- ttd_inline_create and ttd_inline_read ---- */

/* The spec ttd_inline_check gives for w (which must pass), wanting what w says. */
static ttd_tensor_spec checked_spec(const inline_wire *w) {
  ttd_value_type want = {.dtype = (ttd_dtype)w->spec.dtype, .shape = {.ndim = (int)w->spec.n_shape}};
  memcpy(want.shape.d, w->shape, sizeof(int64_t) * w->spec.n_shape);
  ttd_tensor_spec spec;
  ttd_status_t s = ttd_inline_check(core, &w->t, &want, "inline input", 0, "x", CALL_DEVICE, &spec);
  ck_assert_msg(s == NULL, "%s", ttd_status_message(s));
  return spec;
}

/* A failed create left no tensor, no device memory, no charge and no count behind. */
static void expect_nothing_made(const ttd_tensor *t) {
  ck_assert_ptr_null(t);
  ck_assert_uint_eq(device_used(), 0);
  ck_assert_uint_eq(quota_used(), 0);
  ck_assert_uint_eq(to_device(), 0);
}

/* Creates the tensor of w, checks where it is, what it is charged and counted, reads it back
 * (expecting want's bytes) and releases it. */
static void create_and_read(const inline_wire *w, const uint8_t *want) {
  ttd_tensor_spec spec = checked_spec(w);
  ttd_tensor *t = (ttd_tensor *)&t; /* must be set */
  ttd_status_t s = ttd_inline_create(&call, &spec, &w->t, &t);
  ck_assert_msg(s == NULL, "%s", ttd_status_message(s));
  ck_assert_ptr_nonnull(t);
  ck_assert_int_eq(t->spec.device, CALL_DEVICE);
  ck_assert_int_eq(t->spec.location, TTD_MEM_DRAM);
  ck_assert_uint_eq(t->spec.nbytes, spec.nbytes);
  ck_assert_ptr_eq(t->quota, session->quota);
  ck_assert_uint_eq(quota_used(), spec.nbytes);
  ck_assert_uint_eq(device_used(), spec.nbytes);
  ck_assert_uint_eq(to_device(), spec.nbytes);

  ProtobufCBinaryData out = {.len = 99, .data = NULL};
  s = ttd_inline_read(&call, t, &out);
  ck_assert_msg(s == NULL, "%s", ttd_status_message(s));
  ck_assert_uint_eq(out.len, spec.nbytes);
  ck_assert_ptr_nonnull(out.data);
  if (spec.nbytes) ck_assert_mem_eq(out.data, want, spec.nbytes);
  ck_assert_uint_eq(to_host(), spec.nbytes);
  ttd_tensor_release(t);
  ck_assert_uint_eq(quota_used(), 0);
  ck_assert_uint_eq(device_used(), 0);
}

/* Inline data becomes a device tensor with those bytes, charged to the session. */
START_TEST(test_create_from_data) {
  inline_wire w;
  make_inline(&w, &(inline_desc){.dtype = F32, .ndim = 2, .shape = {2, 3}, .data_len = 24, .shm_len = NO_SHM});
  create_and_read(&w, w.data);
}
END_TEST

/* A range of the session's segment becomes a device tensor with those bytes; the segment's
 * reference is given back. */
START_TEST(test_create_from_shm) {
  inline_wire w;
  make_inline(&w, &(inline_desc){.dtype = BF16, .ndim = 1, .shape = {12}, .shm_len = 24});
  w.shm.offset = SEGMENT_BYTES - 24; /* the last bytes */
  for (int i = 0; i < 24; i++) segment->addr[SEGMENT_BYTES - 24 + i] = (uint8_t)(0xf0 - i);
  int refs = segment_refs();
  create_and_read(&w, segment->addr + SEGMENT_BYTES - 24);
  ck_assert_int_eq(segment_refs(), refs);
}
END_TEST

/* An empty tensor is made without a write and reads back as no bytes. */
START_TEST(test_create_empty) {
  inline_wire w;
  make_inline(&w, &(inline_desc){.dtype = F32, .ndim = 2, .shape = {3, 0}, .shm_len = NO_SHM});
  create_and_read(&w, NULL);
}
END_TEST

/* A bad range is refused before anything is allocated, with the segment's reference given
 * back: NOT_FOUND for a segment the session lacks, INVALID_ARGUMENT for bytes outside it. */
START_TEST(test_create_bad_range) {
  static const struct {
    bool other_segment;
    uint64_t offset, length;
    ttd_code code;
    const char *message; /* %s: the segment id's hex */
  } cases[] = {
      {true, 0, 24, GRPC_STATUS_NOT_FOUND, "shared-memory segment 0x%s is not registered in this session"},
      {false, SEGMENT_BYTES - 23, 24, GRPC_STATUS_INVALID_ARGUMENT, "the range [4073, +24) lies outside the 4096-byte segment"},
      {false, SEGMENT_BYTES + 1, 24, GRPC_STATUS_INVALID_ARGUMENT, "the range [4097, +24) lies outside the 4096-byte segment"},
      {false, UINT64_MAX - 7, 24, GRPC_STATUS_INVALID_ARGUMENT,
       "the range [18446744073709551608, +24) lies outside the 4096-byte segment"},
      {false, 0, 25, GRPC_STATUS_INVALID_ARGUMENT, "the shared-memory range holds 25 bytes but the transfer moves 24"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    inline_wire w;
    make_inline(&w, &(inline_desc){.dtype = F32, .ndim = 2, .shape = {2, 3}, .shm_len = 24});
    ttd_tensor_spec spec = checked_spec(&w);
    w.shm.segment = cases[i].other_segment ? segment_id ^ 1 : segment_id;
    w.shm.offset = cases[i].offset;
    w.shm.length = cases[i].length;
    char hex[17], message[256];
    snprintf(hex, sizeof(hex), "%016" PRIx64, w.shm.segment);
    snprintf(message, sizeof(message), cases[i].message, hex);
    int refs = segment_refs();
    ttd_tensor *t = (ttd_tensor *)&t;
    expect_status(ttd_inline_create(&call, &spec, &w.t, &t), cases[i].code, message, message);
    expect_nothing_made(t);
    ck_assert_int_eq(segment_refs(), refs);
  }
}
END_TEST

/* A tensor past the session's quota, or past the card's memory, is RESOURCE_EXHAUSTED with
 * their messages, and nothing is held or counted. */
START_TEST(test_create_no_room) {
  static const struct {
    uint64_t quota;
    int64_t elements;
    const char *prefix;
  } cases[] = {
      {16, 6, "session memory quota exceeded: "},
      {0, 512 * 1024, "tt:1 dram is full: requested 2097152 bytes"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    ttd_quota_set_limit(session->quota, cases[i].quota);
    uint8_t *data = calloc((size_t)cases[i].elements, 4);
    ck_assert_ptr_nonnull(data);
    Ttd__V1__InlineTensor wire = TTD__V1__INLINE_TENSOR__INIT;
    wire.data.data = data;
    wire.data.len = (size_t)cases[i].elements * 4;
    ttd_tensor_spec spec = {.dtype = TTD_DTYPE_FLOAT32, .ndim = 1, .shape = {cases[i].elements}, .device = CALL_DEVICE,
                            .location = TTD_MEM_DRAM};
    ck_assert_ptr_null(ttd_tensor_spec_finish(&spec));
    ttd_tensor *t = (ttd_tensor *)&t;
    ttd_status_t s = ttd_inline_create(&call, &spec, &wire, &t);
    ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_RESOURCE_EXHAUSTED);
    ck_assert_msg(strncmp(ttd_status_message(s), cases[i].prefix, strlen(cases[i].prefix)) == 0, "%s",
                  ttd_status_message(s));
    ttd_status_free(s);
    expect_nothing_made(t);
    free(data);
  }
}
END_TEST

Suite *inline_tensor_suite(void) {
  Suite *s = suite_create("inline_tensor");
  TCase *tc = tcase_create("check");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_loop_test(tc, test_check, 0, (int)(sizeof(check_rows) / sizeof(check_rows[0])));
  tcase_add_test(tc, test_check_names_tensor);
  tcase_add_test(tc, test_check_empty_tensor);
  tcase_add_test(tc, test_check_total);
  tcase_add_test(tc, test_value_type_nbytes);
  suite_add_tcase(s, tc);

  tc = tcase_create("create");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_create_from_data);
  tcase_add_test(tc, test_create_from_shm);
  tcase_add_test(tc, test_create_empty);
  tcase_add_test(tc, test_create_bad_range);
  tcase_add_test(tc, test_create_no_room);
  suite_add_tcase(s, tc);
  return s;
}
