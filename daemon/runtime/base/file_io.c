#include "base/file_io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define IO_CHUNK (1u << 30) /* largest single read/write, below Linux's 2 GiB cap */

/* UNAVAILABLE with strerror(err) as the message; errno stays err. */
static ttd_status_t errno_status(int err) {
  ttd_status_t status = ttd_make_status(GRPC_STATUS_UNAVAILABLE, "%s", strerror(err));
  errno = err;
  return status;
}

ttd_status_t ttd_write_all(int fd, const void *buf, uint64_t len) {
  const char *p = buf;
  while (len > 0) {
    size_t want = len > IO_CHUNK ? IO_CHUNK : (size_t)len;
    ssize_t n = write(fd, p, want);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno_status(errno);
    p += n;
    len -= (uint64_t)n;
  }
  return TTD_OK;
}

ttd_status_t ttd_read_all_at(int fd, void *buf, uint64_t len, uint64_t offset) {
  char *p = buf;
  while (len > 0) {
    size_t want = len > IO_CHUNK ? IO_CHUNK : (size_t)len;
    ssize_t n = pread(fd, p, want, (off_t)offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno_status(errno);
    if (n == 0) {
      ttd_status_t status = ttd_make_status(GRPC_STATUS_OUT_OF_RANGE, "the file ends at byte %llu, %llu bytes short",
                                            (unsigned long long)offset, (unsigned long long)len);
      errno = 0;
      return status;
    }
    p += n;
    len -= (uint64_t)n;
    offset += (uint64_t)n;
  }
  return TTD_OK;
}

ttd_status_t ttd_sync_parent_dir(const char *path) {
  const char *slash = strrchr(path, '/');
  char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
  if (!dir) return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "out of host memory");
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int err = 0;
  if (fd < 0 || (fsync(fd) != 0 && errno != EINVAL)) err = errno;
  if (fd >= 0) close(fd);
  free(dir);
  return err ? errno_status(err) : TTD_OK;
}
