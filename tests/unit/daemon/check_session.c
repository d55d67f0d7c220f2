/* daemon/session.h, session_table.h and tensor.h over a sim backend: random handles, lookups
 * holding references, uniform NOT_FOUND, all-or-nothing frees, closing, leases and specs. */
#define _GNU_SOURCE /* memfd_create */
#include <check.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "telemetry/log.h"
#include "session/auth.h"
#include "session/session.h"
#include "session/session_table.h"
#include "session/shm_segment.h"
#include "device/tensor.h"
#include "suites.h"

#define DRAM_BYTES (1u << 20)
#define L1_BYTES (64u << 10)

static ttd_backend *backend;

static void setup(void) {
  ttd_log_threshold = TTD_LOG_ERROR; /* lease expiry logs at info */
  ttd_backend_options options = {.devices = 2, .dram_bytes = DRAM_BYTES, .l1_bytes = L1_BYTES, .cores = 1};
  ttd_status_t s = ttd_backend_create("sim", &options, &backend);
  ck_assert_msg(s == NULL, "%s", ttd_status_message(s));
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

static uint64_t used_total(void) {
  return used(0, TTD_MEM_DRAM) + used(0, TTD_MEM_L1) + used(1, TTD_MEM_DRAM) + used(1, TTD_MEM_L1);
}

static int tensor_refs(ttd_tensor *t) { return atomic_load(&t->refs); }
static int session_refs(ttd_session *s) { return atomic_load(&s->refs); }
static int64_t last_seen(ttd_session *s) { return atomic_load(&s->last_seen_ms); }

/* A new int32 tensor of n elements (1-d) on device/loc, charged to quota (may be NULL);
 * one reference owned by the caller. */
static ttd_tensor *new_charged_tensor(ttd_quota *quota, int64_t n, int device, ttd_memloc loc) {
  ttd_tensor_spec spec = {.dtype = TTD_DTYPE_INT32, .ndim = 1, .shape = {n}, .device = device, .location = loc};
  ttd_status_t s = ttd_tensor_spec_finish(&spec);
  ck_assert_msg(s == NULL, "%s", ttd_status_message(s));
  ttd_tensor *t = NULL;
  s = ttd_tensor_create(backend, quota, &spec, &t);
  ck_assert_msg(s == NULL, "%s", ttd_status_message(s));
  ck_assert_int_eq(tensor_refs(t), 1);
  return t;
}

static ttd_tensor *new_tensor(int64_t n, int device, ttd_memloc loc) { return new_charged_tensor(NULL, n, device, loc); }

/* Adds a new tensor of n int32 elements to session and drops the creator's reference. */
static uint64_t add_new(ttd_session *session, int64_t n, int device, ttd_memloc loc) {
  ttd_tensor *t = new_charged_tensor(session->quota, n, device, loc);
  uint64_t h = 0;
  ttd_status_t s = ttd_session_tensor_add(session, t, &h);
  ck_assert_msg(s == NULL, "%s", ttd_status_message(s));
  ck_assert_uint_ne(h, 0);
  ttd_tensor_release(t);
  return h;
}

/* The message of status with the handle's 16-digit hex replaced by "<H>"; frees status. */
static void message_without_handle(ttd_status_t status, uint64_t handle, char *out, size_t len) {
  char hex[24];
  snprintf(hex, sizeof(hex), "%016" PRIx64, handle);
  size_t hex_len = strlen(hex);
  const char *m = ttd_status_message(status);
  size_t o = 0;
  while (*m && o + 4 < len) {
    if (strncasecmp(m, hex, hex_len) == 0) {
      memcpy(out + o, "<H>", 3);
      o += 3;
      m += hex_len;
    } else {
      out[o++] = *m++;
    }
  }
  out[o] = '\0';
  ttd_status_free(status);
}

/* Asserts that looking handle up in session is NOT_FOUND, and returns the normalised message. */
static void expect_not_found(ttd_session *session, uint64_t handle, char *out, size_t len) {
  ttd_tensor *t = (ttd_tensor *)&t; /* must be cleared */
  ttd_status_t s = ttd_session_tensor_lookup(session, handle, &t);
  ck_assert_msg(ttd_status_code(s) == GRPC_STATUS_NOT_FOUND, "handle %016" PRIx64 ": %s", handle,
                ttd_code_name(ttd_status_code(s)));
  ck_assert_ptr_null(t);
  message_without_handle(s, handle, out, len);
}

/* ---- sessions ---- */

/* tensor_add hands out distinct, nonzero, random-looking 64-bit handles. */
START_TEST(test_add_random_handles) {
  enum { N = 400 };
  ttd_session *session = ttd_session_create(1, &(ttd_session_params){.client_name = "t"}, 0);
  ck_assert_ptr_nonnull(session);
  uint64_t handles[N];
  ttd_handle_map seen = {0};
  int small = 0;
  for (int i = 0; i < N; i++) {
    handles[i] = add_new(session, 1, 0, TTD_MEM_DRAM);
    ck_assert_int_eq(ttd_handle_map_put(&seen, handles[i], (void *)1), 0); /* distinct */
    if (handles[i] < (1ull << 32)) small++;
  }
  ck_assert_int_le(small, 2); /* sequential or small handles would be guessable */
  int consecutive = 0;
  for (int i = 1; i < N; i++) consecutive += handles[i] == handles[i - 1] + 1;
  ck_assert_int_eq(consecutive, 0);
  ck_assert_uint_eq(session->tensors.count, N);
  ck_assert_uint_eq(session->tensor_bytes, N * 4);
  ttd_handle_map_clear(&seen);
  ttd_session_release(session);
  ck_assert_uint_eq(used_total(), 0);
}
END_TEST

/* The session takes its own reference on add; lookup returns the same tensor with a new one. */
START_TEST(test_lookup_retains) {
  ttd_session *session = ttd_session_create(1, &(ttd_session_params){.client_name = "t"}, 0);
  ttd_tensor *t = new_tensor(10, 0, TTD_MEM_L1);
  uint64_t h;
  ck_assert_ptr_null(ttd_session_tensor_add(session, t, &h));
  ck_assert_int_eq(tensor_refs(t), 2);
  ttd_tensor_release(t);
  ck_assert_int_eq(tensor_refs(t), 1);

  ttd_tensor *a = NULL, *b = NULL;
  ck_assert_ptr_null(ttd_session_tensor_lookup(session, h, &a));
  ck_assert_ptr_eq(a, t);
  ck_assert_int_eq(tensor_refs(t), 2);
  ck_assert_ptr_null(ttd_session_tensor_lookup(session, h, &b));
  ck_assert_ptr_eq(b, t);
  ck_assert_int_eq(tensor_refs(t), 3);
  ck_assert_int_eq(a->spec.nbytes, 40);
  ck_assert_int_eq(a->spec.location, TTD_MEM_L1);
  ttd_tensor_release(a);
  ttd_tensor_release(b);
  ck_assert_int_eq(tensor_refs(t), 1);
  ttd_session_release(session);
  ck_assert_uint_eq(used_total(), 0);
}
END_TEST

/* Unknown, zero and freed handles are all NOT_FOUND with messages identical but for the handle. */
START_TEST(test_lookup_unknown_uniform) {
  ttd_session *session = ttd_session_create(1, &(ttd_session_params){.client_name = "t"}, 0);
  uint64_t h = add_new(session, 4, 0, TTD_MEM_DRAM);
  uint64_t keep = add_new(session, 4, 0, TTD_MEM_DRAM);
  uint64_t out_t, out_b;
  ck_assert_ptr_null(ttd_session_tensors_free(session, &h, 1, &out_t, &out_b));

  char freed[512], never[512], zero[512], small[512];
  expect_not_found(session, h, freed, sizeof(freed));
  uint64_t never_issued = h ^ 0x5a5a5a5a00000000ull;
  if (never_issued == keep) never_issued ^= 1;
  expect_not_found(session, never_issued, never, sizeof(never));
  expect_not_found(session, 0, zero, sizeof(zero));
  expect_not_found(session, 0x1f, small, sizeof(small));
  ck_assert_str_eq(freed, never);
  ck_assert_str_eq(freed, zero);
  ck_assert_str_eq(freed, small);
  ck_assert_ptr_nonnull(strstr(freed, "<H>")); /* the message does name the handle */
  ck_assert_str_eq(ttd_code_name(GRPC_STATUS_NOT_FOUND), "NOT_FOUND");
  ttd_session_release(session);
}
END_TEST

/* ttd_session_handle_not_found is the same message lookup gives. */
START_TEST(test_handle_not_found_message) {
  ttd_session *session = ttd_session_create(1, &(ttd_session_params){.client_name = "t"}, 0);
  char direct[512], looked_up[512];
  ttd_status_t s = ttd_session_handle_not_found(0xabcdef);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_NOT_FOUND);
  message_without_handle(s, 0xabcdef, direct, sizeof(direct));
  expect_not_found(session, 0x1234567890ull, looked_up, sizeof(looked_up));
  ck_assert_str_eq(direct, looked_up);
  ttd_session_release(session);
}
END_TEST

