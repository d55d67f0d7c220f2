/* device/tensor.h over a sim backend: tensor specs (sizes, bad dims and dtypes, overflow) and
 * tensors (too big, zeroed, references). */
#include <check.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "session/session.h"
#include "device/tensor.h"
#include "session_fixture.h"
#include "suites.h"

/* ---- tensor specs ---- */

static ttd_status_t finish(ttd_dtype dtype, int ndim, const int64_t *shape, ttd_tensor_spec *out) {
  memset(out, 0, sizeof(*out));
  out->dtype = dtype;
  out->ndim = ndim;
  for (int i = 0; i < ndim && i < TTD_MAX_DIMS; i++) out->shape[i] = shape[i];
  return ttd_tensor_spec_finish(out);
}

static void expect_spec_invalid(int line, ttd_status_t s, const char *fragment) {
  ck_assert_msg(ttd_status_code(s) == GRPC_STATUS_INVALID_ARGUMENT, "line %d: got %s", line,
                ttd_code_name(ttd_status_code(s)));
  ck_assert_msg(strstr(ttd_status_message(s), fragment) != NULL, "line %d: '%s' lacks '%s'", line,
                ttd_status_message(s), fragment);
  ttd_status_free(s);
}
#define EXPECT_SPEC_INVALID(s, fragment) expect_spec_invalid(__LINE__, (s), (fragment))

/* numel and nbytes: 0-d has one element, zero-size dims give zero, each dtype's size. */
START_TEST(test_spec_numel_nbytes) {
  ttd_tensor_spec spec;
  ck_assert_ptr_null(finish(TTD_DTYPE_FLOAT32, 0, NULL, &spec));
  ck_assert_uint_eq(spec.numel, 1);
  ck_assert_uint_eq(spec.nbytes, 4);
  ck_assert_ptr_null(finish(TTD_DTYPE_BFLOAT16, 0, NULL, &spec));
  ck_assert_uint_eq(spec.nbytes, 2);
  ck_assert_ptr_null(finish(TTD_DTYPE_INT32, 3, (int64_t[]){3, 0, 5}, &spec));
  ck_assert_uint_eq(spec.numel, 0);
  ck_assert_uint_eq(spec.nbytes, 0);
  ck_assert_ptr_null(finish(TTD_DTYPE_FLOAT32, 1, (int64_t[]){0}, &spec));
  ck_assert_uint_eq(spec.numel, 0);
  ck_assert_ptr_null(finish(TTD_DTYPE_BFLOAT16, 3, (int64_t[]){2, 3, 4}, &spec));
  ck_assert_uint_eq(spec.numel, 24);
  ck_assert_uint_eq(spec.nbytes, 48);
  ck_assert_ptr_null(finish(TTD_DTYPE_INT32, 8, (int64_t[]){2, 2, 2, 2, 2, 2, 2, 2}, &spec));
  ck_assert_uint_eq(spec.numel, 256);
  ck_assert_uint_eq(spec.nbytes, 1024);
  /* The largest sizes that still fit. */
  ck_assert_ptr_null(finish(TTD_DTYPE_FLOAT32, 1, (int64_t[]){(1ll << 61) - 1}, &spec));
  ck_assert_uint_eq(spec.nbytes, (1ull << 63) - 4);
  ck_assert_ptr_null(finish(TTD_DTYPE_BFLOAT16, 2, (int64_t[]){1ll << 31, (1ll << 31) - 1}, &spec));
  ck_assert_uint_eq(spec.numel, (1ull << 62) - (1ull << 31));
}
END_TEST

/* A negative dim is INVALID_ARGUMENT naming it. */
START_TEST(test_spec_negative_dim) {
  ttd_tensor_spec spec;
  EXPECT_SPEC_INVALID(finish(TTD_DTYPE_FLOAT32, 2, (int64_t[]){4, -1}, &spec), "-1");
  EXPECT_SPEC_INVALID(finish(TTD_DTYPE_FLOAT32, 1, (int64_t[]){INT64_MIN}, &spec), "dim");
  EXPECT_SPEC_INVALID(finish(TTD_DTYPE_FLOAT32, 3, (int64_t[]){0, 5, -3}, &spec), "-3"); /* even after a 0 */
}
END_TEST

/* More than TTD_MAX_DIMS dims, or a negative count, is INVALID_ARGUMENT. */
START_TEST(test_spec_too_many_dims) {
  ttd_tensor_spec spec;
  memset(&spec, 0, sizeof(spec));
  spec.dtype = TTD_DTYPE_FLOAT32;
  spec.ndim = TTD_MAX_DIMS + 1;
  EXPECT_SPEC_INVALID(ttd_tensor_spec_finish(&spec), "9");
  spec.ndim = -1;
  EXPECT_SPEC_INVALID(ttd_tensor_spec_finish(&spec), "dims");
  spec.ndim = 1000;
  EXPECT_SPEC_INVALID(ttd_tensor_spec_finish(&spec), "dims");
}
END_TEST

