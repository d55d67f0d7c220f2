/* ttctl token new / token hash: tokens for a --tokens file, made with the daemon's own
 * helpers (daemon/runtime/wire/tokens.h) so that ttctl and ttd cannot disagree. No daemon is involved. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/config.h"
#include "wire/tokens.h"
#include "ttctl.h"

/* Prints a fresh token and the tokens-file line for it, which the daemon's parser has read
 * back as this very tenant (so the name and options are known to be valid). */
static int token_new(const ttctl_options *options, int argc, char **args) {
  if (argc != 1) return ttctl_usage_error("token new needs one NAME, the tenant's name");
  const char *name = args[0];
  uint64_t quota = 0;
  if (options->quota && (ttd_config_parse_size(options->quota, &quota) != 0 || quota == 0)) {
    return ttctl_usage_error("--quota must be a byte size above 0 such as 512M or 4G, got '%s'", options->quota);
  }
  if (!*name || strpbrk(name, " \t\r\n#")) {
    return ttctl_usage_error("tenant name '%s' must be 1-63 characters of A-Z a-z 0-9 . _ -", name);
  }
  char token[64], digest[80], line[256];
  ttd_token_generate(token, sizeof(token));
  ttd_token_digest_text(token, strlen(token), digest, sizeof(digest));
  int len = snprintf(line, sizeof(line), "%s %s%s%s%s", name, digest, options->admin ? " admin" : "",
                     options->quota ? " quota=" : "", options->quota ? options->quota : "");
  if (len < 0 || (size_t)len >= sizeof(line)) {
    explicit_bzero(token, sizeof(token));
    return ttctl_usage_error("the tenant name or quota is too long for a tokens-file line");
  }
  ttd_tokens *parsed = NULL;
  ttd_status_t status = ttd_tokens_parse(line, "token new", &parsed);
  int rc = TTCTL_OK;
  if (status) {
    rc = ttctl_usage_error("%s", ttd_status_message(status));
  } else if (parsed->count != 1 || strcmp(parsed->tenants[0].name, name) != 0) {
    rc = ttctl_usage_error("tenant name '%s' does not read back from a tokens file", name);
  } else {
    printf("%s\n%s\n", token, line);
  }
  ttd_status_free(status);
  ttd_tokens_release(parsed);
  explicit_bzero(token, sizeof(token));
  return rc;
}

/* Reads one token from stdin (a trailing line break is not part of it) and prints its
 * digest, for a token an operator chose or received. */
static int token_hash(int argc, char **args) {
  if (argc != 0) return ttctl_usage_error("token hash reads the token from stdin and takes no arguments");
  char buf[1024];
  size_t len = fread(buf, 1, sizeof(buf), stdin);
  int rc = TTCTL_OK;
  int too_long = len == sizeof(buf);
  while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r')) len--;
  if (too_long) {
    rc = ttctl_usage_error("the token on stdin is longer than %zu bytes", sizeof(buf) - 2);
  } else if (len == 0) {
    rc = ttctl_usage_error("token hash reads the token from stdin, and stdin is empty");
  } else if (memchr(buf, '\n', len) || memchr(buf, '\r', len)) {
    rc = ttctl_usage_error("stdin holds more than one line; give one token");
  } else {
    char digest[80];
    ttd_token_digest_text(buf, len, digest, sizeof(digest));
    printf("%s\n", digest);
  }
  explicit_bzero(buf, sizeof(buf));
  return rc;
}

int ttctl_cmd_token(const ttctl_options *options, int argc, char **args) {
  if (argc >= 1 && strcmp(args[0], "new") == 0) return token_new(options, argc - 1, args + 1);
  if (options->admin || options->quota) return ttctl_usage_error("--admin and --quota apply to token new only");
  if (argc >= 1 && strcmp(args[0], "hash") == 0) return token_hash(argc - 1, args + 1);
  return ttctl_usage_error("token needs a subcommand: new NAME [--admin] [--quota SIZE], or hash");
}