/* A handle of session A is NOT_FOUND in session B, and B cannot free it. */
START_TEST(test_foreign_handle) {
  ttd_session *a = ttd_session_create(1, &(ttd_session_params){.client_name = "a"}, 0);
  ttd_session *b = ttd_session_create(2, &(ttd_session_params){.client_name = "b"}, 0);
  uint64_t ha = add_new(a, 8, 0, TTD_MEM_DRAM);
  uint64_t hb = add_new(b, 8, 1, TTD_MEM_DRAM);
  char foreign[512], never[512];
  expect_not_found(b, ha, foreign, sizeof(foreign));
  expect_not_found(b, ha ^ hb ^ 0x10000, never, sizeof(never));
  ck_assert_str_eq(foreign, never);
  uint64_t out_t = 9, out_b = 9;
  ttd_status_t s = ttd_session_tensors_free(b, &ha, 1, &out_t, &out_b);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_NOT_FOUND);
  ttd_status_free(s);
  ck_assert_uint_eq(out_t, 0);
  ck_assert_uint_eq(out_b, 0);
  ttd_tensor *t = NULL;
  ck_assert_ptr_null(ttd_session_tensor_lookup(a, ha, &t)); /* still there in A */
  ttd_tensor_release(t);
  ttd_session_release(a);
  ttd_session_release(b);
  ck_assert_uint_eq(used_total(), 0);
}
END_TEST

/* Free is all or nothing: one unknown handle in the list frees none of them. */
START_TEST(test_free_all_or_nothing) {
  ttd_session *session = ttd_session_create(1, &(ttd_session_params){.client_name = "t"}, 0);
  uint64_t h1 = add_new(session, 10, 0, TTD_MEM_DRAM);
  uint64_t h2 = add_new(session, 20, 0, TTD_MEM_L1);
  uint64_t h3 = add_new(session, 30, 1, TTD_MEM_DRAM);
  uint64_t unknown = h1 ^ h2 ^ h3 ^ 1;
  uint64_t list[] = {h1, unknown, h2};
  uint64_t out_t = 7, out_b = 7;
  ttd_status_t s = ttd_session_tensors_free(session, list, 3, &out_t, &out_b);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_NOT_FOUND);
  char want[24];
  snprintf(want, sizeof(want), "%016" PRIx64, unknown);
  ck_assert_ptr_nonnull(strstr(ttd_status_message(s), want)); /* names the unknown one */
  ttd_status_free(s);
  ck_assert_uint_eq(out_t, 0);
  ck_assert_uint_eq(out_b, 0);
  ck_assert_uint_eq(session->tensors.count, 3);
  ck_assert_uint_eq(session->tensor_bytes, 240);
  ck_assert_uint_eq(used(0, TTD_MEM_DRAM), 40);
  ck_assert_uint_eq(used(0, TTD_MEM_L1), 80);
  ck_assert_uint_eq(used(1, TTD_MEM_DRAM), 120);
  /* The unknown handle last: still nothing freed. */
  uint64_t list2[] = {h1, h2, h3, unknown};
  s = ttd_session_tensors_free(session, list2, 4, &out_t, &out_b);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_NOT_FOUND);
  ttd_status_free(s);
  ck_assert_uint_eq(session->tensors.count, 3);
  ck_assert_uint_eq(used_total(), 240);
  ttd_session_release(session);
}
END_TEST

