/* TLS ended by ttd on its TCP listeners, with OpenSSL: the listeners' context, and the
 * server side of one connection's handshake, driven without blocking by the connection gate
 * (conn_gate.h); after it the relay (conn_relay.h) reads and writes through the session. */
#ifndef TTD_RPC_TLS_SERVER_H
#define TTD_RPC_TLS_SERVER_H

#include <openssl/ssl.h>
#include <stddef.h>

#include "base/status.h"

/* A context serving cert (a PEM chain, leaf first) with key: TLS 1.2 and later, ALPN "h2"
 * only (a client offering other protocols is refused in the handshake), and with ca (a PEM
 * bundle, or NULL) a client certificate that ca signed is required. Partial writes on; no
 * renegotiation, session tickets or cache. The caller frees *out with SSL_CTX_free.
 * INVALID_ARGUMENT saying what OpenSSL refused. */
ttd_status_t ttd_tls_server_context(const char *cert, const char *key, const char *ca, SSL_CTX **out);

/* A server session over fd (non-blocking; not taken), its handshake not begun. Until
 * ttd_tls_server_handshake says TTD_TLS_DONE the session writes to memory, which the
 * handshake sends on, so that a failed handshake sends no alert: gRPC's own TLS server sends
 * none, and its clients tell a closed connection apart as a refusal. NULL when out of memory. */
SSL *ttd_tls_server_session(SSL_CTX *ctx, int fd);

typedef enum ttd_tls_step {
  TTD_TLS_WANT_READ,  /* call again when fd is readable */
  TTD_TLS_WANT_WRITE, /* call again when fd is writable */
  TTD_TLS_DONE,       /* the session reads and writes fd from here (ALPN h2 chosen) */
  TTD_TLS_FAILED,     /* refused: what the client sent is read, so closing fd sends no reset */
} ttd_tls_step;

/* Advances ssl's handshake (a session of ttd_tls_server_session) over fd. On TTD_TLS_FAILED,
 * why holds the reason ("... certificate verify failed", "the client did not offer HTTP/2
 * (ALPN h2)"). Not again after TTD_TLS_DONE. The thread that owns the connection. */
ttd_tls_step ttd_tls_server_handshake(SSL *ssl, int fd, char *why, size_t why_size);

#endif
