/* The side Unix socket of the same-host fast path (shm_protocol.h): local clients hand
 * their memfd segments to the daemon here, once each. It lives beside the first unix:
 * listener as PATH.shm, mode 0660 like it, on the daemon's libevent loop. The peer's uid
 * (SO_PEERCRED) is recorded: a session's segments all come from one user. */
#ifndef TTD_SHM_LISTENER_H
#define TTD_SHM_LISTENER_H

#include <event2/event.h>

#include "core/core.h"
#include "rpc/call_lane.h"

typedef struct ttd_shm_listener ttd_shm_listener;

/* Listens on path (a filesystem path, no "unix:"); the owner group follows group (NULL:
 * the daemon's). */
ttd_status_t ttd_shm_listener_start(struct event_base *base, ttd_core *core, const char *path, const char *group,
                                    ttd_shm_listener **out_listener);

/* Where TTD_SHM_LANE registers a session's call lane (the server's); until set, lanes are
 * refused UNAVAILABLE. NULL listener ok. */
void ttd_shm_listener_set_lanes(ttd_shm_listener *listener, ttd_lanes *lanes);

/* Closes the socket and every connection, removes the file. NULL ok. */
void ttd_shm_listener_stop(ttd_shm_listener *listener);

#endif
