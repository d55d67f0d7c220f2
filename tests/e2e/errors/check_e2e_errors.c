/* Bad input through a real ttd: every malformed request, foreign or forged handle and
 * broken stream gets a precise gRPC code and a message that says what to fix, the daemon
 * keeps serving, and no device byte is left behind. */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "raw_rpc.h"
#include "suites.h"
#include "ttd/v1/ttd.pb-c.h"
#include "ttd_harness.h"

static ttd_proc proc;
static char session[17], instance[40];

static void setup(void) {
  const char *args[] = {"--devices", "2", "--dram", "1M", "--l1", "64K", NULL};
  ttd_proc_start(&proc, args);
  raw_open_session(proc.target, session, instance);
}

static void teardown(void) {
  /* After every bad input: the daemon still serves and holds no device memory. */
  ck_assert_msg(ttd_proc_alive(&proc), "ttd died; see %s", proc.log_path);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 0);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 1), 0);
  ck_assert_uint_eq(harness_used_bytes(&proc, 1, 0), 0);
  ck_assert_int_eq(ttd_proc_stop(&proc), 0);
}

static raw_md md(void) { return (raw_md){.session = session, .instance = instance}; }

/* Packs msg and calls method in this test's session; asserts the code and a message part. */

static void free_handles(const char *sess, uint64_t *handles, size_t n, int code) {
  Ttd__V1__FreeRequest req = TTD__V1__FREE_REQUEST__INIT;
  req.n_handles = n;
  req.handles = handles;
  raw_expect(proc.target, "/ttd.v1.Device/Free", &req.base, (raw_md){.session = sess, .instance = NULL}, code, NULL);
}

/* Bytes that are not a protobuf message are INVALID_ARGUMENT naming the message type. */
START_TEST(test_garbage_request) {
  static const unsigned char garbage[] = {0xff, 0xff, 0xff, 0xff, 0x0f, 0x12, 0x99};
  raw_result r;
  raw_call(proc.target, "/ttd.v1.Device/Allocate", md(), garbage, sizeof(garbage), &r);
  ck_assert_int_eq(r.code, 3);
  ck_assert_ptr_nonnull(strstr(r.details, "ttd.v1.AllocateRequest"));
  raw_result_free(&r);
  raw_call(proc.target, "/ttd.v1.Device/OpenSession", (raw_md){0}, garbage, sizeof(garbage), &r);
  ck_assert_int_eq(r.code, 3);
  raw_result_free(&r);
  /* A truncated message: a length-delimited field cut short. */
  static const unsigned char cut[] = {0x0a, 0x20, 0x08, 0x01};
  raw_call(proc.target, "/ttd.v1.Device/Allocate", md(), cut, sizeof(cut), &r);
  ck_assert_int_eq(r.code, 3);
  raw_result_free(&r);
}
END_TEST

/* Garbage on the socket itself (not HTTP/2) is dropped and the daemon keeps serving. */
START_TEST(test_garbage_on_socket) {
  for (int i = 0; i < 5; i++) {
    int fd = harness_unix_connect(proc.target + 5, SOCK_STREAM);
    unsigned char junk[4096];
    harness_fill_random(junk, sizeof(junk), (uint64_t)i);
    ck_assert_int_gt(write(fd, junk, (size_t)(i + 1) * 800), 0);
    close(fd);
  }
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 0); /* still answers */
}
END_TEST

/* A method that does not exist is UNIMPLEMENTED. */
START_TEST(test_unknown_method) {
  raw_result r;
  raw_call(proc.target, "/ttd.v1.Device/Explode", md(), "", 0, &r);
  ck_assert_int_eq(r.code, 12);
  raw_result_free(&r);
}
END_TEST

