/* The simulated card through daemon/backend.h (ttd_backend_create("sim", ...)): registry,
 * device info, exact allocation accounting, RESOURCE_EXHAUSTED messages, byte copies (big
 * ones spread over the cores). */
#include <check.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/backend.h"
#include "backends/sim/sim_backend.h"
#include "suites.h"

#define DRAM_BYTES (1u << 20)
#define L1_BYTES (64u << 10)

static ttd_backend *backend;

static void setup(void) {
  ttd_backend_options options = {.devices = 2, .dram_bytes = DRAM_BYTES, .l1_bytes = L1_BYTES, .cores = 1};
  ttd_status_t s = ttd_backend_create("sim", &options, &backend);
  ck_assert_msg(s == NULL, "%s", ttd_status_message(s));
  ck_assert_ptr_nonnull(backend);
}

static void teardown(void) {
  ttd_backend_destroy(backend);
  backend = NULL;
}

static uint64_t used(int device, ttd_memloc loc) {
  ttd_device_info info;
  backend->vtable->device_info(backend, device, &info);
  return info.memory[loc == TTD_MEM_L1 ? 1 : 0].used_bytes;
}

static ttd_backend_buffer *alloc_ok(int device, ttd_memloc loc, uint64_t bytes) {
  ttd_backend_buffer *buf = NULL;
  ttd_status_t s = backend->vtable->buffer_alloc(backend, device, loc, bytes, &buf);
  ck_assert_msg(s == NULL, "alloc %" PRIu64 " on tt:%d %s: %s", bytes, device, ttd_memloc_name(loc),
                ttd_status_message(s));
  ck_assert_ptr_nonnull(buf);
  return buf;
}

static void free_buf(ttd_backend_buffer *buf) { backend->vtable->buffer_free(backend, buf); }

static void fill_pattern(unsigned char *p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)((i * 131 + seed * 7 + (i >> 8)) & 0xff);
}

/* An unknown backend name is INVALID_ARGUMENT naming it and listing "sim"; out is NULL. */
START_TEST(test_unknown_backend) {
  ttd_backend_options options = {.devices = 1, .dram_bytes = DRAM_BYTES, .l1_bytes = L1_BYTES};
  ttd_backend *b = (ttd_backend *)&options; /* must be cleared */
  ttd_status_t s = ttd_backend_create("cuda", &options, &b);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(ttd_status_message(s), "cuda"));
  ck_assert_ptr_nonnull(strstr(ttd_status_message(s), "sim"));
  ck_assert_ptr_null(b);
  ttd_status_free(s);
  s = ttd_backend_create("", &options, &b);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_INVALID_ARGUMENT);
  ttd_status_free(s);
  s = ttd_backend_create("SIM", &options, &b);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_INVALID_ARGUMENT);
  ttd_status_free(s);
}
END_TEST

/* The registry names "sim", memory locations have names, and destroying NULL is a no-op. */
START_TEST(test_names) {
  ck_assert_ptr_nonnull(strstr(ttd_backend_names(), "sim"));
  ck_assert_str_eq(backend->name, "sim");
  ck_assert_str_eq(ttd_memloc_name(TTD_MEM_DRAM), "dram");
  ck_assert_str_eq(ttd_memloc_name(TTD_MEM_L1), "l1");
  ck_assert_str_eq(ttd_memloc_name((ttd_memloc)0), "invalid");
  ck_assert_str_eq(ttd_memloc_name((ttd_memloc)3), "invalid");
  ttd_backend_destroy(NULL);
}
END_TEST

/* A sim backend with fewer than one device is INVALID_ARGUMENT. */
START_TEST(test_zero_devices_refused) {
  ttd_backend_options options = {.devices = 0, .dram_bytes = DRAM_BYTES, .l1_bytes = L1_BYTES};
  ttd_backend *b = NULL;
  ttd_status_t s = ttd_backend_create("sim", &options, &b);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_INVALID_ARGUMENT);
  ck_assert_ptr_null(b);
  ttd_status_free(s);
  options.devices = -3;
  s = ttd_backend_create("sim", &options, &b);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_INVALID_ARGUMENT);
  ck_assert_ptr_null(b);
  ttd_status_free(s);
}
END_TEST

