#include "base/config.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>


typedef enum option_type { OPT_INT, OPT_SIZE, OPT_DURATION, OPT_STRING, OPT_STRING_LIST, OPT_BOOL } option_type;

typedef struct option {
  const char *name;
  option_type type;
  size_t offset;
  int64_t min, max; /* bounds for numbers (bytes, ms) */
  const char *default_value;
  const char *help;
} option;

#define FIELD(f) offsetof(ttd_config, f)

static const option options[] = {
    {"listen", OPT_STRING_LIST, FIELD(listen), 0, 0, NULL,
     "address to serve: unix:/path or host:port (repeatable; default: $XDG_RUNTIME_DIR/ttd.sock, "
     "or /run/ttd/ttd.sock as root)"},
    {"threads", OPT_INT, FIELD(threads), 1, 256, "4", "RPC threads: one polls, the others run calls that copy tensor bytes, compile or free"},
    {"spin-us", OPT_INT, FIELD(spin_us), 0, 10000, "1000",
     "after answering a light call the poller polls for the next call, yielding the CPU, for up to this many "
     "microseconds before it sleeps (adaptive; 0: sleep at once)"},
    {"device-spin-us", OPT_INT, FIELD(device_spin_us), 0, 100000, "2000",
     "after answering device work (an Execute, a Backward, an optimizer step) the poller (or, for a call lane's, "
     "the card's thread) polls for the client's next call, yielding the CPU, for up to this many microseconds "
     "before it sleeps (adaptive: it stops while calls come further apart; 0: sleep at once)"},
    {"backend", OPT_STRING, FIELD(backend), 0, 0, "sim", "device backend"},
    {"devices", OPT_INT, FIELD(devices), 1, 64, "1", "number of simulated cards"},
    {"dram", OPT_SIZE, FIELD(dram), 0, INT64_MAX, "12G", "DRAM per simulated card"},
    {"l1", OPT_SIZE, FIELD(l1), 0, INT64_MAX, "108M", "L1 per simulated card (72 cores x 1.5M)"},
    {"cores", OPT_INT, FIELD(cores), 0, 1024, "0", "host threads running the simulated cards' kernels, one pool for all cards (0: one per CPU ttd may use)"},
    {"programs-at-once", OPT_INT, FIELD(programs_at_once), 0, 64, "0", "programs of different sessions a card runs at once, each on one of its threads, while at least that many sessions have work (0: as many as the card can: one per --cores thread on a single simulated card; 1: one at a time, each on all of them; a number below the card's leaves its other threads idle meanwhile)"},
    {"lease", OPT_DURATION, FIELD(lease_ms), 50, 86400000, "30", "close a session after this long without a call"},
    {"drain-timeout", OPT_DURATION, FIELD(drain_timeout_ms), 0, 3600000, "10",
     "on SIGTERM, how long in-flight calls may run; then queued device calls are refused (UNAVAILABLE) and "
     "running programs stopped (ABORTED)"},
    {"state-dir", OPT_STRING, FIELD(state_dir), 0, 0, NULL,
     "keep training state across a graceful restart: on SIGTERM or SIGINT, after draining, write every open "
     "session to DIR (0700); at start read it back, and clients resume their sessions (default: none)"},
    {"log-level", OPT_STRING, FIELD(log_level), 0, 0, "info", "debug, info, warn or error"},
    {"admin", OPT_STRING, FIELD(admin), 0, 0, "127.0.0.1:9464", "admin HTTP (/healthz, /readyz, /metrics) on host:port, or off"},
    {"admin-timeout", OPT_DURATION, FIELD(admin_timeout_ms), 1000, 3600000, "10",
     "admin HTTP: close a connection that sends or takes nothing for this long"},
    {"admin-max-connections", OPT_INT, FIELD(admin_max_connections), 1, 65536, "64",
     "admin HTTP connections held at once; more are closed at once"},
    {"max-connections", OPT_INT, FIELD(max_connections), 1, 1000000, "4096",
     "connections all listeners hold at once; more are closed at once (keep it well under the descriptor limit, "
     "LimitNOFILE: a TLS connection takes 3 to 5 descriptors)"},
    {"max-peer-connections", OPT_INT, FIELD(max_peer_connections), 1, 1000000, "1024",
     "connections one TCP address, or one local user on a Unix socket, may hold at once (a user's training "
     "processes each hold one or more); more are closed at once"},
    {"handshake-timeout", OPT_DURATION, FIELD(handshake_timeout_ms), 100, 3600000, "10",
     "close a connection that has not sent the HTTP/2 client preface (TLS: finished its handshake) within this long, "
     "and one that has made no call within as long again"},
    {"max-program-cost", OPT_SIZE, FIELD(max_program_cost), 1, INT64_MAX, "1T",
     "operations one forward of a program may cost, as Compile estimates them (a multiply-add is 2; K, M, G, T as "
     "powers of 1024): a larger program is refused; one that runs stops within a chunk of its kernel when its "
     "call's deadline passes or its session ends"},
    {"max-sessions", OPT_INT, FIELD(max_sessions), 1, 65536, "1024",
     "sessions one tenant may hold open at once, unless its max_sessions= in the tokens file says otherwise"},
    {"quota", OPT_SIZE, FIELD(quota), 0, INT64_MAX, "0",
     "device memory a tenant's sessions may hold together, unless its quota= says otherwise; a session may ask for "
     "less for itself (0: no quota)"},
    {"tokens", OPT_STRING, FIELD(tokens_file), 0, 0, NULL,
     "tenants and their hashed tokens, one per line: NAME sha256:HEX [admin] [quota=SIZE] [max_sessions=N] "
     "[weight=N] (ttctl token new); "
     "without it every client is the tenant 'local', with admin rights only for ttd's own user and root on a Unix "
     "socket file"},
    {"tls-cert", OPT_STRING, FIELD(tls_cert), 0, 0, NULL, "PEM certificate chain served on TCP listeners"},
    {"tls-key", OPT_STRING, FIELD(tls_key), 0, 0, NULL, "PEM private key of --tls-cert"},
    {"tls-client-ca", OPT_STRING, FIELD(tls_client_ca), 0, 0, NULL,
     "PEM CA bundle: TCP clients must present a certificate it signed (mutual TLS)"},
    {"insecure", OPT_BOOL, FIELD(insecure), 0, 1, "false", "allow plain-text TCP listeners (no TLS); never on an untrusted network"},
    {"socket-group", OPT_STRING, FIELD(socket_group), 0, 0, NULL,
     "group owning the Unix sockets (mode 0660); default: the daemon's group"},
    {"shm", OPT_BOOL, FIELD(shm), 0, 1, "true",
     "same-host fast path: local clients move tensor bytes through shared memory (side socket PATH.shm)"},
    {"config", OPT_STRING, FIELD(config_file), 0, 0, NULL, "read options from FILE (flags win)"},
};

