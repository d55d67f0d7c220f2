/* End-to-end transfers through a real ttd: bitwise round trips, bfloat16 conversion,
 * device-to-device and DRAM <-> L1 moves, torch .to() semantics, memory accounting. */
#include <check.h>
#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dtype.h"
#include "raw_rpc.h"
#include "suites.h"
#include "ttd/v1/ttd.pb-c.h"
#include "ttd_harness.h"

static ttd_proc proc;
static tt_client *client;

static void setup(void) {
  const char *args[] = {"--devices", "2", NULL};
  ttd_proc_start(&proc, args);
  client = harness_connect(&proc, 1);
}

static void teardown(void) {
  tt_disconnect(client);
  ck_assert_int_eq(ttd_proc_stop(&proc), 0);
}

/* Uploads numel random elements of dtype to device, downloads them, compares bitwise. */
static void round_trip(tt_dtype dtype, int64_t numel, int ndim, const char *device) {
  size_t bytes = (size_t)numel * tt_dtype_size(dtype);
  void *data = malloc(bytes ? bytes : 1);
  harness_fill_random(data, bytes, (uint64_t)numel * 31 + (uint64_t)dtype);
  int64_t shape[1] = {numel};
  tt_tensor *host = tt_tensor_from_host(client, data, dtype, shape, ndim);
  ck_assert_ptr_nonnull(host);
  tt_tensor *dev = tt_to(host, device);
  ck_assert_msg(dev != NULL, "upload: %s", tt_last_error(client));
  ck_assert_int_eq(tt_tensor_is_host(dev), 0);
  ck_assert_uint_eq(tt_tensor_nbytes(dev), bytes);
  tt_tensor *back = tt_to(dev, "cpu");
  ck_assert_msg(back != NULL, "download: %s", tt_last_error(client));
  ck_assert_int_eq(tt_tensor_ndim(back), ndim);
  ck_assert_int_eq(tt_tensor_dtype(back), dtype);
  ck_assert_msg(memcmp(tt_tensor_data(back), data, bytes) == 0, "%zu bytes differ after the round trip", bytes);
  tt_tensor_free(back);
  tt_tensor_free(dev);
  tt_tensor_free(host);
  free(data);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 0);
}

/* A 0-d float32 scalar survives the round trip bit for bit. */
START_TEST(test_scalar_float32) { round_trip(TT_FLOAT32, 1, 0, "tt"); }
END_TEST

/* A 0-d int32 scalar survives the round trip bit for bit. */
START_TEST(test_scalar_int32) { round_trip(TT_INT32, 1, 0, "tt"); }
END_TEST

/* One float32 element and one int32 element round-trip bitwise (random bits, NaNs included). */
START_TEST(test_one_element) {
  round_trip(TT_FLOAT32, 1, 1, "tt:0");
  round_trip(TT_INT32, 1, 1, "tt:0");
}
END_TEST

/* Just past one 1 MiB chunk (1 MiB + one element) round-trips for float32 and int32. */
START_TEST(test_one_mib_plus) {
  round_trip(TT_FLOAT32, (1 << 18) + 1, 1, "tt");
  round_trip(TT_INT32, (1 << 18) + 1, 1, "tt");
}
END_TEST

/* 64 MiB float32 and int32 tensors round-trip bitwise. */
START_TEST(test_64_mib) {
  round_trip(TT_FLOAT32, 16 << 20, 1, "tt");
  round_trip(TT_INT32, 16 << 20, 1, "tt:1");
}
END_TEST

/* A zero-element tensor is a valid tensor both ways. */
START_TEST(test_empty_tensor) { round_trip(TT_FLOAT32, 0, 1, "tt"); }
END_TEST