/* device_count is the number of devices asked for. */
START_TEST(test_device_count) {
  ck_assert_int_eq(backend->vtable->device_count(backend), 2);
  ttd_backend_options options = {.devices = 64, .dram_bytes = 1, .l1_bytes = 1};
  ttd_backend *b = NULL;
  ck_assert_ptr_null(ttd_backend_create("sim", &options, &b));
  ck_assert_int_eq(b->vtable->device_count(b), 64);
  ttd_backend_destroy(b);
}
END_TEST

/* device_info reports kind, cores, both locations with their capacities and nothing used. */
START_TEST(test_device_info) {
  for (int d = 0; d < 2; d++) {
    ttd_device_info info;
    memset(&info, 0xCC, sizeof(info));
    backend->vtable->device_info(backend, d, &info);
    ck_assert_str_eq(info.kind, "sim-wormhole-n150");
    ck_assert_uint_eq(info.cores, TTD_SIM_CORES_PER_CARD);
    ck_assert_int_eq(info.memory[0].location, TTD_MEM_DRAM);
    ck_assert_uint_eq(info.memory[0].capacity_bytes, DRAM_BYTES);
    ck_assert_uint_eq(info.memory[0].used_bytes, 0);
    ck_assert_int_eq(info.memory[1].location, TTD_MEM_L1);
    ck_assert_uint_eq(info.memory[1].capacity_bytes, L1_BYTES);
    ck_assert_uint_eq(info.memory[1].used_bytes, 0);
  }
}
END_TEST

/* The Wormhole defaults (12 GiB DRAM, 108 MiB L1) are reported without being backed up front. */
START_TEST(test_default_capacities) {
  ttd_backend_options options = {.devices = 4, .dram_bytes = TTD_SIM_DEFAULT_DRAM_BYTES,
                                 .l1_bytes = TTD_SIM_DEFAULT_L1_BYTES};
  ttd_backend *b = NULL;
  ck_assert_ptr_null(ttd_backend_create("sim", &options, &b));
  ttd_device_info info;
  b->vtable->device_info(b, 3, &info);
  ck_assert_uint_eq(info.memory[0].capacity_bytes, 12ull << 30);
  ck_assert_uint_eq(info.memory[1].capacity_bytes, 108ull << 20);
  ck_assert_uint_eq(TTD_SIM_DEFAULT_L1_BYTES, 72 * (3ull << 19)); /* 72 cores x 1.5 MiB */
  ttd_backend_destroy(b);
}
END_TEST

/* Allocations are accounted exactly per device and per location, and freeing gives them back. */
START_TEST(test_accounting) {
  ttd_backend_buffer *a = alloc_ok(0, TTD_MEM_DRAM, 1000);
  ck_assert_uint_eq(used(0, TTD_MEM_DRAM), 1000);
  ck_assert_uint_eq(used(0, TTD_MEM_L1), 0);
  ck_assert_uint_eq(used(1, TTD_MEM_DRAM), 0);
  ck_assert_uint_eq(used(1, TTD_MEM_L1), 0);
  ttd_backend_buffer *b = alloc_ok(0, TTD_MEM_L1, 333);
  ttd_backend_buffer *c = alloc_ok(1, TTD_MEM_DRAM, 5001);
  ttd_backend_buffer *d = alloc_ok(1, TTD_MEM_L1, 7);
  ttd_backend_buffer *e = alloc_ok(0, TTD_MEM_DRAM, 24);
  ck_assert_uint_eq(used(0, TTD_MEM_DRAM), 1024);
  ck_assert_uint_eq(used(0, TTD_MEM_L1), 333);
  ck_assert_uint_eq(used(1, TTD_MEM_DRAM), 5001);
  ck_assert_uint_eq(used(1, TTD_MEM_L1), 7);
  free_buf(a);
  ck_assert_uint_eq(used(0, TTD_MEM_DRAM), 24);
  ck_assert_uint_eq(used(0, TTD_MEM_L1), 333);
  free_buf(d);
  ck_assert_uint_eq(used(1, TTD_MEM_L1), 0);
  ck_assert_uint_eq(used(1, TTD_MEM_DRAM), 5001);
  free_buf(b);
  free_buf(c);
  free_buf(e);
  for (int dev = 0; dev < 2; dev++) {
    ck_assert_uint_eq(used(dev, TTD_MEM_DRAM), 0);
    ck_assert_uint_eq(used(dev, TTD_MEM_L1), 0);
  }
}
END_TEST

