/* The daemon's configuration: one table of options (name, type, bounds, default, help)
 * read from command-line flags and from a config file alike. Flags win over the file.
 *
 * Flags: --name VALUE or --name=VALUE. File (--config FILE): lines `name = value`,
 * `#` starts a comment. Sizes accept K, M, G, T suffixes (binary: 1K = 1024) and
 * durations accept s or ms suffixes (plain numbers are seconds). */
#ifndef TTD_CONFIG_H
#define TTD_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/status.h"

#define TTD_CONFIG_MAX_LISTEN 16
#define TTD_CONFIG_MAX_OPTIONS 64 /* at least the options of the table */

/* What the command line asks for besides the options. */
typedef enum ttd_config_action {
  TTD_CONFIG_RUN,
  TTD_CONFIG_HELP,    /* --help or -h */
  TTD_CONFIG_VERSION, /* --version */
} ttd_config_action;

typedef struct ttd_config {
  char *listen[TTD_CONFIG_MAX_LISTEN]; /* "unix:/path" or "host:port"; none = default socket */
  int listen_count;
  int threads;        /* RPC threads: one polls gRPC's queue, the rest run heavy calls */
  int spin_us;        /* the poller polls this long after a light call before it sleeps */
  int device_spin_us; /* and this long after answering device work */
  char *backend;      /* "sim" */
  int devices;        /* simulated cards */
  uint64_t dram;      /* bytes per card */
  uint64_t l1;
  int cores;          /* host threads per card for kernels; 0 = all */
  int programs_at_once; /* programs of different sessions run together on a card; 0 = as many as it can */
  int64_t lease_ms;
  int64_t drain_timeout_ms;
  int64_t admin_timeout_ms; /* admin HTTP: a connection idle this long is closed */
  int admin_max_connections; /* admin HTTP: connections at once; more are closed */
  int max_connections;      /* every listener (the gate): connections at once, in all */
  int max_peer_connections; /* ... from one TCP address or one local uid */
  int64_t handshake_timeout_ms; /* a connection without its HTTP/2 preface (or TLS handshake) is closed */
  int max_sessions;         /* open sessions a tenant may hold at once, unless its max_sessions= */
  uint64_t max_program_cost; /* Compile refuses a program whose forward costs more operations */
  char *log_level;
  char *admin;        /* admin HTTP "host:port", or "off" */
  uint64_t quota;     /* default per-session device memory quota; 0 = none */
  char *tokens_file;  /* NULL: no tokens, every client is the tenant "local" */
  char *tls_cert, *tls_key, *tls_client_ca;
  bool insecure;      /* plain TCP allowed */
  char *socket_group;
  bool shm;           /* the shared-memory side socket beside the first unix: listener */
  char *config_file;
  char *state_dir;    /* NULL: sessions end with the daemon */
} ttd_config;

/* Sets every option to its default. */
void ttd_config_defaults(ttd_config *config);

/* Applies --config FILE (if given) and then the flags. INVALID_ARGUMENT naming the flag or
 * the file and line for an unknown option, a malformed value or one out of bounds.
 * *out_action says whether --help or --version was given (then nothing else is read). */
ttd_status_t ttd_config_load(ttd_config *config, int argc, char **argv, ttd_config_action *out_action);

/* Applies one option by name; used by both the flag and the file readers. */
ttd_status_t ttd_config_set(ttd_config *config, const char *name, const char *value);

/* Reads `name = value` lines from text (the contents of a config file). */
ttd_status_t ttd_config_apply_text(ttd_config *config, const char *text, const char *source_name);

/* Checks the options together: a listener other processes or hosts can reach without the
 * file mode of a Unix socket (TCP, unix-abstract:) needs --tokens, mutual TLS
 * (--tls-client-ca; TCP only) or an explicit --insecure, since without tokens every caller is the
 * tenant "local"; --tls-client-ca needs --tls-cert and --tls-key. INVALID_ARGUMENT saying
 * what to add. */
ttd_status_t ttd_config_check(const ttd_config *config);

/* A reload's new settings against the running ones: ttd_config_check of fresh, and no
 * network listener left bound (listeners, TLS and --insecure apply only at a restart)
 * without authentication once fresh's tokens apply. INVALID_ARGUMENT naming the listener. */
ttd_status_t ttd_config_check_reload(const ttd_config *running, const ttd_config *fresh);

void ttd_config_usage(FILE *out);

/* The options whose value differs between running and fresh but which only a restart
 * applies (every option but --tokens, --quota and --config): their names go to out_names,
 * at most max of them; returns how many. */
int ttd_config_restart_changes(const ttd_config *running, const ttd_config *fresh, const char **out_names, int max);

/* Frees strings held by config. */
void ttd_config_clear(ttd_config *config);

/* Reads a whole text file into a new NUL-terminated string (free it). INVALID_ARGUMENT
 * naming `what` and the path when it cannot be opened, holds a NUL byte, is writable by
 * its group or everyone, is owned by another user than ttd's and root, or sits in a folder
 * another user could swap it in (owned by another user, or writable by its group or
 * everyone without the sticky bit; the folder of a symbolic link's target too), naming
 * the uid or folder and what to run. As sshd refuses such files: whoever can write ttd's
 * config, tokens or keys controls it. */
ttd_status_t ttd_read_text_file(const char *path, const char *what, char **out_text);

/* Whether everyone may read the file (a tokens file or a private key should not be). */
bool ttd_file_world_readable(const char *path);

/* Parses "12G", "108M", "4096" into bytes; -1 on a malformed value or overflow. */
int ttd_config_parse_size(const char *text, uint64_t *out_bytes);

/* Parses "30", "30s", "500ms", "0.5" into milliseconds; -1 if malformed. */
int ttd_config_parse_duration_ms(const char *text, int64_t *out_ms);

#endif