/* A successful free returns tensors and bytes freed and gives the device memory back. */
START_TEST(test_free_counts) {
  ttd_session *session = ttd_session_create(1, &(ttd_session_params){.client_name = "t"}, 0);
  uint64_t h1 = add_new(session, 10, 0, TTD_MEM_DRAM);
  uint64_t h2 = add_new(session, 20, 0, TTD_MEM_L1);
  uint64_t h3 = add_new(session, 30, 1, TTD_MEM_DRAM);
  uint64_t h4 = add_new(session, 0, 1, TTD_MEM_L1); /* 0 bytes, still a tensor */
  uint64_t list[] = {h3, h1, h4};
  uint64_t out_t = 0, out_b = 0;
  ck_assert_ptr_null(ttd_session_tensors_free(session, list, 3, &out_t, &out_b));
  ck_assert_uint_eq(out_t, 3);
  ck_assert_uint_eq(out_b, 160);
  ck_assert_uint_eq(session->tensors.count, 1);
  ck_assert_uint_eq(session->tensor_bytes, 80);
  ck_assert_uint_eq(used(0, TTD_MEM_DRAM), 0);
  ck_assert_uint_eq(used(1, TTD_MEM_DRAM), 0);
  ck_assert_uint_eq(used(0, TTD_MEM_L1), 80);
  ttd_tensor *t = NULL;
  ck_assert_ptr_null(ttd_session_tensor_lookup(session, h2, &t));
  ttd_tensor_release(t);
  char m[512];
  expect_not_found(session, h1, m, sizeof(m));
  ck_assert_ptr_null(ttd_session_tensors_free(session, &h2, 1, &out_t, &out_b));
  ck_assert_uint_eq(out_t, 1);
  ck_assert_uint_eq(out_b, 80);
  ck_assert_uint_eq(session->tensor_bytes, 0);
  ck_assert_uint_eq(used_total(), 0);
  ttd_session_release(session);
}
END_TEST

/* An empty list and a list naming a handle twice are INVALID_ARGUMENT and free nothing. */
START_TEST(test_free_empty_and_duplicates) {
  ttd_session *session = ttd_session_create(1, &(ttd_session_params){.client_name = "t"}, 0);
  uint64_t h1 = add_new(session, 10, 0, TTD_MEM_DRAM);
  uint64_t h2 = add_new(session, 10, 0, TTD_MEM_DRAM);
  uint64_t out_t = 5, out_b = 5;
  ttd_status_t s = ttd_session_tensors_free(session, &h1, 0, &out_t, &out_b);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_INVALID_ARGUMENT);
  ttd_status_free(s);
  ck_assert_uint_eq(out_t, 0);
  ck_assert_uint_eq(out_b, 0);
  uint64_t dup[] = {h1, h2, h1};
  s = ttd_session_tensors_free(session, dup, 3, &out_t, &out_b);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_INVALID_ARGUMENT);
  ttd_status_free(s);
  uint64_t dup2[] = {h2, h2};
  s = ttd_session_tensors_free(session, dup2, 2, &out_t, &out_b);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_INVALID_ARGUMENT);
  ttd_status_free(s);
  ck_assert_uint_eq(out_t, 0);
  ck_assert_uint_eq(session->tensors.count, 2);
  ck_assert_uint_eq(used(0, TTD_MEM_DRAM), 80);
  ttd_session_release(session);
}
END_TEST

/* Closing a session frees all its device memory, reports counts, and is idempotent. */
START_TEST(test_close_frees_memory) {
  ttd_session *session = ttd_session_create(1, &(ttd_session_params){.client_name = "t"}, 0);
  add_new(session, 100, 0, TTD_MEM_DRAM);
  add_new(session, 200, 0, TTD_MEM_L1);
  add_new(session, 300, 1, TTD_MEM_DRAM);
  add_new(session, 400, 1, TTD_MEM_L1);
  ck_assert_uint_eq(used_total(), 4000);
  uint64_t out_t = 0, out_b = 0;
  ttd_session_close(session, &out_t, &out_b);
  ck_assert_uint_eq(out_t, 4);
  ck_assert_uint_eq(out_b, 4000);
  ck_assert(session->closed);
  ck_assert_uint_eq(used_total(), 0);
  ck_assert_uint_eq(session->tensor_bytes, 0);
  ttd_session_close(session, &out_t, &out_b);
  ck_assert_uint_eq(out_t, 0);
  ck_assert_uint_eq(out_b, 0);
  ttd_session_close(session, NULL, NULL);
  ttd_session_release(session);
}
END_TEST

/* A closed session refuses tensor_add with FAILED_PRECONDITION and takes no reference. */
START_TEST(test_closed_refuses_add) {
  ttd_session *session = ttd_session_create(0xfeed, &(ttd_session_params){.client_name = "t"}, 0);
  uint64_t old = add_new(session, 1, 0, TTD_MEM_DRAM);
  ttd_session_close(session, NULL, NULL);
  ttd_tensor *t = new_tensor(5, 0, TTD_MEM_DRAM);
  uint64_t h = 99;
  ttd_status_t s = ttd_session_tensor_add(session, t, &h);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_FAILED_PRECONDITION);
  ttd_status_free(s);
  ck_assert_uint_eq(h, 0);
  ck_assert_int_eq(tensor_refs(t), 1);
  char m[512];
  expect_not_found(session, old, m, sizeof(m));
  ttd_tensor_release(t);
  ck_assert_uint_eq(used_total(), 0);
  ttd_session_release(session);
}
END_TEST

