/* wire/address: the default addresses of daemon and client, and the search for a running
 * ttd among them, with an error that names every address tried and what it answered. */
#include <check.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "suites.h"
#include "wire/address.h"

static char dir[64];

static void setup(void) {
  snprintf(dir, sizeof(dir), "/tmp/ttd-address-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void teardown(void) {
  char cmd[96];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  ck_assert_int_eq(system(cmd), 0);
}

/* A Unix socket bound at path; listening when listening, else left refusing (stale). */
static int bound_socket(const char *path, int listening) {
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
  ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
  if (listening) ck_assert_int_eq(listen(fd, 1), 0);
  return fd;
}

/* Without a target a client tries the user's own socket first, then the system service's;
 * root's default is the system socket, tried once. */
START_TEST(test_client_addresses) {
  char got[TTD_ADDRESS_CANDIDATES][TTD_ADDRESS_MAX], own[TTD_ADDRESS_MAX];
  ck_assert_int_eq(ttd_default_address(own, sizeof(own)), 0);
  int n = ttd_default_client_addresses(got, TTD_ADDRESS_CANDIDATES);
  ck_assert_str_eq(got[0], own);
  ck_assert_str_eq(got[n - 1], "unix:/run/ttd/ttd.sock");
  ck_assert_int_eq(n, geteuid() == 0 ? 1 : 2);
  ck_assert_int_eq(ttd_default_client_addresses(got, 1), 1);
  char tiny[8];
  ck_assert_int_eq(ttd_default_address(tiny, sizeof(tiny)), -1);
}
END_TEST

/* The first address whose socket accepts wins, whatever comes before it. */
START_TEST(test_find_first_live) {
  char c[3][TTD_ADDRESS_MAX], out[TTD_ADDRESS_MAX], why[1024];
  snprintf(c[0], TTD_ADDRESS_MAX, "unix:%s/none.sock", dir);
  snprintf(c[1], TTD_ADDRESS_MAX, "unix:%s/stale.sock", dir);
  snprintf(c[2], TTD_ADDRESS_MAX, "unix:%s/live.sock", dir);
  int stale = bound_socket(c[1] + 5, 0);
  int live = bound_socket(c[2] + 5, 1);
  ck_assert_int_eq(ttd_find_daemon_among((const char(*)[TTD_ADDRESS_MAX])c, 3, out, sizeof(out), why, sizeof(why)), 0);
  ck_assert_str_eq(out, c[2]);
  close(live);
  close(stale);
}
END_TEST

/* Nothing answers: -1, and the message names each address with its own reason and how to
 * start ttd. */
START_TEST(test_find_none_says_why) {
  char c[2][TTD_ADDRESS_MAX], out[TTD_ADDRESS_MAX] = "", why[1024];
  snprintf(c[0], TTD_ADDRESS_MAX, "unix:%s/none.sock", dir);
  snprintf(c[1], TTD_ADDRESS_MAX, "unix:%s/stale.sock", dir);
  int stale = bound_socket(c[1] + 5, 0);
  ck_assert_int_eq(ttd_find_daemon_among((const char(*)[TTD_ADDRESS_MAX])c, 2, out, sizeof(out), why, sizeof(why)), -1);
  char want[TTD_ADDRESS_MAX + 32];
  snprintf(want, sizeof(want), "%s (no such socket)", c[0]);
  ck_assert_msg(strstr(why, want), "%s", why);
  snprintf(want, sizeof(want), "%s (refused", c[1]);
  ck_assert_msg(strstr(why, want), "%s", why);
  ck_assert_msg(strstr(why, "systemctl start ttd") && strstr(why, "TTD_ADDRESS"), "%s", why);
  ck_assert_str_eq(out, "");
  /* A short buffer is cut, never overrun. */
  char small[16];
  ck_assert_int_eq(ttd_find_daemon_among((const char(*)[TTD_ADDRESS_MAX])c, 2, out, sizeof(out), small, sizeof(small)), -1);
  ck_assert_uint_eq(strlen(small), sizeof(small) - 1);
  close(stale);
}
END_TEST

/* A socket in a folder others may write to (or another user's) is not tried, though it
 * answers: a client would send its token to whoever made it. The reason says so. */
START_TEST(test_untrusted_folder_not_tried) {
  char loose[200], c[1][TTD_ADDRESS_MAX], out[TTD_ADDRESS_MAX] = "", why[1024];
  snprintf(loose, sizeof(loose), "%s/loose", dir);
  ck_assert_int_eq(mkdir(loose, 0700), 0);
  snprintf(c[0], TTD_ADDRESS_MAX, "unix:%s/live.sock", loose);
  int live = bound_socket(c[0] + 5, 1);
  ck_assert_int_eq(ttd_find_daemon_among((const char(*)[TTD_ADDRESS_MAX])c, 1, out, sizeof(out), why, sizeof(why)), 0);
  ck_assert_int_eq(chmod(loose, 0777), 0);
  ck_assert_int_eq(ttd_find_daemon_among((const char(*)[TTD_ADDRESS_MAX])c, 1, out, sizeof(out), why, sizeof(why)), -1);
  ck_assert_msg(strstr(why, "its folder is another user's, or others may write to it"), "%s", why);
  close(live);
  unlink(c[0] + 5);
  rmdir(loose);
}
END_TEST

Suite *address_suite(void) {
  Suite *s = suite_create("address");
  TCase *tc = tcase_create("address");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_client_addresses);
  tcase_add_test(tc, test_find_first_live);
  tcase_add_test(tc, test_untrusted_folder_not_tried);
  tcase_add_test(tc, test_find_none_says_why);
  suite_add_tcase(s, tc);
  return s;
}
