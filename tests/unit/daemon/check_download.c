/* daemon/methods/download.c through its handlers over a sim backend, in one session: the
 * Download streams a session may have open at once are bounded, and the buffers a
 * converting stream copies through are charged to the session's quota while it lasts. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "call_fixture.h"
#include "device/quota.h"
#include "device/tensor.h"
#include "methods/methods.h"
#include "session/session.h"
#include "suites.h"

/* A tensor of n elements of dtype in the session; its handle. */
static uint64_t put(int64_t n, ttd_dtype dtype) {
  ttd_tensor_spec spec = {.dtype = dtype, .ndim = 1, .shape = {n}, .device = 0, .location = TTD_MEM_DRAM};
  ck_assert_ptr_null(ttd_tensor_spec_finish(&spec));
  ttd_tensor *t = NULL;
  ck_assert_ptr_null(ttd_tensor_create_zeroed(cf.backend, cf.session->quota, &spec, &t));
  uint64_t h = 0;
  ck_assert_ptr_null(ttd_session_tensor_add(cf.session, t, &h));
  ttd_tensor_release(t);
  return h;
}

/* A call of the fixture's session that begins a Download of handle (as target, 0: its own
 * dtype, in chunks of chunk_bytes, 0: the default); the status. */
static ttd_status_t begin(ttd_call *stream, uint64_t handle, int target, uint32_t chunk_bytes) {
  *stream = cf.call;
  stream->stream = NULL;
  stream->arena = NULL;
  Ttd__V1__DownloadRequest req = TTD__V1__DOWNLOAD_REQUEST__INIT;
  req.handle = handle;
  req.target_dtype = target;
  req.chunk_bytes = chunk_bytes;
  return ttd_download_begin(stream, &req.base);
}

static void done(ttd_call *stream) {
  ttd_download_done(stream);
  ttd_call_arena_free(stream);
}

/* TTD_SESSION_MAX_DOWNLOADS streams open at once; one more is RESOURCE_EXHAUSTED naming the
 * bound, and goes once one of the others is done. */
START_TEST(test_downloads_bounded_per_session) {
  uint64_t h = put(16, TTD_DTYPE_FLOAT32);
  ttd_call streams[TTD_SESSION_MAX_DOWNLOADS + 1];
  for (int i = 0; i < TTD_SESSION_MAX_DOWNLOADS; i++) ck_assert_ptr_null(begin(&streams[i], h, 0, 0));
  ttd_status_t s = begin(&streams[TTD_SESSION_MAX_DOWNLOADS], h, 0, 0);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_RESOURCE_EXHAUSTED);
  ck_assert_msg(strstr(ttd_status_message(s), "64 Downloads open already"), "%s", ttd_status_message(s));
  ttd_status_free(s);
  done(&streams[TTD_SESSION_MAX_DOWNLOADS]);
  done(&streams[0]);
  ck_assert_ptr_null(begin(&streams[0], h, 0, 0));
  for (int i = 0; i < TTD_SESSION_MAX_DOWNLOADS; i++) done(&streams[i]);
  ck_assert_int_eq(atomic_load(&cf.session->downloads), 0);
}
END_TEST

/* A bfloat16 tensor downloaded as float32 copies through a chunk and its raw bytes: charged
 * while the stream lasts (none for a download as it is, whose sends are views), refused
 * when they pass the quota with a message that names them, refunded at the end. */
START_TEST(test_converting_download_charges_its_buffers) {
  uint64_t h = put(1 << 16, TTD_DTYPE_BFLOAT16); /* 128 KiB */
  uint64_t base = atomic_load(&cf.session->quota->used);
  ttd_call a, b;
  ck_assert_ptr_null(begin(&a, h, 0, 0));
  ck_assert_uint_eq(atomic_load(&cf.session->quota->used), base);
  done(&a);
  ck_assert_ptr_null(begin(&a, h, TTD__V1__DTYPE__DTYPE_FLOAT32, 64 << 10)); /* 64 KiB chunks */
  uint64_t charged = atomic_load(&cf.session->quota->used) - base;
  ck_assert_uint_eq(charged, (64 << 10) + (32 << 10) + 1); /* a chunk, and its bfloat16 bytes */
  ttd_quota_set_limit(cf.session->quota, base + charged + 1000);
  ttd_status_t s = begin(&b, h, TTD__V1__DTYPE__DTYPE_FLOAT32, 64 << 10);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_RESOURCE_EXHAUSTED);
  ck_assert_msg(strstr(ttd_status_message(s), "copies through 98305 bytes of buffers"), "%s", ttd_status_message(s));
  ttd_status_free(s);
  done(&b);
  done(&a);
  ck_assert_uint_eq(atomic_load(&cf.session->quota->used), base);
  ttd_quota_set_limit(cf.session->quota, 0);
}
END_TEST

Suite *download_suite(void) {
  Suite *s = suite_create("download");
  TCase *tc = cf_tcase("streams");
  tcase_add_test(tc, test_downloads_bounded_per_session);
  tcase_add_test(tc, test_converting_download_charges_its_buffers);
  suite_add_tcase(s, tc);
  return s;
}
