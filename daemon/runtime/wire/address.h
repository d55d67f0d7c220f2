/* Where ttd listens, and where a client looks for it, when neither is told an address; one
 * place, so that the two always agree. */
#ifndef TTD_ADDRESS_H
#define TTD_ADDRESS_H

#include <stddef.h>

#define TTD_ADDRESS_MAX 256      /* bytes of an address, with its NUL */
#define TTD_ADDRESS_CANDIDATES 3 /* at most this many default addresses to try */

/* Writes the address a ttd started without --listen serves: unix:/run/ttd/ttd.sock as root
 * (the system service's), else unix:$XDG_RUNTIME_DIR/ttd.sock, else unix:/tmp/ttd-UID/ttd.sock.
 * Returns 0, or -1 when it does not fit in len. */
int ttd_default_address(char *buf, size_t len);

/* The addresses a client tries when told none, in order: the user's own daemon (the
 * default address above, when not root), then the system service's socket, which members
 * of group ttd may use. Returns how many were written (at most max). */
int ttd_default_client_addresses(char out[][TTD_ADDRESS_MAX], int max);

/* Finds a ttd among the default client addresses: the first whose Unix socket accepts a
 * connection goes to out and 0 is returned. Else -1, and why says every address tried and
 * what each answered (no such file, permission denied, refused), with how to start ttd. */
int ttd_find_default_daemon(char *out, size_t len, char *why, size_t why_len);

/* The same over the n given unix: addresses. */
int ttd_find_daemon_among(const char candidates[][TTD_ADDRESS_MAX], int n, char *out, size_t len, char *why,
                          size_t why_len);

#endif