/* An L1 alloc that does not fit is RESOURCE_EXHAUSTED naming tt:0, l1, bytes asked and free. */
START_TEST(test_alloc_too_big_l1) {
  ttd_backend_buffer *a = alloc_ok(0, TTD_MEM_L1, 50000);
  ttd_backend_buffer *buf = (ttd_backend_buffer *)&buf; /* must be cleared */
  ttd_status_t s = backend->vtable->buffer_alloc(backend, 0, TTD_MEM_L1, 20000, &buf);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_RESOURCE_EXHAUSTED);
  ck_assert_ptr_null(buf);
  const char *m = ttd_status_message(s);
  ck_assert_msg(strstr(m, "tt:0") && strstr(m, "l1") && strstr(m, "20000") && strstr(m, "15536"),
                "message: %s", m);
  ck_assert_ptr_null(strstr(m, "dram"));
  ttd_status_free(s);
  ck_assert_uint_eq(used(0, TTD_MEM_L1), 50000); /* a failed alloc takes nothing */
  /* DRAM of the same device and L1 of the other are unaffected. */
  free_buf(alloc_ok(0, TTD_MEM_DRAM, 20000));
  free_buf(alloc_ok(1, TTD_MEM_L1, 20000));
  free_buf(a);
}
END_TEST

/* A DRAM alloc larger than the whole card names tt:1, dram, bytes asked and bytes free. */
START_TEST(test_alloc_too_big_dram) {
  ttd_backend_buffer *a = alloc_ok(1, TTD_MEM_DRAM, 4096);
  ttd_backend_buffer *buf = NULL;
  ttd_status_t s = backend->vtable->buffer_alloc(backend, 1, TTD_MEM_DRAM, 3u << 20, &buf);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_RESOURCE_EXHAUSTED);
  ck_assert_ptr_null(buf);
  char requested[32], free_bytes[32];
  snprintf(requested, sizeof(requested), "%u", 3u << 20);
  snprintf(free_bytes, sizeof(free_bytes), "%u", DRAM_BYTES - 4096);
  const char *m = ttd_status_message(s);
  ck_assert_msg(strstr(m, "tt:1") && strstr(m, "dram") && strstr(m, requested) && strstr(m, free_bytes),
                "message: %s", m);
  ttd_status_free(s);
  ck_assert_uint_eq(used(1, TTD_MEM_DRAM), 4096);
  /* A size near 2^64 does not wrap the accounting. */
  s = backend->vtable->buffer_alloc(backend, 1, TTD_MEM_DRAM, UINT64_MAX, &buf);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_RESOURCE_EXHAUSTED);
  ttd_status_free(s);
  ck_assert_uint_eq(used(1, TTD_MEM_DRAM), 4096);
  free_buf(a);
}
END_TEST

/* An alloc of exactly the free bytes succeeds; then one more byte does not, but 0 bytes does. */
START_TEST(test_exact_fit) {
  ttd_backend_buffer *a = alloc_ok(0, TTD_MEM_L1, 1000);
  ttd_backend_buffer *b = alloc_ok(0, TTD_MEM_L1, L1_BYTES - 1000);
  ck_assert_uint_eq(used(0, TTD_MEM_L1), L1_BYTES);
  ttd_backend_buffer *c = NULL;
  ttd_status_t s = backend->vtable->buffer_alloc(backend, 0, TTD_MEM_L1, 1, &c);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_RESOURCE_EXHAUSTED);
  ck_assert_ptr_nonnull(strstr(ttd_status_message(s), "0 bytes free"));
  ttd_status_free(s);
  ttd_backend_buffer *z = alloc_ok(0, TTD_MEM_L1, 0);
  free_buf(z);
  free_buf(a);
  free_buf(b);
  ck_assert_uint_eq(used(0, TTD_MEM_L1), 0);
  /* The whole card in one buffer. */
  free_buf(alloc_ok(1, TTD_MEM_DRAM, DRAM_BYTES));
  ck_assert_uint_eq(used(1, TTD_MEM_DRAM), 0);
}
END_TEST

