/* Layer daemon/session: sessions and their handle maps, tenants' tokens and quotas, mapped
 * shared-memory segments. Calls daemon/telemetry and the runtime.
 *
 * A client session: the tensors it created, keyed by random handles, and its lease.
 * Every tensor belongs to exactly one session; a handle is looked up only in the
 * caller's own session, so a foreign, freed and never-issued handle all look the same.
 *
 * Reference counted: calls in flight hold a reference, so a session closed by its lease
 * or by CloseSession stays valid memory until they finish (they then see `closed`).
 * All functions are thread-safe. */
#ifndef TTD_SESSION_H
#define TTD_SESSION_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "session/handle_map.h"
#include "graph/program.h"
#include "device/quota.h"
#include "session/shm_segment.h"
#include "device/tensor.h"
#include "wire/tokens.h"

#define TTD_RESUME_SECRET_BYTES 32

/* A stream of the session that may wait on its client without end: a client that stops
 * reading a Download or sending an Upload, its connection open. Closing the session
 * cancels it, so that the tensor the stream holds goes with the session. A device call
 * registers the same way while its program runs, which closing the session stops. */
typedef struct ttd_session_stream {
  struct ttd_session_stream *prev, *next;
  /* Called once, under the session's lock: must not block, nor take that lock. */
  void (*cancel)(struct ttd_session_stream *stream);
} ttd_session_stream;

typedef struct ttd_session {
  atomic_int refs;
  uint64_t id;
  char client_name[64];
  char tenant[TTD_TENANT_NAME_MAX]; /* only this tenant's calls find the session */
  uint64_t tenant_key;              /* the tenant's group in the device scheduler */
  atomic_uint weight;               /* the tenant's share of the card (weight=), set again at reloads */
  char peer[64];                    /* the client: "unix:uid=N,pid=P", "ipv4:ADDR:PORT", ... */
  int64_t opened_ms;
  uint64_t quota_asked;             /* at OpenSession; 0 = as much as allowed */
  ttd_quota *quota;                 /* device bytes of everything the session made */
  _Atomic int64_t last_seen_ms; /* monotonic ms of the latest call */
  atomic_int queued_calls;      /* device calls waiting for their turn (TTD_SESSION_MAX_QUEUED) */
  atomic_int device_calls;      /* device calls admitted and not yet answered: the lease waits for them */
  atomic_int downloads;         /* Download streams begun and not yet done (TTD_SESSION_MAX_DOWNLOADS) */
  pthread_mutex_t lock;         /* guards everything below */
  bool closed;
  ttd_handle_map tensors;       /* handle -> ttd_tensor* (one reference each) */
  uint64_t tensor_bytes;        /* device bytes held by this session's tensors */
  ttd_handle_map programs;      /* handle -> ttd_program* (one reference each) */
  uint64_t program_bytes;       /* their host memory (ttd_program.host_bytes), summed */
  uint64_t program_charged;     /* what of it the quota carries: past TTD_SESSION_PROGRAM_ALLOWANCE */
  ttd_handle_map runs;          /* handle -> ttd_run* kept for Backward (owned) */
  ttd_handle_map segments;      /* id -> ttd_shm_segment* (one reference each) */
  uid_t segments_uid;           /* every segment comes from this user (SO_PEERCRED) */
  uint64_t segments_bytes;      /* mapped by its segments */
  uint64_t shm_key[2];          /* random; side-socket requests must carry it */
  /* The SHA-256 digest of the token that opened or last resumed the session (the tokens
   * file holds the same digest); a reload that gives its tenant another token ends it.
   * by_token false: opened without a token, or read back from state files and not yet
   * resumed. */
  bool by_token;
  uint8_t token_digest[TTD_TOKEN_DIGEST_BYTES];
  ttd_session_stream *streams;  /* open streams, cancelled at close */
  /* Resuming after a graceful restart (ttd --state-dir): the secret OpenSession hands out,
   * and, for a session read back from the state files, whether its client has yet to
   * resume it (no call finds it until then) and what of its files is on disk (a
   * ttd_on_disk; daemon/state alone changes it once the session is in the table). */
  uint8_t resume_secret[TTD_RESUME_SECRET_BYTES];
  atomic_bool awaiting_resume;
  atomic_int on_disk;
} ttd_session;