/* A tensor past protobuf's 2 GiB message limit moves in chunks, both ways. */
START_TEST(test_past_two_gib) {
  if (getenv("TTD_SKIP_HUGE")) return;
  int64_t numel = (int64_t)((2ull << 30) + 4096) / 4;
  size_t bytes = (size_t)numel * 4;
  int32_t *data = malloc(bytes);
  ck_assert_ptr_nonnull(data);
  for (int64_t i = 0; i < numel; i++) data[i] = (int32_t)(i * 2654435761u);
  int64_t shape[2] = {numel / 1024, 1024};
  tt_tensor *host = tt_tensor_from_host(client, data, TT_INT32, shape, 2);
  free(data);
  tt_tensor *dev = tt_to(host, "tt");
  ck_assert_msg(dev != NULL, "upload: %s", tt_last_error(client));
  tt_tensor_free(host);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), bytes);
  tt_tensor *back = tt_to(dev, "cpu");
  ck_assert_msg(back != NULL, "download: %s", tt_last_error(client));
  const int32_t *got = tt_tensor_data(back);
  for (int64_t i = 0; i < numel; i++) {
    if (got[i] != (int32_t)(i * 2654435761u)) ck_abort_msg("element %lld differs", (long long)i);
  }
  tt_tensor_free(back);
  tt_tensor_free(dev);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 0);
}
END_TEST

/* float32 into a bfloat16 tensor rounds to nearest even (exactly as the reference), and back
 * to float32 every value is within half a bfloat16 ulp. */
START_TEST(test_bfloat16_conversion) {
  enum { N = 300007 };
  float *data = malloc(sizeof(float) * N);
  uint32_t x = 12345;
  for (int i = 0; i < N; i++) {
    x = x * 1664525u + 1013904223u;
    data[i] = ((float)(x >> 8) / 16777216.0f - 0.5f) * powf(2.0f, (float)((int)(x % 40) - 20));
  }
  data[0] = 1.00390625f;  /* exactly half way between two bfloat16 values: ties to even (1.0) */
  data[1] = 1.01171875f;  /* half way, ties to even upwards (1.015625) */
  int64_t shape[1] = {N};
  tt_tensor *host = tt_tensor_from_host(client, data, TT_FLOAT32, shape, 1);
  tt_tensor *dev = tt_to_dtype(host, "tt", TT_BFLOAT16);
  ck_assert_msg(dev != NULL, "%s", tt_last_error(client));
  ck_assert_int_eq(tt_tensor_dtype(dev), TT_BFLOAT16);
  ck_assert_uint_eq(tt_tensor_nbytes(dev), (uint64_t)N * 2);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), (uint64_t)N * 2);
  tt_tensor *raw = tt_to(dev, "cpu"); /* bfloat16 bits as stored on the card */
  tt_tensor *wide = tt_to_dtype(dev, "cpu", TT_FLOAT32);
  ck_assert_ptr_nonnull(raw);
  ck_assert_ptr_nonnull(wide);
  const uint16_t *bits = tt_tensor_data(raw);
  const float *back = tt_tensor_data(wide);
  ck_assert_float_eq(back[0], 1.0f);
  ck_assert_float_eq(back[1], 1.015625f);
  for (int i = 0; i < N; i++) {
    ck_assert_uint_eq(bits[i], ttd_bf16_from_f32(data[i]));
    int e;
    frexpf(data[i], &e);
    float half_ulp = ldexpf(1.0f, e - 9);
    if (fabsf(back[i] - data[i]) > half_ulp) ck_abort_msg("element %d: %g -> %g, more than half an ulp", i, data[i], back[i]);
  }
  tt_tensor_free(raw);
  tt_tensor_free(wide);
  tt_tensor_free(dev);
  tt_tensor_free(host);
  free(data);
}
END_TEST

/* tt:0 -> tt:1 and dram -> l1 moves copy the bytes on the daemon and account memory per
 * device and location. */
START_TEST(test_moves) {
  enum { N = 100003 };
  int32_t *data = malloc(sizeof(int32_t) * N);
  harness_fill_random(data, sizeof(int32_t) * N, 7);
  int64_t shape[1] = {N};
  tt_tensor *host = tt_tensor_from_host(client, data, TT_INT32, shape, 1);
  tt_tensor *d0 = tt_to(host, "tt:0");
  tt_tensor *d1 = tt_to(d0, "tt:1");
  ck_assert_msg(d1 != NULL, "%s", tt_last_error(client));
  ck_assert_str_eq(tt_tensor_device(d1), "tt:1");
  tt_tensor *l1 = tt_to(d1, "tt:1/l1");
  ck_assert_msg(l1 != NULL, "%s", tt_last_error(client));
  ck_assert_str_eq(tt_tensor_device(l1), "tt:1/l1");
  tt_tensor *l1_0 = tt_to(l1, "tt:0/l1");
  ck_assert_ptr_nonnull(l1_0);
  uint64_t bytes = sizeof(int32_t) * N;
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), bytes);
  ck_assert_uint_eq(harness_used_bytes(&proc, 1, 0), bytes);
  ck_assert_uint_eq(harness_used_bytes(&proc, 1, 1), bytes);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 1), bytes);
  tt_tensor *back = tt_to(l1_0, "cpu");
  ck_assert_int_eq(memcmp(tt_tensor_data(back), data, bytes), 0);
  tt_tensor *back1 = tt_to(d1, "cpu");
  ck_assert_int_eq(memcmp(tt_tensor_data(back1), data, bytes), 0);
  tt_tensor_free(back1);
  tt_tensor_free(back);
  tt_tensor_free(l1_0);
  tt_tensor_free(l1);
  tt_tensor_free(d1);
  tt_tensor_free(d0);
  tt_tensor_free(host);
  free(data);
  ck_assert_uint_eq(harness_used_bytes(&proc, 1, 1), 0);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 0);
}
END_TEST