#define OPTION_COUNT (sizeof(options) / sizeof(options[0]))
_Static_assert(OPTION_COUNT <= TTD_CONFIG_MAX_OPTIONS, "raise TTD_CONFIG_MAX_OPTIONS");

static const option *find_option(const char *name, size_t len) {
  for (size_t i = 0; i < OPTION_COUNT; i++) {
    if (strlen(options[i].name) == len && strncmp(options[i].name, name, len) == 0) return &options[i];
  }
  return NULL;
}

int ttd_config_parse_size(const char *text, uint64_t *out_bytes) {
  errno = 0;
  char *end;
  if (!isdigit((unsigned char)*text)) return -1;
  unsigned long long v = strtoull(text, &end, 10);
  if (errno) return -1;
  unsigned shift = 0;
  switch (toupper((unsigned char)*end)) {
    case 'K': shift = 10; end++; break;
    case 'M': shift = 20; end++; break;
    case 'G': shift = 30; end++; break;
    case 'T': shift = 40; end++; break;
    default: break;
  }
  if (shift && (*end == 'i' || *end == 'I')) end++;
  if (*end == 'B' || *end == 'b') end++;
  if (*end != '\0') return -1;
  if (shift && v > (UINT64_MAX >> shift)) return -1;
  *out_bytes = (uint64_t)v << shift;
  return 0;
}

int ttd_config_parse_duration_ms(const char *text, int64_t *out_ms) {
  if (!isdigit((unsigned char)text[0]) && text[0] != '.') return -1; /* no signs, spaces or hex */
  if (text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) return -1;
  errno = 0;
  char *end;
  double v = strtod(text, &end);
  if (errno || end == text || !isfinite(v) || v < 0) return -1;
  double scale = 1000.0;
  if (strcmp(end, "ms") == 0) scale = 1.0;
  else if (strcmp(end, "s") != 0 && *end != '\0') return -1;
  double ms = v * scale;
  if (ms > 9.0e15) return -1;
  *out_ms = (int64_t)llround(ms);
  return 0;
}