/* Streams registered with a session (a Download or Upload that may stall on its client)
 * are each cancelled once when it closes; a removed one is not; a closed session takes
 * none. */
typedef struct counted_stream {
  ttd_session_stream link;
  int cancels;
} counted_stream;

static void count_cancel(ttd_session_stream *stream) { ((counted_stream *)stream)->cancels++; }

START_TEST(test_close_cancels_streams) {
  ttd_session *session = ttd_session_create(7, &(ttd_session_params){.client_name = "t"}, 0);
  counted_stream streams[3] = {{.link.cancel = count_cancel}, {.link.cancel = count_cancel},
                               {.link.cancel = count_cancel}};
  for (int i = 0; i < 3; i++) ck_assert(ttd_session_stream_add(session, &streams[i].link));
  ttd_session_stream_remove(session, &streams[1].link); /* ended before the close */
  ck_assert_ptr_null(streams[1].link.cancel);
  ttd_session_close(session, NULL, NULL);
  ttd_session_close(session, NULL, NULL); /* idempotent: nothing cancelled twice */
  ck_assert_int_eq(streams[0].cancels, 1);
  ck_assert_int_eq(streams[1].cancels, 0);
  ck_assert_int_eq(streams[2].cancels, 1);
  for (int i = 0; i < 3; i++) ttd_session_stream_remove(session, &streams[i].link);
  counted_stream late = {.link.cancel = count_cancel};
  ck_assert(!ttd_session_stream_add(session, &late.link));
  ck_assert_int_eq(late.cancels, 0);
  ttd_session_release(session);
}
END_TEST

/* A tensor referenced elsewhere keeps its memory after free or close until released. */
START_TEST(test_refcount_keeps_memory) {
  ttd_session *session = ttd_session_create(1, &(ttd_session_params){.client_name = "t"}, 0);
  uint64_t h = add_new(session, 256, 0, TTD_MEM_DRAM);
  ttd_tensor *held = NULL;
  ck_assert_ptr_null(ttd_session_tensor_lookup(session, h, &held)); /* an in-flight call's reference */
  uint64_t out_t, out_b;
  ck_assert_ptr_null(ttd_session_tensors_free(session, &h, 1, &out_t, &out_b));
  ck_assert_uint_eq(out_b, 1024);
  ck_assert_uint_eq(used(0, TTD_MEM_DRAM), 1024); /* still held */
  ck_assert_int_eq(tensor_refs(held), 1);
  unsigned char data[16] = {1, 2, 3};
  ck_assert_ptr_null(backend->vtable->buffer_write(backend, held->buffer, 0, data, sizeof(data)));
  ttd_tensor_release(held);
  ck_assert_uint_eq(used(0, TTD_MEM_DRAM), 0);

  /* The same through close. */
  h = add_new(session, 100, 1, TTD_MEM_L1);
  ck_assert_ptr_null(ttd_session_tensor_lookup(session, h, &held));
  ttd_session_close(session, &out_t, &out_b);
  ck_assert_uint_eq(out_t, 1);
  ck_assert_uint_eq(out_b, 0); /* freed now: nothing, the call still holds it */
  ck_assert_uint_eq(used(1, TTD_MEM_L1), 400);
  ck_assert_uint_eq(session->quota->used, 400);
  ttd_tensor_release(held);
  ck_assert_uint_eq(used(1, TTD_MEM_L1), 0);
  ck_assert_uint_eq(session->quota->used, 0); /* refunded by the last reference */
  ttd_session_release(session);
}
END_TEST

/* Releasing the last session reference closes it and frees its tensors. */
START_TEST(test_release_last_reference) {
  ttd_session *session = ttd_session_create(1, &(ttd_session_params){.client_name = "t"}, 0);
  ck_assert_ptr_eq(ttd_session_retain(session), session);
  add_new(session, 50, 0, TTD_MEM_DRAM);
  ttd_session_release(session);
  ck_assert_uint_eq(used_total(), 200); /* one reference left */
  ck_assert(!session->closed);
  ttd_session_release(session);
  ck_assert_uint_eq(used_total(), 0);
  ttd_session_release(NULL);
}
END_TEST

/* A session keeps its id, client name (truncated safely) and times; touch moves last_seen. */
START_TEST(test_session_fields_and_touch) {
  char long_name[200];
  memset(long_name, 'n', sizeof(long_name) - 1);
  long_name[sizeof(long_name) - 1] = '\0';
  ttd_session *s = ttd_session_create(77, &(ttd_session_params){.client_name = long_name}, 1000);
  ck_assert_uint_eq(s->id, 77);
  ck_assert_uint_eq(strlen(s->client_name), sizeof(s->client_name) - 1);
  ck_assert_int_eq(s->opened_ms, 1000);
  ck_assert_int_eq(last_seen(s), 1000);
  ttd_session_touch(s, 2500);
  ck_assert_int_eq(last_seen(s), 2500);
  ck_assert_int_eq(s->opened_ms, 1000);
  ttd_session_release(s);
  s = ttd_session_create(78, &(ttd_session_params){.client_name = NULL}, 0);
  ck_assert_str_eq(s->client_name, "");
  ttd_session_release(s);
}
END_TEST

/* ---- session table ---- */

/* open gives distinct nonzero ids; lookup returns the session (a reference) and touches it;
 * close removes it, after which lookup is NOT_FOUND naming the id. */