/* A 0-byte buffer exists, uses nothing, and reads, writes, zeroes and copies nothing. */
START_TEST(test_zero_bytes) {
  ttd_backend_buffer *a = alloc_ok(0, TTD_MEM_DRAM, 0);
  ttd_backend_buffer *b = alloc_ok(1, TTD_MEM_L1, 0);
  ck_assert_ptr_ne(a, b);
  ck_assert_uint_eq(used(0, TTD_MEM_DRAM), 0);
  ck_assert_uint_eq(used(1, TTD_MEM_L1), 0);
  char byte = 'x';
  ck_assert_ptr_null(backend->vtable->buffer_write(backend, a, 0, &byte, 0));
  ck_assert_ptr_null(backend->vtable->buffer_read(backend, a, 0, &byte, 0));
  ck_assert_ptr_null(backend->vtable->buffer_zero(backend, a));
  ck_assert_ptr_null(backend->vtable->buffer_copy(backend, a, b));
  ck_assert_int_eq(byte, 'x');
  free_buf(a);
  free_buf(b);
}
END_TEST

/* Bytes written at offsets read back exactly, whole and in pieces. */
START_TEST(test_write_read_offsets) {
  enum { N = 10000 };
  static unsigned char src[N], dst[N];
  fill_pattern(src, N, 1);
  ttd_backend_buffer *buf = alloc_ok(0, TTD_MEM_DRAM, N);
  ck_assert_ptr_null(backend->vtable->buffer_write(backend, buf, 0, src, N));
  memset(dst, 0, N);
  ck_assert_ptr_null(backend->vtable->buffer_read(backend, buf, 0, dst, N));
  ck_assert_mem_eq(dst, src, N);

  /* Overwrite a middle piece and the very last byte. */
  unsigned char patch[100];
  fill_pattern(patch, sizeof(patch), 99);
  ck_assert_ptr_null(backend->vtable->buffer_write(backend, buf, 4321, patch, sizeof(patch)));
  memcpy(src + 4321, patch, sizeof(patch));
  unsigned char last = 0xEE;
  ck_assert_ptr_null(backend->vtable->buffer_write(backend, buf, N - 1, &last, 1));
  src[N - 1] = last;

  /* Read back in odd-sized chunks at every offset they fall on. */
  memset(dst, 0, N);
  for (uint64_t off = 0; off < N; off += 777) {
    uint64_t n = off + 777 > N ? N - off : 777;
    ck_assert_ptr_null(backend->vtable->buffer_read(backend, buf, off, dst + off, n));
  }
  ck_assert_mem_eq(dst, src, N);
  unsigned char one = 0;
  ck_assert_ptr_null(backend->vtable->buffer_read(backend, buf, N - 1, &one, 1));
  ck_assert_uint_eq(one, 0xEE);
  free_buf(buf);
}
END_TEST

/* Buffers are separate: writing one does not change another. */
START_TEST(test_buffers_independent) {
  unsigned char x[256], y[256], out[256];
  fill_pattern(x, sizeof(x), 3);
  fill_pattern(y, sizeof(y), 4);
  ttd_backend_buffer *a = alloc_ok(0, TTD_MEM_L1, 256);
  ttd_backend_buffer *b = alloc_ok(0, TTD_MEM_L1, 256);
  ck_assert_ptr_null(backend->vtable->buffer_write(backend, a, 0, x, 256));
  ck_assert_ptr_null(backend->vtable->buffer_write(backend, b, 0, y, 256));
  ck_assert_ptr_null(backend->vtable->buffer_read(backend, a, 0, out, 256));
  ck_assert_mem_eq(out, x, 256);
  free_buf(a);
  free_buf(b);
}
END_TEST