/* Bad tensor specs in Allocate are INVALID_ARGUMENT and say what is wrong. */
START_TEST(test_bad_specs) {
  Ttd__V1__AllocateRequest req = TTD__V1__ALLOCATE_REQUEST__INIT;
  raw_expect(proc.target, "/ttd.v1.Device/Allocate", &req.base, md(), 3, "spec is missing");
  Ttd__V1__TensorSpec spec = TTD__V1__TENSOR_SPEC__INIT;
  int64_t shape[9] = {2, 3, 1, 1, 1, 1, 1, 1, 1};
  spec.shape = shape;
  spec.n_shape = 2;
  req.spec = &spec;
  raw_expect(proc.target, "/ttd.v1.Device/Allocate", &req.base, md(), 3, "dtype 0");
  spec.dtype = 17;
  raw_expect(proc.target, "/ttd.v1.Device/Allocate", &req.base, md(), 3, "dtype 17");
  spec.dtype = TTD__V1__DTYPE__DTYPE_INT32;
  shape[1] = -3;
  raw_expect(proc.target, "/ttd.v1.Device/Allocate", &req.base, md(), 3, "-3");
  shape[1] = 0;
  spec.n_shape = 9;
  raw_expect(proc.target, "/ttd.v1.Device/Allocate", &req.base, md(), 3, "9 dims");
  spec.n_shape = 3;
  shape[0] = INT64_MAX;
  shape[1] = 2;
  shape[2] = 3;
  raw_expect(proc.target, "/ttd.v1.Device/Allocate", &req.base, md(), 3, "2^63");
  shape[0] = (int64_t)1 << 62; /* 2^62 elements fit in 63 bits, their bytes do not */
  spec.n_shape = 1;
  raw_expect(proc.target, "/ttd.v1.Device/Allocate", &req.base, md(), 3, "2^63 bytes");
  shape[0] = 4;
  spec.device = "tt:2";
  raw_expect(proc.target, "/ttd.v1.Device/Allocate", &req.base, md(), 3, "tt:0 .. tt:1");
  spec.device = "gpu:0";
  raw_expect(proc.target, "/ttd.v1.Device/Allocate", &req.base, md(), 3, "gpu:0");
  spec.device = "tt:1";
  spec.location = 9;
  raw_expect(proc.target, "/ttd.v1.Device/Allocate", &req.base, md(), 3, "memory location 9");
}
END_TEST

/* An allocation past capacity is RESOURCE_EXHAUSTED naming device, location, requested
 * and free bytes; an exact fit then succeeds. */
START_TEST(test_capacity_exhaustion) {
  Ttd__V1__TensorSpec spec = TTD__V1__TENSOR_SPEC__INIT;
  int64_t shape[1] = {(1 << 18) + 1}; /* 1 MiB + 4 bytes of float32 */
  spec.dtype = TTD__V1__DTYPE__DTYPE_FLOAT32;
  spec.n_shape = 1;
  spec.shape = shape;
  Ttd__V1__AllocateRequest req = TTD__V1__ALLOCATE_REQUEST__INIT;
  req.spec = &spec;
  raw_expect(proc.target, "/ttd.v1.Device/Allocate", &req.base, md(), 8, "tt:0 dram is full: requested 1048580 bytes, 1048576 bytes free");
  spec.location = TTD__V1__MEMORY_LOCATION__MEMORY_LOCATION_L1;
  shape[0] = 16385;
  raw_expect(proc.target, "/ttd.v1.Device/Allocate", &req.base, md(), 8, "tt:0 l1 is full: requested 65540 bytes, 65536 bytes free");
  uint64_t h = raw_allocate(proc.target, session, 1 << 18); /* exactly the whole DRAM */
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 1 << 20);
  spec.location = TTD__V1__MEMORY_LOCATION__MEMORY_LOCATION_DRAM;
  shape[0] = 1;
  raw_expect(proc.target, "/ttd.v1.Device/Allocate", &req.base, md(), 8, "0 bytes free");
  free_handles(session, &h, 1, 0);
}
END_TEST

/* Session metadata: missing or malformed is INVALID_ARGUMENT (an empty instance too), unknown
 * is NOT_FOUND, another daemon instance is FAILED_PRECONDITION "daemon restarted". */
START_TEST(test_session_metadata) {
  Ttd__V1__KeepAliveRequest req = TTD__V1__KEEP_ALIVE_REQUEST__INIT;
  raw_expect(proc.target, "/ttd.v1.Device/KeepAlive", &req.base, (raw_md){0}, 3, "needs a session");
  raw_expect(proc.target, "/ttd.v1.Device/KeepAlive", &req.base, (raw_md){.session = "not-hex", .instance = NULL}, 3, "16 hex digits");
  raw_expect(proc.target, "/ttd.v1.Device/KeepAlive", &req.base, (raw_md){.session = "0123456789abcdef0", .instance = NULL}, 3, "16 hex digits");
  raw_expect(proc.target, "/ttd.v1.Device/KeepAlive", &req.base, (raw_md){.session = "00000000000000aa", .instance = NULL}, 5, "is not open");
  raw_expect(proc.target, "/ttd.v1.Device/KeepAlive", &req.base, (raw_md){.session = session, .instance = "0000000000000000"}, 9, "daemon restarted");
  raw_expect(proc.target, "/ttd.v1.Device/KeepAlive", &req.base, (raw_md){.session = session, .instance = ""}, 3,
             "'ttd-instance' metadata is empty");
  raw_expect(proc.target, "/ttd.v1.Device/KeepAlive", &req.base, md(), 0, NULL);
}
END_TEST

