/* Connection, session and keep-alive of libttclient. */
#include <errno.h>
#include <grpc/grpc_security.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/absl_deadlock.h"
#include "conn/conn.h"
#include "wire/address.h"

extern const char *program_invocation_short_name;

uint64_t tt_session_id(const tt_client *client) { return client->session_id; }

const char *tt_instance_id(const tt_client *client) { return client->instance_id; }

uint64_t tt_session_quota(const tt_client *client) { return client->quota_bytes; }

const char *tt_session_tenant(const tt_client *client) { return client->tenant; }

void tt_connect_options_init(tt_connect_options *options) {
  memset(options, 0, sizeof(*options));
  options->client_name = program_invocation_short_name;
  options->call_timeout_ms = 60000;
}

static void *keepalive_main(void *arg) {
  tt_client *c = arg;
  pthread_mutex_lock(&c->keepalive_lock);
  while (!c->stopping) {
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    int64_t ms = c->lease_ms / 3 ? c->lease_ms / 3 : 1;
    until.tv_sec += ms / 1000;
    until.tv_nsec += (ms % 1000) * 1000000;
    if (until.tv_nsec >= 1000000000) {
      until.tv_sec++;
      until.tv_nsec -= 1000000000;
    }
    while (!c->stopping && pthread_cond_timedwait(&c->keepalive_cond, &c->keepalive_lock, &until) != ETIMEDOUT) {
    }
    if (c->stopping) break;
    pthread_mutex_unlock(&c->keepalive_lock);
    Ttd__V1__KeepAliveRequest req = TTD__V1__KEEP_ALIVE_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;
    /* A failure here is not the user's call: keep it out of tt_last_error. */
    char ignored[256];
    if (tt_rpc_unary_quiet(c, TT_RPC_KEEP_ALIVE, &req.base, &ttd__v1__keep_alive_response__descriptor, &resp,
                           ignored, sizeof(ignored)) == TT_OK) {
      protobuf_c_message_free_unpacked(resp, NULL);
    }
    pthread_mutex_lock(&c->keepalive_lock);
  }
  pthread_mutex_unlock(&c->keepalive_lock);
  return NULL;
}

/* Why a connection to ttd failed, from gRPC's text (why), in words that say what to fix. */
static tt_status fail_unreachable(tt_client *c, const char *why) {
  if (strstr(why, "certificate verify failed")) {
    return tt_client_fail(c, TT_UNAVAILABLE,
                          "the TLS handshake with ttd at %s failed: its certificate is not signed by a CA this client "
                          "trusts; pass the CA that signed it (tls_ca_file, TTD_TLS_CA, ttctl --tls-ca) and check the "
                          "name it is issued for (tls_server_name) [%s]", c->target, why);
  }
  if (strstr(why, "andshake") || strstr(why, "SSL_ERROR") || strstr(why, "alert")) {
    return tt_client_fail(c, TT_UNAVAILABLE,
                          "the TLS handshake with ttd at %s failed; ttd answers, so check the CA (tls_ca_file), the "
                          "name (tls_server_name) and, if ttd asks for client certificates, your tls_cert_file and "
                          "tls_key_file [%s]", c->target, why);
  }
  if (strstr(why, "Connection refused") || strstr(why, "No such file")) {
    return tt_client_fail(c, TT_UNAVAILABLE,
                          "nothing listens at %s: start ttd there (`ttd --listen ...`, or `sudo systemctl start ttd` "
                          "for the service), or point TTD_ADDRESS at the ttd you mean [%s]", c->target, why);
  }
  if ((strstr(why, "Socket closed") || strstr(why, "Connection reset by peer")) && strncmp(c->target, "unix", 4) != 0) {
    return tt_client_fail(c, TT_UNAVAILABLE,
                          "ttd at %s closed the connection during setup: a TLS listener refuses plain text (drop "
                          "insecure and pass tls_ca_file), and a listener that needs a client certificate refuses "
                          "a client without one [%s]", c->target, why);
  }
  if (strstr(why, "ermission denied")) {
    return tt_client_fail(c, TT_UNAVAILABLE,
                          "no permission to use the socket %s: add your user to its group (ttd for the service) "
                          "[%s]", c->target, why);
  }
  return tt_client_fail(c, TT_UNAVAILABLE, "cannot reach ttd at %s: %s", c->target, why);
}

