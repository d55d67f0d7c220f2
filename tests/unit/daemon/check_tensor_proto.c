/* rpc/tensor_proto.h: ttd.v1 TensorSpec to ttd_tensor_spec and back (TensorInfo), against
 * two simulated cards. Valid specs round-trip through protobuf-c's pack and unpack; each
 * bad input is INVALID_ARGUMENT with its exact message, the first problem named first. */
#include <check.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "rpc/tensor_proto.h"
#include "suites.h"

/* The conversions read only the core's backend (its device count): a core of just that. */
static ttd_core core;

static void setup(void) {
  ttd_backend_options options = {.devices = 2, .dram_bytes = 1u << 20, .l1_bytes = 64u << 10, .cores = 1};
  ttd_status_t s = ttd_backend_create("sim", &options, &core.backend);
  ck_assert_msg(s == NULL, "%s", ttd_status_message(s));
}

static void teardown(void) { ttd_backend_destroy(core.backend); }

/* s is INVALID_ARGUMENT with exactly message (every refusal here is); frees s. */
static void expect_invalid(ttd_status_t s, const char *message, const char *what) {
  ck_assert_msg(ttd_status_code(s) == GRPC_STATUS_INVALID_ARGUMENT && strcmp(ttd_status_message(s), message) == 0,
                "%s:\n  got  %s \"%s\"\n  want INVALID_ARGUMENT \"%s\"", what, ttd_code_name(ttd_status_code(s)),
                ttd_status_message(s), message);
  ttd_status_free(s);
}

/* A wire spec over shape (kept by the caller). */
static Ttd__V1__TensorSpec wire_spec(int dtype, size_t ndim, int64_t *shape, const char *device, int location) {
  Ttd__V1__TensorSpec w = TTD__V1__TENSOR_SPEC__INIT;
  w.dtype = (Ttd__V1__DType)dtype;
  w.n_shape = ndim;
  w.shape = shape;
  w.device = (char *)device;
  w.location = (Ttd__V1__MemoryLocation)location;
  return w;
}

enum {
  F32 = TTD__V1__DTYPE__DTYPE_FLOAT32,
  BF16 = TTD__V1__DTYPE__DTYPE_BFLOAT16,
  I32 = TTD__V1__DTYPE__DTYPE_INT32,
  UNSPEC = TTD__V1__MEMORY_LOCATION__MEMORY_LOCATION_UNSPECIFIED,
  DRAM = TTD__V1__MEMORY_LOCATION__MEMORY_LOCATION_DRAM,
  L1 = TTD__V1__MEMORY_LOCATION__MEMORY_LOCATION_L1,
};

/* ---- valid specs ---- */

static const struct good_row {
  const char *what;
  int dtype;
  size_t ndim;
  int64_t shape[TTD_MAX_DIMS];
  const char *device;
  int location;
  int want_device;
  ttd_memloc want_location;
  uint64_t numel, nbytes;
} good[] = {
    {"a 0-d float32, all defaults", F32, 0, {0}, "", UNSPEC, 0, TTD_MEM_DRAM, 1, 4},
    {"a NULL device means tt:0", I32, 1, {5}, NULL, DRAM, 0, TTD_MEM_DRAM, 5, 20},
    {"bfloat16 in L1 of tt:1", BF16, 2, {2, 3}, "tt:1", L1, 1, TTD_MEM_L1, 6, 12},
    {"8 dims", I32, TTD_MAX_DIMS, {1, 2, 1, 2, 1, 2, 1, 2}, "tt:0", DRAM, 0, TTD_MEM_DRAM, 16, 64},
    {"a 0 dim holds no bytes", F32, 3, {4, 0, 5}, "tt:1", UNSPEC, 1, TTD_MEM_DRAM, 0, 0},
    {"the largest byte count", I32, 1, {((int64_t)1 << 61) - 1}, "", L1, 0, TTD_MEM_L1, ((uint64_t)1 << 61) - 1,
     ((uint64_t)1 << 63) - 4},
};

static void expect_spec(const ttd_tensor_spec *got, const struct good_row *row) {
  ck_assert_int_eq(got->dtype, row->dtype);
  ck_assert_int_eq(got->ndim, (int)row->ndim);
  for (size_t i = 0; i < row->ndim; i++) ck_assert_int_eq(got->shape[i], row->shape[i]);
  ck_assert_int_eq(got->device, row->want_device);
  ck_assert_int_eq(got->location, row->want_location);
  ck_assert_uint_eq(got->numel, row->numel);
  ck_assert_uint_eq(got->nbytes, row->nbytes);
}

