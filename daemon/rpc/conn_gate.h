/* The connection gate: ttd's own accept loop for the plain-text listeners that gRPC 1.51 can
 * be handed connections of (TCP with --insecure, unix-abstract:), and the prober that tells
 * whether every listener, gRPC's own included, still takes connections. Runs two threads of
 * its own; hands each admitted connection to the gRPC server through a callback.
 *
 * Why: gRPC 1.51's accept loop stops for good at the first EMFILE, bounds nothing per peer,
 * and has no handshake timeout for plain text. The gate bounds connections per peer (TCP:
 * the address; Unix: the uid) and in total, closes a peer that has not sent the HTTP/2 client
 * preface within the handshake timeout, keeps accepting after EMFILE (a reserve descriptor
 * is given up to accept and close the connection it cannot hold), and closes a connection
 * whose client resets calls faster than TTD_GATE_MAX_RESETS a second (HTTP/2 rapid reset),
 * counted by the RPC layer as cancelled calls arrive (ttd_conn_gate_note_reset). */
#ifndef TTD_RPC_CONN_GATE_H
#define TTD_RPC_CONN_GATE_H

#include <netdb.h>
#include <stdbool.h>

#include "core/core.h"

/* Resets a connection's calls may take a second (a bucket this deep, refilled at this rate)
 * before the gate closes it. A client that cancels its own calls does so a few at a time. */
#define TTD_GATE_MAX_RESETS 200
/* How often the prober checks every listener, and how long one answer may take. */
#define TTD_GATE_PROBE_MS 1000
#define TTD_GATE_PROBE_TIMEOUT_MS 2000

typedef struct ttd_conn_gate ttd_conn_gate;

/* Receives an admitted connection's descriptor, which gRPC then owns (and closes). */
typedef void (*ttd_conn_gate_handoff_fn)(void *arg, int fd);

/* Whether the gate, rather than gRPC, listens on address (plain text: unix-abstract:, or TCP
 * with --insecure and no TLS). unix: socket files stay gRPC's: calls over them must keep
 * gRPC's "unix:" peer name, which admin rights without a token depend on. */
bool ttd_conn_gate_owns(const ttd_config *config, const char *address);

/* Resolves a TCP "host:port" for listening (AI_PASSIVE); INVALID_ARGUMENT naming it. The
 * caller frees *out with freeaddrinfo. */
ttd_status_t ttd_conn_gate_resolve(const char *address, struct addrinfo **out);

/* A gate for core's config (its bounds, --listen). Nothing listens yet. */
ttd_status_t ttd_conn_gate_create(ttd_core *core, ttd_conn_gate_handoff_fn handoff, void *arg,
                                  ttd_conn_gate **out_gate);

/* Binds and listens on address (one the gate owns); UNAVAILABLE / INVALID_ARGUMENT naming
 * it. Before ttd_conn_gate_start. */
ttd_status_t ttd_conn_gate_listen(ttd_conn_gate *gate, const char *address);

/* Starts the accept thread and the prober (which also watches gRPC's own listeners, named
 * in config->listen, and sets core->metrics.listeners_down). */
ttd_status_t ttd_conn_gate_start(ttd_conn_gate *gate);

/* Whether the gate listens anywhere (else no call comes over its connections). NULL ok. */
bool ttd_conn_gate_listening(const ttd_conn_gate *gate);

/* The client of the connection gRPC names "fd:FD" cancelled a call. Any thread. */
void ttd_conn_gate_note_reset(ttd_conn_gate *gate, int fd);

/* Stops accepting and the threads, closes connections not yet handed over. NULL ok. */
void ttd_conn_gate_destroy(ttd_conn_gate *gate);

#endif