START_TEST(test_table_open_lookup_close) {
  ttd_session_table table;
  ttd_session_table_init(&table, 1000);
  ttd_session *a = NULL, *b = NULL;
  ck_assert_ptr_null(ttd_session_table_open(&table, &(ttd_session_params){.client_name = "alpha"}, 10, &a));
  ck_assert_ptr_null(ttd_session_table_open(&table, &(ttd_session_params){.client_name = "beta"}, 20, &b));
  ck_assert_ptr_nonnull(a);
  ck_assert_uint_ne(a->id, 0);
  ck_assert_uint_ne(a->id, b->id);
  ck_assert_str_eq(a->client_name, "alpha");
  ck_assert_uint_eq(ttd_session_table_count(&table), 2);

  ttd_session *found = NULL;
  ck_assert_ptr_null(ttd_session_table_lookup(&table, a->id, NULL, 500, &found));
  ck_assert_ptr_eq(found, a);
  ck_assert_int_eq(last_seen(a), 500);
  ck_assert_int_eq(session_refs(a), 3); /* table + ours + lookup's */
  ttd_session_release(found);

  add_new(a, 25, 0, TTD_MEM_DRAM);
  uint64_t out_t = 0, out_b = 0;
  uint64_t a_id = a->id;
  ttd_session_table_close(&table, a, &out_t, &out_b);
  ck_assert_uint_eq(out_t, 1);
  ck_assert_uint_eq(out_b, 100);
  ck_assert(a->closed);
  ck_assert_uint_eq(used_total(), 0);
  ck_assert_uint_eq(ttd_session_table_count(&table), 1);
  ck_assert_int_eq(session_refs(a), 1); /* only ours is left */

  found = (ttd_session *)&found;
  ttd_status_t s = ttd_session_table_lookup(&table, a_id, NULL, 600, &found);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_NOT_FOUND);
  ck_assert_ptr_null(found);
  char id_hex[24];
  snprintf(id_hex, sizeof(id_hex), "%016" PRIx64, a_id);
  ck_assert_ptr_nonnull(strstr(ttd_status_message(s), id_hex));
  ttd_status_free(s);
  s = ttd_session_table_lookup(&table, 0, NULL, 600, &found);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_NOT_FOUND);
  ttd_status_free(s);

  /* Closing an already closed session again is harmless. */
  ttd_session_table_close(&table, a, &out_t, &out_b);
  ck_assert_uint_eq(out_t, 0);
  ck_assert_uint_eq(ttd_session_table_count(&table), 1);

  ttd_session_release(a);
  ttd_session_release(b);
  ttd_session_table_destroy(&table);
}
END_TEST

/* sweep closes exactly the sessions idle for longer than the lease, freeing their tensors. */
START_TEST(test_table_sweep) {
  ttd_session_table table;
  ttd_session_table_init(&table, 1000);
  ttd_session *a, *b, *c;
  ck_assert_ptr_null(ttd_session_table_open(&table, &(ttd_session_params){.client_name = "a"}, 0, &a));
  ck_assert_ptr_null(ttd_session_table_open(&table, &(ttd_session_params){.client_name = "b"}, 0, &b));
  ck_assert_ptr_null(ttd_session_table_open(&table, &(ttd_session_params){.client_name = "c"}, 500, &c));
  add_new(b, 10, 0, TTD_MEM_DRAM);
  add_new(c, 20, 1, TTD_MEM_L1);
  ttd_session *found;
  ck_assert_ptr_null(ttd_session_table_lookup(&table, a->id, NULL, 800, &found)); /* a call touches a */
  ttd_session_release(found);

  ck_assert_uint_eq(ttd_session_table_sweep(&table, 999), 0);
  ck_assert_uint_eq(ttd_session_table_sweep(&table, 1000), 0); /* idle exactly the lease: kept */
  ck_assert_uint_eq(ttd_session_table_count(&table), 3);
  ck_assert_uint_eq(ttd_session_table_sweep(&table, 1001), 1); /* b only */
  ck_assert(b->closed);
  ck_assert(!a->closed);
  ck_assert(!c->closed);
  ck_assert_uint_eq(used(0, TTD_MEM_DRAM), 0);
  ck_assert_uint_eq(used(1, TTD_MEM_L1), 80);
  ck_assert_uint_eq(ttd_session_table_count(&table), 2);
  ttd_status_t s = ttd_session_table_lookup(&table, b->id, NULL, 1001, &found);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_NOT_FOUND);
  ttd_status_free(s);

  ck_assert_uint_eq(ttd_session_table_sweep(&table, 1500), 0);
  ck_assert_uint_eq(ttd_session_table_sweep(&table, 1501), 1); /* c */
  ck_assert(c->closed);
  ck_assert_uint_eq(used_total(), 0);
  ck_assert_uint_eq(ttd_session_table_sweep(&table, 1800), 0);
  ck_assert_uint_eq(ttd_session_table_sweep(&table, 1801), 1); /* a, last touched at 800 */
  ck_assert_uint_eq(ttd_session_table_count(&table), 0);
  ck_assert_uint_eq(ttd_session_table_sweep(&table, 100000), 0);

  /* A session closed by sweep can still be "closed" by its owner without harm. */
  uint64_t out_t = 5, out_b = 5;
  ttd_session_table_close(&table, b, &out_t, &out_b);
  ck_assert_uint_eq(out_t, 0);
  ck_assert_uint_eq(out_b, 0);
  ttd_session_release(a);
  ttd_session_release(b);
  ttd_session_release(c);
  ttd_session_table_destroy(&table);
}
END_TEST

/* sweep closes several expired sessions in one pass. */
START_TEST(test_table_sweep_many) {
  ttd_session_table table;
  ttd_session_table_init(&table, 100);
  for (int i = 0; i < 50; i++) {
    ttd_session *s;
    ck_assert_ptr_null(ttd_session_table_open(&table, &(ttd_session_params){.client_name = "x"}, i % 2 ? 0 : 1000, &s));
    add_new(s, 1, i % 2, TTD_MEM_DRAM);
    ttd_session_release(s);
  }
  ck_assert_uint_eq(ttd_session_table_sweep(&table, 1050), 25);
  ck_assert_uint_eq(ttd_session_table_count(&table), 25);
  ck_assert_uint_eq(used(1, TTD_MEM_DRAM), 0);
  ck_assert_uint_eq(used(0, TTD_MEM_DRAM), 100);
  ttd_session_table_destroy(&table);
  ck_assert_uint_eq(used_total(), 0);
}
END_TEST

