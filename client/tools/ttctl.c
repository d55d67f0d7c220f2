/* ttctl: the operator's tool for ttd, in the spirit of nvidia-smi. This file reads the
 * command line (one table of options) and dispatches; the commands live in
 * ttctl_daemon.c and ttctl_token.c. It uses only libttclient's public API and, for tokens,
 * the daemon's own token helpers. */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ttctl.h"
#include "wire/address.h"
#include "ttd/v1/protocol.h"

static void print_usage(FILE *out) {
  fputs("usage: ttctl [OPTIONS] COMMAND [ARGS]\n"
        "\n"
        "commands:\n"
        "  status                  devices with memory bars, then the open sessions\n"
        "  sessions                every open session: tenant, client, peer, age, idle, memory\n"
        "  kill SESSION            close a session now and free its memory (its 16 hex digits)\n"
        "  ping [--count N]        N round trips (5): min, median and max latency\n"
        "  token new NAME [--admin] [--quota SIZE]\n"
        "                          a new random token (line 1) and its tokens-file line (line 2)\n"
        "  token hash              the sha256: digest of the token read from stdin\n"
        "\n"
        "options (also as --name=VALUE):\n"
        "  --target T              unix:/path or host:port; default $TTD_ADDRESS, then the\n"
        "                          first default socket where a ttd answers (yours, then\n"
        "                          the service's /run/ttd/ttd.sock)\n"
        "  --token TOKEN           bearer token of an admin tenant; default $TTD_TOKEN (which\n"
        "                          keeps it out of the process list)\n"
        "  --tls-ca FILE           PEM roots for the daemon's certificate; default $TTD_TLS_CA\n"
        "  --tls-cert FILE --tls-key FILE\n"
        "                          client certificate and key for mutual TLS\n"
        "  --tls-server-name N     name to check in the daemon's certificate\n"
        "  --insecure              plain-text TCP, for a ttd started with --insecure\n"
        "  --json                  machine-readable output (status, sessions, kill, ping)\n"
        "  -h, --help              this text\n"
        "  --version               ttctl's version and the protocol version it speaks\n"
        "\n"
        "exit status: 0 done, 1 the daemon refused or could not be reached, 2 bad usage\n",
        out);
}

int ttctl_usage_error(const char *fmt, ...) {
  fputs("ttctl: ", stderr);
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputs("; see ttctl --help\n", stderr);
  return TTCTL_USAGE;
}

int ttctl_fail(tt_client *client) {
  fprintf(stderr, "ttctl: %s: %s\n", tt_status_name(tt_errcode(client)), tt_last_error(client));
  return TTCTL_FAILED;
}

tt_client *ttctl_connect(const ttctl_options *options) {
  tt_connect_options co;
  tt_connect_options_init(&co);
  co.client_name = "ttctl";
  co.disable_keepalive = 1; /* one command, a few calls: well within any lease */
  co.call_timeout_ms = 10000;
  co.token = options->token;
  co.insecure = options->insecure;
  co.tls_ca_file = options->tls_ca;
  co.tls_cert_file = options->tls_cert;
  co.tls_key_file = options->tls_key;
  co.tls_server_name = options->tls_server_name;
  tt_client *client = NULL;
  if (tt_connect(options->target, &co, &client) != TT_OK) {
    ttctl_fail(client);
    tt_disconnect(client);
    return NULL;
  }
  return client;
}

void ttctl_target_text(const ttctl_options *options, char *buf, size_t size) {
  const char *env = getenv("TTD_ADDRESS");
  if (options->target && *options->target) {
    snprintf(buf, size, "%s", options->target);
  } else if (env && *env) {
    snprintf(buf, size, "%s", env);
  } else {
    char why[512];
    if (ttd_find_default_daemon(buf, size, why, sizeof(why)) != 0 && tt_default_target(buf, size) != 0) {
      snprintf(buf, size, "?");
    }
  }
}

/* The options: name, whether a value follows, where it goes, and the commands it applies
 * to (NULL: every command). */
typedef struct option_spec {
  const char *name;
  int takes_value;
  size_t offset;
  const char *commands;
} option_spec;

