#include "wire/tokens.h"

#include <ctype.h>
#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/config.h"
#include "base/random.h"

void ttd_token_digest(const char *token, size_t len, unsigned char out[TTD_TOKEN_DIGEST_BYTES]) {
  unsigned int n = 0;
  EVP_Digest(token, len, out, &n, EVP_sha256(), NULL);
}

void ttd_token_digest_text(const char *token, size_t len, char *out, size_t size) {
  unsigned char d[TTD_TOKEN_DIGEST_BYTES];
  ttd_token_digest(token, len, d);
  char hex[2 * TTD_TOKEN_DIGEST_BYTES + 1];
  for (int i = 0; i < TTD_TOKEN_DIGEST_BYTES; i++) snprintf(hex + 2 * i, 3, "%02x", d[i]);
  snprintf(out, size, "sha256:%s", hex);
}

void ttd_token_generate(char *out, size_t size) {
  static const char alphabet[] = "abcdefghijklmnopqrstuvwxyz234567";
  char token[48] = "ttd_";
  uint64_t bits = 0;
  int have = 0;
  for (int i = 0; i < 40; i++) {
    if (have < 5) {
      bits = ttd_random_u64();
      have = 64;
    }
    token[4 + i] = alphabet[bits & 31];
    bits >>= 5;
    have -= 5;
  }
  token[44] = '\0';
  snprintf(out, size, "%s", token);
}

ttd_tokens *ttd_tokens_retain(ttd_tokens *tokens) {
  if (tokens) atomic_fetch_add_explicit(&tokens->refs, 1, memory_order_relaxed);
  return tokens;
}

void ttd_tokens_release(ttd_tokens *tokens) {
  if (!tokens || atomic_fetch_sub_explicit(&tokens->refs, 1, memory_order_acq_rel) != 1) return;
  OPENSSL_cleanse(tokens->tenants, tokens->count * sizeof(ttd_tenant));
  free(tokens);
}

const ttd_tenant *ttd_tokens_match(const ttd_tokens *tokens, const char *token, size_t len) {
  unsigned char d[TTD_TOKEN_DIGEST_BYTES];
  ttd_token_digest(token, len, d);
  const ttd_tenant *found = NULL;
  for (size_t i = 0; i < tokens->count; i++) {
    /* Every entry is compared, whatever matched before. */
    int differs = CRYPTO_memcmp(d, tokens->tenants[i].digest, sizeof(d));
    if (!differs) found = &tokens->tenants[i];
  }
  return found;
}

const ttd_tenant *ttd_tokens_find(const ttd_tokens *tokens, const char *name) {
  for (size_t i = 0; i < tokens->count; i++) {
    if (strcmp(tokens->tenants[i].name, name) == 0) return &tokens->tenants[i];
  }
  return NULL;
}

static int valid_name(const char *s, size_t len) {
  if (len == 0 || len >= TTD_TENANT_NAME_MAX) return 0;
  for (size_t i = 0; i < len; i++) {
    if (!isalnum((unsigned char)s[i]) && s[i] != '.' && s[i] != '_' && s[i] != '-') return 0;
  }
  return 1;
}

static int parse_digest(const char *s, size_t len, unsigned char out[TTD_TOKEN_DIGEST_BYTES]) {
  if (len != 7 + 2 * TTD_TOKEN_DIGEST_BYTES || strncmp(s, "sha256:", 7) != 0) return -1;
  for (int i = 0; i < TTD_TOKEN_DIGEST_BYTES; i++) {
    unsigned v = 0;
    for (int k = 0; k < 2; k++) {
      char c = (char)tolower((unsigned char)s[7 + 2 * i + k]);
      int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (d < 0) return -1;
      v = v * 16 + (unsigned)d;
    }
    out[i] = (unsigned char)v;
  }
  return 0;
}

#define FAIL(...)                                                                  \
  do {                                                                             \
    status = ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, __VA_ARGS__);           \
    goto done;                                                                     \
  } while (0)

/* A whole number from 1 to max, all of text; -1 otherwise. */
static int parse_count(const char *text, long max, uint32_t *out) {
  char *end = NULL;
  errno = 0;
  long n = strtol(text, &end, 10);
  if (end == text || *end || errno || n < 1 || n > max) return -1;
  *out = (uint32_t)n;
  return 0;
}

