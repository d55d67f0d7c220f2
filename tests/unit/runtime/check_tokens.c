/* The tokens file, token digests, tenant quotas and the quota account. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "session/auth.h"
#include "device/quota.h"
#include "wire/tokens.h"
#include "suites.h"

#define DIGEST_ABC "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
#define DIGEST_EMPTY "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

START_TEST(test_digest_is_sha256) {
  char text[80];
  ttd_token_digest_text("abc", 3, text, sizeof(text));
  ck_assert_str_eq(text, DIGEST_ABC); /* FIPS 180-2 test vector */
  ttd_token_digest_text("", 0, text, sizeof(text));
  ck_assert_str_eq(text, DIGEST_EMPTY);
}
END_TEST

START_TEST(test_generate_is_random_and_well_formed) {
  char a[64], b[64];
  ttd_token_generate(a, sizeof(a));
  ttd_token_generate(b, sizeof(b));
  ck_assert_uint_eq(strlen(a), 44);
  ck_assert(strncmp(a, "ttd_", 4) == 0);
  ck_assert_uint_eq(strspn(a + 4, "abcdefghijklmnopqrstuvwxyz234567"), 40);
  ck_assert_str_ne(a, b);
}
END_TEST

START_TEST(test_parse_and_match) {
  ttd_tokens *t = NULL;
  const char *text = "# tenants\n\nalice " DIGEST_ABC " quota=512M   # the ML team\n"
                     "ops\t" DIGEST_EMPTY "\tadmin\n";
  ck_assert_ptr_null(ttd_tokens_parse(text, "t.conf", &t));
  ck_assert_uint_eq(t->count, 2);
  const ttd_tenant *a = ttd_tokens_match(t, "abc", 3);
  ck_assert_ptr_nonnull(a);
  ck_assert_str_eq(a->name, "alice");
  ck_assert(!a->admin);
  ck_assert_uint_eq(a->quota, 512ull << 20);
  const ttd_tenant *o = ttd_tokens_match(t, "", 0);
  ck_assert_ptr_nonnull(o);
  ck_assert(o->admin);
  ck_assert_ptr_null(ttd_tokens_match(t, "abd", 3));
  ck_assert_ptr_null(ttd_tokens_match(t, "ab", 2));
  ck_assert_ptr_eq(ttd_tokens_find(t, "ops"), o);
  ck_assert_ptr_null(ttd_tokens_find(t, "bob"));
  ttd_tokens_release(t);
}
END_TEST

static void expect_bad(const char *text, const char *needle) {
  ttd_tokens *t = (ttd_tokens *)1;
  ttd_status_t s = ttd_tokens_parse(text, "f", &t);
  ck_assert_ptr_nonnull(s);
  ck_assert_ptr_null(t);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_INVALID_ARGUMENT);
  ck_assert_msg(strstr(ttd_status_message(s), needle), "'%s' lacks '%s'", ttd_status_message(s), needle);
  ttd_status_free(s);
}

START_TEST(test_parse_errors_name_the_line) {
  expect_bad("alice\n", "f:1: tenant alice needs the token's digest");
  expect_bad("a " DIGEST_ABC " max_sessions=0\n", "f:1: max_sessions of tenant a must be a whole number from 1 to 65536");
  expect_bad("a " DIGEST_ABC " max_sessions=70000\n", "got '70000'");
  expect_bad("a " DIGEST_ABC " max_sessions=2x\n", "got '2x'");
  expect_bad("a " DIGEST_ABC " sessions=2\n", "use admin, quota=SIZE, max_sessions=N or weight=N");
  expect_bad("a " DIGEST_ABC " weight=0\n", "f:1: weight of tenant a must be a whole number from 1 to 1000");
  expect_bad("a " DIGEST_ABC " weight=1001\n", "got '1001'");
  expect_bad("\nalice sha256:abc\n", "f:2: tenant alice needs");
  expect_bad("alice " DIGEST_ABC " root\n", "f:1: unknown option 'root'");
  expect_bad("alice " DIGEST_ABC " quota=lots\n", "quota of tenant alice");
  expect_bad("alice " DIGEST_ABC " quota=0\n", "above 0");
  expect_bad("al/ce " DIGEST_ABC "\n", "tenant name 'al/ce'");
  expect_bad("a " DIGEST_ABC "\nb " DIGEST_EMPTY "\na " DIGEST_EMPTY "\n", "f:3: tenant a is listed twice");
  expect_bad("a " DIGEST_ABC "\nb " DIGEST_ABC "\n", "f:2: tenants a and b have the same token");
  /* A token in place of its digest is refused: the file never holds tokens. */
  expect_bad("a ttd_abcdefghijklmnopqrstuvwxyz234567abcdefgh\n", "sha256:");
}
END_TEST

