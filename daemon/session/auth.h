/* Who may call, as whom, with how much memory: the tenants table (--tokens) and the
 * default session quota (--quota), both replaced together by a SIGHUP reload.
 *
 * Without a tokens file every caller is the tenant "local": the Unix socket's mode and
 * group decide who may connect, and admin rights go only to ttd's own user and root over
 * a Unix socket file (rpc/dispatch.c, from the credentials the connection gate read).
 * With one, every call needs `authorization: Bearer TOKEN` metadata; a missing or unknown
 * token is UNAUTHENTICATED. Thread-safe. */
#ifndef TTD_AUTH_H
#define TTD_AUTH_H

#include <pthread.h>

#include "device/quota.h"
#include "session/session.h"
#include "wire/tokens.h"

#define TTD_LOCAL_TENANT "local"

/* The caller of one call: a copy, so that a reload cannot change it mid-call. */
typedef struct ttd_principal {
  char tenant[TTD_TENANT_NAME_MAX];
  bool admin;
  bool by_token; /* named by a token; else the local tenant of a ttd without tokens, whose
                  * admin rights hold only for ttd's user and root over a Unix socket file
                  * (dispatch.c) */
  uint8_t token_digest[TTD_TOKEN_DIGEST_BYTES]; /* by_token: its token's SHA-256, as the file has it */
} ttd_principal;

typedef struct ttd_auth {
  pthread_mutex_t lock;
  ttd_tokens *tokens;     /* NULL: no tokens file */
  uint64_t default_quota; /* --quota; 0 = none */
  uint32_t default_max_sessions; /* --max-sessions */
  struct ttd_tenant_quota *tenant_quotas; /* one per tenant admitted so far, under lock */
  size_t n_tenant_quotas;
} ttd_auth;

/* Takes the tokens reference (NULL for none). */
void ttd_auth_init(ttd_auth *auth, ttd_tokens *tokens, uint64_t default_quota, uint32_t default_max_sessions);
void ttd_auth_destroy(ttd_auth *auth);

/* Swaps in a new table (taking its reference) and default quota. */
void ttd_auth_replace(ttd_auth *auth, ttd_tokens *tokens, uint64_t default_quota, uint32_t default_max_sessions);

/* Whether a caller can be tenant_name now: a tenant of the tokens file, or, without one,
 * the local tenant. */
bool ttd_auth_tenant_known(ttd_auth *auth, const char *tenant_name);

/* The quota bounding the sum over tenant_name's sessions (its quota=, else --quota; 0: none),
 * one reference for the caller; made at the tenant's first session, its limit set again at
 * each reload. NULL when out of memory. */
ttd_quota *ttd_auth_tenant_quota(ttd_auth *auth, const char *tenant_name);

/* tenant_name's share of the cards against other tenants: its weight=, else 1. */
uint32_t ttd_auth_weight(ttd_auth *auth, const char *tenant_name);

/* The most sessions tenant_name may hold open at once: its max_sessions=, else the default. */
uint32_t ttd_auth_max_sessions(ttd_auth *auth, const char *tenant_name);

/* Resolves the value of the `authorization` metadata (NULL when absent) into a principal. */
ttd_status_t ttd_auth_check(ttd_auth *auth, const char *authorization, size_t len, ttd_principal *out);

/* Whether the table now in force still admits principal, resolved before a reload may have
 * swapped the table: UNAUTHENTICATED, as ttd_auth_check answers, when its token (or, for
 * a principal without one, its tenant) is gone. */
ttd_status_t ttd_auth_recheck(ttd_auth *auth, const ttd_principal *principal);

/* Whether tokens (NULL: no tokens file) admit session: its tenant is listed with the very
 * token that opened or resumed it (compared in constant time); a session with no token
 * recorded needs only its tenant listed, and without tokens only the local tenant's
 * sessions stay. A reload ends every session this refuses. */
bool ttd_auth_admits_session(const ttd_tokens *tokens, ttd_session *session);

/* The quota of a session of tenant that asked for `asked` bytes (0: as much as allowed):
 * the tenant's limit (quota= in the tokens file), else --quota, or asked when smaller.
 * Asking for more is RESOURCE_EXHAUSTED naming the most this tenant may have. asked 0
 * gives that most (0 itself meaning no quota). */
ttd_status_t ttd_auth_session_quota(ttd_auth *auth, const char *tenant, uint64_t asked, uint64_t *out_quota);

#endif