static tt_status open_session(tt_client *c, const tt_connect_options *options) {
  Ttd__V1__OpenSessionRequest req = TTD__V1__OPEN_SESSION_REQUEST__INIT;
  snprintf(c->client_name, sizeof(c->client_name), "%s", options->client_name ? options->client_name : "");
  req.client_name = c->client_name;
  req.protocol_version = TTD_PROTOCOL_VERSION;
  req.quota_bytes = options->quota_bytes;
  ProtobufCMessage *out = NULL;
  tt_status st = tt_rpc_unary(c, TT_RPC_OPEN_SESSION, &req.base, &ttd__v1__open_session_response__descriptor, &out);
  if (st != TT_OK) {
    if (st == TT_UNAVAILABLE) {
      char why[sizeof(c->errmsg)];
      snprintf(why, sizeof(why), "%s", tt_last_error(c));
      return fail_unreachable(c, why);
    }
    return st;
  }
  Ttd__V1__OpenSessionResponse *resp = (Ttd__V1__OpenSessionResponse *)out;
  tt_session_adopt(c, resp);
  tt_shm_connect(c, resp->shm_socket, options);
  tt_lane_open(c); /* on the side socket: device calls in shared memory */
  protobuf_c_message_free_unpacked(out, NULL);
  return TT_OK;
}

/* Reads a whole PEM file into a new string; NULL with the failure recorded in c. */
static char *read_pem(tt_client *c, const char *what, const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    tt_client_fail(c, TT_INVALID_ARGUMENT, "cannot open the TLS %s %s: %s", what, path, strerror(errno));
    return NULL;
  }
  char *text = NULL;
  size_t len = 0;
  for (;;) {
    char *grown = realloc(text, len + 65536 + 1);
    if (!grown) break;
    text = grown;
    size_t n = fread(text + len, 1, 65536, f);
    len += n;
    if (n < 65536) break;
  }
  fclose(f);
  if (text) text[len] = '\0';
  if (!text || len == 0 || !strstr(text, "-----BEGIN")) {
    free(text);
    tt_client_fail(c, TT_INVALID_ARGUMENT, "the TLS %s %s is not a PEM file", what, path);
    return NULL;
  }
  return text;
}

static const char *option_or_env(const char *value, const char *env) {
  if (value && *value) return value;
  const char *e = getenv(env);
  return e && *e ? e : NULL;
}

/* Plain text for Unix sockets and insecure TCP; TLS (mutual when a client certificate is
 * given) otherwise. May extend *args with the server-name override (free it if it moved). */
static tt_status channel_credentials(tt_client *c, const tt_connect_options *options, grpc_channel_args *args,
                                     grpc_channel_credentials **out) {
  *out = NULL;
  const char *insecure_env = getenv("TTD_INSECURE");
  int insecure = options->insecure || (insecure_env && strcmp(insecure_env, "1") == 0);
  if (strncmp(c->target, "unix:", 5) == 0 || strncmp(c->target, "unix-abstract:", 14) == 0 || insecure) {
    *out = grpc_insecure_credentials_create();
    return TT_OK;
  }
  const char *ca = option_or_env(options->tls_ca_file, "TTD_TLS_CA");
  const char *cert = option_or_env(options->tls_cert_file, "TTD_TLS_CERT");
  const char *key = option_or_env(options->tls_key_file, "TTD_TLS_KEY");
  if (!cert != !key) {
    return tt_client_fail(c, TT_INVALID_ARGUMENT, "mutual TLS needs both a client certificate and its key "
                          "(tls_cert_file and tls_key_file, or TTD_TLS_CERT and TTD_TLS_KEY)");
  }
  char *ca_pem = ca ? read_pem(c, "CA bundle", ca) : NULL;
  char *cert_pem = cert ? read_pem(c, "client certificate", cert) : NULL;
  char *key_pem = key ? read_pem(c, "client key", key) : NULL;
  tt_status st = (ca && !ca_pem) || (cert && !cert_pem) || (key && !key_pem) ? tt_errcode(c) : TT_OK;
  if (st == TT_OK) {
    grpc_ssl_pem_key_cert_pair pair = {.private_key = key_pem, .cert_chain = cert_pem};
    *out = grpc_ssl_credentials_create(ca_pem, cert_pem ? &pair : NULL, NULL, NULL);
    if (!*out) st = tt_client_fail(c, TT_INVALID_ARGUMENT, "TLS credentials could not be made from the given files");
  }
  free(ca_pem);
  free(cert_pem);
  if (key_pem) explicit_bzero(key_pem, strlen(key_pem));
  free(key_pem);
  if (st == TT_OK && options->tls_server_name) {
    grpc_arg *grown = malloc((args->num_args + 1) * sizeof(*grown));
    if (!grown) {
      grpc_channel_credentials_release(*out);
      *out = NULL;
      return tt_client_fail(c, TT_RESOURCE_EXHAUSTED, "out of memory");
    }
    memcpy(grown, args->args, args->num_args * sizeof(*grown));
    grown[args->num_args] = (grpc_arg){.type = GRPC_ARG_STRING, .key = GRPC_SSL_TARGET_NAME_OVERRIDE_ARG,
                                       .value.string = (char *)options->tls_server_name};
    args->args = grown;
    args->num_args++;
  }
  return st;
}

