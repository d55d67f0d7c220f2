/* What a listener of the gRPC server is secured with, and why one could not be opened: the
 * TLS files read and checked so that an error names the file to fix. */
#ifndef TTD_RPC_LISTENER_CREDENTIALS_H
#define TTD_RPC_LISTENER_CREDENTIALS_H

#include <grpc/grpc_security.h>

#include "base/config.h"
#include "base/status.h"

/* The credentials of one listener: Unix sockets are plain (the file's mode and group guard
 * them); TCP is TLS from --tls-cert/--tls-key (mutual with --tls-client-ca), or plain only
 * with --insecure. INVALID_ARGUMENT naming the option or file to fix. */
ttd_status_t ttd_listener_credentials(const ttd_config *config, const char *address, grpc_server_credentials **out);

/* Why a TCP address cannot be listened on: resolves it and binds a socket to it, so the
 * error says which of syntax, name, port in use or permission it is. */
ttd_status_t ttd_tcp_listen_error(const char *address);

#endif