/* A client speaking another protocol version is refused with both versions named. */
START_TEST(test_protocol_version) {
  Ttd__V1__OpenSessionRequest req = TTD__V1__OPEN_SESSION_REQUEST__INIT;
  req.protocol_version = 2;
  raw_expect(proc.target, "/ttd.v1.Device/OpenSession", &req.base, (raw_md){0}, 9, "protocol 2, this daemon speaks 1");
}
END_TEST

/* A foreign handle (another session's), a freed one and a forged one all give NOT_FOUND
 * with the same message; none of them touches the owner's tensor. */
START_TEST(test_foreign_freed_forged_handles) {
  char other[17], other_instance[40];
  raw_open_session(proc.target, other, other_instance);
  uint64_t mine = raw_allocate(proc.target, session, 16);
  uint64_t theirs = raw_allocate(proc.target, other, 16);
  uint64_t freed = raw_allocate(proc.target, session, 16);
  free_handles(session, &freed, 1, 0);
  uint64_t cases[3] = {theirs, freed, 0x0123456789abcdefull};
  char first[1024] = "";
  for (int i = 0; i < 3; i++) {
    Ttd__V1__DownloadRequest req = TTD__V1__DOWNLOAD_REQUEST__INIT;
    req.handle = cases[i];
    unsigned char buf[64];
    size_t len = ttd__v1__download_request__pack(&req, buf);
    raw_result r;
    raw_call(proc.target, "/ttd.v1.Device/Download", md(), buf, len, &r);
    ck_assert_int_eq(r.code, 5);
    char hex[20];
    snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)cases[i]);
    char *at = strstr(r.details, hex);
    ck_assert_ptr_nonnull(at);
    memset(at, 'X', 16); /* the messages differ only in the handle */
    if (i == 0) snprintf(first, sizeof(first), "%s", r.details);
    else ck_assert_str_eq(r.details, first);
    raw_result_free(&r);
    Ttd__V1__MoveRequest mv = TTD__V1__MOVE_REQUEST__INIT;
    mv.handle = cases[i];
    mv.device = "tt:1";
    raw_expect(proc.target, "/ttd.v1.Device/Move", &mv.base, md(), 5, "not found in this session");
    free_handles(session, &cases[i], 1, 5);
  }
  free_handles(other, &theirs, 1, 0); /* the owner still has it */
  free_handles(session, &mine, 1, 0);
}
END_TEST

/* Free is all or nothing: an empty list and a duplicated handle are INVALID_ARGUMENT, one
 * unknown handle among good ones is NOT_FOUND and frees none. */
START_TEST(test_free_lists) {
  free_handles(session, NULL, 0, 3);
  uint64_t h[3] = {raw_allocate(proc.target, session, 8), raw_allocate(proc.target, session, 8), 0x77};
  free_handles(session, h, 3, 5);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 64);
  uint64_t dup[2] = {h[0], h[0]};
  free_handles(session, dup, 2, 3);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 64);
  free_handles(session, h, 2, 0);
}
END_TEST

/* Upload streams: no header, a second header, bytes past the end, a short stream and an
 * unconvertible dtype are all INVALID_ARGUMENT and leave nothing allocated. */