tt_status tt_connect(const char *target, const tt_connect_options *options, tt_client **out_client) {
  *out_client = NULL;
  tt_client *c = calloc(1, sizeof(*c));
  if (!c) return TT_RESOURCE_EXHAUSTED;
  *out_client = c;
  atomic_init(&c->refs, 1);
  pthread_mutex_init(&c->error_lock, NULL);
  tt_client_error_init(c);
  pthread_mutex_init(&c->keepalive_lock, NULL);
  pthread_mutex_init(&c->shm_lock, NULL);
  pthread_mutex_init(&c->lane_lock, NULL);
  c->lane_ring_fd = c->lane_answer_fd = c->lane_watch_fd = -1;
  pthread_mutex_init(&c->cq_lock, NULL);
  pthread_mutex_init(&c->resume_lock, NULL);
  ttd_block_cache_init(&c->blocks);
  c->shm_fd = -1;
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&c->keepalive_cond, &attr);
  pthread_condattr_destroy(&attr);
  tt_connect_options defaults;
  tt_connect_options_init(&defaults);
  if (!options) options = &defaults;
  c->call_timeout_ms = options->call_timeout_ms > 0 ? options->call_timeout_ms : 60000;
  const char *resume_env = getenv("TTD_RESUME_TIMEOUT_MS");
  long resume_ms = resume_env ? strtol(resume_env, NULL, 10) : 0;
  c->resume_timeout_ms = resume_ms > 0 && resume_ms <= 3600000 ? resume_ms : 60000;
  const char *spin_env = getenv("TTD_SPIN");
  bool spin_off = options->disable_spin || (spin_env && strcmp(spin_env, "0") == 0);
  ttd_cq_spin_init(&c->spin, spin_off ? 0 : TTD_CQ_SPIN_DEFAULT_US);
  ttd_cq_spin_init(&c->device_spin, spin_off ? 0 : TTD_CQ_SPIN_DEVICE_US);
  tt_malloc_tune(options);

  if (!target || !*target) target = getenv("TTD_ADDRESS");
  if (target && *target) {
    if (strlen(target) >= sizeof(c->target)) {
      return tt_client_fail(c, TT_INVALID_ARGUMENT, "target is longer than %zu bytes", sizeof(c->target) - 1);
    }
    snprintf(c->target, sizeof(c->target), "%s", target);
  } else {
    char why[sizeof(c->errmsg) - 64];
    if (ttd_find_default_daemon(c->target, sizeof(c->target), why, sizeof(why)) != 0) {
      return tt_client_fail(c, TT_UNAVAILABLE, "no ttd answers at the default addresses: %s", why);
    }
  }

  ttd_absl_deadlock_detection_off(); /* before grpc_init: see absl_deadlock.h */
  /* Between calls no thread of ours polls the channel, and gRPC's backup poller looks at it
   * every 5 s by default: a daemon that stops gracefully waits that long for this idle
   * client to acknowledge its GOAWAY, and a restart (systemctl restart ttd) with it. */
  setenv("GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS", "100", 0);
  grpc_init();
  c->grpc_initialized = true;
  const char *connect_env = getenv("TTD_CONNECT_TIMEOUT_MS");
  long connect_ms = connect_env ? strtol(connect_env, NULL, 10) : 0;
  if (connect_ms <= 0 || connect_ms > 600000) connect_ms = 2000;
  grpc_arg args[] = {
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, .value.integer = TTD_MAX_MESSAGE_BYTES},
      /* A restarted local daemon is back within a second: retry the connection quickly. The
       * minimum is also how long gRPC gives one connection attempt (its handshake and first
       * SETTINGS frame): 2 s is long enough for a TLS link across a slow network, a loaded
       * host or a daemon busy starting, and short enough that an attempt that hangs is soon
       * retried. TTD_CONNECT_TIMEOUT_MS sets another (a daemon under valgrind). */
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, .value.integer = 100},
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, .value.integer = (int)connect_ms},
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, .value.integer = 2000},
      /* Bulk downloads: a deep HTTP/2 receive window so the daemon is never stalled by flow
       * control between 4 MiB messages. */
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, .value.integer = 16 << 20},
  };
  const char *token = options->token ? options->token : getenv("TTD_TOKEN");
  if (token && *token) {
    if (strlen(token) + 8 > sizeof(c->authorization) || strpbrk(token, "\r\n")) {
      return tt_client_fail(c, TT_INVALID_ARGUMENT, "the token is longer than %zu bytes or holds a line break",
                            sizeof(c->authorization) - 8);
    }
    snprintf(c->authorization, sizeof(c->authorization), "Bearer %s", token);
  }
  grpc_channel_args channel_args = {sizeof(args) / sizeof(args[0]), args};
  grpc_channel_credentials *creds = NULL;
  tt_status st = channel_credentials(c, options, &channel_args, &creds);
  if (st != TT_OK) return st;
  c->channel = grpc_channel_create(c->target, creds, &channel_args);
  grpc_channel_credentials_release(creds);
  free(channel_args.args != args ? channel_args.args : NULL);
  if (!c->channel) return tt_client_fail(c, TT_INVALID_ARGUMENT, "cannot create a channel to '%s'", c->target);
  tt_rpc_register(c);

  st = open_session(c, options);
  if (st != TT_OK) return st;
  if (!options->disable_keepalive) {
    c->keepalive_running = pthread_create(&c->keepalive_thread, NULL, keepalive_main, c) == 0;
  }
  return TT_OK;
}