/* buffer_zero clears every byte. */
START_TEST(test_zero_buffer) {
  enum { N = 4099 };
  static unsigned char src[N], dst[N], zeros[N];
  fill_pattern(src, N, 5);
  ttd_backend_buffer *buf = alloc_ok(1, TTD_MEM_L1, N);
  ck_assert_ptr_null(backend->vtable->buffer_write(backend, buf, 0, src, N));
  ck_assert_ptr_null(backend->vtable->buffer_zero(backend, buf));
  memset(dst, 0xFF, N);
  ck_assert_ptr_null(backend->vtable->buffer_read(backend, buf, 0, dst, N));
  ck_assert_mem_eq(dst, zeros, N);
  free_buf(buf);
}
END_TEST

/* buffer_copy copies whole buffers across devices and locations; used bytes are unchanged. */
START_TEST(test_copy_across) {
  enum { N = 3000 };
  static unsigned char src[N], dst[N];
  fill_pattern(src, N, 6);
  ttd_backend_buffer *d0 = alloc_ok(0, TTD_MEM_DRAM, N);
  ttd_backend_buffer *l1_1 = alloc_ok(1, TTD_MEM_L1, N);
  ttd_backend_buffer *l1_0 = alloc_ok(0, TTD_MEM_L1, N);
  ttd_backend_buffer *d1 = alloc_ok(1, TTD_MEM_DRAM, N);
  ck_assert_ptr_null(backend->vtable->buffer_write(backend, d0, 0, src, N));
  ck_assert_ptr_null(backend->vtable->buffer_copy(backend, d0, l1_1));   /* device 0 -> 1, dram -> l1 */
  ck_assert_ptr_null(backend->vtable->buffer_copy(backend, l1_1, l1_0)); /* device 1 -> 0, l1 -> l1 */
  ck_assert_ptr_null(backend->vtable->buffer_copy(backend, l1_0, d1));   /* device 0 -> 1, l1 -> dram */
  ttd_backend_buffer *all[] = {l1_1, l1_0, d1};
  for (int i = 0; i < 3; i++) {
    memset(dst, 0, N);
    ck_assert_ptr_null(backend->vtable->buffer_read(backend, all[i], 0, dst, N));
    ck_assert_mem_eq(dst, src, N);
  }
  /* The source is left as it was. */
  memset(dst, 0, N);
  ck_assert_ptr_null(backend->vtable->buffer_read(backend, d0, 0, dst, N));
  ck_assert_mem_eq(dst, src, N);
  ck_assert_uint_eq(used(0, TTD_MEM_DRAM), N);
  ck_assert_uint_eq(used(0, TTD_MEM_L1), N);
  ck_assert_uint_eq(used(1, TTD_MEM_DRAM), N);
  ck_assert_uint_eq(used(1, TTD_MEM_L1), N);
  free_buf(d0);
  free_buf(l1_1);
  free_buf(l1_0);
  free_buf(d1);
}
END_TEST

/* Copies of 4 MiB and more are spread over the card's cores: an odd size at an odd offset
 * comes back byte for byte through write, read (whole and in pieces) and a copy across
 * devices, with one core or three. */
