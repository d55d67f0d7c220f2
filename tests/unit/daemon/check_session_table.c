/* daemon/session_table.h and auth.h over a sim backend: opening, lookups, lease sweeps,
 * per-tenant bounds on sessions and shared-memory segments, revocation and admission by token. */
#define _GNU_SOURCE /* memfd_create */
#include <check.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "session/auth.h"
#include "session/session.h"
#include "session/session_table.h"
#include "session/shm_segment.h"
#include "device/tensor.h"
#include "session_fixture.h"
#include "suites.h"

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
  ck_assert_int_eq(sf_last_seen(a), 500);
  ck_assert_int_eq(sf_session_refs(a), 3); /* table + ours + lookup's */
  ttd_session_release(found);

  sf_add_new(a, 25, 0, TTD_MEM_DRAM);
  uint64_t out_t = 0, out_b = 0;
  uint64_t a_id = a->id;
  ttd_session_table_close(&table, a, &out_t, &out_b);
  ck_assert_uint_eq(out_t, 1);
  ck_assert_uint_eq(out_b, 100);
  ck_assert(a->closed);
  ck_assert_uint_eq(sf_used_total(), 0);
  ck_assert_uint_eq(ttd_session_table_count(&table), 1);
  ck_assert_int_eq(sf_session_refs(a), 1); /* only ours is left */

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
  sf_add_new(b, 10, 0, TTD_MEM_DRAM);
  sf_add_new(c, 20, 1, TTD_MEM_L1);
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
  ck_assert_uint_eq(sf_used(0, TTD_MEM_DRAM), 0);
  ck_assert_uint_eq(sf_used(1, TTD_MEM_L1), 80);
  ck_assert_uint_eq(ttd_session_table_count(&table), 2);
  ttd_status_t s = ttd_session_table_lookup(&table, b->id, NULL, 1001, &found);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_NOT_FOUND);
  ttd_status_free(s);

  ck_assert_uint_eq(ttd_session_table_sweep(&table, 1500), 0);
  ck_assert_uint_eq(ttd_session_table_sweep(&table, 1501), 1); /* c */
  ck_assert(c->closed);
  ck_assert_uint_eq(sf_used_total(), 0);
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

/* A session "x" opened in table at now_ms (a reference of the caller's). */
static ttd_session *open_at(ttd_session_table *table, int64_t now_ms) {
  ttd_session *s;
  ck_assert_ptr_null(ttd_session_table_open(table, &(ttd_session_params){.client_name = "x"}, now_ms, &s));
  return s;
}

/* sweep closes several expired sessions in one pass. */
START_TEST(test_table_sweep_many) {
  ttd_session_table table;
  ttd_session_table_init(&table, 100);
  for (int i = 0; i < 50; i++) {
    ttd_session *s = open_at(&table, i % 2 ? 0 : 1000);
    sf_add_new(s, 1, i % 2, TTD_MEM_DRAM);
    ttd_session_release(s);
  }
  ck_assert_uint_eq(ttd_session_table_sweep(&table, 1050), 25);
  ck_assert_uint_eq(ttd_session_table_count(&table), 25);
  ck_assert_uint_eq(sf_used(1, TTD_MEM_DRAM), 0);
  ck_assert_uint_eq(sf_used(0, TTD_MEM_DRAM), 100);
  ttd_session_table_destroy(&table);
  ck_assert_uint_eq(sf_used_total(), 0);
}
END_TEST

/* 5000 expired sessions: each sweep closes at most TTD_SWEEP_MAX_CLOSE of them (bounded work
 * per call, the event loop runs between), and repeated sweeps close them all, the live ones
 * kept. */
START_TEST(test_table_sweep_bounded_per_call) {
  ttd_session_table table;
  ttd_session_table_init(&table, 100);
  for (int i = 0; i < 5010; i++) {
    ttd_session_release(open_at(&table, i < 10 ? 1000 : 0));
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
  sf_add_new(a, 10, 0, TTD_MEM_DRAM);
  sf_add_new(b, 10, 1, TTD_MEM_L1);
  ttd_session_release(b);
  ttd_session_table_destroy(&table);
  ck_assert(a->closed);
  ck_assert_uint_eq(sf_used_total(), 0);
  ttd_session_release(a);
}
END_TEST

Suite *session_table_suite(void) {
  Suite *s = suite_create("session_table");
  TCase *tc = tcase_create("session_table");
  tcase_add_checked_fixture(tc, sf_setup, sf_teardown);
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
  return s;
}
