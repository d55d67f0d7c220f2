#include "session/auth.h"

#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "device/quota.h"

typedef struct ttd_tenant_quota {
  char name[TTD_TENANT_NAME_MAX];
  ttd_quota *quota;
} ttd_tenant_quota;

/* The tenant's limit over all its sessions; lock held. */
static uint64_t tenant_limit(const ttd_auth *auth, const char *tenant_name) {
  const ttd_tenant *tenant = auth->tokens ? ttd_tokens_find(auth->tokens, tenant_name) : NULL;
  return tenant && tenant->quota ? tenant->quota : auth->default_quota;
}

/* Sets every tenant quota's limit from the current tokens; lock held. */
static void update_tenant_limits(ttd_auth *auth) {
  for (size_t i = 0; i < auth->n_tenant_quotas; i++) {
    ttd_quota_set_limit(auth->tenant_quotas[i].quota, tenant_limit(auth, auth->tenant_quotas[i].name));
  }
}

void ttd_auth_init(ttd_auth *auth, ttd_tokens *tokens, uint64_t default_quota, uint32_t default_max_sessions) {
  pthread_mutex_init(&auth->lock, NULL);
  auth->tokens = tokens;
  auth->default_quota = default_quota;
  auth->default_max_sessions = default_max_sessions;
  auth->tenant_quotas = NULL;
  auth->n_tenant_quotas = 0;
}

void ttd_auth_destroy(ttd_auth *auth) {
  ttd_tokens_release(auth->tokens);
  auth->tokens = NULL;
  for (size_t i = 0; i < auth->n_tenant_quotas; i++) ttd_quota_release(auth->tenant_quotas[i].quota);
  free(auth->tenant_quotas);
  auth->tenant_quotas = NULL;
  auth->n_tenant_quotas = 0;
  pthread_mutex_destroy(&auth->lock);
}

void ttd_auth_replace(ttd_auth *auth, ttd_tokens *tokens, uint64_t default_quota, uint32_t default_max_sessions) {
  pthread_mutex_lock(&auth->lock);
  ttd_tokens *old = auth->tokens;
  auth->tokens = tokens;
  auth->default_quota = default_quota;
  auth->default_max_sessions = default_max_sessions;
  update_tenant_limits(auth);
  pthread_mutex_unlock(&auth->lock);
  ttd_tokens_release(old);
}

bool ttd_auth_tenant_known(ttd_auth *auth, const char *tenant_name) {
  pthread_mutex_lock(&auth->lock);
  bool known = auth->tokens ? ttd_tokens_find(auth->tokens, tenant_name) != NULL
                            : strcmp(tenant_name, TTD_LOCAL_TENANT) == 0;
  pthread_mutex_unlock(&auth->lock);
  return known;
}

ttd_quota *ttd_auth_tenant_quota(ttd_auth *auth, const char *tenant_name) {
  pthread_mutex_lock(&auth->lock);
  ttd_quota *q = NULL;
  for (size_t i = 0; i < auth->n_tenant_quotas && !q; i++) {
    if (strcmp(auth->tenant_quotas[i].name, tenant_name) == 0) q = ttd_quota_retain(auth->tenant_quotas[i].quota);
  }
  if (!q) {
    ttd_tenant_quota *grown = realloc(auth->tenant_quotas, sizeof(*grown) * (auth->n_tenant_quotas + 1));
    ttd_quota *made = grown ? ttd_quota_create_tenant(tenant_limit(auth, tenant_name), tenant_name) : NULL;
    if (grown) auth->tenant_quotas = grown;
    if (made) {
      ttd_tenant_quota *e = &auth->tenant_quotas[auth->n_tenant_quotas++];
      snprintf(e->name, sizeof(e->name), "%s", tenant_name);
      e->quota = made;
      q = ttd_quota_retain(made);
    }
  }
  pthread_mutex_unlock(&auth->lock);
  return q;
}

static ttd_tokens *current_tokens(ttd_auth *auth, uint64_t *out_default_quota) {
  pthread_mutex_lock(&auth->lock);
  ttd_tokens *t = ttd_tokens_retain(auth->tokens);
  if (out_default_quota) *out_default_quota = auth->default_quota;
  pthread_mutex_unlock(&auth->lock);
  return t;
}

/* Whether tokens (NULL: none) admit tenant_name holding the token of digest (NULL: one
 * named without a token). */
static bool admits(const ttd_tokens *tokens, const char *tenant_name, const uint8_t *digest) {
  if (!tokens) return strcmp(tenant_name, TTD_LOCAL_TENANT) == 0;
  const ttd_tenant *tenant = ttd_tokens_find(tokens, tenant_name);
  return tenant && (!digest || CRYPTO_memcmp(tenant->digest, digest, TTD_TOKEN_DIGEST_BYTES) == 0);
}

