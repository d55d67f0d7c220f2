/* The read guard: the HTTP/2 frames of every plain-text connection the gate hands to gRPC
 * (unix:, unix-abstract:, TCP with --insecure) are counted in the very reads gRPC makes,
 * before gRPC parses them, with no copy and no thread of its own.
 *
 * Why: gRPC 1.51 reads everything a peer sent while the socket has data and queues a call per
 * stream before ttd sees any of them, with no bound on resets (HTTP/2 rapid reset: 200000
 * HEADERS + RST_STREAM pairs took ttd to 2.5 GiB). A relay in front of gRPC would count them
 * too, but costs two copies per byte and a thread hop (TCP downloads at 0.55x a bare gRPC
 * stream on 2 cores); the TLS listeners, whose bytes only ttd can decrypt, take that relay.
 *
 * How: ttd defines recvmsg, sendmsg and close, which the dynamic linker then resolves
 * libgrpc's calls to (an executable's definitions come before libc's); each makes the system
 * call directly.
 * recvmsg on a watched descriptor feeds what it read through the connection's h2_frames
 * parser, and once the verdict is no longer TTD_H2_PASS it returns only the bytes before the
 * offending frame (0 reads as the end of the stream), shuts the socket down and reports the
 * verdict, once. close ends the watch, so a later descriptor of the same number (a shared-
 * memory side socket, say) is never read as HTTP/2. sendmsg on a watched descriptor tells the
 * parser, at gRPC's first write, just before it, that the server's SETTINGS are out
 * (h2_frames.h: an acknowledgement counts from then on). gRPC 1.51's TCP endpoint reads its data with recvmsg
 * only and writes it with sendmsg only (libgrpc.so.29 imports both for sockets, read and
 * write for its wake-up fds).
 *
 * Thread safety: any thread; one mutex per watched descriptor, taken by gRPC's reading
 * thread, by its first write and by watch; no allocation in recvmsg or sendmsg. */
#ifndef TTD_RPC_H2_READ_GUARD_H
#define TTD_RPC_H2_READ_GUARD_H

#include <stdbool.h>
#include <stdint.h>

#include "rpc/h2_frames.h"

/* Called from the reading thread when a watched connection's verdict turns (after its socket
 * is shut down): log and count, nothing that waits for gRPC. */
typedef void (*ttd_h2_guard_fn)(void *arg, int fd, ttd_h2_verdict why);

/* Sets the callback for every watched descriptor; before the first watch. */
void ttd_h2_read_guard_init(ttd_h2_guard_fn fn, void *arg);

/* Watches fd from its first byte (the client preface is next; MSG_PEEK reads do not count),
 * allowing max_resets RST_STREAM frames at once and max_resets a second. Returns 0, or -1
 * with no watch when fd is out of the guard's range (then refuse the connection). Until
 * close(fd). */
int ttd_h2_read_guard_watch(int fd, int max_resets);

/* Whether the peer on watched fd has opened a stream (sent a call's HEADERS); false when fd
 * is not watched. */
bool ttd_h2_read_guard_called(int fd);

/* The frames and resets counted on fd so far (0 when not watched): for tests and logs. */
void ttd_h2_read_guard_counts(int fd, uint64_t *out_frames, uint64_t *out_resets);

#endif