/* 5000 expired sessions: each sweep closes at most TTD_SWEEP_MAX_CLOSE of them (bounded work
 * per call, the event loop runs between), and repeated sweeps close them all, the live ones
 * kept. */
START_TEST(test_table_sweep_bounded_per_call) {
  ttd_session_table table;
  ttd_session_table_init(&table, 100);
  for (int i = 0; i < 5010; i++) {
    ttd_session *s;
    ck_assert_ptr_null(ttd_session_table_open(&table, &(ttd_session_params){.client_name = "x"}, i < 10 ? 1000 : 0, &s));
    ttd_session_release(s);
  }
  size_t total = 0, calls = 0, closed;
  do {
    closed = ttd_session_table_sweep(&table, 1050);
    ck_assert_uint_le(closed, TTD_SWEEP_MAX_CLOSE);
    total += closed;
    calls++;
  } while (closed == TTD_SWEEP_MAX_CLOSE);
  ck_assert_uint_eq(total, 5000);
  ck_assert_uint_eq(calls, 5000 / TTD_SWEEP_MAX_CLOSE + 1);
  ck_assert_uint_eq(ttd_session_table_count(&table), 10);
  ttd_session_table_destroy(&table);
}
END_TEST

/* A tenant holds at most max_tenant_sessions open at once: the next is RESOURCE_EXHAUSTED
 * naming it and the limit; other tenants are not counted; closing one makes room. */
START_TEST(test_table_sessions_per_tenant) {
  ttd_session_table table;
  ttd_session_table_init(&table, 1000);
  ttd_session_params alice = {.client_name = "x", .tenant = "alice", .max_tenant_sessions = 3};
  ttd_session_params bob = {.client_name = "x", .tenant = "bob", .max_tenant_sessions = 3};
  ttd_session *s[3], *extra = NULL, *b;
  for (int i = 0; i < 3; i++) ck_assert_ptr_null(ttd_session_table_open(&table, &alice, 0, &s[i]));
  ck_assert_ptr_null(ttd_session_table_open(&table, &bob, 0, &b));
  ttd_status_t st = ttd_session_table_open(&table, &alice, 0, &extra);
  ck_assert_int_eq(ttd_status_code(st), GRPC_STATUS_RESOURCE_EXHAUSTED);
  ck_assert_ptr_nonnull(strstr(ttd_status_message(st), "tenant alice holds 3 open sessions, its limit"));
  ck_assert_ptr_null(extra);
  ttd_status_free(st);
  ck_assert_uint_eq(ttd_session_table_count(&table), 4);
  ttd_session_table_close(&table, s[0], NULL, NULL);
  ck_assert_ptr_null(ttd_session_table_open(&table, &alice, 0, &extra));
  for (int i = 0; i < 3; i++) ttd_session_release(s[i]);
  ttd_session_release(extra);
  ttd_session_release(b);
  ttd_session_table_destroy(&table);
}
END_TEST

/* A sealed 4 KiB memfd mapped as a segment; the status of the map. */
static ttd_status_t map_one(ttd_shm_segment **out) {
  int fd = memfd_create("ttd-limit-test", MFD_ALLOW_SEALING);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(ftruncate(fd, 4096), 0);
  ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  ttd_status_t s = ttd_shm_segment_map(fd, 4096, out);
  close(fd);
  return s;
}

/* The process maps at most ttd_shm_segment_limit() segments: past it RESOURCE_EXHAUSTED
 * naming the limit and vm.max_map_count; releasing one makes room; the default is set from
 * the kernel's map count. */
START_TEST(test_shm_segments_bounded) {
  uint64_t base = ttd_shm_segments_mapped();
  ttd_shm_segment_set_limit(base + 2);
  ttd_shm_segment *a = NULL, *b = NULL, *c = NULL;
  ck_assert_ptr_null(map_one(&a));
  ck_assert_ptr_null(map_one(&b));
  ck_assert_uint_eq(ttd_shm_segments_mapped(), base + 2);
  ttd_status_t s = map_one(&c);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_RESOURCE_EXHAUSTED);
  ck_assert_ptr_nonnull(strstr(ttd_status_message(s), "vm.max_map_count"));
  ck_assert_ptr_null(c);
  ttd_status_free(s);
  ttd_shm_segment_release(a);
  ck_assert_ptr_null(map_one(&c));
  ttd_shm_segment_release(b);
  ttd_shm_segment_release(c);
  ck_assert_uint_eq(ttd_shm_segments_mapped(), base);
  ttd_shm_segment_set_limit(0);
  ck_assert_uint_ge(ttd_shm_segment_limit(), 1024);
}
END_TEST

/* Adds a fresh 4 KiB segment to session as uid 1000; the status (the segment is released
 * when refused). */
static ttd_status_t add_segment(ttd_session *session) {
  ttd_shm_segment *seg = NULL;
  ck_assert_ptr_null(map_one(&seg));
  uint64_t id;
  ttd_status_t st = ttd_session_segment_add(session, seg, 1000, &id);
  if (st) ttd_shm_segment_release(seg);
  return st;
}

/* One tenant's sessions hold at most ttd_shm_segment_tenant_limit() segments together (with
 * a daemon limit of 8, 2): alice's third, in her second session, is RESOURCE_EXHAUSTED naming
 * her and the bound, while bob still registers; a release and a closed session give alice
 * room again. */
