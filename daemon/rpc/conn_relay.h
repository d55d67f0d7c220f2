/* The relay between a TLS peer and gRPC: the connection gate (conn_gate.h) ends TLS, hands
 * gRPC one end of a socketpair and the relay the other, with the peer's socket and its TLS
 * session (handshake done). The relay moves bytes both ways, decrypting and encrypting, and
 * reads the peer's HTTP/2 frames (h2_frames.h) before gRPC does, so that a peer resetting
 * streams faster than the bucket allows (HTTP/2 rapid reset), or opening more streams than
 * allowed before it acknowledges the SETTINGS, is closed before gRPC has parsed and queued
 * its frames. (Plain-text peers need no
 * relay: h2_read_guard.h counts their frames in gRPC's own reads.)
 *
 * Each direction holds at most one read's bytes (TTD_RELAY_CHUNK) that the other side could
 * not take yet, and reads no more until they are gone: a side that stops reading stops the
 * other side's reads, so nothing makes ttd buffer without bound. Runs threads of its own,
 * each with an epoll set; connections are spread over them. */
#ifndef TTD_RPC_CONN_RELAY_H
#define TTD_RPC_CONN_RELAY_H

#include <openssl/ssl.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "rpc/h2_frames.h"

/* The most one read takes from a side, and so the most a direction holds back. */
#define TTD_RELAY_CHUNK (256 * 1024)

typedef struct ttd_conn_relay ttd_conn_relay;

/* A relayed connection has ended: both of the relay's descriptors are closed. why is
 * TTD_H2_PASS for an ordinary end (either side closed), else what the peer did. Called on a
 * relay thread, once per connection, never after ttd_conn_relay_destroy began. */
typedef void (*ttd_conn_relay_end_fn)(void *arg, void *cookie, ttd_h2_verdict why);

/* A relay with `threads` threads (at least 1), started; each connection's peer may reset
 * max_resets streams at once and max_resets a second, and must open its first stream within
 * first_call_ms of its handoff (0: no bound), else it ends with TTD_H2_NO_CALL (checked
 * every RELAY_SWEEP_MS). RESOURCE_EXHAUSTED when threads or descriptors cannot be had. */
ttd_status_t ttd_conn_relay_create(int threads, int max_resets, int64_t first_call_ms, ttd_conn_relay_end_fn end,
                                   void *end_arg, ttd_conn_relay **out_relay);

/* Relays between peer_fd (a connected TCP socket, with ssl the TLS session over it whose
 * handshake is done) and local_fd (a socketpair end whose other end gRPC reads). first holds
 * bytes already read from the peer (its preface), passed on first and parsed like the rest.
 * Takes peer_fd, ssl and local_fd whatever it returns (closes and frees them on an error).
 * cookie is passed to the end callback. Any thread. */
ttd_status_t ttd_conn_relay_add(ttd_conn_relay *r, int peer_fd, SSL *ssl, int local_fd, const uint8_t *first,
                                size_t first_len, void *cookie);

/* Stops the threads and closes every connection still relayed, without end callbacks.
 * NULL ok. */
void ttd_conn_relay_destroy(ttd_conn_relay *r);

#endif
