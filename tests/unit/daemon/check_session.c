/* daemon/session.h over a sim backend: random handles, lookups holding references, uniform
 * NOT_FOUND, all-or-nothing frees, closing and touching a session. */
#include <check.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "session/session.h"
#include "device/tensor.h"
#include "session_fixture.h"
#include "suites.h"

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
    handles[i] = sf_add_new(session, 1, 0, TTD_MEM_DRAM);
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
  ck_assert_uint_eq(sf_used_total(), 0);
}
END_TEST

/* The session takes its own reference on add; lookup returns the same tensor with a new one. */
START_TEST(test_lookup_retains) {
  ttd_session *session = ttd_session_create(1, &(ttd_session_params){.client_name = "t"}, 0);
  ttd_tensor *t = sf_new_tensor(10, 0, TTD_MEM_L1);
  uint64_t h;
  ck_assert_ptr_null(ttd_session_tensor_add(session, t, &h));
  ck_assert_int_eq(sf_tensor_refs(t), 2);
  ttd_tensor_release(t);
  ck_assert_int_eq(sf_tensor_refs(t), 1);

  ttd_tensor *a = NULL, *b = NULL;
  ck_assert_ptr_null(ttd_session_tensor_lookup(session, h, &a));
  ck_assert_ptr_eq(a, t);
  ck_assert_int_eq(sf_tensor_refs(t), 2);
  ck_assert_ptr_null(ttd_session_tensor_lookup(session, h, &b));
  ck_assert_ptr_eq(b, t);
  ck_assert_int_eq(sf_tensor_refs(t), 3);
  ck_assert_int_eq(a->spec.nbytes, 40);
  ck_assert_int_eq(a->spec.location, TTD_MEM_L1);
  ttd_tensor_release(a);
  ttd_tensor_release(b);
  ck_assert_int_eq(sf_tensor_refs(t), 1);
  ttd_session_release(session);
  ck_assert_uint_eq(sf_used_total(), 0);
}
END_TEST

/* Unknown, zero and freed handles are all NOT_FOUND with messages identical but for the handle. */
START_TEST(test_lookup_unknown_uniform) {
  ttd_session *session = ttd_session_create(1, &(ttd_session_params){.client_name = "t"}, 0);
  uint64_t h = sf_add_new(session, 4, 0, TTD_MEM_DRAM);
  uint64_t keep = sf_add_new(session, 4, 0, TTD_MEM_DRAM);
  uint64_t out_t, out_b;
  ck_assert_ptr_null(ttd_session_tensors_free(session, &h, 1, &out_t, &out_b));

  char freed[512], never[512], zero[512], small[512];
  sf_expect_not_found(session, h, freed, sizeof(freed));
  uint64_t never_issued = h ^ 0x5a5a5a5a00000000ull;
  if (never_issued == keep) never_issued ^= 1;
  sf_expect_not_found(session, never_issued, never, sizeof(never));
  sf_expect_not_found(session, 0, zero, sizeof(zero));
  sf_expect_not_found(session, 0x1f, small, sizeof(small));
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
  sf_message_without_handle(s, 0xabcdef, direct, sizeof(direct));
  sf_expect_not_found(session, 0x1234567890ull, looked_up, sizeof(looked_up));
  ck_assert_str_eq(direct, looked_up);
  ttd_session_release(session);
}
END_TEST

/* A handle of session A is NOT_FOUND in session B, and B cannot free it. */
START_TEST(test_foreign_handle) {
  ttd_session *a = ttd_session_create(1, &(ttd_session_params){.client_name = "a"}, 0);
  ttd_session *b = ttd_session_create(2, &(ttd_session_params){.client_name = "b"}, 0);
  uint64_t ha = sf_add_new(a, 8, 0, TTD_MEM_DRAM);
  uint64_t hb = sf_add_new(b, 8, 1, TTD_MEM_DRAM);
  char foreign[512], never[512];
  sf_expect_not_found(b, ha, foreign, sizeof(foreign));
  sf_expect_not_found(b, ha ^ hb ^ 0x10000, never, sizeof(never));
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
  ck_assert_uint_eq(sf_used_total(), 0);
}
END_TEST