START_TEST(test_bad_upload_streams) {
  Ttd__V1__TensorSpec spec = TTD__V1__TENSOR_SPEC__INIT;
  int64_t shape[1] = {4};
  spec.dtype = TTD__V1__DTYPE__DTYPE_FLOAT32;
  spec.n_shape = 1;
  spec.shape = shape;
  Ttd__V1__UploadHeader header = TTD__V1__UPLOAD_HEADER__INIT;
  header.target_case = TTD__V1__UPLOAD_HEADER__TARGET_SPEC;
  header.spec = &spec;
  unsigned char bytes[32] = {0};
  struct {
    int with_header[3];
    size_t data_len[3];
    int n;
    int source_dtype;
    const char *needle;
  } cases[] = {
      {{0}, {16}, 1, 0, "must carry a header"},
      {{1, 1}, {8, 8}, 2, 0, "only the first Upload message"},
      {{1, 0}, {16, 4}, 2, 0, "past the tensor's end"},
      {{1, 0}, {8, 4}, 2, 0, "ended after 12 of 16 bytes"},
      {{1}, {16}, 1, TTD__V1__DTYPE__DTYPE_INT32, "cannot upload int32 bytes into a float32 tensor"},
      {{0}, {0}, 0, 0, "ended before its header"},
  };
  for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
    unsigned char *msgs[3];
    size_t lens[3];
    header.source_dtype = cases[c].source_dtype;
    for (int i = 0; i < cases[c].n; i++) {
      Ttd__V1__UploadRequest req = TTD__V1__UPLOAD_REQUEST__INIT;
      req.header = cases[c].with_header[i] ? &header : NULL;
      req.data.data = bytes;
      req.data.len = cases[c].data_len[i];
      msgs[i] = malloc(ttd__v1__upload_request__get_packed_size(&req));
      lens[i] = ttd__v1__upload_request__pack(&req, msgs[i]);
    }
    raw_result r;
    raw_stream(proc.target, "/ttd.v1.Device/Upload", md(), (const void *const *)msgs, lens, cases[c].n, 0, &r);
    ck_assert_msg(r.code == 3, "case %zu: code %d (%s)", c, r.code, r.details);
    ck_assert_msg(strstr(r.details, cases[c].needle), "case %zu: '%s' lacks '%s'", c, r.details, cases[c].needle);
    raw_result_free(&r);
    for (int i = 0; i < cases[c].n; i++) free(msgs[i]);
    ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 0);
  }
  /* Garbage as a stream message. */
  const void *garbage[1] = {"\xff\xff\xff"};
  size_t glen[1] = {3};
  raw_result r;
  raw_stream(proc.target, "/ttd.v1.Device/Upload", md(), garbage, glen, 1, 0, &r);
  ck_assert_int_eq(r.code, 3);
  raw_result_free(&r);
  /* Lengths and field numbers that lie: a header "2^63 bytes long", a key whose field number
   * overflows 32 bits into field 2 (data). Both are read as garbage, not as a huge
   * allocation or as data. */
  static const unsigned char huge[] = {0x0a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0x01};
  static const unsigned char alias[] = {0x92, 0x80, 0x80, 0x80, 0x80, 0x02, 0x01, 0x00};
  const void *liars[2] = {huge, alias};
  size_t liar_lens[2] = {sizeof(huge), sizeof(alias)};
  for (int i = 0; i < 2; i++) {
    raw_stream(proc.target, "/ttd.v1.Device/Upload", md(), &liars[i], &liar_lens[i], 1, 0, &r);
    ck_assert_msg(r.code == 3 && strstr(r.details, "not a valid ttd.v1.UploadRequest"), "%d: %d %s", i, r.code,
                  r.details);
    raw_result_free(&r);
  }
}
END_TEST

/* Download: an oversized chunk request and an unconvertible target dtype are INVALID_ARGUMENT. */
START_TEST(test_bad_downloads) {
  uint64_t h = raw_allocate(proc.target, session, 4);
  Ttd__V1__DownloadRequest req = TTD__V1__DOWNLOAD_REQUEST__INIT;
  req.handle = h;
  req.chunk_bytes = 64u << 20;
  raw_expect(proc.target, "/ttd.v1.Device/Download", &req.base, md(), 3, "chunk_bytes");
  req.chunk_bytes = 0;
  req.target_dtype = TTD__V1__DTYPE__DTYPE_INT32;
  raw_expect(proc.target, "/ttd.v1.Device/Download", &req.base, md(), 3, "cannot download a float32 tensor as int32");
  req.target_dtype = 0;
  raw_expect(proc.target, "/ttd.v1.Device/Download", &req.base, md(), 0, NULL);
  free_handles(session, &h, 1, 0);
}
END_TEST

/* Client-side misuse through the library: a bad device string and a bad dtype are
 * TT_INVALID_ARGUMENT with a message; nothing reaches the daemon. */
