/* The address ttd listens on and libttclient connects to when told nothing, so that the two
 * always agree. */
#ifndef TTD_ADDRESS_H
#define TTD_ADDRESS_H

#include <stddef.h>

/* Writes the default address into buf: unix:$XDG_RUNTIME_DIR/ttd.sock, unix:/run/ttd/ttd.sock
 * as root, else unix:/tmp/ttd-UID/ttd.sock. Returns 0, or -1 when it does not fit in len. */
int ttd_default_address(char *buf, size_t len);

#endif