/* Free is all or nothing: one unknown handle in the list frees none of them. */
START_TEST(test_free_all_or_nothing) {
  ttd_session *session = ttd_session_create(1, &(ttd_session_params){.client_name = "t"}, 0);
  uint64_t h1 = sf_add_new(session, 10, 0, TTD_MEM_DRAM);
  uint64_t h2 = sf_add_new(session, 20, 0, TTD_MEM_L1);
  uint64_t h3 = sf_add_new(session, 30, 1, TTD_MEM_DRAM);
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
  ck_assert_uint_eq(sf_used(0, TTD_MEM_DRAM), 40);
  ck_assert_uint_eq(sf_used(0, TTD_MEM_L1), 80);
  ck_assert_uint_eq(sf_used(1, TTD_MEM_DRAM), 120);
  /* The unknown handle last: still nothing freed. */
  uint64_t list2[] = {h1, h2, h3, unknown};
  s = ttd_session_tensors_free(session, list2, 4, &out_t, &out_b);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_NOT_FOUND);
  ttd_status_free(s);
  ck_assert_uint_eq(session->tensors.count, 3);
  ck_assert_uint_eq(sf_used_total(), 240);
  ttd_session_release(session);
}
END_TEST

/* A successful free returns tensors and bytes freed and gives the device memory back. */
START_TEST(test_free_counts) {
  ttd_session *session = ttd_session_create(1, &(ttd_session_params){.client_name = "t"}, 0);
  uint64_t h1 = sf_add_new(session, 10, 0, TTD_MEM_DRAM);
  uint64_t h2 = sf_add_new(session, 20, 0, TTD_MEM_L1);
  uint64_t h3 = sf_add_new(session, 30, 1, TTD_MEM_DRAM);
  uint64_t h4 = sf_add_new(session, 0, 1, TTD_MEM_L1); /* 0 bytes, still a tensor */
  uint64_t list[] = {h3, h1, h4};
  uint64_t out_t = 0, out_b = 0;
  ck_assert_ptr_null(ttd_session_tensors_free(session, list, 3, &out_t, &out_b));
  ck_assert_uint_eq(out_t, 3);
  ck_assert_uint_eq(out_b, 160);
  ck_assert_uint_eq(session->tensors.count, 1);
  ck_assert_uint_eq(session->tensor_bytes, 80);
  ck_assert_uint_eq(sf_used(0, TTD_MEM_DRAM), 0);
  ck_assert_uint_eq(sf_used(1, TTD_MEM_DRAM), 0);
  ck_assert_uint_eq(sf_used(0, TTD_MEM_L1), 80);
  ttd_tensor *t = NULL;
  ck_assert_ptr_null(ttd_session_tensor_lookup(session, h2, &t));
  ttd_tensor_release(t);
  char m[512];
  sf_expect_not_found(session, h1, m, sizeof(m));
  ck_assert_ptr_null(ttd_session_tensors_free(session, &h2, 1, &out_t, &out_b));
  ck_assert_uint_eq(out_t, 1);
  ck_assert_uint_eq(out_b, 80);
  ck_assert_uint_eq(session->tensor_bytes, 0);
  ck_assert_uint_eq(sf_used_total(), 0);
  ttd_session_release(session);
}
END_TEST

/* An empty list and a list naming a handle twice are INVALID_ARGUMENT and free nothing. */
START_TEST(test_free_empty_and_duplicates) {
  ttd_session *session = ttd_session_create(1, &(ttd_session_params){.client_name = "t"}, 0);
  uint64_t h1 = sf_add_new(session, 10, 0, TTD_MEM_DRAM);
  uint64_t h2 = sf_add_new(session, 10, 0, TTD_MEM_DRAM);
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
  ck_assert_uint_eq(sf_used(0, TTD_MEM_DRAM), 80);
  ttd_session_release(session);
}
END_TEST

