/* The connection gate: ttd's own accept loop for every listener (unix: socket files,
 * unix-abstract:, TCP in plain text with --insecure and TCP with TLS), and the prober that
 * tells whether every listener still takes connections. Runs two threads of its own; hands
 * each admitted connection to the gRPC server through a callback, and remembers who is at
 * its other end (ttd_conn_gate_peer).
 *
 * Why: gRPC 1.51's accept loop stops for good at the first EMFILE, bounds nothing per peer,
 * has no handshake timeout for plain text, names a Unix caller only "unix:", without its
 * user, and reads and queues every frame a peer sends before ttd sees the first call. The
 * gate reads a Unix peer's credentials (SO_PEERCRED) and a TCP peer's address at accept,
 * bounds connections per peer (TCP: the address; Unix: the uid) and in total, closes a peer
 * that has not sent the HTTP/2 client preface (TLS: finished its handshake and sent the
 * preface) within the handshake timeout, and keeps accepting after EMFILE (a reserve
 * descriptor is given up to accept and close the connection it cannot hold).
 *
 * Every peer's HTTP/2 frames are counted before gRPC parses them, and a peer that resets
 * streams faster than TTD_GATE_MAX_RESETS a second (HTTP/2 rapid reset) or sends a frame gRPC
 * would refuse is closed. A plain-text connection (unix:, unix-abstract:, TCP with --insecure)
 * goes to gRPC as it is (two descriptors: the socket and a duplicate the gate watches for
 * its end), and the read guard (h2_read_guard.h) counts the frames in gRPC's own
 * reads: no copy, no thread hop. A TLS connection goes through the relay (conn_relay.h): the
 * gate ends TLS itself (OpenSSL; ALPN h2; client certificates with --tls-client-ca), gRPC
 * gets one end of a socketpair in plain text, and the relay counts the decrypted frames. */
#ifndef TTD_RPC_CONN_GATE_H
#define TTD_RPC_CONN_GATE_H

#include <netdb.h>
#include <openssl/ssl.h>
#include <stdbool.h>
#include <sys/types.h>

#include "core/core.h"

/* Streams a connection's client may reset a second (a bucket this deep, refilled at this
 * rate) before the gate closes it. A client that cancels its own calls does so a few at a time. */
#define TTD_GATE_MAX_RESETS 200

typedef struct ttd_conn_gate ttd_conn_gate;

/* Who is at the other end of a connection the gate handed over. */
typedef enum ttd_conn_peer_kind {
  TTD_CONN_PEER_UNKNOWN,       /* not a connection the gate handed over */
  TTD_CONN_PEER_UNIX_FILE,     /* a unix: socket file: uid, gid, pid */
  TTD_CONN_PEER_UNIX_ABSTRACT, /* a unix-abstract: socket, which every local user may reach */
  TTD_CONN_PEER_TCP,           /* a TCP address */
  TTD_CONN_PEER_PROBER,        /* ttd's own prober */
} ttd_conn_peer_kind;

typedef struct ttd_conn_peer {
  ttd_conn_peer_kind kind;
  uid_t uid; /* Unix sockets: SO_PEERCRED at accept */
  gid_t gid;
  pid_t pid;
  char name[64]; /* "unix:uid=1000,pid=4242", "unix-abstract:uid=...", "ipv4:127.0.0.1:5555",
                  * "ipv6:[::1]:5555" */
} ttd_conn_peer;

/* Receives an admitted connection's descriptor, which gRPC then owns (and closes). */
typedef void (*ttd_conn_gate_handoff_fn)(void *arg, int fd);

/* Resolves a TCP "host:port" for listening (AI_PASSIVE); INVALID_ARGUMENT naming it. The
 * caller frees *out with freeaddrinfo. */
ttd_status_t ttd_conn_gate_resolve(const char *address, struct addrinfo **out);

/* A gate for core's config (its bounds, --listen). Nothing listens yet. */
ttd_status_t ttd_conn_gate_create(ttd_core *core, ttd_conn_gate_handoff_fn handoff, void *arg,
                                  ttd_conn_gate **out_gate);

/* Binds and listens on address; with tls (TCP only; the gate takes a reference) it ends TLS
 * on each connection, else plain text. UNAVAILABLE / INVALID_ARGUMENT naming it. A unix:
 * socket file is born mode 0660 (no moment where others may connect), owned by
 * --socket-group when given; the caller has removed a stale file, and removes it at the
 * stop. Before ttd_conn_gate_start. */
ttd_status_t ttd_conn_gate_listen(ttd_conn_gate *gate, const char *address, SSL_CTX *tls);

/* Starts the accept thread, the relay's threads when a TCP listener is there, and the
 * listener prober (listener_probe.h). */
ttd_status_t ttd_conn_gate_start(ttd_conn_gate *gate);

/* Whether the gate listens anywhere (else no call comes over its connections). NULL ok. */
bool ttd_conn_gate_listening(const ttd_conn_gate *gate);

/* Who is at the other end of the connection gRPC names "fd:FD": what the gate recorded when
 * it last handed a connection over as FD (kept after the connection ends, overwritten at the
 * next hand-off of that number); kind TTD_CONN_PEER_UNKNOWN when it never handed FD over.
 * Any thread. */
void ttd_conn_gate_peer(ttd_conn_gate *gate, int fd, ttd_conn_peer *out);

/* Stops accepting and the gate's threads, closes connections not yet handed over; the relay
 * goes on relaying the handed ones (calls still draining) until ttd_conn_gate_destroy, and
 * what the gate recorded stays for ttd_conn_gate_peer. Once;
 * the thread that created the gate. NULL ok. */
void ttd_conn_gate_stop(ttd_conn_gate *gate);

/* Stops the gate if it runs, closes every relayed connection and frees it: after gRPC's
 * server is destroyed. NULL ok. */
void ttd_conn_gate_destroy(ttd_conn_gate *gate);

#endif
