/* One message with descriptors attached (SCM_RIGHTS) on a Unix socket, either way: the
 * shared-memory side socket's requests and replies (shm_protocol.h). Shared by ttd and
 * libttclient. */
#ifndef TTD_FD_PASSING_H
#define TTD_FD_PASSING_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* At most this many descriptors are read off one message; more make it truncated. */
#define TTD_FD_PASSING_MAX 4

/* Sends len bytes of buf with nfds (0 to TTD_FD_PASSING_MAX) descriptors of fds attached;
 * sendmsg's result (MSG_NOSIGNAL). */
ssize_t ttd_send_fds(int sock, const void *buf, size_t len, const int *fds, int nfds);

/* Receives one message into buf (at most len bytes; flags as recvmsg's, MSG_CMSG_CLOEXEC
 * added): recvmsg's result. The first max_fds descriptors it carried go to fds (*nfds of
 * them), the others are closed; *truncated says whether it carried more than
 * TTD_FD_PASSING_MAX (those are lost). */
ssize_t ttd_recv_fds(int sock, void *buf, size_t len, int flags, int *fds, int max_fds, int *nfds, bool *truncated);

#endif
