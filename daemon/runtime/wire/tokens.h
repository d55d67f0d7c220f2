/* Tenants and their bearer tokens (--tokens FILE). Only SHA-256 digests of tokens are
 * stored, in the file and in memory; a presented token is hashed and compared with every
 * tenant's digest in constant time, so neither the match nor its position leaks through
 * timing.
 *
 * File format, one tenant per line, `#` starts a comment:
 *   NAME sha256:HEX64 [admin] [quota=SIZE] [max_sessions=N] [weight=N]
 * NAME is 1-63 characters of [A-Za-z0-9._-]; `admin` lets the tenant list and kill every
 * session; quota= caps the device memory of each of its sessions. `ttctl token new NAME`
 * prints a fresh token and its line.
 *
 * A table is immutable once loaded and reference counted, so a SIGHUP reload swaps in a
 * new one while calls still hold the old. */
#ifndef TTD_TOKENS_H
#define TTD_TOKENS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#define TTD_TENANT_NAME_MAX 64
#define TTD_TOKEN_DIGEST_BYTES 32

/* The most sessions a tenant's max_sessions= or --max-sessions may allow at once, and the
 * largest weight=. */
#define TTD_MAX_SESSIONS_LIMIT 65536
#define TTD_MAX_WEIGHT 1000

typedef struct ttd_tenant {
  char name[TTD_TENANT_NAME_MAX];
  bool admin;
  uint64_t quota; /* per-session limit; 0 = the daemon's --quota */
  uint32_t max_sessions; /* open sessions at once; 0 = the daemon's --max-sessions */
  uint32_t weight;       /* share of the cards against other tenants; 0 = 1 */
  unsigned char digest[TTD_TOKEN_DIGEST_BYTES];
} ttd_tenant;

typedef struct ttd_tokens {
  atomic_int refs;
  size_t count;
  ttd_tenant tenants[];
} ttd_tokens;

/* Parses the text of a tokens file. INVALID_ARGUMENT naming source:line and what to fix
 * (bad name, bad digest, unknown option, a tenant or digest given twice). */
ttd_status_t ttd_tokens_parse(const char *text, const char *source, ttd_tokens **out_tokens);

/* Reads and parses a tokens file. */
ttd_status_t ttd_tokens_load(const char *path, ttd_tokens **out_tokens);

ttd_tokens *ttd_tokens_retain(ttd_tokens *tokens);
void ttd_tokens_release(ttd_tokens *tokens); /* accepts NULL */

/* The tenant whose digest matches the token, or NULL. Constant time in the token's
 * position in the table. */
const ttd_tenant *ttd_tokens_match(const ttd_tokens *tokens, const char *token, size_t len);

/* The tenant named name, or NULL. */
const ttd_tenant *ttd_tokens_find(const ttd_tokens *tokens, const char *name);

/* SHA-256 of a token. */
void ttd_token_digest(const char *token, size_t len, unsigned char out[TTD_TOKEN_DIGEST_BYTES]);

/* "sha256:" and 64 lower-case hex digits of the token's digest, into out (at least 72 bytes). */
void ttd_token_digest_text(const char *token, size_t len, char *out, size_t size);

/* A new random token, "ttd_" and 40 base32 characters (200 bits), into out (>= 48 bytes). */
void ttd_token_generate(char *out, size_t size);

#endif