START_TEST(test_big_copies_whole) {
  enum { N = (9 << 20) + 13, OFFSET = 7, SLICE = (1 << 20) + 3 };
  unsigned char *src = malloc(N), *dst = malloc(N);
  ck_assert_ptr_nonnull(src);
  ck_assert_ptr_nonnull(dst);
  fill_pattern(src, N, 11);
  for (int cores = 1; cores <= 3; cores += 2) {
    ttd_backend_destroy(backend);
    backend = NULL;
    ttd_backend_options options = {.devices = 2, .dram_bytes = 32u << 20, .l1_bytes = L1_BYTES, .cores = cores};
    ck_assert_ptr_null(ttd_backend_create("sim", &options, &backend));
    ttd_backend_buffer *a = alloc_ok(0, TTD_MEM_DRAM, N + OFFSET), *b = alloc_ok(1, TTD_MEM_DRAM, N + OFFSET);
    ck_assert_ptr_null(backend->vtable->buffer_zero(backend, a));
    ck_assert_ptr_null(backend->vtable->buffer_write(backend, a, OFFSET, src, N));
    memset(dst, 0, N);
    ck_assert_ptr_null(backend->vtable->buffer_read(backend, a, OFFSET, dst, N));
    ck_assert_msg(memcmp(dst, src, N) == 0, "cores %d: a whole read differs", cores);
    unsigned char head[OFFSET];
    ck_assert_ptr_null(backend->vtable->buffer_read(backend, a, 0, head, OFFSET));
    for (int i = 0; i < OFFSET; i++) ck_assert_uint_eq(head[i], 0); /* nothing written before the offset */
    memset(dst, 0, N);
    for (uint64_t off = 0; off < N; off += SLICE) {
      uint64_t n = off + SLICE > N ? N - off : SLICE;
      ck_assert_ptr_null(backend->vtable->buffer_read(backend, a, OFFSET + off, dst + off, n));
    }
    ck_assert_msg(memcmp(dst, src, N) == 0, "cores %d: a read in pieces differs", cores);
    ck_assert_ptr_null(backend->vtable->buffer_copy(backend, a, b));
    memset(dst, 0, N);
    ck_assert_ptr_null(backend->vtable->buffer_read(backend, b, OFFSET, dst, N));
    ck_assert_msg(memcmp(dst, src, N) == 0, "cores %d: the copy across devices differs", cores);
    free_buf(a);
    free_buf(b);
    ck_assert_uint_eq(used(0, TTD_MEM_DRAM), 0);
    ck_assert_uint_eq(used(1, TTD_MEM_DRAM), 0);
  }
  free(src);
  free(dst);
}
END_TEST

/* buffer_copy between buffers of different sizes is an error and changes nothing. */
START_TEST(test_copy_size_mismatch) {
  unsigned char src[64], dst[32], out[32];
  fill_pattern(src, sizeof(src), 7);
  fill_pattern(dst, sizeof(dst), 8);
  ttd_backend_buffer *a = alloc_ok(0, TTD_MEM_DRAM, 64);
  ttd_backend_buffer *b = alloc_ok(0, TTD_MEM_DRAM, 32);
  ck_assert_ptr_null(backend->vtable->buffer_write(backend, a, 0, src, 64));
  ck_assert_ptr_null(backend->vtable->buffer_write(backend, b, 0, dst, 32));
  ttd_status_t s = backend->vtable->buffer_copy(backend, a, b);
  ck_assert_ptr_nonnull(s);
  ck_assert_int_ne(ttd_status_code(s), GRPC_STATUS_OK);
  ttd_status_free(s);
  ck_assert_ptr_null(backend->vtable->buffer_read(backend, b, 0, out, 32));
  ck_assert_mem_eq(out, dst, 32);
  free_buf(a);
  free_buf(b);
}
END_TEST

