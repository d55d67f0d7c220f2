/* runtime/base/file_io.h: whole writes and positioned reads, reads past the end, errors that
 * carry the errno text, and the folder sync after a rename. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file_io.h"
#include "suites.h"

static char dir[64];
static char path[128];

static void setup(void) {
  snprintf(dir, sizeof(dir), "/tmp/ttd-fio-XXXXXX");
  ck_assert_msg(mkdtemp(dir) != NULL, "mkdtemp: %s", strerror(errno));
  snprintf(path, sizeof(path), "%s/f", dir);
}

static void teardown(void) {
  unlink(path);
  rmdir(dir);
}

/* What write_all wrote, read_all_at reads back at any offset. */
START_TEST(test_write_then_read_at) {
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
  ck_assert_int_ge(fd, 0);
  char data[4096];
  for (size_t i = 0; i < sizeof(data); i++) data[i] = (char)(i * 7);
  ck_assert_ptr_null(ttd_write_all(fd, data, sizeof(data)));
  ck_assert_ptr_null(ttd_write_all(fd, NULL, 0));
  char got[100];
  ck_assert_ptr_null(ttd_read_all_at(fd, got, sizeof(got), 1000));
  ck_assert_mem_eq(got, data + 1000, sizeof(got));
  ck_assert_ptr_null(ttd_read_all_at(fd, got, 0, 99999));
  close(fd);
}
END_TEST

/* A read past the end is OUT_OF_RANGE with errno 0; a failed read or write is UNAVAILABLE
 * with the errno text. */
START_TEST(test_errors) {
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
  ck_assert_ptr_null(ttd_write_all(fd, "abcd", 4));
  char got[8];
  ttd_status_t status = ttd_read_all_at(fd, got, 8, 0);
  ck_assert_int_eq(ttd_status_code(status), GRPC_STATUS_OUT_OF_RANGE);
  ck_assert_int_eq(errno, 0);
  ck_assert_ptr_nonnull(strstr(ttd_status_message(status), "ends at byte 4"));
  ttd_status_free(status);
  close(fd);

  fd = open(path, O_RDONLY);
  status = ttd_write_all(fd, "x", 1);
  ck_assert_int_eq(ttd_status_code(status), GRPC_STATUS_UNAVAILABLE);
  ck_assert_int_eq(errno, EBADF);
  ck_assert_str_eq(ttd_status_message(status), strerror(EBADF));
  ttd_status_free(status);
  close(fd);
  status = ttd_read_all_at(-1, got, 1, 0);
  ck_assert_int_eq(ttd_status_code(status), GRPC_STATUS_UNAVAILABLE);
  ck_assert_str_eq(ttd_status_message(status), strerror(EBADF));
  ttd_status_free(status);
}
END_TEST

/* The folder of a path, of a bare name (".") and of "/x" sync; a missing folder is UNAVAILABLE. */
START_TEST(test_sync_parent_dir) {
  ck_assert_ptr_null(ttd_sync_parent_dir(path));
  ck_assert_ptr_null(ttd_sync_parent_dir("bare-name"));
  ck_assert_ptr_null(ttd_sync_parent_dir("/x"));
  char missing[160];
  snprintf(missing, sizeof(missing), "%s/no/f", dir);
  ttd_status_t status = ttd_sync_parent_dir(missing);
  ck_assert_int_eq(ttd_status_code(status), GRPC_STATUS_UNAVAILABLE);
  ck_assert_str_eq(ttd_status_message(status), strerror(ENOENT));
  ttd_status_free(status);
}
END_TEST

Suite *file_io_suite(void) {
  Suite *s = suite_create("file_io");
  TCase *tc = tcase_create("file_io");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_write_then_read_at);
  tcase_add_test(tc, test_errors);
  tcase_add_test(tc, test_sync_parent_dir);
  suite_add_tcase(s, tc);
  return s;
}
