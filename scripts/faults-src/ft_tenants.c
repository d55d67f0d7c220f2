/* A tokens file with fresh tokens, through the daemon's own token helpers. */
#include "ft_tenants.h"

#include <stdio.h>
#include <string.h>

#include "wire/tokens.h"

int ft_tenants_write(ft_tenant *tenants, int n, const char *path) {
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  for (int i = 0; i < n; i++) {
    char digest[80];
    ttd_token_generate(tenants[i].token, sizeof(tenants[i].token));
    ttd_token_digest_text(tenants[i].token, strlen(tenants[i].token), digest, sizeof(digest));
    snprintf(tenants[i].env, sizeof(tenants[i].env), "TTD_TOKEN=%s", tenants[i].token);
    fprintf(f, "%s %s %s\n", tenants[i].name, digest, tenants[i].options);
  }
  return fclose(f) ? -1 : 0;
}
