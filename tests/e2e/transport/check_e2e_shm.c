/* The same-host fast path through a real ttd: host tensors of 256 KiB or more move through
 * shared-memory segments registered on the side socket. It must give the very bytes the
 * gRPC path gives (both directions, with and without dtype conversion), be switched off
 * by TTD_SHM=0, and refuse bad segments and ranges with precise errors. */
#define _GNU_SOURCE /* memfd_create */
#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "wire/shm_protocol.h"
#include "graph_builder.h"
#include "raw_rpc.h"
#include "side_socket.h"
#include "suites.h"
#include "ttd/v1/ttd.pb-c.h"
#include "ttd_harness.h"

static ttd_proc proc;

static void setup(void) { ttd_proc_start(&proc, NULL); }

static void teardown(void) {
  unsetenv("TTD_SHM");
  ck_assert_uint_eq(harness_wait_used_bytes(&proc, 0, 0, 0, 2000), 0);
  ck_assert_int_eq(ttd_proc_stop(&proc), 0);
}

/* Uploads n floats (as dtype on the device) and downloads them back as float32. */
static float *round_trip(tt_client *c, const float *data, int64_t n, tt_dtype device_dtype) {
  tt_tensor *h = tt_tensor_from_host(c, data, TT_FLOAT32, &n, 1);
  tt_tensor *d = tt_to_dtype(h, "tt", device_dtype);
  ck_assert_msg(d != NULL, "%s", tt_last_error(c));
  tt_tensor *back = tt_to_dtype(d, "cpu", TT_FLOAT32);
  ck_assert_msg(back != NULL, "%s", tt_last_error(c));
  float *out = malloc((size_t)n * sizeof(float));
  memcpy(out, tt_tensor_data(back), (size_t)n * sizeof(float));
  tt_tensor_free(back);
  tt_tensor_free(d);
  tt_tensor_free(h);
  return out;
}

START_TEST(test_same_bytes_as_grpc) {
  int64_t n = 3 * 1024 * 1024 + 7; /* 12 MiB and a bit: not a whole number of chunks */
  float *data = malloc((size_t)n * sizeof(float));
  harness_fill_random(data, (size_t)n * sizeof(float), 42);
  for (int64_t i = 0; i < n; i++) if (data[i] != data[i]) data[i] = 1.0f; /* no NaN payloads */
  tt_client *fast = harness_connect(&proc, 0);
  float *f32 = round_trip(fast, data, n, TT_FLOAT32);
  float *bf16 = round_trip(fast, data, n, TT_BFLOAT16);
  int registered = harness_log_count(&proc, "event=shm-register");
  ck_assert_int_ge(registered, 2); /* the fast path was used */
  /* Twice more: segments are reused, not registered again. */
  free(round_trip(fast, data, n, TT_FLOAT32));
  free(round_trip(fast, data, n, TT_FLOAT32));
  ck_assert_int_eq(harness_log_count(&proc, "event=shm-register"), registered);
  tt_disconnect(fast);

  setenv("TTD_SHM", "0", 1);
  tt_client *plain = harness_connect(&proc, 0);
  float *f32_plain = round_trip(plain, data, n, TT_FLOAT32);
  float *bf16_plain = round_trip(plain, data, n, TT_BFLOAT16);
  tt_disconnect(plain);
  ck_assert_int_eq(harness_log_count(&proc, "event=shm-register"), registered); /* off means off */
  ck_assert_int_eq(memcmp(f32, data, (size_t)n * sizeof(float)), 0);
  ck_assert_int_eq(memcmp(f32_plain, data, (size_t)n * sizeof(float)), 0);
  ck_assert_int_eq(memcmp(bf16, bf16_plain, (size_t)n * sizeof(float)), 0);
  ck_assert_int_ne(memcmp(bf16, data, (size_t)n * sizeof(float)), 0); /* it did round */
  free(f32);
  free(bf16);
  free(f32_plain);
  free(bf16_plain);
  free(data);
}
END_TEST