/* Closing a session frees all its device memory, reports counts, and is idempotent. */
START_TEST(test_close_frees_memory) {
  ttd_session *session = ttd_session_create(1, &(ttd_session_params){.client_name = "t"}, 0);
  sf_add_new(session, 100, 0, TTD_MEM_DRAM);
  sf_add_new(session, 200, 0, TTD_MEM_L1);
  sf_add_new(session, 300, 1, TTD_MEM_DRAM);
  sf_add_new(session, 400, 1, TTD_MEM_L1);
  ck_assert_uint_eq(sf_used_total(), 4000);
  uint64_t out_t = 0, out_b = 0;
  ttd_session_close(session, &out_t, &out_b);
  ck_assert_uint_eq(out_t, 4);
  ck_assert_uint_eq(out_b, 4000);
  ck_assert(session->closed);
  ck_assert_uint_eq(sf_used_total(), 0);
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
  uint64_t old = sf_add_new(session, 1, 0, TTD_MEM_DRAM);
  ttd_session_close(session, NULL, NULL);
  ttd_tensor *t = sf_new_tensor(5, 0, TTD_MEM_DRAM);
  uint64_t h = 99;
  ttd_status_t s = ttd_session_tensor_add(session, t, &h);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_FAILED_PRECONDITION);
  ttd_status_free(s);
  ck_assert_uint_eq(h, 0);
  ck_assert_int_eq(sf_tensor_refs(t), 1);
  char m[512];
  sf_expect_not_found(session, old, m, sizeof(m));
  ttd_tensor_release(t);
  ck_assert_uint_eq(sf_used_total(), 0);
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
  uint64_t h = sf_add_new(session, 256, 0, TTD_MEM_DRAM);
  ttd_tensor *held = NULL;
  ck_assert_ptr_null(ttd_session_tensor_lookup(session, h, &held)); /* an in-flight call's reference */
  uint64_t out_t, out_b;
  ck_assert_ptr_null(ttd_session_tensors_free(session, &h, 1, &out_t, &out_b));
  ck_assert_uint_eq(out_b, 1024);
  ck_assert_uint_eq(sf_used(0, TTD_MEM_DRAM), 1024); /* still held */
  ck_assert_int_eq(sf_tensor_refs(held), 1);
  unsigned char data[16] = {1, 2, 3};
  ck_assert_ptr_null(sf_backend->vtable->buffer_write(sf_backend, held->buffer, 0, data, sizeof(data)));
  ttd_tensor_release(held);
  ck_assert_uint_eq(sf_used(0, TTD_MEM_DRAM), 0);

  /* The same through close. */
  h = sf_add_new(session, 100, 1, TTD_MEM_L1);
  ck_assert_ptr_null(ttd_session_tensor_lookup(session, h, &held));
  ttd_session_close(session, &out_t, &out_b);
  ck_assert_uint_eq(out_t, 1);
  ck_assert_uint_eq(out_b, 0); /* freed now: nothing, the call still holds it */
  ck_assert_uint_eq(sf_used(1, TTD_MEM_L1), 400);
  ck_assert_uint_eq(session->quota->used, 400);
  ttd_tensor_release(held);
  ck_assert_uint_eq(sf_used(1, TTD_MEM_L1), 0);
  ck_assert_uint_eq(session->quota->used, 0); /* refunded by the last reference */
  ttd_session_release(session);
}
END_TEST

/* Releasing the last session reference closes it and frees its tensors. */
START_TEST(test_release_last_reference) {
  ttd_session *session = ttd_session_create(1, &(ttd_session_params){.client_name = "t"}, 0);
  ck_assert_ptr_eq(ttd_session_retain(session), session);
  sf_add_new(session, 50, 0, TTD_MEM_DRAM);
  ttd_session_release(session);
  ck_assert_uint_eq(sf_used_total(), 200); /* one reference left */
  ck_assert(!session->closed);
  ttd_session_release(session);
  ck_assert_uint_eq(sf_used_total(), 0);
  ttd_session_release(NULL);
}
END_TEST

/* A session keeps its id, client name (truncated safely) and times; touch moves sf_last_seen. */
START_TEST(test_session_fields_and_touch) {
  char long_name[200];
  memset(long_name, 'n', sizeof(long_name) - 1);
  long_name[sizeof(long_name) - 1] = '\0';
  ttd_session *s = ttd_session_create(77, &(ttd_session_params){.client_name = long_name}, 1000);
  ck_assert_uint_eq(s->id, 77);
  ck_assert_uint_eq(strlen(s->client_name), sizeof(s->client_name) - 1);
  ck_assert_int_eq(s->opened_ms, 1000);
  ck_assert_int_eq(sf_last_seen(s), 1000);
  ttd_session_touch(s, 2500);
  ck_assert_int_eq(sf_last_seen(s), 2500);
  ck_assert_int_eq(s->opened_ms, 1000);
  ttd_session_release(s);
  s = ttd_session_create(78, &(ttd_session_params){.client_name = NULL}, 0);
  ck_assert_str_eq(s->client_name, "");
  ttd_session_release(s);
}
END_TEST

Suite *session_suite(void) {
  Suite *s = suite_create("session");
  TCase *tc = tcase_create("session");
  tcase_add_checked_fixture(tc, sf_setup, sf_teardown);
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
  return s;
}