/* A shape whose element or byte count passes 2^63 is INVALID_ARGUMENT, not a wrapped size. */
START_TEST(test_spec_overflow) {
  ttd_tensor_spec spec;
  EXPECT_SPEC_INVALID(finish(TTD_DTYPE_INT32, 2, (int64_t[]){1ll << 32, 1ll << 32}, &spec), "2^63");
  EXPECT_SPEC_INVALID(finish(TTD_DTYPE_INT32, 2, (int64_t[]){3037000500ll, 3037000500ll}, &spec), "2^63");
  EXPECT_SPEC_INVALID(finish(TTD_DTYPE_INT32, 2, (int64_t[]){INT64_MAX, 2}, &spec), "2^63");
  EXPECT_SPEC_INVALID(finish(TTD_DTYPE_INT32, 8, (int64_t[]){256, 256, 256, 256, 256, 256, 256, 256}, &spec),
                      "2^63");
  /* Elements fit but bytes do not. */
  EXPECT_SPEC_INVALID(finish(TTD_DTYPE_FLOAT32, 1, (int64_t[]){1ll << 61}, &spec), "2^63");
  EXPECT_SPEC_INVALID(finish(TTD_DTYPE_BFLOAT16, 1, (int64_t[]){1ll << 62}, &spec), "2^63");
  EXPECT_SPEC_INVALID(finish(TTD_DTYPE_INT32, 1, (int64_t[]){INT64_MAX}, &spec), "2^63");
}
END_TEST

/* An invalid or unknown dtype is INVALID_ARGUMENT. */
START_TEST(test_spec_bad_dtype) {
  ttd_tensor_spec spec;
  EXPECT_SPEC_INVALID(finish(TTD_DTYPE_INVALID, 1, (int64_t[]){4}, &spec), "dtype");
  EXPECT_SPEC_INVALID(finish((ttd_dtype)4, 1, (int64_t[]){4}, &spec), "dtype");
  EXPECT_SPEC_INVALID(finish((ttd_dtype)-2, 0, NULL, &spec), "dtype");
}
END_TEST

/* ---- tensors ---- */

/* A tensor that does not fit is RESOURCE_EXHAUSTED and takes no memory. */
START_TEST(test_tensor_create_too_big) {
  ttd_tensor_spec spec;
  ck_assert_ptr_null(finish(TTD_DTYPE_FLOAT32, 1, (int64_t[]){L1_BYTES / 4 + 1}, &spec));
  spec.device = 1;
  spec.location = TTD_MEM_L1;
  ttd_tensor *t = (ttd_tensor *)&t;
  ttd_status_t s = ttd_tensor_create(sf_backend, NULL, &spec, &t);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_RESOURCE_EXHAUSTED);
  ck_assert_ptr_nonnull(strstr(ttd_status_message(s), "tt:1"));
  ttd_status_free(s);
  ck_assert_ptr_null(t);
  ck_assert_uint_eq(sf_used_total(), 0);
}
END_TEST

/* A tensor keeps its spec and sf_backend; create_zeroed shows no old device data. */
START_TEST(test_tensor_create_zeroed) {
  enum { N = 4096 };
  ttd_tensor_spec spec;
  ck_assert_ptr_null(finish(TTD_DTYPE_INT32, 2, (int64_t[]){32, 32}, &spec));
  spec.location = TTD_MEM_DRAM;
  static unsigned char junk[N], out[N], zeros[N];
  memset(junk, 0xA7, N);
  for (int round = 0; round < 4; round++) {
    ttd_tensor *dirty = NULL;
    ck_assert_ptr_null(ttd_tensor_create(sf_backend, NULL, &spec, &dirty));
    ck_assert_ptr_null(sf_backend->vtable->buffer_write(sf_backend, dirty->buffer, 0, junk, N));
    ttd_tensor_release(dirty);
    ttd_tensor *clean = NULL;
    ck_assert_ptr_null(ttd_tensor_create_zeroed(sf_backend, NULL, &spec, &clean));
    ck_assert_ptr_eq(clean->backend, sf_backend);
    ck_assert_int_eq(clean->spec.ndim, 2);
    ck_assert_int_eq(clean->spec.shape[1], 32);
    ck_assert_uint_eq(clean->spec.nbytes, N);
    ck_assert_int_eq(sf_tensor_refs(clean), 1);
    memset(out, 0xFF, N);
    ck_assert_ptr_null(sf_backend->vtable->buffer_read(sf_backend, clean->buffer, 0, out, N));
    ck_assert_mem_eq(out, zeros, N);
    ttd_tensor_release(clean);
  }
  ck_assert_uint_eq(sf_used_total(), 0);
}
END_TEST

/* retain/release count references; the last release frees device memory; NULL is accepted. */
START_TEST(test_tensor_retain_release) {
  ttd_tensor *t = sf_new_tensor(64, 0, TTD_MEM_L1);
  ck_assert_ptr_eq(ttd_tensor_retain(t), t);
  ck_assert_ptr_eq(ttd_tensor_retain(t), t);
  ck_assert_int_eq(sf_tensor_refs(t), 3);
  ttd_tensor_release(t);
  ttd_tensor_release(t);
  ck_assert_uint_eq(sf_used(0, TTD_MEM_L1), 256);
  ttd_tensor_release(t);
  ck_assert_uint_eq(sf_used(0, TTD_MEM_L1), 0);
  ttd_tensor_release(NULL);
}
END_TEST

Suite *device_tensor_suite(void) {
  Suite *s = suite_create("device_tensor");
  TCase *tc = tcase_create("device_tensor");
  tcase_add_checked_fixture(tc, sf_setup, sf_teardown);
  tcase_add_test(tc, test_spec_numel_nbytes);
  tcase_add_test(tc, test_spec_negative_dim);
  tcase_add_test(tc, test_spec_too_many_dims);
  tcase_add_test(tc, test_spec_overflow);
  tcase_add_test(tc, test_spec_bad_dtype);
  tcase_add_test(tc, test_tensor_create_too_big);
  tcase_add_test(tc, test_tensor_create_zeroed);
  tcase_add_test(tc, test_tensor_retain_release);
  suite_add_tcase(s, tc);
  return s;
}