/* The side socket and the shm fields refuse what is wrong, precisely, and keep serving. */
START_TEST(test_bad_segments_and_ranges) {
  char session[17];
  uint64_t key[2];
  harness_open_session_with_key(&proc, session, key);
  uint64_t sid = strtoull(session, NULL, 16);
  int sock = harness_side_socket(&proc);
  /* A memfd that could shrink under the daemon's mapping is refused; a sealed one cannot. */
  int loose = memfd_create("t", MFD_CLOEXEC);
  ck_assert_int_eq(ftruncate(loose, 1 << 20), 0);
  ttd_shm_reply r = harness_side_request(sock, (ttd_shm_request){TTD_SHM_MAGIC, TTD_SHM_REGISTER, sid, 0, 4096, {key[0], key[1]}}, loose, NULL);
  ck_assert_int_eq(r.code, 3);
  ck_assert_ptr_nonnull(strstr(r.message, "sealed against shrinking"));
  close(loose);
  int memfd = memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ck_assert_int_eq(ftruncate(memfd, 1 << 20), 0);
  ck_assert_int_eq(fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  ck_assert_int_eq(ftruncate(memfd, 0), -1);
  /* The session id alone is not enough: the key from OpenSession must come with it. */
  r = harness_side_request(sock, (ttd_shm_request){TTD_SHM_MAGIC, TTD_SHM_REGISTER, sid, 0, 4096, {key[0], key[1] ^ 1}}, memfd, NULL);
  ck_assert_int_eq(r.code, 5);
  ck_assert_ptr_nonnull(strstr(r.message, "shm_key"));

  r = harness_side_request(sock, (ttd_shm_request){.magic = 0x1234, .op = TTD_SHM_REGISTER, .key = {key[0], key[1]}}, -1, NULL);
  ck_assert_int_eq(r.code, 3);
  ck_assert_ptr_nonnull(strstr(r.message, "bad magic"));
  r = harness_side_request(sock, (ttd_shm_request){TTD_SHM_MAGIC, TTD_SHM_REGISTER, 0x1234, 0, 4096, {key[0], key[1]}}, memfd, NULL);
  ck_assert_int_eq(r.code, 5); /* no such session */
  r = harness_side_request(sock, (ttd_shm_request){TTD_SHM_MAGIC, TTD_SHM_REGISTER, sid, 0, 4096, {key[0], key[1]}}, -1, NULL);
  ck_assert_int_eq(r.code, 3);
  ck_assert_ptr_nonnull(strstr(r.message, "needs the memfd attached"));
  r = harness_side_request(sock, (ttd_shm_request){TTD_SHM_MAGIC, TTD_SHM_REGISTER, sid, 0, 2 << 20, {key[0], key[1]}}, memfd, NULL);
  ck_assert_int_eq(r.code, 3);
  ck_assert_ptr_nonnull(strstr(r.message, "ftruncate"));
  r = harness_side_request(sock, (ttd_shm_request){TTD_SHM_MAGIC, 9, sid, 0, 0, {key[0], key[1]}}, -1, NULL);
  ck_assert_int_eq(r.code, 3);
  r = harness_side_request(sock, (ttd_shm_request){TTD_SHM_MAGIC, TTD_SHM_REGISTER, sid, 0, 1 << 20, {key[0], key[1]}}, memfd, NULL);
  ck_assert_int_eq(r.code, 0);
  uint64_t segment = r.segment_id;
  ck_assert_uint_ne(segment, 0);

  /* Upload from the segment: the range must fit the segment and match the tensor. */
  int64_t shape[1] = {1000};
  Ttd__V1__TensorSpec spec = TTD__V1__TENSOR_SPEC__INIT;
  spec.dtype = TTD__V1__DTYPE__DTYPE_FLOAT32;
  spec.n_shape = 1;
  spec.shape = shape;
  Ttd__V1__ShmRange range = TTD__V1__SHM_RANGE__INIT;
  Ttd__V1__UploadHeader header = TTD__V1__UPLOAD_HEADER__INIT;
  header.target_case = TTD__V1__UPLOAD_HEADER__TARGET_SPEC;
  header.spec = &spec;
  header.shm = &range;
  Ttd__V1__UploadRequest req = TTD__V1__UPLOAD_REQUEST__INIT;
  req.header = &header;
  uint8_t buf[256];
  const void *msgs[1] = {buf};
  size_t lens[1];
  raw_result res;
  struct { uint64_t seg, off, len; int code; const char *needle; } cases[] = {
      {segment ^ 1, 0, 4000, 5, "not registered in this session"},
      {segment, 0, 3996, 3, "holds 3996 bytes but the transfer moves 4000"},
      {segment, (1 << 20) - 3000, 4000, 3, "lies outside the 1048576-byte segment"},
      {segment, UINT64_MAX - 10, 4000, 3, "lies outside"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    range.segment = cases[i].seg;
    range.offset = cases[i].off;
    range.length = cases[i].len;
    lens[0] = ttd__v1__upload_request__pack(&req, buf);
    raw_stream(proc.target, "/ttd.v1.Device/Upload", (raw_md){.session = session}, msgs, lens, 1, 0, &res);
    ck_assert_msg(res.code == cases[i].code && strstr(res.details, cases[i].needle), "case %zu: %d %s", i, res.code,
                  res.details);
    raw_result_free(&res);
  }
  /* A good one, then the same range back through Download. */
  float *mem = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  for (int i = 0; i < 1000; i++) mem[i] = (float)i * 0.25f;
  range.segment = segment;
  range.offset = 0;
  range.length = 4000;
  lens[0] = ttd__v1__upload_request__pack(&req, buf);
  raw_stream(proc.target, "/ttd.v1.Device/Upload", (raw_md){.session = session}, msgs, lens, 1, 0, &res);
  ck_assert_msg(res.code == 0, "%s", res.details);
  Ttd__V1__UploadResponse *up = ttd__v1__upload_response__unpack(NULL, res.body_len, res.body);
  uint64_t handle = up->tensor->handle;
  ttd__v1__upload_response__free_unpacked(up, NULL);
  raw_result_free(&res);
  Ttd__V1__DownloadRequest dl = TTD__V1__DOWNLOAD_REQUEST__INIT;
  dl.handle = handle;
  dl.shm = &range;
  range.offset = 8192;
  raw_expect(proc.target, "/ttd.v1.Device/Download", &dl.base, (raw_md){.session = session}, 0, NULL);
  for (int i = 0; i < 1000; i++) ck_assert_float_eq(mem[2048 + i], (float)i * 0.25f);
  range.offset = (1 << 20) - 100;
  raw_expect(proc.target, "/ttd.v1.Device/Download", &dl.base, (raw_md){.session = session}, 3, "lies outside");

  /* An Execute input inline by shared memory: relu of 1000 floats at offset 0. */
  for (int i = 0; i < 1000; i++) mem[i] = (float)(i - 500);
  Ttd__V1__InlineTensor wire = TTD__V1__INLINE_TENSOR__INIT, *wires[1] = {&wire};
  Ttd__V1__ShmRange in_range = TTD__V1__SHM_RANGE__INIT;
  wire.spec = &spec;
  wire.shm = &in_range;
  Ttd__V1__ExecuteRequest ex = TTD__V1__EXECUTE_REQUEST__INIT;
  ex.program = gb_compile_relu(proc.target, session, 1, 1000, 0);
  ex.inline_inputs = wires;
  ex.n_inline_inputs = 1;
  ex.output_mode = TTD__V1__OUTPUT_MODE__OUTPUT_MODE_INLINE;
  uint64_t used = harness_used_bytes(&proc, 0, 0);
  in_range.segment = segment;
  in_range.length = 4000;
  uint8_t exbuf[512];
  size_t exlen = ttd__v1__execute_request__pack(&ex, exbuf);
  raw_call(proc.target, "/ttd.v1.Device/Execute", (raw_md){.session = session}, exbuf, exlen, &res);
  ck_assert_msg(res.code == 0, "%s", res.details);
  Ttd__V1__ExecuteResponse *er = ttd__v1__execute_response__unpack(NULL, res.body_len, res.body);
  ck_assert_uint_eq(er->n_output_data, 1);
  ck_assert_uint_eq(er->output_data[0].len, 4000);
  const float *relu = (const float *)er->output_data[0].data;
  for (int i = 0; i < 1000; i++) ck_assert_float_eq(relu[i], i > 500 ? (float)(i - 500) : 0.0f);
  ttd__v1__execute_response__free_unpacked(er, NULL);
  raw_result_free(&res);
  struct { uint64_t seg, off, len; int with_data; int code; const char *needle; } bad[] = {
      {segment ^ 1, 0, 4000, 0, 5, "not registered in this session"},
      {segment, 0, 3996, 0, 3, "has 3996 bytes of shared memory; float32 [1000] needs exactly 4000"},
      {segment, (1 << 20) - 3000, 4000, 0, 3, "lies outside the 1048576-byte segment"},
      {segment, UINT64_MAX - 10, 4000, 0, 3, "lies outside"},
      {segment, 0, 4000, 1, 3, "has both data and a shared-memory range; send one of them"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    in_range.segment = bad[i].seg;
    in_range.offset = bad[i].off;
    in_range.length = bad[i].len;
    wire.data.data = bad[i].with_data ? (uint8_t *)mem : NULL;
    wire.data.len = bad[i].with_data ? 4000 : 0;
    raw_expect(proc.target, "/ttd.v1.Device/Execute", &ex.base, (raw_md){.session = session}, bad[i].code, bad[i].needle);
  }
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), used); /* nothing left behind */

  /* Released: gone for later calls; releasing twice is NOT_FOUND. */
  r = harness_side_request(sock, (ttd_shm_request){TTD_SHM_MAGIC, TTD_SHM_RELEASE, sid, segment, 0, {key[0], key[1]}}, -1, NULL);
  ck_assert_int_eq(r.code, 0);
  r = harness_side_request(sock, (ttd_shm_request){TTD_SHM_MAGIC, TTD_SHM_RELEASE, sid, segment, 0, {key[0], key[1]}}, -1, NULL);
  ck_assert_int_eq(r.code, 5);
  range.offset = 0;
  raw_expect(proc.target, "/ttd.v1.Device/Download", &dl.base, (raw_md){.session = session}, 5, "not registered");
  /* Another session cannot use a segment of this one. */
  r = harness_side_request(sock, (ttd_shm_request){TTD_SHM_MAGIC, TTD_SHM_REGISTER, sid, 0, 1 << 20, {key[0], key[1]}}, memfd, NULL);
  ck_assert_int_eq(r.code, 0);
  char other[17], other_instance[40];
  raw_open_session(proc.target, other, other_instance);
  range.segment = r.segment_id;
  raw_expect(proc.target, "/ttd.v1.Device/Download", &dl.base, (raw_md){.session = other}, 5, NULL);
  Ttd__V1__FreeRequest fr = TTD__V1__FREE_REQUEST__INIT;
  fr.n_handles = 1;
  fr.handles = &handle;
  raw_expect(proc.target, "/ttd.v1.Device/Free", &fr.base, (raw_md){.session = session}, 0, NULL);
  munmap(mem, 1 << 20);
  close(memfd);
  close(sock);
}
END_TEST

/* A side-socket request renews its session's lease only with the session's key: requests
 * naming the session with a wrong key, every 200 ms for 2 s, leave it to expire at its
 * 500 ms lease; the same requests with the right key keep another session open. */
START_TEST(test_wrong_key_renews_no_lease) {
  ck_assert_int_eq(ttd_proc_stop(&proc), 0);
  static const char *short_lease[] = {"--lease", "500ms", NULL};
  ttd_proc_start(&proc, short_lease);
  char stranger[17], holder[17];
  uint64_t stranger_key[2], holder_key[2];
  harness_open_session_with_key(&proc, stranger, stranger_key);
  harness_open_session_with_key(&proc, holder, holder_key);
  int sock = harness_side_socket(&proc);
  for (int i = 0; i < 10; i++) {
    ttd_shm_request req = {.magic = TTD_SHM_MAGIC, .op = TTD_SHM_RELEASE, .segment_id = 1};
    req.session_id = strtoull(stranger, NULL, 16);
    req.key[0] = stranger_key[0] ^ 1, req.key[1] = stranger_key[1];
    ck_assert_int_eq(harness_side_request(sock, req, -1, NULL).code, 5 /* NOT_FOUND */);
    req.session_id = strtoull(holder, NULL, 16);
    req.key[0] = holder_key[0], req.key[1] = holder_key[1];
    ck_assert_int_eq(harness_side_request(sock, req, -1, NULL).code, 5 /* no such segment, the session found */);
    usleep(200 * 1000);
  }
  close(sock);
  Ttd__V1__KeepAliveRequest keep = TTD__V1__KEEP_ALIVE_REQUEST__INIT;
  raw_unary(proc.target, "/ttd.v1.Device/KeepAlive", &keep.base, (raw_md){.session = stranger}, NULL, 5, "expired");
  raw_unary(proc.target, "/ttd.v1.Device/KeepAlive", &keep.base, (raw_md){.session = holder}, NULL, 0, NULL);
}
END_TEST

Suite *e2e_shm_suite(void) {
  Suite *s = suite_create("e2e_shm");
  TCase *tc = tcase_create("shm");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_same_bytes_as_grpc);
  tcase_add_test(tc, test_bad_segments_and_ranges);
  tcase_add_test(tc, test_wrong_key_renews_no_lease);
  suite_add_tcase(s, tc);
  return s;
}
