/* All open sessions of the daemon, keyed by random session id, with lease expiry.
 * Thread-safe. */
#ifndef TTD_SESSION_TABLE_H
#define TTD_SESSION_TABLE_H

#include <pthread.h>

#include "session/session.h"

/* How a session ended, kept for the calls that still name it. */
typedef enum ttd_session_end_kind {
  TTD_SESSION_CLOSED = 1, /* CloseSession by its client */
  TTD_SESSION_EXPIRED,    /* its lease ran out */
  TTD_SESSION_KILLED,     /* KillSession by an admin tenant (ttctl kill) */
  TTD_SESSION_REVOKED,    /* a reload revoked the token it was opened with */
} ttd_session_end_kind;

typedef struct ttd_session_end {
  uint64_t id;
  ttd_session_end_kind kind;
  char tenant[64]; /* whose session it was */
  char by[64];     /* the admin tenant that killed it */
  int64_t at_ms;
} ttd_session_end;

/* The most recent session ends remembered: a bounded ring, whatever clients do. */
#define TTD_SESSION_ENDS_KEPT 256

/* Told when a session with files on disk (on_disk) is resumed or ends: its state files no
 * longer describe it and must go (a resumed session's data file may stay as its spare).
 * Called without the table's lock. */
typedef void (*ttd_session_forget_fn)(void *ctx, ttd_session *session, bool resumed);

typedef struct ttd_session_table {
  pthread_mutex_t lock;
  ttd_handle_map sessions; /* id -> ttd_session* (one reference each) */
  int64_t lease_ms;
  ttd_session_forget_fn forget; /* NULL: no state files */
  void *forget_ctx;
  ttd_session_end ends[TTD_SESSION_ENDS_KEPT]; /* under lock */
  size_t next_end;
} ttd_session_table;

void ttd_session_table_init(ttd_session_table *table, int64_t lease_ms);

/* Closes every session and frees the table. */
void ttd_session_table_destroy(ttd_session_table *table);

/* Opens a session; *out_session is a reference owned by the caller. RESOURCE_EXHAUSTED when
 * its tenant already holds params->max_tenant_sessions. */
ttd_status_t ttd_session_table_open(ttd_session_table *table, const ttd_session_params *params, int64_t now_ms,
                                    ttd_session **out_session);

/* Puts a session read back from saved state under its own id, awaiting its client's
 * resume; the table takes its own reference. ALREADY_EXISTS if the id is taken. */
ttd_status_t ttd_session_table_insert(ttd_session_table *table, ttd_session *session);

/* Hands tenant's session id, awaiting resume, back to the client that holds its secret: a
 * reference for the caller, touched for its lease. NOT_FOUND, with the message of any
 * unknown session, when the id is unknown, another tenant's, not awaiting resume, or the
 * secret differs. */
ttd_status_t ttd_session_table_resume(ttd_session_table *table, uint64_t id, const char *tenant, const uint8_t *secret,
                                      size_t secret_len, int64_t now_ms, ttd_session **out_session);

/* A reference to tenant's open session id, touched for its lease; NOT_FOUND if there is
 * none, or if it belongs to another tenant (the same message: other tenants' sessions
 * are invisible). For the tenant's own session that ended recently, the message says how:
 * closed, expired, or killed and by which admin tenant. tenant NULL: any tenant (admin
 * tools). A session awaiting resume is FAILED_PRECONDITION: its client resumes it first. */
ttd_status_t ttd_session_table_lookup(ttd_session_table *table, uint64_t id, const char *tenant, int64_t now_ms,
                                      ttd_session **out_session);

/* The same, without touching the session: for a caller that checks a secret first (the
 * shared-memory side socket's key) and touches it only once that matches. */
ttd_status_t ttd_session_table_peek(ttd_session_table *table, uint64_t id, const char *tenant, int64_t now_ms,
                                    ttd_session **out_session);

/* References to every open session, for listing and quota reloads: *out_sessions is a
 * new array the caller frees with ttd_session_table_snapshot_free. */
ttd_status_t ttd_session_table_snapshot(ttd_session_table *table, ttd_session ***out_sessions, size_t *out_count);
void ttd_session_table_snapshot_free(ttd_session **sessions, size_t count);

/* Removes and closes the session (closed by its client). */
void ttd_session_table_close(ttd_session_table *table, ttd_session *session, uint64_t *out_tensors,
                             uint64_t *out_bytes);

/* The same for a session an admin tenant (by) killed: its client's next call is told so. */
void ttd_session_table_kill(ttd_session_table *table, ttd_session *session, const char *by, uint64_t *out_tensors,
                            uint64_t *out_bytes);

/* The same for a session whose token a reload revoked: its client's next call is told so. */
void ttd_session_table_revoke(ttd_session_table *table, ttd_session *session, uint64_t *out_tensors,
                              uint64_t *out_bytes);

/* Closes sessions with no call for longer than the lease and none in flight on a card
 * (ttd_session.device_calls), at most TTD_SWEEP_MAX_CLOSE of
 * them (the next call takes the rest): one pass over the table, so the work of a call is
 * linear in the table's size plus the sessions it closes. Returns how many it closed. */
#define TTD_SWEEP_MAX_CLOSE 256
size_t ttd_session_table_sweep(ttd_session_table *table, int64_t now_ms);

size_t ttd_session_table_count(ttd_session_table *table);

/* Open sessions and the tensors they hold, for metrics. */
void ttd_session_table_stats(ttd_session_table *table, uint64_t *out_sessions, uint64_t *out_tensors);

#endif