START_TEST(test_shm_segments_per_tenant) {
  ck_assert_uint_eq(ttd_shm_segments_mapped(), 0);
  ttd_shm_segment_set_limit(8);
  ck_assert_uint_eq(ttd_shm_segment_tenant_limit(), 2);
  ttd_session_table table;
  ttd_session_table_init(&table, 1000);
  ttd_quota *alice_q = ttd_quota_create_tenant(0, "alice"), *bob_q = ttd_quota_create_tenant(0, "bob");
  ttd_session_params alice = {.client_name = "x", .tenant = "alice", .tenant_quota = alice_q};
  ttd_session_params bob = {.client_name = "x", .tenant = "bob", .tenant_quota = bob_q};
  ttd_session *a1, *a2, *b;
  ck_assert_ptr_null(ttd_session_table_open(&table, &alice, 0, &a1));
  ck_assert_ptr_null(ttd_session_table_open(&table, &alice, 0, &a2));
  ck_assert_ptr_null(ttd_session_table_open(&table, &bob, 0, &b));
  ck_assert_ptr_null(add_segment(a1));
  ck_assert_ptr_null(add_segment(a2));
  ttd_status_t st = add_segment(a2);
  ck_assert_int_eq(ttd_status_code(st), GRPC_STATUS_RESOURCE_EXHAUSTED);
  ck_assert_msg(strstr(ttd_status_message(st), "tenant alice holds 2 shared-memory segments over its sessions, its "
                                              "bound (a quarter of the daemon's 8)") != NULL,
                "%s", ttd_status_message(st));
  ttd_status_free(st);
  ck_assert_uint_eq(atomic_load(&alice_q->shm_segments), 2);
  ck_assert_uint_eq(a2->segments.count, 1);
  ck_assert_ptr_null(add_segment(b));
  ck_assert_ptr_null(add_segment(b));
  uint64_t id = 0;
  for (size_t i = 0; i < a2->segments.capacity && !id; i++) id = a2->segments.keys[i];
  ck_assert_ptr_null(ttd_session_segment_remove(a2, id, 1000));
  ck_assert_ptr_null(add_segment(a2));
  ttd_session_table_close(&table, a1, NULL, NULL);
  ck_assert_uint_eq(atomic_load(&alice_q->shm_segments), 1);
  ck_assert_ptr_null(add_segment(a2));
  ttd_session_release(a1);
  ttd_session_release(a2);
  ttd_session_release(b);
  ttd_session_table_destroy(&table);
  ck_assert_uint_eq(atomic_load(&alice_q->shm_segments), 0);
  ck_assert_uint_eq(atomic_load(&bob_q->shm_segments), 0);
  ck_assert_uint_eq(ttd_shm_segments_mapped(), 0);
  ttd_quota_release(alice_q);
  ttd_quota_release(bob_q);
  ttd_shm_segment_set_limit(0);
}
END_TEST

/* A session a reload revoked: its tenant's next call by id is NOT_FOUND saying its token was
 * revoked at a reload, not that an admin killed it. */
START_TEST(test_table_revoked_session_says_so) {
  ttd_session_table table;
  ttd_session_table_init(&table, 1000);
  ttd_session *s;
  ck_assert_ptr_null(ttd_session_table_open(&table, &(ttd_session_params){.client_name = "x", .tenant = "bob"}, 0, &s));
  uint64_t id = s->id;
  ttd_session_table_revoke(&table, s, NULL, NULL);
  ck_assert(s->closed);
  ttd_session_release(s);
  ttd_session *found = NULL;
  ttd_status_t st = ttd_session_table_lookup(&table, id, "bob", 0, &found);
  ck_assert_int_eq(ttd_status_code(st), GRPC_STATUS_NOT_FOUND);
  ck_assert_msg(strstr(ttd_status_message(st), "the token it was opened with was revoked at a reload") != NULL, "%s",
                ttd_status_message(st));
  ck_assert_ptr_null(strstr(ttd_status_message(st), "admin tenant"));
  ck_assert_ptr_null(found);
  ttd_status_free(st);
  ttd_session_table_destroy(&table);
}
END_TEST

/* Which sessions a reload's tokens keep: one opened with a token stays while its tenant has
 * that very token and goes once the tenant has another (or is gone); one with no token
 * recorded needs only its tenant listed; a principal checked before the swap is rechecked
 * the same way, UNAUTHENTICATED once its token is gone. */
START_TEST(test_auth_admits_sessions_by_token) {
  char old_tok[] = "ttd_old", new_tok[] = "ttd_new", line[256];
  char old_digest[80], new_digest[80];
  ttd_token_digest_text(old_tok, strlen(old_tok), old_digest, sizeof(old_digest));
  ttd_token_digest_text(new_tok, strlen(new_tok), new_digest, sizeof(new_digest));
  ttd_tokens *before = NULL, *rotated = NULL;
  snprintf(line, sizeof(line), "alice %s\n", old_digest);
  ck_assert_ptr_null(ttd_tokens_parse(line, "before", &before));
  snprintf(line, sizeof(line), "alice %s\n", new_digest);
  ck_assert_ptr_null(ttd_tokens_parse(line, "rotated", &rotated));
  ttd_auth auth;
  ttd_auth_init(&auth, ttd_tokens_retain(before), 0, 16);
  ttd_principal p;
  char bearer[64];
  snprintf(bearer, sizeof(bearer), "Bearer %s", old_tok);
  ck_assert_ptr_null(ttd_auth_check(&auth, bearer, strlen(bearer), &p));
  ck_assert(p.by_token);
  ttd_session *by_old =
      ttd_session_create(1, &(ttd_session_params){.tenant = "alice", .token_digest = p.token_digest}, 0);
  ttd_session *untold = ttd_session_create(2, &(ttd_session_params){.tenant = "alice"}, 0);
  ck_assert(ttd_auth_admits_session(before, by_old));
  ck_assert(ttd_auth_admits_session(before, untold));

  ttd_auth_replace(&auth, ttd_tokens_retain(rotated), 0, 16);
  ck_assert(!ttd_auth_admits_session(rotated, by_old));
  ck_assert(ttd_auth_admits_session(rotated, untold));
  ck_assert(!ttd_auth_admits_session(NULL, untold)); /* without tokens only "local" stays */
  ttd_status_t st = ttd_auth_recheck(&auth, &p);
  ck_assert_int_eq(ttd_status_code(st), GRPC_STATUS_UNAUTHENTICATED);
  ck_assert_msg(strstr(ttd_status_message(st), "the token is not valid for this ttd (unknown or revoked)"), "%s",
                ttd_status_message(st));
  ttd_status_free(st);
  /* Resumed with the new token, the session is the new token's. */
  const ttd_tenant *alice = ttd_tokens_find(rotated, "alice");
  ttd_session_set_token(by_old, alice->digest);
  ck_assert(ttd_auth_admits_session(rotated, by_old));
  ck_assert(!ttd_auth_admits_session(before, by_old));

  ttd_session_release(by_old);
  ttd_session_release(untold);
  ttd_tokens_release(before);
  ttd_tokens_release(rotated);
  ttd_auth_destroy(&auth);
}
END_TEST