START_TEST(test_auth_check_and_session_quota) {
  ttd_auth auth;
  ttd_auth_init(&auth, NULL, 0, 1024);
  ttd_principal p;
  ck_assert_ptr_null(ttd_auth_check(&auth, NULL, 0, &p));
  ck_assert_str_eq(p.tenant, "local");
  ck_assert(p.admin);
  uint64_t q = 1;
  ck_assert_ptr_null(ttd_auth_session_quota(&auth, "local", 0, &q));
  ck_assert_uint_eq(q, 0); /* no quota at all */
  ck_assert_ptr_null(ttd_auth_session_quota(&auth, "local", 4096, &q));
  ck_assert_uint_eq(q, 4096);

  ttd_tokens *t = NULL;
  ck_assert_int_eq(ttd_auth_max_sessions(&auth, "local"), 1024);
  ck_assert_ptr_null(
      ttd_tokens_parse("alice " DIGEST_ABC " quota=1M max_sessions=3\nops " DIGEST_EMPTY " admin\n", "f", &t));
  ttd_auth_replace(&auth, t, 4 << 20, 16);
  ck_assert_int_eq(ttd_auth_max_sessions(&auth, "alice"), 3); /* her own */
  ck_assert_int_eq(ttd_auth_max_sessions(&auth, "ops"), 16);  /* --max-sessions */
  ttd_status_t s = ttd_auth_check(&auth, NULL, 0, &p);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_UNAUTHENTICATED);
  ttd_status_free(s);
  s = ttd_auth_check(&auth, "Token abc", 9, &p);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_UNAUTHENTICATED);
  ttd_status_free(s);
  ck_assert_ptr_null(ttd_auth_check(&auth, "Bearer abc", 10, &p));
  ck_assert_str_eq(p.tenant, "alice");
  ck_assert(!p.admin);
  /* alice: her 1M limit is below --quota 4M; ops: --quota. */
  ck_assert_ptr_null(ttd_auth_session_quota(&auth, "alice", 0, &q));
  ck_assert_uint_eq(q, 1 << 20);
  ck_assert_ptr_null(ttd_auth_session_quota(&auth, "alice", 1 << 20, &q));
  ck_assert_uint_eq(q, 1 << 20);
  s = ttd_auth_session_quota(&auth, "alice", (1 << 20) + 1, &q);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_RESOURCE_EXHAUSTED);
  ck_assert_ptr_nonnull(strstr(ttd_status_message(s), "at most 1.00 MiB (1048576 bytes, the tenant's limit)"));
  ttd_status_free(s);
  ck_assert_ptr_null(ttd_auth_session_quota(&auth, "ops", 0, &q));
  ck_assert_uint_eq(q, 4 << 20);
  /* A tenant's own limit replaces --quota, upwards too. */
  char digest[80], text[160];
  ttd_token_digest_text("big", 3, digest, sizeof(digest));
  snprintf(text, sizeof(text), "big %s quota=8M\n", digest);
  ck_assert_ptr_null(ttd_tokens_parse(text, "f", &t));
  ttd_auth_replace(&auth, t, 4 << 20, 16);
  ck_assert_ptr_null(ttd_auth_session_quota(&auth, "big", 0, &q));
  ck_assert_uint_eq(q, 8 << 20);
  ck_assert_ptr_null(ttd_auth_session_quota(&auth, "big", 6 << 20, &q));
  ck_assert_uint_eq(q, 6 << 20);
  ttd_auth_destroy(&auth);
}
END_TEST

START_TEST(test_quota_account) {
  ttd_quota *q = ttd_quota_create(100);
  ck_assert_ptr_null(ttd_quota_charge(q, 60));
  ck_assert_ptr_null(ttd_quota_charge(q, 40)); /* exactly full */
  ttd_status_t s = ttd_quota_charge(q, 1);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_RESOURCE_EXHAUSTED);
  ck_assert_ptr_nonnull(strstr(ttd_status_message(s), "quota 100 B (100 bytes), used 100 B (100 bytes), requested 1 B"));
  ttd_status_free(s);
  s = ttd_quota_charge(q, UINT64_MAX); /* no wrap-around */
  ck_assert_ptr_nonnull(s);
  ttd_status_free(s);
  ttd_quota_refund(q, 60);
  ck_assert_uint_eq(q->used, 40);
  ttd_quota_set_limit(q, 30); /* lowered below use: holds, refuses more */
  s = ttd_quota_charge(q, 1);
  ck_assert_ptr_nonnull(s);
  ttd_status_free(s);
  ttd_quota_set_limit(q, 0); /* no limit */
  ck_assert_ptr_null(ttd_quota_charge(q, UINT64_MAX / 2));
  ck_assert_ptr_null(ttd_quota_charge(NULL, 1));
  ttd_quota_release(q);
  char buf[32];
  ck_assert_str_eq(ttd_format_bytes(1536, buf, sizeof(buf)), "1.50 KiB");
  ck_assert_str_eq(ttd_format_bytes(12ull << 30, buf, sizeof(buf)), "12.0 GiB");
  ck_assert_str_eq(ttd_format_bytes(512 << 10, buf, sizeof(buf)), "512 KiB");
}
END_TEST

Suite *tokens_suite(void) {
  Suite *s = suite_create("tokens");
  TCase *tc = tcase_create("tokens");
  tcase_add_test(tc, test_digest_is_sha256);
  tcase_add_test(tc, test_generate_is_random_and_well_formed);
  tcase_add_test(tc, test_parse_and_match);
  tcase_add_test(tc, test_parse_errors_name_the_line);
  tcase_add_test(tc, test_auth_check_and_session_quota);
  tcase_add_test(tc, test_quota_account);
  suite_add_tcase(s, tc);
  return s;
}
