/* What a listener is secured with, and why one could not be opened: the TLS files read and
 * checked so that an error names the file to fix, and the OpenSSL context the connection
 * gate ends TLS with. */
#ifndef TTD_RPC_LISTENER_CREDENTIALS_H
#define TTD_RPC_LISTENER_CREDENTIALS_H

#include <openssl/ssl.h>

#include "base/config.h"
#include "base/status.h"

/* The credentials of one listener: Unix sockets are plain (the file's mode and group guard
 * them: *out NULL); TCP is TLS from --tls-cert/--tls-key (mutual with --tls-client-ca), or
 * plain (*out NULL) only with --insecure. A TLS context serves TLS 1.2 and later, selects
 * ALPN "h2" (a client that does not offer it is refused, as gRPC's own server did) and, with
 * --tls-client-ca, requires a client certificate that CA signed. The files are read here,
 * once: a reload leaves the running listeners' certificate as it is. The caller frees *out
 * with SSL_CTX_free. INVALID_ARGUMENT naming the option or file to fix. */
ttd_status_t ttd_listener_credentials(const ttd_config *config, const char *address, SSL_CTX **out);

#endif
