/* The daemon's shared-memory side socket spoken by hand (wire/shm_protocol.h): what the
 * transport suites use to register segments and call lanes as a client would, or as a
 * hostile one would not. */
#ifndef TTD_TESTS_SIDE_SOCKET_H
#define TTD_TESTS_SIDE_SOCKET_H

#include <stdint.h>

#include "ttd_harness.h"
#include "wire/shm_protocol.h"

/* A connection to the side socket of proc's daemon (its socket path + ".shm"). */
int harness_side_socket(const ttd_proc *proc);

/* Sends req with fd attached (or none: -1) and returns the reply; the descriptors the reply
 * carries go to out_fds (-1 where none), or are closed when out_fds is NULL. */
ttd_shm_reply harness_side_request(int sock, ttd_shm_request req, int fd, int out_fds[2]);

/* Opens a session with raw gRPC calls: its id (16 hex digits) and side-socket key. */
void harness_open_session_with_key(const ttd_proc *proc, char session[17], uint64_t key[2]);

/* The same for the tenant of "authorization" metadata (NULL: none). */
void harness_open_session_with_key_as(const ttd_proc *proc, const char *authorization, char session[17],
                                      uint64_t key[2]);

#endif