static char **string_field(ttd_config *config, const option *opt) {
  return (char **)((char *)config + opt->offset);
}

static ttd_status_t set_option(ttd_config *config, const option *opt, const char *value) {
  void *field = (char *)config + opt->offset;
  switch (opt->type) {
    case OPT_INT: {
      errno = 0;
      char *end;
      long v = strtol(value, &end, 10);
      bool plain = isdigit((unsigned char)value[0]) || (value[0] == '-' && isdigit((unsigned char)value[1]));
      if (!plain || errno || end == value || *end != '\0' || v < opt->min || v > opt->max) {
        return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "--%s must be an integer in [%lld, %lld], got '%s'",
                               opt->name, (long long)opt->min, (long long)opt->max, value);
      }
      *(int *)field = (int)v;
      return TTD_OK;
    }
    case OPT_SIZE: {
      uint64_t v;
      if (ttd_config_parse_size(value, &v) != 0 || v > (uint64_t)opt->max) {
        return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                               "--%s must be a byte size such as 4096, 512M or 12G, got '%s'", opt->name, value);
      }
      *(uint64_t *)field = v;
      return TTD_OK;
    }
    case OPT_DURATION: {
      int64_t v;
      if (ttd_config_parse_duration_ms(value, &v) != 0 || v < opt->min || v > opt->max) {
        return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                               "--%s must be a duration between %lld ms and %lld s (e.g. 30, 30s, 500ms), got '%s'",
                               opt->name, (long long)opt->min, (long long)opt->max / 1000, value);
      }
      *(int64_t *)field = v;
      return TTD_OK;
    }
    case OPT_BOOL: {
      if (strcmp(value, "true") == 0 || strcmp(value, "yes") == 0 || strcmp(value, "1") == 0) *(bool *)field = true;
      else if (strcmp(value, "false") == 0 || strcmp(value, "no") == 0 || strcmp(value, "0") == 0) *(bool *)field = false;
      else return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "--%s must be true or false, got '%s'", opt->name, value);
      return TTD_OK;
    }
    case OPT_STRING: {
      char *copy = strdup(value);
      if (!copy) return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
      free(*string_field(config, opt));
      *string_field(config, opt) = copy;
      return TTD_OK;
    }
    case OPT_STRING_LIST: {
      if (config->listen_count >= TTD_CONFIG_MAX_LISTEN) {
        return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "--%s given more than %d times", opt->name,
                               TTD_CONFIG_MAX_LISTEN);
      }
      char *copy = strdup(value);
      if (!copy) return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
      config->listen[config->listen_count++] = copy;
      return TTD_OK;
    }
  }
  return ttd_make_status(GRPC_STATUS_INTERNAL, "option type");
}

ttd_status_t ttd_config_set(ttd_config *config, const char *name, const char *value) {
  const option *opt = find_option(name, strlen(name));
  if (!opt) return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "unknown option '%s'", name);
  return set_option(config, opt, value);
}

void ttd_config_defaults(ttd_config *config) {
  memset(config, 0, sizeof(*config));
  for (size_t i = 0; i < OPTION_COUNT; i++) {
    if (options[i].default_value) {
      ttd_status_t s = set_option(config, &options[i], options[i].default_value);
      if (s) abort(); /* a default outside its own bounds is a build bug */
    }
  }
}

void ttd_config_clear(ttd_config *config) {
  for (int i = 0; i < config->listen_count; i++) free(config->listen[i]);
  for (size_t i = 0; i < OPTION_COUNT; i++) {
    if (options[i].type == OPT_STRING) free(*string_field(config, &options[i]));
  }
  memset(config, 0, sizeof(*config));
}

static char *trim(char *s) {
  while (isspace((unsigned char)*s)) s++;
  char *e = s + strlen(s);
  while (e > s && isspace((unsigned char)e[-1])) *--e = '\0';
  return s;
}

