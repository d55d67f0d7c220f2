/* ttctl, the operator's tool for ttd: what its commands share.
 *
 * ttctl.c parses the command line and connects; ttctl_daemon.c holds the commands that talk
 * to a daemon (status, sessions, kill, ping); ttctl_token.c the ones that do not (token new,
 * token hash); ttctl_format.c the human-readable sizes, durations, bars and tables.
 * Every command returns the process exit status: 0 done, 1 an RPC failed, 2 bad usage. */
#ifndef TTCTL_H
#define TTCTL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "ttclient.h"

enum { TTCTL_OK = 0, TTCTL_FAILED = 1, TTCTL_USAGE = 2 };

typedef struct ttctl_options {
  const char *target; /* NULL: $TTD_ADDRESS, then the default socket (the library decides) */
  const char *token, *tls_ca, *tls_cert, *tls_key, *tls_server_name;
  int insecure;
  int json;
  int admin;          /* token new --admin */
  const char *quota;  /* token new --quota SIZE */
  const char *count;  /* ping --count N */
} ttctl_options;

/* Prints "ttctl: MESSAGE" and the usage to stderr; returns TTCTL_USAGE. */
int ttctl_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Connects with ttctl's settings (client name "ttctl", no keep-alive). On failure prints
 * "ttctl: STATUS: message", releases the client and returns NULL. */
tt_client *ttctl_connect(const ttctl_options *options);

/* Prints "ttctl: STATUS: message" for the client's last error; returns TTCTL_FAILED. */
int ttctl_fail(tt_client *client);

/* The target a connection went to, for display: options->target, $TTD_ADDRESS or the
 * default socket, into buf. */
void ttctl_target_text(const ttctl_options *options, char *buf, size_t size);

/* ---- commands; args are the words after the command's name ---- */
int ttctl_cmd_status(const ttctl_options *options, int argc, char **args);
int ttctl_cmd_sessions(const ttctl_options *options, int argc, char **args);
int ttctl_cmd_kill(const ttctl_options *options, int argc, char **args);
int ttctl_cmd_ping(const ttctl_options *options, int argc, char **args);
int ttctl_cmd_token(const ttctl_options *options, int argc, char **args);

/* ---- formatting (ttctl_format.c) ---- */

/* "512 B", "1.00 MiB", "12.00 GiB": binary units, two decimals above bytes. */
void ttctl_format_size(uint64_t bytes, char *buf, size_t size);
/* "12s", "3m05s", "1h02m", "2d03h". */
void ttctl_format_duration(uint64_t ms, char *buf, size_t size);
/* "[#####...............]  25.0%": 20 cells, used of capacity; any use shows one '#'. */
void ttctl_format_bar(uint64_t used, uint64_t capacity, char *buf, size_t size);

/* A text table: columns sized to their widest cell, two spaces apart. */
typedef struct ttctl_table ttctl_table;
/* headers: ncols names; right: ncols flags, 1 right-aligns the column (numbers). NULL if
 * out of memory. */
ttctl_table *ttctl_table_create(int ncols, const char *const *headers, const int *right);
/* Appends a row of ncols cells (copied). Returns 0, or -1 if out of memory. */
int ttctl_table_add(ttctl_table *table, const char *const *cells);
/* Prints the header and rows to stdout, trailing blanks trimmed. */
void ttctl_table_print(const ttctl_table *table);
void ttctl_table_free(ttctl_table *table); /* accepts NULL */

/* Writes value as indented JSON and a newline to stdout and releases it (the reference is
 * stolen; NULL is out of memory). Returns TTCTL_OK, or TTCTL_FAILED naming the problem. */
int ttctl_print_json(json_t *value);

#endif