static const option_spec option_table[] = {
    {"target", 1, offsetof(ttctl_options, target), NULL},
    {"token", 1, offsetof(ttctl_options, token), "status sessions kill ping"},
    {"tls-ca", 1, offsetof(ttctl_options, tls_ca), "status sessions kill ping"},
    {"tls-cert", 1, offsetof(ttctl_options, tls_cert), "status sessions kill ping"},
    {"tls-key", 1, offsetof(ttctl_options, tls_key), "status sessions kill ping"},
    {"tls-server-name", 1, offsetof(ttctl_options, tls_server_name), "status sessions kill ping"},
    {"insecure", 0, offsetof(ttctl_options, insecure), "status sessions kill ping"},
    {"json", 0, offsetof(ttctl_options, json), "status sessions kill ping"},
    {"admin", 0, offsetof(ttctl_options, admin), "token"},
    {"quota", 1, offsetof(ttctl_options, quota), "token"},
    {"count", 1, offsetof(ttctl_options, count), "ping"},
};
#define OPTION_COUNT (sizeof(option_table) / sizeof(option_table[0]))

typedef struct command_spec {
  const char *name;
  int (*run)(const ttctl_options *options, int argc, char **args);
} command_spec;

static const command_spec command_table[] = {
    {"status", ttctl_cmd_status}, {"sessions", ttctl_cmd_sessions}, {"kill", ttctl_cmd_kill},
    {"ping", ttctl_cmd_ping},     {"token", ttctl_cmd_token},
};

static int word_in(const char *word, const char *list) {
  size_t len = strlen(word);
  for (const char *p = list; (p = strstr(p, word)) != NULL; p += len) {
    if ((p == list || p[-1] == ' ') && (p[len] == ' ' || p[len] == '\0')) return 1;
  }
  return 0;
}

int main(int argc, char **argv) {
  ttctl_options options = {0};
  int seen[OPTION_COUNT] = {0};
  int nwords = 0; /* the words that are not options, gathered at the front of argv */
  int only_words = 0;
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    if (only_words || arg[0] != '-' || arg[1] == '\0') {
      argv[nwords++] = argv[i];
      continue;
    }
    if (strcmp(arg, "--") == 0) {
      only_words = 1;
      continue;
    }
    if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
      print_usage(stdout);
      return TTCTL_OK;
    }
    if (strcmp(arg, "--version") == 0) {
      printf("ttctl %s (protocol ttd.v1, version %d)\n", TTD_VERSION, TTD_PROTOCOL_VERSION);
      return TTCTL_OK;
    }
    const char *eq = strchr(arg, '=');
    size_t name_len = eq ? (size_t)(eq - arg) - 2 : strlen(arg) - 2;
    size_t k = 0;
    while (k < OPTION_COUNT && !(strncmp(arg, "--", 2) == 0 && strlen(option_table[k].name) == name_len &&
                                 strncmp(arg + 2, option_table[k].name, name_len) == 0)) {
      k++;
    }
    if (k == OPTION_COUNT) return ttctl_usage_error("unknown option '%s'", arg);
    const option_spec *spec = &option_table[k];
    char *field = (char *)&options + spec->offset;
    seen[k] = 1;
    if (!spec->takes_value) {
      if (eq) return ttctl_usage_error("--%s takes no value", spec->name);
      *(int *)field = 1;
    } else if (eq) {
      *(const char **)field = eq + 1;
    } else if (i + 1 < argc) {
      *(const char **)field = argv[++i];
    } else {
      return ttctl_usage_error("--%s needs a value", spec->name);
    }
  }
  if (nwords == 0) return ttctl_usage_error("no command given");
  const char *command = argv[0];
  for (size_t c = 0; c < sizeof(command_table) / sizeof(command_table[0]); c++) {
    if (strcmp(command, command_table[c].name) != 0) continue;
    for (size_t k = 0; k < OPTION_COUNT; k++) {
      if (seen[k] && option_table[k].commands && !word_in(command, option_table[k].commands)) {
        return ttctl_usage_error("--%s does not apply to %s (only to: %s)", option_table[k].name, command,
                                 option_table[k].commands);
      }
    }
    return command_table[c].run(&options, nwords - 1, argv + 1);
  }
  return ttctl_usage_error("unknown command '%s'", command);
}