ttd_status_t ttd_config_apply_text(ttd_config *config, const char *text, const char *source_name) {
  char *copy = strdup(text);
  if (!copy) return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
  ttd_status_t status = TTD_OK;
  int line_no = 0;
  for (char *line = copy, *next; line && !status; line = next) {
    next = strchr(line, '\n');
    if (next) *next++ = '\0';
    line_no++;
    char *hash = strchr(line, '#');
    if (hash) *hash = '\0';
    char *body = trim(line);
    if (*body == '\0') continue;
    char *eq = strchr(body, '=');
    if (!eq) {
      status = ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "%s:%d: expected 'name = value', got '%s'",
                               source_name, line_no, body);
      break;
    }
    *eq = '\0';
    char *name = trim(body), *value = trim(eq + 1);
    if (strcmp(name, "config") == 0) {
      status = ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "%s:%d: a config file cannot name another config file",
                               source_name, line_no);
      break;
    }
    ttd_status_t s = ttd_config_set(config, name, value);
    if (s) {
      status = ttd_make_status(ttd_status_code(s), "%s:%d: %s", source_name, line_no, ttd_status_message(s));
      ttd_status_free(s);
    }
  }
  free(copy);
  return status;
}

bool ttd_file_world_readable(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && (st.st_mode & S_IROTH);
}

/* Whether uid may own what ttd trusts: ttd's own user or root. */
static bool trusted_owner(uid_t uid) { return uid == geteuid() || uid == 0; }

/* INVALID_ARGUMENT when another user could put a file of its own in place of path, which
 * sits in the folder dir: dir is owned by another user than ttd's and root, or its group
 * or everyone may write it without the sticky bit (which keeps others from renaming or
 * removing what they do not own). */
static ttd_status_t check_folder(const char *what, const char *path, const char *dir) {
  struct stat st;
  if (stat(dir, &st) != 0) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "cannot check the folder %s of %s %s: %s", dir, what, path,
                           strerror(errno));
  }
  if (!trusted_owner(st.st_uid)) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                           "%s %s is in the folder %s, owned by uid %u, neither ttd's user (uid %u) nor root: that "
                           "user can replace the file; run chown %u (or chown root) on the folder, or move the file",
                           what, path, dir, (unsigned)st.st_uid, (unsigned)geteuid(), (unsigned)geteuid());
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX)) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                           "%s %s is in the folder %s, which %s may write without the sticky bit (mode %04o): they "
                           "can replace the file; run chmod go-w (or chmod +t) on the folder, or move the file",
                           what, path, dir, (st.st_mode & S_IWOTH) ? "everyone" : "its group",
                           (unsigned)(st.st_mode & 07777));
  }
  return TTD_OK;
}

/* check_folder for the folder path names, and for the one its target lies in when a
 * symbolic link leads elsewhere. */
static ttd_status_t check_folders(const char *what, const char *path) {
  char dir[PATH_MAX], real[PATH_MAX];
  const char *slash = strrchr(path, '/');
  if (!slash) snprintf(dir, sizeof(dir), ".");
  else snprintf(dir, sizeof(dir), "%.*s", slash == path ? 1 : (int)(slash - path), path);
  TTD_RETURN_IF_ERROR(check_folder(what, path, dir));
  if (!realpath(path, real)) return TTD_OK; /* fstat judged the file itself */
  char *real_slash = strrchr(real, '/');
  if (real_slash == real) real_slash++; /* a file at / */
  *real_slash = '\0';
  char *resolved_dir = realpath(dir, NULL);
  bool same = resolved_dir && strcmp(resolved_dir, real) == 0;
  free(resolved_dir);
  return same ? TTD_OK : check_folder(what, path, real);
}

