/* HTTP/2 by hand, for tests of hostile peers: the frames of an HTTP/2 rapid reset
 * (CVE-2023-44487), as scripts/attacks/rapid_reset.py sends them, and a flood of whole
 * calls, written through a callback so that the same flood goes over plain TCP or a TLS
 * session. */
#ifndef TTD_TESTS_H2_FLOOD_H
#define TTD_TESTS_H2_FLOOD_H

#include <stddef.h>

/* Writes all of buf; 0 when it did, -1 when the connection failed. */
typedef int (*h2_flood_write_fn)(void *arg, const void *buf, size_t len);

/* Writes the client preface and an empty SETTINGS frame, then `pairs` times a HEADERS frame
 * opening a call of path (HPACK literals without Huffman: POST, http, path, authority,
 * content-type application/grpc, te trailers) and an RST_STREAM cancelling it, 256 pairs a
 * write, as fast as the connection takes them. Returns the pairs written before a write
 * failed: `pairs` when none did. */
int h2_flood_rapid_reset(h2_flood_write_fn write, void *arg, const char *path, int pairs);

/* The same start (with a SETTINGS acknowledgement right after it when early_ack, before the
 * server's SETTINGS can have arrived), then `calls` complete calls of path, each a HEADERS
 * frame and a DATA frame holding an empty gRPC message with END_STREAM, 256 a write, never
 * reading the answers. Returns the calls written before a write failed: `calls` when none
 * did. */
int h2_flood_calls(h2_flood_write_fn write, void *arg, const char *path, int calls, int early_ack);

/* A write function for a plain socket: arg points at its descriptor. */
int h2_flood_write_fd(void *arg, const void *buf, size_t len);

#endif