static ttd_status_t token_not_valid(void) {
  return ttd_make_status(GRPC_STATUS_UNAUTHENTICATED,
                         "the token is not valid for this ttd (unknown or revoked); ask the operator for one");
}

ttd_status_t ttd_auth_check(ttd_auth *auth, const char *authorization, size_t len, ttd_principal *out) {
  memset(out, 0, sizeof(*out));
  ttd_tokens *tokens = current_tokens(auth, NULL);
  if (!tokens) {
    snprintf(out->tenant, sizeof(out->tenant), "%s", TTD_LOCAL_TENANT);
    out->admin = true;
    return TTD_OK;
  }
  ttd_status_t status = TTD_OK;
  if (!authorization) {
    status = ttd_make_status(GRPC_STATUS_UNAUTHENTICATED,
                             "this ttd needs a token: send 'authorization: Bearer TOKEN' metadata "
                             "(libttclient: set TTD_TOKEN or tt_connect_options.token)");
  } else if (len < 7 || strncasecmp(authorization, "Bearer ", 7) != 0) {
    status = ttd_make_status(GRPC_STATUS_UNAUTHENTICATED,
                             "the 'authorization' metadata must read 'Bearer TOKEN'; other schemes are not accepted");
  } else {
    const ttd_tenant *tenant = ttd_tokens_match(tokens, authorization + 7, len - 7);
    if (!tenant) {
      status = token_not_valid();
    } else {
      snprintf(out->tenant, sizeof(out->tenant), "%s", tenant->name);
      out->admin = tenant->admin;
      out->by_token = true;
      memcpy(out->token_digest, tenant->digest, TTD_TOKEN_DIGEST_BYTES);
    }
  }
  ttd_tokens_release(tokens);
  return status;
}

ttd_status_t ttd_auth_recheck(ttd_auth *auth, const ttd_principal *principal) {
  pthread_mutex_lock(&auth->lock);
  bool admitted = admits(auth->tokens, principal->tenant, principal->by_token ? principal->token_digest : NULL);
  pthread_mutex_unlock(&auth->lock);
  return admitted ? TTD_OK : token_not_valid();
}

bool ttd_auth_admits_session(const ttd_tokens *tokens, ttd_session *session) {
  pthread_mutex_lock(&session->lock);
  bool admitted = admits(tokens, session->tenant, session->by_token ? session->token_digest : NULL);
  pthread_mutex_unlock(&session->lock);
  return admitted;
}

uint32_t ttd_auth_weight(ttd_auth *auth, const char *tenant_name) {
  pthread_mutex_lock(&auth->lock);
  const ttd_tenant *tenant = auth->tokens ? ttd_tokens_find(auth->tokens, tenant_name) : NULL;
  uint32_t weight = tenant && tenant->weight ? tenant->weight : 1;
  pthread_mutex_unlock(&auth->lock);
  return weight;
}

uint32_t ttd_auth_max_sessions(ttd_auth *auth, const char *tenant_name) {
  pthread_mutex_lock(&auth->lock);
  const ttd_tenant *tenant = auth->tokens ? ttd_tokens_find(auth->tokens, tenant_name) : NULL;
  uint32_t max = tenant && tenant->max_sessions ? tenant->max_sessions : auth->default_max_sessions;
  pthread_mutex_unlock(&auth->lock);
  return max;
}

ttd_status_t ttd_auth_session_quota(ttd_auth *auth, const char *tenant_name, uint64_t asked, uint64_t *out_quota) {
  uint64_t cap;
  ttd_tokens *tokens = current_tokens(auth, &cap);
  const ttd_tenant *tenant = tokens ? ttd_tokens_find(tokens, tenant_name) : NULL;
  const char *why = "the daemon's --quota";
  if (tenant && tenant->quota) { /* a tenant's own limit replaces the daemon's default */
    cap = tenant->quota;
    why = "the tenant's limit";
  }
  ttd_tokens_release(tokens);
  if (cap && asked > cap) {
    char a[32], c[32];
    return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED,
                           "asked for a session quota of %s (%llu bytes), but tenant %s may have at most %s "
                           "(%llu bytes, %s); ask for less, or 0 for the most allowed",
                           ttd_format_bytes(asked, a, sizeof(a)), (unsigned long long)asked, tenant_name,
                           ttd_format_bytes(cap, c, sizeof(c)), (unsigned long long)cap, why);
  }
  *out_quota = asked ? asked : cap;
  return TTD_OK;
}