/* A valid spec converts, and goes to a TensorInfo (canonical device and location) that
 * packs, unpacks and converts back to the same spec. */
START_TEST(test_valid_spec_round_trip) {
  const struct good_row *row = &good[_i];
  int64_t shape[TTD_MAX_DIMS];
  memcpy(shape, row->shape, sizeof(shape));
  Ttd__V1__TensorSpec w = wire_spec(row->dtype, row->ndim, shape, row->device, row->location);
  ttd_tensor_spec spec;
  memset(&spec, 0xff, sizeof(spec)); /* must be overwritten */
  ttd_status_t s = ttd_tensor_spec_from_proto(&core, &w, &spec);
  ck_assert_msg(s == NULL, "%s: %s", row->what, ttd_status_message(s));
  expect_spec(&spec, row);

  ttd_call call = {0};
  ttd_call_init(&call, &core, NULL);
  Ttd__V1__TensorInfo *info = ttd_tensor_info_to_proto(&call, 0xfedcba9876543210ull, &spec);
  ck_assert_ptr_nonnull(info);
  ck_assert_uint_eq(info->handle, 0xfedcba9876543210ull);
  ck_assert_uint_eq(info->nbytes, row->nbytes);
  ck_assert_int_eq(info->spec->dtype, row->dtype);
  ck_assert_uint_eq(info->spec->n_shape, row->ndim);
  ck_assert_ptr_nonnull(info->spec->shape);
  ck_assert_str_eq(info->spec->device, row->want_device ? "tt:1" : "tt:0");
  ck_assert_int_eq(info->spec->location, row->want_location == TTD_MEM_L1 ? L1 : DRAM);

  uint8_t packed[256];
  ck_assert_uint_le(ttd__v1__tensor_info__get_packed_size(info), sizeof(packed));
  size_t len = ttd__v1__tensor_info__pack(info, packed);
  ttd_call_deinit(&call); /* the info lived in the call's arena */
  Ttd__V1__TensorInfo *back = ttd__v1__tensor_info__unpack(NULL, len, packed);
  ck_assert_ptr_nonnull(back);
  ttd_tensor_spec again;
  s = ttd_tensor_spec_from_proto(&core, back->spec, &again);
  ck_assert_msg(s == NULL, "%s, back: %s", row->what, ttd_status_message(s));
  expect_spec(&again, row);
  ck_assert_uint_eq(back->nbytes, row->nbytes);
  ttd__v1__tensor_info__free_unpacked(back, NULL);
}
END_TEST

/* ---- bad specs ---- */

#define X16 "xxxxxxxxxxxxxxxx"
#define BAD_DTYPE(d) "dtype " #d " is not supported; use DTYPE_FLOAT32, DTYPE_BFLOAT16 or DTYPE_INT32"
#define NO_DEVICE(name) "device '" name "' does not exist; this daemon has tt:0 .. tt:1"
#define BAD_LOCATION(l) "memory location " #l " is unknown; use MEMORY_LOCATION_DRAM or MEMORY_LOCATION_L1"