/* What of a session's saved state is on disk: nothing; its state files, which a restart
 * resumes; or, once it is resumed, only its data file, kept for its next save to write over
 * in place (daemon/state/state.h says why). */
typedef enum ttd_on_disk { TTD_ON_DISK_NONE, TTD_ON_DISK_STATE, TTD_ON_DISK_SPARE } ttd_on_disk;

/* Who opens a session and what it asks for. */
typedef struct ttd_session_params {
  const char *client_name;
  const char *tenant;
  const char *peer;
  uint64_t quota_asked;
  uint64_t quota; /* the limit granted */
  uint32_t max_tenant_sessions; /* the tenant's sessions open at once, this one included; 0: no bound */
  uint32_t weight;              /* the tenant's share of the card; 0 counts as 1 */
  ttd_quota *tenant_quota;      /* bounds the sum over the tenant's sessions (retained); NULL: none */
  const uint8_t *token_digest;  /* TTD_TOKEN_DIGEST_BYTES of the token that opens it; NULL: none */
} ttd_session_params;

/* Whether secret (len bytes) is the session's resume secret (constant time). */
bool ttd_session_resume_secret_matches(const ttd_session *session, const uint8_t *secret, size_t len);

/* A new open session with one reference owned by the caller. NULL if out of memory. */
ttd_session *ttd_session_create(uint64_t id, const ttd_session_params *params, int64_t now_ms);

ttd_session *ttd_session_retain(ttd_session *session);
void ttd_session_release(ttd_session *session); /* accepts NULL */

/* Records the token that resumed the session (NULL: none), replacing the one that opened it. */
void ttd_session_set_token(ttd_session *session, const uint8_t *token_digest);

/* Records activity for the lease. */
void ttd_session_touch(ttd_session *session, int64_t now_ms);

/* A device call of the session is admitted (waiting for the card or running): the session
 * does not expire until the matching call_end, which restarts its lease at now_ms. */
void ttd_session_device_call_begin(ttd_session *session);
void ttd_session_device_call_end(ttd_session *session, int64_t now_ms);

/* Adds tensor under a new random handle; the session takes its own reference.
 * FAILED_PRECONDITION if the session has been closed meanwhile. */
ttd_status_t ttd_session_tensor_add(ttd_session *session, ttd_tensor *tensor, uint64_t *out_handle);

/* A new reference to the tensor under handle, or NOT_FOUND. */
ttd_status_t ttd_session_tensor_lookup(ttd_session *session, uint64_t handle, ttd_tensor **out_tensor);

/* The device of the first of handles that names a tensor of the session, or -1: tells
 * the scheduler which device a call is for before the handler checks everything. */
int ttd_session_device_of(ttd_session *session, const uint64_t *handles, size_t count);

/* The device of the session's kept run under handle, or -1. */
int ttd_session_run_device(ttd_session *session, uint64_t handle);

/* INVALID_ARGUMENT naming the first handle listed twice (0 aside: never a handle), else OK.
 * Linear in count. */
ttd_status_t ttd_handles_check_distinct(const uint64_t *handles, size_t count);

/* Frees the listed handles, all or nothing: NOT_FOUND if any is unknown, INVALID_ARGUMENT
 * if the list is empty or names a handle twice. */
ttd_status_t ttd_session_tensors_free(ttd_session *session, const uint64_t *handles, size_t count,
                                      uint64_t *out_tensors, uint64_t *out_bytes);

/* Programs one session may hold: each is host memory of the daemon. */
#define TTD_SESSION_MAX_PROGRAMS 256
/* Device calls (Execute, Backward, OptimizerStep) a session may have waiting for the card. */
#define TTD_SESSION_MAX_QUEUED 64
/* Download streams a session may have open at once: each holds its tensor, and a converting
 * one its copy buffers, as long as its client takes to read it. */
#define TTD_SESSION_MAX_DOWNLOADS 64