ttd_status_t ttd_tokens_parse(const char *text, const char *source, ttd_tokens **out_tokens) {
  *out_tokens = NULL;
  size_t lines = 1;
  for (const char *p = text; *p; p++) lines += *p == '\n';
  ttd_tokens *t = calloc(1, sizeof(*t) + lines * sizeof(ttd_tenant));
  if (t) atomic_init(&t->refs, 1);
  char *copy = strdup(text);
  ttd_status_t status = TTD_OK;
  if (!t || !copy) {
    status = ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory reading %s", source);
    goto done;
  }
  int line_no = 0;
  for (char *line = copy, *next; line; line = next) {
    next = strchr(line, '\n');
    if (next) *next++ = '\0';
    line_no++;
    char *hash = strchr(line, '#');
    if (hash) *hash = '\0';
    char *save = NULL;
    char *name = strtok_r(line, " \t\r", &save);
    if (!name) continue;
    if (!valid_name(name, strlen(name))) {
      FAIL("%s:%d: tenant name '%.80s' must be 1-%d characters of A-Z a-z 0-9 . _ -", source, line_no, name,
           TTD_TENANT_NAME_MAX - 1);
    }
    ttd_tenant *tenant = &t->tenants[t->count];
    snprintf(tenant->name, sizeof(tenant->name), "%s", name);
    char *digest = strtok_r(NULL, " \t\r", &save);
    if (!digest || parse_digest(digest, strlen(digest), tenant->digest) != 0) {
      FAIL("%s:%d: tenant %s needs the token's digest as sha256: and 64 hex digits (ttctl token hash prints it)",
           source, line_no, name);
    }
    for (char *word; (word = strtok_r(NULL, " \t\r", &save));) {
      if (strcmp(word, "admin") == 0) {
        tenant->admin = true;
      } else if (strncmp(word, "quota=", 6) == 0) {
        if (ttd_config_parse_size(word + 6, &tenant->quota) != 0 || tenant->quota == 0) {
          FAIL("%s:%d: quota of tenant %s must be a byte size above 0 such as 512M or 4G, got '%.40s'", source,
               line_no, name, word + 6);
        }
      } else if (strncmp(word, "max_sessions=", 13) == 0) {
        if (parse_count(word + 13, TTD_MAX_SESSIONS_LIMIT, &tenant->max_sessions) != 0) {
          FAIL("%s:%d: max_sessions of tenant %s must be a whole number from 1 to %d, got '%.40s'", source, line_no,
               name, TTD_MAX_SESSIONS_LIMIT, word + 13);
        }
      } else if (strncmp(word, "weight=", 7) == 0) {
        if (parse_count(word + 7, TTD_MAX_WEIGHT, &tenant->weight) != 0) {
          FAIL("%s:%d: weight of tenant %s must be a whole number from 1 to %d, got '%.40s'", source, line_no, name,
               TTD_MAX_WEIGHT, word + 7);
        }
      } else {
        FAIL("%s:%d: unknown option '%.40s' for tenant %s; use admin, quota=SIZE, max_sessions=N or weight=N", source,
             line_no, word, name);
      }
    }
    for (size_t i = 0; i < t->count; i++) {
      if (strcmp(t->tenants[i].name, name) == 0) FAIL("%s:%d: tenant %s is listed twice", source, line_no, name);
      if (memcmp(t->tenants[i].digest, tenant->digest, TTD_TOKEN_DIGEST_BYTES) == 0) {
        FAIL("%s:%d: tenants %s and %s have the same token; give each its own", source, line_no, t->tenants[i].name,
             name);
      }
    }
    t->count++;
  }
done:
  free(copy);
  if (status) {
    ttd_tokens_release(t);
    return status;
  }
  *out_tokens = t;
  return TTD_OK;
}

ttd_status_t ttd_tokens_load(const char *path, ttd_tokens **out_tokens) {
  *out_tokens = NULL;
  char *text;
  TTD_RETURN_IF_ERROR(ttd_read_text_file(path, "tokens file", &text));
  ttd_status_t status = ttd_tokens_parse(text, path, out_tokens);
  free(text);
  return status;
}
