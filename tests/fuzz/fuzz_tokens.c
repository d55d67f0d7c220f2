/* Fuzz harness: the tokens file parser (daemon/tokens.c) and, on a table it accepts, the
 * check of an `authorization` metadata value against it and the session quota of the
 * tenant found (daemon/auth.c).
 *
 * Input: the first line is the authorization value (its bytes as they are, NULs
 * included), the rest the text of a tokens file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "session/auth.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Aborts unless every tenant of a parsed table reads as the file format promises. */
static void check_table(const ttd_tokens *tokens) {
  for (size_t i = 0; i < tokens->count; i++) {
    const ttd_tenant *t = &tokens->tenants[i];
    size_t len = strnlen(t->name, sizeof(t->name));
    if (len == 0 || len >= sizeof(t->name) || ttd_tokens_find(tokens, t->name) != t) {
      fprintf(stderr, "fuzz: the tokens parser accepted tenant %zu with a bad or repeated name\n", i);
      abort();
    }
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const uint8_t *newline = memchr(data, '\n', size);
  size_t header_len = newline ? (size_t)(newline - data) : size;
  size_t rest = newline ? size - header_len - 1 : 0;
  char *header = malloc(header_len + 1);
  char *text = strndup(newline ? (const char *)newline + 1 : "", rest);
  if (!header || !text) abort();
  memcpy(header, data, header_len);
  header[header_len] = '\0';
  ttd_tokens *tokens = NULL;
  ttd_status_t status = ttd_tokens_parse(text, "fuzz.tokens", &tokens);
  if (!status) {
    check_table(tokens);
    ttd_auth auth;
    ttd_auth_init(&auth, tokens, 1u << 20, 1024);
    ttd_principal principal;
    status = ttd_auth_check(&auth, header, header_len, &principal);
    uint64_t quota = 0;
    if (!status) status = ttd_auth_session_quota(&auth, principal.tenant, header_len * 4096, &quota);
    ttd_auth_destroy(&auth);
  }
  ttd_status_free(status);
  free(text);
  free(header);
  return 0;
}