/* Random allocations and frees on every device and location end with nothing used. */
START_TEST(test_random_alloc_free_to_zero) {
  enum { SLOTS = 64 };
  ttd_backend_buffer *bufs[SLOTS] = {0};
  uint64_t sizes[SLOTS] = {0};
  int devs[SLOTS] = {0};
  ttd_memloc locs[SLOTS];
  uint64_t want[2][2] = {{0, 0}, {0, 0}};
  uint64_t state = 12345;
  for (int op = 0; op < 5000; op++) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    int i = (int)((state >> 33) % SLOTS);
    if (bufs[i]) {
      free_buf(bufs[i]);
      want[devs[i]][locs[i] == TTD_MEM_L1] -= sizes[i];
      bufs[i] = NULL;
    } else {
      devs[i] = (int)((state >> 20) & 1);
      locs[i] = (state >> 21) & 1 ? TTD_MEM_L1 : TTD_MEM_DRAM;
      sizes[i] = (state >> 40) % 4000;
      uint64_t cap = locs[i] == TTD_MEM_L1 ? L1_BYTES : DRAM_BYTES;
      ttd_status_t s = backend->vtable->buffer_alloc(backend, devs[i], locs[i], sizes[i], &bufs[i]);
      int fits = want[devs[i]][locs[i] == TTD_MEM_L1] + sizes[i] <= cap;
      ck_assert_int_eq(s == NULL, fits);
      if (s) {
        ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_RESOURCE_EXHAUSTED);
        ttd_status_free(s);
      } else {
        want[devs[i]][locs[i] == TTD_MEM_L1] += sizes[i];
      }
    }
    for (int d = 0; d < 2; d++) {
      ck_assert_uint_eq(used(d, TTD_MEM_DRAM), want[d][0]);
      ck_assert_uint_eq(used(d, TTD_MEM_L1), want[d][1]);
    }
  }
  for (int i = 0; i < SLOTS; i++) free_buf(bufs[i]);
  for (int d = 0; d < 2; d++) {
    ck_assert_uint_eq(used(d, TTD_MEM_DRAM), 0);
    ck_assert_uint_eq(used(d, TTD_MEM_L1), 0);
  }
}
END_TEST

static uint64_t in_flight(int device, ttd_memloc loc) {
  ttd_device_info info;
  backend->vtable->device_info(backend, device, &info);
  return info.memory[loc == TTD_MEM_L1 ? 1 : 0].in_flight_bytes;
}

/* A pinned view outlives buffer_free: the device's bytes go back at the free (a whole-card
 * allocation fits next), the host bytes stay readable and unchanged until the last pin is
 * released, counted as in flight meanwhile. */
START_TEST(test_view_pin_outlives_free) {
  enum { BYTES = 256 << 10, PART = 64 << 10 };
  ttd_backend_buffer *buf = alloc_ok(0, TTD_MEM_DRAM, BYTES);
  unsigned char *want = malloc(BYTES);
  fill_pattern(want, BYTES, 5);
  ck_assert_ptr_null(backend->vtable->buffer_write(backend, buf, 0, want, BYTES));
  ttd_host_pin *pins[2] = {NULL, NULL}, *none = (ttd_host_pin *)want;
  const unsigned char *views[2];
  for (int i = 0; i < 2; i++) {
    views[i] = backend->vtable->buffer_host_view(backend, buf, (uint64_t)i * PART, PART, &pins[i]);
    ck_assert_ptr_nonnull(views[i]);
    ck_assert_ptr_nonnull(pins[i]);
  }
  ck_assert_ptr_null(backend->vtable->buffer_host_view(backend, buf, BYTES - PART + 1, PART, &none));
  ck_assert_ptr_null(none);
  ck_assert_uint_eq(in_flight(0, TTD_MEM_DRAM), 0);
  free_buf(buf);
  ck_assert_uint_eq(used(0, TTD_MEM_DRAM), 0);
  ck_assert_uint_eq(in_flight(0, TTD_MEM_DRAM), BYTES);
  ttd_backend_buffer *whole = alloc_ok(0, TTD_MEM_DRAM, DRAM_BYTES);
  unsigned char *ones = malloc(DRAM_BYTES);
  memset(ones, 0xff, DRAM_BYTES);
  ck_assert_ptr_null(backend->vtable->buffer_write(backend, whole, 0, ones, DRAM_BYTES));
  for (int i = 0; i < 2; i++) ck_assert_int_eq(memcmp(views[i], want + i * PART, PART), 0);
  pins[0]->release(pins[0]);
  ck_assert_uint_eq(in_flight(0, TTD_MEM_DRAM), BYTES);
  ck_assert_int_eq(memcmp(views[1], want + PART, PART), 0);
  pins[1]->release(pins[1]);
  ck_assert_uint_eq(in_flight(0, TTD_MEM_DRAM), 0);
  free_buf(whole);
  ck_assert_uint_eq(used(0, TTD_MEM_DRAM), 0);
  free(ones);
  free(want);
}
END_TEST