static const struct bad_row {
  const char *what;
  bool missing;
  int dtype;
  size_t ndim;
  int64_t shape[TTD_MAX_DIMS + 1];
  const char *device;
  int location;
  const char *message;
} bad[] = {
    {"no spec at all", true, 0, 0, {0}, "", 0, "the tensor spec is missing; set dtype, shape and device"},
    {"dtype unspecified", false, 0, 1, {1}, "", 0, BAD_DTYPE(0)},
    {"dtype past the last", false, 4, 1, {1}, "", 0, BAD_DTYPE(4)},
    {"a negative dtype", false, -1, 1, {1}, "", 0, BAD_DTYPE(-1)},
    {"9 dims", false, F32, TTD_MAX_DIMS + 1, {1}, "", 0, "shape has 9 dims; at most 8 are supported"},
    {"a negative dim", false, F32, 2, {2, -3}, "", 0, "dim 1 of the shape is -3; dims must be >= 0"},
    {"the most negative dim", false, F32, 1, {INT64_MIN}, "", 0,
     "dim 0 of the shape is -9223372036854775808; dims must be >= 0"},
    {"elements past 2^64", false, F32, 2, {(int64_t)1 << 32, (int64_t)1 << 32}, "", 0,
     "shape has more than 2^63 elements (overflow at dim 1)"},
    {"exactly 2^63 elements", false, I32, 3, {(int64_t)1 << 31, (int64_t)1 << 31, 2}, "", 0,
     "shape has more than 2^63 elements (overflow at dim 2)"},
    {"elements that fit in bytes that do not", false, F32, 1, {(int64_t)1 << 62}, "", 0,
     "tensor of 4611686018427387904 float32 elements exceeds 2^63 bytes"},
    {"overflowing dims beside a 0 dim", false, F32, 3, {0, (int64_t)1 << 62, 4}, "", 0,
     "shape has more than 2^63 elements (overflow at dim 2)"},
    {"a device past the last", false, F32, 1, {1}, "tt:2", 0, NO_DEVICE("tt:2")},
    {"another kind of device", false, F32, 1, {1}, "gpu:0", 0, NO_DEVICE("gpu:0")},
    {"a device without a number", false, F32, 1, {1}, "tt:", 0, NO_DEVICE("tt:")},
    {"a negative device", false, F32, 1, {1}, "tt:-1", 0, NO_DEVICE("tt:-1")},
    {"a device with a tail", false, F32, 1, {1}, "tt:1x", 0, NO_DEVICE("tt:1x")},
    {"a device with a space", false, F32, 1, {1}, "tt: 1", 0, NO_DEVICE("tt: 1")},
    {"a device number past long", false, F32, 1, {1}, "tt:99999999999999999999", 0, NO_DEVICE("tt:99999999999999999999")},
    {"a device in capitals", false, F32, 1, {1}, "TT:0", 0, NO_DEVICE("TT:0")},
    {"a long device name is cut at 64 characters", false, F32, 1, {1}, X16 X16 X16 X16 "yyyy", 0,
     NO_DEVICE(X16 X16 X16 X16)},
    {"a location past the last", false, F32, 1, {1}, "", 3, BAD_LOCATION(3)},
    {"a negative location", false, F32, 1, {1}, "", -1, BAD_LOCATION(-1)},
    /* the first problem is the one named */
    {"bad dtype, dims, device and location", false, 0, TTD_MAX_DIMS + 1, {1}, "tt:9", 7, BAD_DTYPE(0)},
    {"too many dims, bad device", false, F32, TTD_MAX_DIMS + 1, {1}, "tt:9", 7,
     "shape has 9 dims; at most 8 are supported"},
    {"a negative dim, bad device", false, F32, 1, {-1}, "tt:9", 7, "dim 0 of the shape is -1; dims must be >= 0"},
    {"bad device and location", false, F32, 1, {1}, "tt:9", 7, NO_DEVICE("tt:9")},
};

/* A bad spec is INVALID_ARGUMENT with a message naming what to fix. */
START_TEST(test_bad_spec) {
  const struct bad_row *row = &bad[_i];
  int64_t shape[TTD_MAX_DIMS + 1];
  memcpy(shape, row->shape, sizeof(shape));
  Ttd__V1__TensorSpec w = wire_spec(row->dtype, row->ndim, shape, row->device, row->location);
  ttd_tensor_spec spec;
  ttd_status_t s = ttd_tensor_spec_from_proto(&core, row->missing ? NULL : &w, &spec);
  expect_invalid(s, row->message, row->what);
}
END_TEST

/* Memory locations: unspecified and DRAM are DRAM, L1 is L1, anything else is refused. */
START_TEST(test_memloc_from_proto) {
  static const struct {
    int wire;
    ttd_memloc want;
  } ok[] = {{UNSPEC, TTD_MEM_DRAM}, {DRAM, TTD_MEM_DRAM}, {L1, TTD_MEM_L1}};
  for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
    ttd_memloc loc = 0;
    ck_assert_ptr_null(ttd_memloc_from_proto(ok[i].wire, &loc));
    ck_assert_int_eq(loc, ok[i].want);
  }
  ttd_memloc loc;
  expect_invalid(ttd_memloc_from_proto(3, &loc), BAD_LOCATION(3), "location 3");
  expect_invalid(ttd_memloc_from_proto(INT_MAX, &loc), BAD_LOCATION(2147483647), "location INT_MAX");
  expect_invalid(ttd_memloc_from_proto(INT_MIN, &loc), BAD_LOCATION(-2147483648), "location INT_MIN");
}
END_TEST

Suite *tensor_proto_suite(void) {
  Suite *s = suite_create("tensor_proto");
  TCase *tc = tcase_create("tensor_proto");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_loop_test(tc, test_valid_spec_round_trip, 0, (int)(sizeof(good) / sizeof(good[0])));
  tcase_add_loop_test(tc, test_bad_spec, 0, (int)(sizeof(bad) / sizeof(bad[0])));
  tcase_add_test(tc, test_memloc_from_proto);
  suite_add_tcase(s, tc);
  return s;
}