/* .to() to where the tensor already is returns the same tensor with one more reference;
 * freeing both references frees the device memory once. */
START_TEST(test_to_same_place) {
  float v[4] = {1, 2, 3, 4};
  int64_t shape[1] = {4};
  tt_tensor *host = tt_tensor_from_host(client, v, TT_FLOAT32, shape, 1);
  ck_assert_ptr_eq(tt_to(host, "cpu"), host);
  tt_tensor_free(host);
  tt_tensor *dev = tt_to(host, "tt");
  ck_assert_ptr_eq(tt_to(dev, "tt:0"), dev);
  ck_assert_ptr_eq(tt_to(dev, "tt:0/dram"), dev);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 16);
  tt_tensor_free(dev);
  tt_tensor_free(dev);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 16);
  tt_tensor_free(dev); /* the third reference: now the device tensor goes */
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 0);
  tt_tensor_free(host);
  tt_tensor_free(NULL);
  ck_assert_ptr_null(tt_to(NULL, "tt"));
}
END_TEST

/* tt_tensor_empty on a device allocates zero-filled memory of the right size. */
START_TEST(test_empty_on_device) {
  int64_t shape[2] = {33, 65};
  tt_tensor *dev = tt_tensor_empty(client, TT_FLOAT32, shape, 2, "tt:1/l1");
  ck_assert_msg(dev != NULL, "%s", tt_last_error(client));
  ck_assert_uint_eq(harness_used_bytes(&proc, 1, 1), 33 * 65 * 4);
  tt_tensor *back = tt_to(dev, "cpu");
  const float *f = tt_tensor_data(back);
  for (int i = 0; i < 33 * 65; i++) ck_assert_float_eq(f[i], 0.0f);
  ck_assert_int_eq(tt_tensor_shape(back)[0], 33);
  ck_assert_int_eq(tt_tensor_shape(back)[1], 65);
  tt_tensor_free(back);
  tt_tensor_free(dev);
}
END_TEST

static long daemon_rss_kib(void) { return harness_rss_kib(&proc); }

/* Whether the daemon runs under valgrind (scripts/valgrind-e2e), whose allocator ignores
 * malloc_trim. */
static int daemon_under_valgrind(void) {
  char path[64], exe[256];
  snprintf(path, sizeof(path), "/proc/%d/exe", (int)proc.pid);
  ssize_t n = readlink(path, exe, sizeof(exe) - 1);
  exe[n > 0 ? n : 0] = 0;
  return strstr(exe, "valgrind") != NULL || strstr(exe, "memcheck") != NULL;
}

/* Once calls stop, the heap a burst left behind goes back to the system (idle_trim.h):
 * 240 MiB of tensors below the block cache's size, allocated and freed, leave the daemon's
 * RSS within a few seconds of quiet. */