tt_client *tt_client_retain(tt_client *client) {
  atomic_fetch_add(&client->refs, 1);
  return client;
}

void tt_client_release(tt_client *client) {
  if (!client || atomic_fetch_sub(&client->refs, 1) != 1) return;
  pthread_mutex_destroy(&client->error_lock);
  pthread_mutex_destroy(&client->keepalive_lock);
  pthread_mutex_destroy(&client->cq_lock);
  pthread_mutex_destroy(&client->resume_lock);
  explicit_bzero(client->resume_secret, sizeof(client->resume_secret));
  pthread_cond_destroy(&client->keepalive_cond);
  tt_lane_close(client);
  tt_shm_destroy(client);
  ttd_block_cache_destroy(&client->blocks);
  pthread_mutex_destroy(&client->shm_lock);
  pthread_mutex_destroy(&client->lane_lock);
  explicit_bzero(client->authorization, sizeof(client->authorization));
  free(client);
}

void tt_disconnect(tt_client *client) {
  if (!client) return;
  if (client->keepalive_running) {
    pthread_mutex_lock(&client->keepalive_lock);
    client->stopping = true;
    pthread_cond_broadcast(&client->keepalive_cond);
    pthread_mutex_unlock(&client->keepalive_lock);
    pthread_join(client->keepalive_thread, NULL);
    client->keepalive_running = false;
  }
  if (client->channel) {
    if (client->session_hex[0]) {
      Ttd__V1__CloseSessionRequest req = TTD__V1__CLOSE_SESSION_REQUEST__INIT;
      ProtobufCMessage *resp = NULL;
      if (tt_rpc_unary(client, TT_RPC_CLOSE_SESSION, &req.base, &ttd__v1__close_session_response__descriptor,
                       &resp) == TT_OK) {
        protobuf_c_message_free_unpacked(resp, NULL);
      }
    }
    client->closed = true; /* tensors still held fail with FAILED_PRECONDITION from here on */
    grpc_channel_destroy(client->channel);
    client->channel = NULL;
  }
  client->closed = true;         /* also when there was no channel */
  tt_rpc_cq_cache_clear(client); /* no call keeps its queue once closed */
  if (client->grpc_initialized) {
    grpc_shutdown();
    client->grpc_initialized = false;
  }
  tt_client_release(client);
}