/* The session's handle of program: the one it already has for a program of the same graph
 * (compiling a graph again is idempotent), else a new random one (the session takes its own reference),
 * charged to its quota (ttd_session_program_charge). RESOURCE_EXHAUSTED past
 * TTD_SESSION_MAX_PROGRAMS distinct programs or the quota, FAILED_PRECONDITION when closed. */
ttd_status_t ttd_session_program_add(ttd_session *session, ttd_program *program, uint64_t *out_handle);

/* The host memory of a session's programs that its quota does not carry: a model's programs
 * (tens of KiB) leave its device accounting exact; a huge graph counts. */
#define TTD_SESSION_PROGRAM_ALLOWANCE ((uint64_t)64 << 10)

/* Adds a program's host memory (program->host_bytes) to the session's, charging its quota
 * with what passes TTD_SESSION_PROGRAM_ALLOWANCE (ttd_session_close refunds it):
 * RESOURCE_EXHAUSTED saying so when it does not fit. With the session's lock held, or
 * before the session is shared. */
ttd_status_t ttd_session_program_charge(ttd_session *session, const ttd_program *program);

/* A new reference to the program under handle, or NOT_FOUND. */
ttd_status_t ttd_session_program_lookup(ttd_session *session, uint64_t handle, ttd_program **out_program);

struct ttd_run;

/* Keeps a run under a new handle; the session owns it from here (even on error). */
ttd_status_t ttd_session_run_add(ttd_session *session, struct ttd_run *run, uint64_t *out_handle);

/* Removes the run under handle and hands it to the caller, or NOT_FOUND. */
ttd_status_t ttd_session_run_take(ttd_session *session, uint64_t handle, struct ttd_run **out_run);

/* Puts a taken run back under its handle (Backward with keep_run). */
ttd_status_t ttd_session_run_put_back(ttd_session *session, uint64_t handle, struct ttd_run *run);

/* Registers stream (its cancel set, its links unused) to be cancelled when the session
 * closes. false, with nothing registered, if the session is closed already. */
bool ttd_session_stream_add(ttd_session *session, ttd_session_stream *stream);

/* Unregisters stream before it ends; a no-op for one never registered (cancel NULL). */
void ttd_session_stream_remove(ttd_session *session, ttd_session_stream *stream);

/* Marks the session closed, cancels its streams and drops every tensor. Idempotent. */
void ttd_session_close(ttd_session *session, uint64_t *out_tensors, uint64_t *out_bytes);

/* Whether key is the session's side-socket key (constant time). */
bool ttd_session_shm_key_matches(const ttd_session *session, const uint64_t key[2]);

/* Adds a registered segment under a new id (the session takes its reference on success).
 * FAILED_PRECONDITION when closed, RESOURCE_EXHAUSTED past TTD_SHM_MAX_SEGMENTS segments or
 * TTD_SHM_MAX_SESSION_BYTES, or when the tenant's sessions hold ttd_shm_segment_tenant_limit()
 * segments together (counted on the tenant's quota, the session quota's parent), PERMISSION_DENIED when uid differs from the session's earlier
 * segments'. */
ttd_status_t ttd_session_segment_add(ttd_session *session, ttd_shm_segment *segment, uid_t uid, uint64_t *out_id);

/* The same under the id wanted (0: a new random one), as a client registers its segments
 * again after resuming the session: ALREADY_EXISTS when the session uses that id. */
ttd_status_t ttd_session_segment_add_as(ttd_session *session, ttd_shm_segment *segment, uid_t uid, uint64_t wanted,
                                        uint64_t *out_id);

/* A new reference to the segment under id, or NOT_FOUND. */
ttd_status_t ttd_session_segment_lookup(ttd_session *session, uint64_t id, ttd_shm_segment **out_segment);

/* Drops the session's reference (calls using it keep theirs); NOT_FOUND if unknown,
 * PERMISSION_DENIED for another uid than the segments'. */
ttd_status_t ttd_session_segment_remove(ttd_session *session, uint64_t id, uid_t uid);

/* The message every unknown handle gets, so that all unknown handles look identical. */
ttd_status_t ttd_session_handle_not_found(uint64_t handle);

#endif