ttd_status_t ttd_read_text_file(const char *path, const char *what, char **out_text) {
  *out_text = NULL;
  FILE *f = fopen(path, "rb");
  if (!f) return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "cannot open %s %s: %s", what, path, strerror(errno));
  struct stat st;
  if (fstat(fileno(f), &st) == 0 && !S_ISREG(st.st_mode)) {
    fclose(f);
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "cannot read %s %s: not a regular file (is it a directory?)",
                           what, path);
  }
  if (st.st_mode & (S_IWGRP | S_IWOTH)) { /* the file read, not a path raced */
    fclose(f);
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                           "%s %s is writable by %s (mode %04o): whoever can write it decides what ttd trusts; "
                           "run chmod go-w on it",
                           what, path, (st.st_mode & S_IWOTH) ? "everyone" : "its group", (unsigned)(st.st_mode & 07777));
  }
  if (!trusted_owner(st.st_uid)) {
    fclose(f);
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                           "%s %s is owned by uid %u, neither ttd's user (uid %u) nor root: that user can rewrite it "
                           "and so decides what ttd trusts; run chown %u (or chown root) on it",
                           what, path, (unsigned)st.st_uid, (unsigned)geteuid(), (unsigned)geteuid());
  }
  ttd_status_t folders = check_folders(what, path);
  if (folders) {
    fclose(f);
    return folders;
  }
  char *text = NULL;
  size_t len = 0, cap = 0;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) {
    if (len + n + 1 > cap) {
      cap = (len + n + 1) * 2;
      char *grown = realloc(text, cap);
      if (!grown) {
        free(text);
        fclose(f);
        return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory reading %s %s", what, path);
      }
      text = grown;
    }
    memcpy(text + len, buf, n);
    len += n;
  }
  int read_error = ferror(f);
  fclose(f);
  if (read_error) {
    free(text);
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "cannot read %s %s (is it a directory?)", what, path);
  }
  if (memchr(text ? text : "", '\0', len)) {
    free(text);
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "%s %s contains a NUL byte", what, path);
  }
  if (!text) text = calloc(1, 1);
  else text[len] = '\0';
  if (!text) return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory reading %s %s", what, path);
  *out_text = text;
  return TTD_OK;
}

static ttd_status_t load_file(ttd_config *config, const char *path) {
  char *text;
  TTD_RETURN_IF_ERROR(ttd_read_text_file(path, "config file", &text));
  ttd_status_t status = ttd_config_apply_text(config, text, path);
  free(text);
  return status;
}

/* Splits argv[i] into name and value; advances *i past a separate value. */
static ttd_status_t flag_at(int argc, char **argv, int *i, const option **out_opt, const char **out_value) {
  const char *arg = argv[*i];
  if (strncmp(arg, "--", 2) != 0) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "unexpected argument '%s'; options start with --", arg);
  }
  const char *name = arg + 2;
  const char *eq = strchr(name, '=');
  size_t len = eq ? (size_t)(eq - name) : strlen(name);
  const option *opt = find_option(name, len);
  if (!opt) return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "unknown option '%s'", arg);
  if (eq) {
    *out_value = eq + 1;
  } else if (opt->type == OPT_BOOL) {
    *out_value = "true";
  } else if (*i + 1 < argc) {
    *out_value = argv[++*i];
  } else {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "option --%s needs a value", opt->name);
  }
  *out_opt = opt;
  return TTD_OK;
}

ttd_status_t ttd_config_load(ttd_config *config, int argc, char **argv, ttd_config_action *out_action) {
  *out_action = TTD_CONFIG_RUN;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      *out_action = TTD_CONFIG_HELP;
      return TTD_OK;
    }
    if (strcmp(argv[i], "--version") == 0) {
      *out_action = TTD_CONFIG_VERSION;
      return TTD_OK;
    }
  }
  /* Pass 1: the config file, so that flags applied afterwards win. */
  for (int i = 1; i < argc; i++) {
    const option *opt;
    const char *value;
    TTD_RETURN_IF_ERROR(flag_at(argc, argv, &i, &opt, &value));
    if (strcmp(opt->name, "config") == 0) {
      TTD_RETURN_IF_ERROR(set_option(config, opt, value));
      TTD_RETURN_IF_ERROR(load_file(config, value));
    }
  }
  /* A list given on the command line replaces the file's list. */
  int file_listen = config->listen_count;
  int flags_listen = 0;
  for (int i = 1; i < argc; i++) {
    const option *opt;
    const char *value;
    TTD_RETURN_IF_ERROR(flag_at(argc, argv, &i, &opt, &value));
    if (strcmp(opt->name, "config") == 0) continue;
    if (opt->type == OPT_STRING_LIST && flags_listen++ == 0) {
      for (int k = 0; k < file_listen; k++) free(config->listen[k]);
      config->listen_count = 0;
    }
    TTD_RETURN_IF_ERROR(set_option(config, opt, value));
  }
  return TTD_OK;
}

/* Whether a listener that no socket file guards (address is not "unix:") admits only callers
 * ttd may take as the tenant 'local' without tokens: mutual TLS guards TCP only (an
 * abstract socket has no TLS), and --insecure says the network is trusted. */