START_TEST(test_idle_daemon_gives_memory_back) {
#if defined(__SANITIZE_ADDRESS__)
  return; /* ASan's allocator keeps freed memory in its quarantine and ignores malloc_trim */
#endif
  if (daemon_under_valgrind()) return;
  enum { N = 300, ELEMS = 200 * 1024 }; /* 800 KiB each */
  char session[17], instance[40];
  raw_open_session(proc.target, session, instance);
  long before = daemon_rss_kib();
  static uint64_t handles[N];
  for (int i = 0; i < N; i++) handles[i] = raw_allocate(proc.target, session, ELEMS);
  long peak = daemon_rss_kib();
  ck_assert_msg(peak - before > 200 * 1024, "allocating 240 MiB grew RSS by %ld KiB only", peak - before);
  Ttd__V1__FreeRequest fr = TTD__V1__FREE_REQUEST__INIT;
  fr.n_handles = N;
  fr.handles = handles;
  raw_expect(proc.target, "/ttd.v1.Device/Free", &fr.base, (raw_md){.session = session, .instance = instance}, 0, NULL);
  ck_assert_uint_eq(harness_used_bytes(&proc, 0, 0), 0);
  long now = peak;
  for (int waited = 0; waited < 10000 && now - before > 50 * 1024; waited += 200) {
    struct timespec ts = {0, 200 * 1000000};
    nanosleep(&ts, NULL);
    now = daemon_rss_kib();
  }
  ck_assert_msg(now - before <= 50 * 1024, "RSS %ld KiB before, %ld at the peak, still %ld after 10 s idle", before, peak,
                now);
}
END_TEST

/* libttclient raises glibc's malloc thresholds at the first tt_connect (malloc_tuning.c),
 * unless told not to. Each case is a fresh process (gRPC is not forked: this test process
 * never starts it) that connects, then allocates 24 MiB: from the heap when the thresholds
 * were raised (mallinfo2's count of mmapped blocks unchanged), from mmap with glibc's
 * defaults. Returns 0 heap, 1 mmap, 2 or more: the child failed. */
static int connect_then_allocate(int disable, const char *env_name, const char *env_value) {
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    if (env_name) setenv(env_name, env_value, 1);
    tt_connect_options o;
    tt_connect_options_init(&o);
    o.disable_malloc_tuning = disable;
    tt_client *c = NULL;
    if (tt_connect(proc.target, &o, &c) != TT_OK) _exit(2);
    struct mallinfo2 before = mallinfo2();
    volatile char *p = malloc(24 << 20);
    if (!p) _exit(3);
    p[0] = 1;
    struct mallinfo2 during = mallinfo2();
    free((void *)p);
    tt_disconnect(c);
    _exit(during.hblks == before.hblks ? 0 : 1);
  }
  int status = 0;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 4;
}

START_TEST(test_client_raises_malloc_thresholds) {
#if defined(__SANITIZE_ADDRESS__)
  return; /* ASan's allocator replaces glibc's: no thresholds, no mallinfo2 */
#endif
  ck_assert_int_eq(connect_then_allocate(0, NULL, NULL), 0);
  ck_assert_int_eq(connect_then_allocate(1, NULL, NULL), 1);
  ck_assert_int_eq(connect_then_allocate(0, "TTD_MALLOC_TUNING", "0"), 1);
  ck_assert_int_eq(connect_then_allocate(0, "TTD_MALLOC_TUNING", "1"), 0);
  /* glibc reads GLIBC_TUNABLES at exec, so here it only tells libttclient to keep out */
  ck_assert_int_eq(connect_then_allocate(0, "GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1"), 1);
}
END_TEST

static void setup_daemon(void) {
  const char *args[] = {NULL};
  ttd_proc_start(&proc, args);
}

static void teardown_daemon(void) { ck_assert_int_eq(ttd_proc_stop(&proc), 0); }

Suite *e2e_transfer_suite(void) {
  Suite *s = suite_create("e2e_transfer");
  TCase *tc = tcase_create("transfer");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_scalar_float32);
  tcase_add_test(tc, test_scalar_int32);
  tcase_add_test(tc, test_one_element);
  tcase_add_test(tc, test_one_mib_plus);
  tcase_add_test(tc, test_64_mib);
  tcase_add_test(tc, test_empty_tensor);
  tcase_add_test(tc, test_past_two_gib);
  tcase_add_test(tc, test_bfloat16_conversion);
  tcase_add_test(tc, test_moves);
  tcase_add_test(tc, test_to_same_place);
  tcase_add_test(tc, test_empty_on_device);
  tcase_add_test(tc, test_idle_daemon_gives_memory_back);
  suite_add_tcase(s, tc);

  tc = tcase_create("malloc_tuning");
  tcase_add_checked_fixture(tc, setup_daemon, teardown_daemon);
  tcase_add_test(tc, test_client_raises_malloc_thresholds);
  suite_add_tcase(s, tc);
  return s;
}
