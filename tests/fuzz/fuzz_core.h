/* The in-process daemon the fuzz harnesses drive: one ttd_core on the simulated backend
 * (2 cards of 1 MiB DRAM and 256 KiB L1), made on first use and kept for the process, and
 * calls of the method table run on it as rpc/server.c runs them, minus the transport:
 * ttd_dispatch_prepare (auth, unpack, session) and then the method's handlers.
 *
 * Each input starts on an empty core and must leave it empty: fuzz_core_end_input closes
 * every session, empties the program cache and aborts unless every device's memory
 * accounting is back to zero. Statuses are checked too: an INTERNAL or UNKNOWN answer to a
 * client's bytes, or OK without a response, aborts (each is a daemon bug). */
#ifndef TTD_FUZZ_CORE_H
#define TTD_FUZZ_CORE_H

#include <grpc/grpc.h>
#include <stddef.h>
#include <stdint.h>

#include "core/core.h"
#include "rpc/call.h"

/* Starts an input: the core (created on the first call; aborts if it cannot be), with the
 * deterministic handle sequence restarted (fuzz_random.h). */
ttd_core *fuzz_core_begin_input(void);

/* Bytes of the shared-memory segment every fuzz session holds. */
#define FUZZ_SHM_BYTES 65536

/* Opens a session of the local tenant directly in the session table, with a quota (0:
 * none) and one shared-memory segment of FUZZ_SHM_BYTES registered (as a local client's
 * side-socket request would; every session shares the one mapping); returns its id. The first session of an input is 0x13 and
 * its segment 0x14 (fuzz_random.h). */
uint64_t fuzz_core_open_session(ttd_core *core, uint64_t quota);

/* Ends an input: closes every session, empties the program cache, asserts the accounting. */
void fuzz_core_end_input(ttd_core *core);

/* Aborts unless every device of backend has 0 bytes in use, naming the device, location
 * and bytes. when says at which point, for the message. */
void fuzz_backend_assert_empty(ttd_backend *backend, const char *when);

/* The descriptors the process holds open (/proc/self/fd). A harness that hands the daemon
 * descriptors or connections compares the count before and after an input: one more is
 * one the daemon kept. */
int fuzz_open_fds(void);

/* The session metadata a call carries. */
typedef enum fuzz_session_md {
  FUZZ_MD_SESSION,        /* ttd-session: the id given */
  FUZZ_MD_NONE,           /* no ttd-session */
  FUZZ_MD_BAD_ID,         /* ttd-session that is not 16 hex digits */
  FUZZ_MD_OTHER_INSTANCE, /* the id given, with a ttd-instance of another daemon */
} fuzz_session_md;

/* A call and the storage of its metadata. */
typedef struct fuzz_call {
  ttd_call call;
  char session_text[20];
} fuzz_call;

/* Readies a call of method as it would be on arrival (ttd_call_init plus metadata). */
void fuzz_call_begin(fuzz_call *fc, ttd_core *core, const ttd_method *method, uint64_t session_id,
                     fuzz_session_md md);

/* Releases the call (ttd_call_deinit). */
void fuzz_call_end(fuzz_call *fc);

/* A byte buffer of data cut into slices of slice_bytes (0: one slice; at most 16 slices,
 * the last takes the rest), as a message arriving in several pieces would be. */
grpc_byte_buffer *fuzz_byte_buffer(const uint8_t *data, size_t len, size_t slice_bytes);

/* Packs a handler's response and unpacks it again, as the server and a client would;
 * aborts when response is NULL or does not survive the round trip. */
void fuzz_check_response(const ttd_method *method, const ProtobufCMessage *response);

/* Frees status, aborting first when its code is not one a client's input may get; what
 * names the method (or part) that answered it. With FUZZ_VERBOSE set in the environment,
 * prints every status (to see what a seed does). */
void fuzz_check_status(const char *what, ttd_status_t status);

/* The method of the table at path ("/ttd.v1.Device/Upload"); aborts if absent. */
const ttd_method *fuzz_method(const char *path);

#endif