START_TEST(test_client_misuse) {
  tt_client *c = harness_connect(&proc, 0);
  float v[2] = {1, 2};
  int64_t shape[1] = {2};
  tt_tensor *h = tt_tensor_from_host(c, v, TT_FLOAT32, shape, 1);
  ck_assert_ptr_null(tt_to(h, "gpu"));
  ck_assert_int_eq(tt_errcode(c), TT_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(tt_last_error(c), "'gpu'"));
  ck_assert_ptr_null(tt_to(h, "tt:1/l2"));
  ck_assert_ptr_null(tt_to_dtype(h, "tt", TT_INT32));
  ck_assert_ptr_nonnull(strstr(tt_last_error(c), "float32 to int32"));
  ck_assert_ptr_null(tt_tensor_from_host(c, v, (tt_dtype)9, shape, 1));
  int64_t neg[1] = {-1};
  ck_assert_ptr_null(tt_tensor_from_host(c, v, TT_FLOAT32, neg, 1));
  ck_assert_ptr_nonnull(strstr(tt_last_error(c), "-1"));
  ck_assert_ptr_null(tt_to(h, "tt:5"));
  ck_assert_int_eq(tt_errcode(c), TT_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(tt_last_error(c), "tt:5"));
  tt_tensor_free(h);
  tt_disconnect(c);
  tt_client *bad = NULL;
  ck_assert_int_eq(tt_connect("unix:/nonexistent/ttd.sock", NULL, &bad), TT_UNAVAILABLE);
  ck_assert_msg(strstr(tt_last_error(bad), "nothing listens at unix:/nonexistent/ttd.sock"), "%s", tt_last_error(bad));
  tt_disconnect(bad);
}
END_TEST

/* Two threads failing on one client, each in its own way: each reads its own call's code and
 * message (tt_last_error is per thread, as errno), never the other's. */
typedef struct misuse_thread {
  tt_client *c;
  tt_tensor *h;
  const char *device, *want;
  int wrong;
  char example[160];
} misuse_thread;

static void *misuse_loop(void *arg) {
  misuse_thread *t = arg;
  for (int i = 0; i < 2000; i++) {
    if (tt_to(t->h, t->device) || strstr(tt_last_error(t->c), t->want)) continue;
    if (!t->wrong++) snprintf(t->example, sizeof(t->example), "%s", tt_last_error(t->c));
  }
  return NULL;
}

START_TEST(test_last_error_per_thread) {
  tt_client *c = harness_connect(&proc, 0);
  float v[2] = {1, 2};
  int64_t shape[1] = {2};
  tt_tensor *h = tt_tensor_from_host(c, v, TT_FLOAT32, shape, 1);
  misuse_thread t[2] = {{.c = c, .h = h, .device = "gpu", .want = "'gpu'"},
                        {.c = c, .h = h, .device = "tt:7", .want = "tt:7"}};
  pthread_t threads[2];
  for (int i = 0; i < 2; i++) ck_assert_int_eq(pthread_create(&threads[i], NULL, misuse_loop, &t[i]), 0);
  for (int i = 0; i < 2; i++) pthread_join(threads[i], NULL);
  for (int i = 0; i < 2; i++) ck_assert_msg(t[i].wrong == 0, "thread %d read another's error %d times: %s", i, t[i].wrong,
                                            t[i].example);
  const char *latest = tt_last_error(c); /* this thread made none: the latest of any thread's */
  ck_assert_msg(strstr(latest, "tt:7") || strstr(latest, "'gpu'"), "%s", latest);
  ck_assert_ptr_null(tt_to(h, "tt:9"));
  ck_assert_ptr_nonnull(strstr(tt_last_error(c), "tt:9"));
  tt_tensor_free(h);
  tt_disconnect(c);
}
END_TEST

Suite *e2e_errors_suite(void) {
  Suite *s = suite_create("e2e_errors");
  TCase *tc = tcase_create("errors");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_garbage_request);
  tcase_add_test(tc, test_garbage_on_socket);
  tcase_add_test(tc, test_unknown_method);
  tcase_add_test(tc, test_bad_specs);
  tcase_add_test(tc, test_capacity_exhaustion);
  tcase_add_test(tc, test_session_metadata);
  tcase_add_test(tc, test_protocol_version);
  tcase_add_test(tc, test_foreign_freed_forged_handles);
  tcase_add_test(tc, test_free_lists);
  tcase_add_test(tc, test_bad_upload_streams);
  tcase_add_test(tc, test_bad_downloads);
  tcase_add_test(tc, test_client_misuse);
  tcase_add_test(tc, test_last_error_per_thread);
  suite_add_tcase(s, tc);
  return s;
}
