#include "wire/fd_passing.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

ssize_t ttd_send_fds(int sock, const void *buf, size_t len, const int *fds, int nfds) {
  struct iovec iov = {(void *)buf, len};
  char control[CMSG_SPACE(TTD_FD_PASSING_MAX * sizeof(int))];
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
  if (nfds > 0) {
    memset(control, 0, sizeof(control));
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int));
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
    memcpy(CMSG_DATA(cm), fds, (size_t)nfds * sizeof(int));
  }
  ssize_t n;
  do { /* a signal of a handler without SA_RESTART: the message is not sent yet */
    n = sendmsg(sock, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  return n;
}

ssize_t ttd_recv_fds(int sock, void *buf, size_t len, int flags, int *fds, int max_fds, int *nfds, bool *truncated) {
  struct iovec iov = {buf, len};
  char control[CMSG_SPACE(TTD_FD_PASSING_MAX * sizeof(int))];
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control, .msg_controllen = sizeof(control)};
  ssize_t n;
  do { /* a signal of a handler without SA_RESTART: the reply is still to come, wait on */
    n = recvmsg(sock, &msg, flags | MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  *nfds = 0;
  *truncated = n >= 0 && (msg.msg_flags & MSG_CTRUNC);
  for (struct cmsghdr *cm = n >= 0 ? CMSG_FIRSTHDR(&msg) : NULL; cm; cm = CMSG_NXTHDR(&msg, cm)) {
    if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; i++) {
      int fd;
      memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
      if (*nfds < max_fds) fds[(*nfds)++] = fd;
      else close(fd);
    }
  }
  return n;
}