/* Pins released before the free leave nothing in flight; the free gives everything back. */
START_TEST(test_view_pin_released_first) {
  ttd_backend_buffer *buf = alloc_ok(1, TTD_MEM_L1, 4096);
  ttd_host_pin *pin = NULL;
  ck_assert_ptr_nonnull(backend->vtable->buffer_host_view(backend, buf, 0, 4096, &pin));
  pin->release(pin);
  ck_assert_uint_eq(in_flight(1, TTD_MEM_L1), 0);
  ck_assert_uint_eq(used(1, TTD_MEM_L1), 4096);
  free_buf(buf);
  ck_assert_uint_eq(used(1, TTD_MEM_L1), 0);
  ck_assert_uint_eq(in_flight(1, TTD_MEM_L1), 0);
}
END_TEST

/* Programs of different sessions at once: one per host thread (--cores), each on a thread
 * of its own, all running together. */
typedef struct together_probe {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int arrived;
  int saw_both[2];
  pthread_t thread[2];
} together_probe;

static void together_item(void *arg, size_t i) {
  together_probe *p = arg;
  pthread_mutex_lock(&p->mu);
  p->thread[i] = pthread_self();
  p->arrived++;
  pthread_cond_broadcast(&p->cv);
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 5;
  while (p->arrived < 2 && pthread_cond_timedwait(&p->cv, &p->mu, &until) == 0) {
  }
  p->saw_both[i] = p->arrived == 2;
  pthread_mutex_unlock(&p->mu);
}

START_TEST(test_programs_run_together) {
  ck_assert_int_eq(backend->vtable->programs_at_once(backend, 0), 1); /* the fixture's one core */
  ttd_backend *two = NULL;
  ttd_backend_options options = {.devices = 2, .dram_bytes = DRAM_BYTES, .l1_bytes = L1_BYTES, .cores = 2};
  ck_assert_ptr_null(ttd_backend_create("sim", &options, &two));
  ck_assert_int_eq(two->vtable->programs_at_once(two, 0), 1); /* two cards take turns with the pool */
  ttd_backend_destroy(two);
  options.devices = 1;
  ck_assert_ptr_null(ttd_backend_create("sim", &options, &two));
  ck_assert_int_eq(two->vtable->programs_at_once(two, 0), 2);
  together_probe p = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
  two->vtable->run_together(two, 0, 2, together_item, &p);
  ck_assert_int_eq(p.arrived, 2);
  ck_assert_int_eq(p.saw_both[0], 1);
  ck_assert_int_eq(p.saw_both[1], 1);
  ck_assert(!pthread_equal(p.thread[0], p.thread[1]));
  ttd_backend_destroy(two);
}
END_TEST

Suite *sim_backend_suite(void) {
  Suite *s = suite_create("sim_backend");
  TCase *tc = tcase_create("create");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_unknown_backend);
  tcase_add_test(tc, test_names);
  tcase_add_test(tc, test_zero_devices_refused);
  tcase_add_test(tc, test_device_count);
  tcase_add_test(tc, test_device_info);
  tcase_add_test(tc, test_default_capacities);
  tcase_add_test(tc, test_programs_run_together);
  suite_add_tcase(s, tc);

  tc = tcase_create("memory");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_accounting);
  tcase_add_test(tc, test_alloc_too_big_l1);
  tcase_add_test(tc, test_alloc_too_big_dram);
  tcase_add_test(tc, test_exact_fit);
  tcase_add_test(tc, test_zero_bytes);
  tcase_add_test(tc, test_random_alloc_free_to_zero);
  tcase_add_test(tc, test_view_pin_outlives_free);
  tcase_add_test(tc, test_view_pin_released_first);
  suite_add_tcase(s, tc);

  tc = tcase_create("data");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_write_read_offsets);
  tcase_add_test(tc, test_buffers_independent);
  tcase_add_test(tc, test_zero_buffer);
  tcase_add_test(tc, test_copy_across);
  tcase_add_test(tc, test_big_copies_whole);
  tcase_add_test(tc, test_copy_size_mismatch);
  suite_add_tcase(s, tc);
  return s;
}