/* destroy closes every session and frees their tensors, even ones the caller still holds. */
START_TEST(test_table_destroy_closes_all) {
  ttd_session_table table;
  ttd_session_table_init(&table, 1000);
  ttd_session *a, *b;
  ck_assert_ptr_null(ttd_session_table_open(&table, &(ttd_session_params){.client_name = "a"}, 0, &a));
  ck_assert_ptr_null(ttd_session_table_open(&table, &(ttd_session_params){.client_name = "b"}, 0, &b));
  add_new(a, 10, 0, TTD_MEM_DRAM);
  add_new(b, 10, 1, TTD_MEM_L1);
  ttd_session_release(b);
  ttd_session_table_destroy(&table);
  ck_assert(a->closed);
  ck_assert_uint_eq(used_total(), 0);
  ttd_session_release(a);
}
END_TEST

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
  ttd_status_t s = ttd_tensor_create(backend, NULL, &spec, &t);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_RESOURCE_EXHAUSTED);
  ck_assert_ptr_nonnull(strstr(ttd_status_message(s), "tt:1"));
  ttd_status_free(s);
  ck_assert_ptr_null(t);
  ck_assert_uint_eq(used_total(), 0);
}
END_TEST

/* A tensor keeps its spec and backend; create_zeroed shows no old device data. */
START_TEST(test_tensor_create_zeroed) {
  enum { N = 4096 };
  ttd_tensor_spec spec;
  ck_assert_ptr_null(finish(TTD_DTYPE_INT32, 2, (int64_t[]){32, 32}, &spec));
  spec.location = TTD_MEM_DRAM;
  static unsigned char junk[N], out[N], zeros[N];
  memset(junk, 0xA7, N);
  for (int round = 0; round < 4; round++) {
    ttd_tensor *dirty = NULL;
    ck_assert_ptr_null(ttd_tensor_create(backend, NULL, &spec, &dirty));
    ck_assert_ptr_null(backend->vtable->buffer_write(backend, dirty->buffer, 0, junk, N));
    ttd_tensor_release(dirty);
    ttd_tensor *clean = NULL;
    ck_assert_ptr_null(ttd_tensor_create_zeroed(backend, NULL, &spec, &clean));
    ck_assert_ptr_eq(clean->backend, backend);
    ck_assert_int_eq(clean->spec.ndim, 2);
    ck_assert_int_eq(clean->spec.shape[1], 32);
    ck_assert_uint_eq(clean->spec.nbytes, N);
    ck_assert_int_eq(tensor_refs(clean), 1);
    memset(out, 0xFF, N);
    ck_assert_ptr_null(backend->vtable->buffer_read(backend, clean->buffer, 0, out, N));
    ck_assert_mem_eq(out, zeros, N);
    ttd_tensor_release(clean);
  }
  ck_assert_uint_eq(used_total(), 0);
}
END_TEST

/* retain/release count references; the last release frees device memory; NULL is accepted. */
START_TEST(test_tensor_retain_release) {
  ttd_tensor *t = new_tensor(64, 0, TTD_MEM_L1);
  ck_assert_ptr_eq(ttd_tensor_retain(t), t);
  ck_assert_ptr_eq(ttd_tensor_retain(t), t);
  ck_assert_int_eq(tensor_refs(t), 3);
  ttd_tensor_release(t);
  ttd_tensor_release(t);
  ck_assert_uint_eq(used(0, TTD_MEM_L1), 256);
  ttd_tensor_release(t);
  ck_assert_uint_eq(used(0, TTD_MEM_L1), 0);
  ttd_tensor_release(NULL);
}
END_TEST

Suite *session_suite(void) {
  Suite *s = suite_create("session");
  TCase *tc = tcase_create("session");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_add_random_handles);
  tcase_add_test(tc, test_lookup_retains);
  tcase_add_test(tc, test_lookup_unknown_uniform);
  tcase_add_test(tc, test_handle_not_found_message);
  tcase_add_test(tc, test_foreign_handle);
  tcase_add_test(tc, test_free_all_or_nothing);
  tcase_add_test(tc, test_free_counts);
  tcase_add_test(tc, test_free_empty_and_duplicates);
  tcase_add_test(tc, test_close_frees_memory);
  tcase_add_test(tc, test_closed_refuses_add);
  tcase_add_test(tc, test_close_cancels_streams);
  tcase_add_test(tc, test_refcount_keeps_memory);
  tcase_add_test(tc, test_release_last_reference);
  tcase_add_test(tc, test_session_fields_and_touch);
  suite_add_tcase(s, tc);

  tc = tcase_create("table");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_table_open_lookup_close);
  tcase_add_test(tc, test_table_sweep);
  tcase_add_test(tc, test_table_sweep_many);
  tcase_add_test(tc, test_table_sweep_bounded_per_call);
  tcase_add_test(tc, test_table_sessions_per_tenant);
  tcase_add_test(tc, test_shm_segments_bounded);
  tcase_add_test(tc, test_shm_segments_per_tenant);
  tcase_add_test(tc, test_table_revoked_session_says_so);
  tcase_add_test(tc, test_auth_admits_sessions_by_token);
  tcase_add_test(tc, test_table_destroy_closes_all);
  suite_add_tcase(s, tc);

  tc = tcase_create("tensor");
  tcase_add_checked_fixture(tc, setup, teardown);
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