static bool trusted_without_tokens(const ttd_config *config, const char *address) {
  if (config->insecure) return true;
  return config->tls_client_ca && strncmp(address, "unix-abstract:", 14) != 0;
}

ttd_status_t ttd_config_check(const ttd_config *config) {
  if (config->tls_client_ca && (!config->tls_cert || !config->tls_key)) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                           "--tls-client-ca needs --tls-cert and --tls-key: mutual TLS is TLS with client certificates");
  }
  for (int i = 0; i < config->listen_count; i++) {
    const char *a = config->listen[i];
    if (strncmp(a, "unix:", 5) == 0) continue;
    if (!config->tokens_file && !trusted_without_tokens(config, a)) {
      bool abstract = strncmp(a, "unix-abstract:", 14) == 0;
      return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                             "listener %s is not guarded by a socket file's permissions, and without --tokens every "
                             "caller would be the tenant 'local': pass --tokens FILE, %sor --insecure on a trusted "
                             "%s", a, abstract ? "" : "require client certificates with --tls-client-ca, ",
                             abstract ? "host (mutual TLS does not guard an abstract socket)" : "network");
    }
  }
  return TTD_OK;
}

ttd_status_t ttd_config_check_reload(const ttd_config *running, const ttd_config *fresh) {
  TTD_RETURN_IF_ERROR(ttd_config_check(fresh));
  /* Listeners, TLS and --insecure change only at a restart: the running ones stay bound. */
  for (int i = 0; i < running->listen_count; i++) {
    const char *a = running->listen[i];
    if (strncmp(a, "unix:", 5) == 0) continue;
    if (!fresh->tokens_file && !trusted_without_tokens(running, a)) {
      return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                             "the reload would leave listener %s serving without authentication: the new settings "
                             "have no --tokens, and listeners change only at a restart; keep --tokens, or restart ttd "
                             "without that listener", a);
    }
  }
  return TTD_OK;
}

void ttd_config_usage(FILE *out) {
  fprintf(out, "usage: ttd [options]\n\nttd owns the accelerator cards of this host and shares them over gRPC.\n\n");
  for (size_t i = 0; i < OPTION_COUNT; i++) {
    char head[48];
    snprintf(head, sizeof(head), "--%s", options[i].name);
    fprintf(out, "  %-18s %s", head, options[i].help);
    if (options[i].default_value) fprintf(out, " (default %s)", options[i].default_value);
    fputc('\n', out);
  }
  fprintf(out, "  %-18s %s\n", "--help", "show this help");
  fprintf(out, "  %-18s %s\n", "--version", "show ttd's version and protocol version");
}

static bool option_equal(const ttd_config *a, const ttd_config *b, const option *opt) {
  const char *fa = (const char *)a + opt->offset, *fb = (const char *)b + opt->offset;
  switch (opt->type) {
    case OPT_INT: return *(const int *)fa == *(const int *)fb;
    case OPT_SIZE: return *(const uint64_t *)fa == *(const uint64_t *)fb;
    case OPT_DURATION: return *(const int64_t *)fa == *(const int64_t *)fb;
    case OPT_BOOL: return *(const bool *)fa == *(const bool *)fb;
    case OPT_STRING: {
      const char *sa = *(char *const *)fa, *sb = *(char *const *)fb;
      return sa == sb || (sa && sb && strcmp(sa, sb) == 0);
    }
    case OPT_STRING_LIST:
      if (a->listen_count != b->listen_count) return false;
      for (int i = 0; i < a->listen_count; i++) {
        if (strcmp(a->listen[i], b->listen[i]) != 0) return false;
      }
      return true;
  }
  return false;
}

/* The options SIGHUP applies while serving; every other one takes a restart. */
static bool reloads(const option *opt) {
  return strcmp(opt->name, "tokens") == 0 || strcmp(opt->name, "quota") == 0 || strcmp(opt->name, "config") == 0;
}

int ttd_config_restart_changes(const ttd_config *running, const ttd_config *fresh, const char **out_names, int max) {
  int n = 0;
  for (size_t i = 0; i < OPTION_COUNT; i++) {
    if (reloads(&options[i]) || option_equal(running, fresh, &options[i])) continue;
    if (n < max) out_names[n] = options[i].name;
    n++;
  }
  return n < max ? n : max;
}
