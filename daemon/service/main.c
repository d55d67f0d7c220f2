/* Layer daemon/service (the top): the process. main, the admin HTTP and shared-memory
 * listeners, systemd notification, idle trimming. Calls every layer below.
 *
 * ttd: the daemon that owns this host's accelerator cards and shares them over gRPC.
 * main wires configuration, the core, the gRPC server and the libevent loop (signals and
 * the lease sweep) together, and tears them down in order. */
#include <errno.h>
#include <event2/event.h>
#include <grpc/grpc.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "wire/address.h"
#include "base/absl_deadlock.h"
#include "base/config.h"
#include "core/core.h"
#include "kernels.h"
#include "service/admin_http.h"
#include "service/idle_trim.h"
#include "telemetry/log.h"
#include "rpc/server.h"
#include "service/service_notify.h"
#include "service/shm_listener.h"
#include "state/state.h"
#include "ttd/v1/protocol.h"

/* Everything the process starts, so that one stop path tears down whatever exists. */
typedef struct service {
  ttd_config config;
  int argc;
  char **argv;
  struct event_base *base;
  ttd_core *core;
  ttd_shm_listener *shm;
  ttd_server *server;
  ttd_admin *admin;
  ttd_state *state; /* --state-dir: sessions saved at the stop, read back at start */
  struct event *sigterm, *sigint, *sighup, *sweep;
  ttd_notify_watchdog_timer *watchdog;
  ttd_idle_trim *trim;
  bool bound;      /* the listeners' socket files are ours to remove at stop */
  bool serving;    /* the start completed: the stop drains and says so */
  int stop_signal;
} service;

/* SIGTERM or SIGINT before the loop's handlers are in place (ttd already listens by then):
 * remembered, and the loop is skipped, so the stop is as graceful as a later one. */
static volatile sig_atomic_t early_stop_signal;

static void on_early_stop(int sig) { early_stop_signal = sig; }

static void on_stop_signal(evutil_socket_t sig, short what, void *arg) {
  (void)what;
  service *svc = arg;
  svc->stop_signal = (int)sig;
  event_base_loopbreak(svc->base);
}

static int default_listen(ttd_config *config);

/* SIGHUP: reads the flags and the config file again and applies what can change while
 * serving (tokens and quotas); sessions stay. A broken file keeps the running settings; an
 * option that only a restart applies is named in a warning. */
static void on_reload(evutil_socket_t sig, short what, void *arg) {
  (void)sig;
  (void)what;
  service *svc = arg;
  ttd_config fresh;
  ttd_config_defaults(&fresh);
  ttd_config_action action;
  ttd_status_t status = ttd_config_load(&fresh, svc->argc, svc->argv, &action);
  if (!status && default_listen(&fresh) != 0) status = ttd_make_status(GRPC_STATUS_INTERNAL, "no default address");
  if (!status) status = ttd_config_check_reload(&svc->config, &fresh);
  if (!status) status = ttd_core_reload(svc->core, &fresh);
  if (status) {
    TTD_LOG(TTD_LOG_ERROR, "event=reload-failed action=kept-previous-settings message=\"%s\"", ttd_status_message(status));
    ttd_notify_status("reload failed, previous settings kept: %s", ttd_status_message(status));
  } else {
    const char *changed[TTD_CONFIG_MAX_OPTIONS];
    int n = ttd_config_restart_changes(&svc->config, &fresh, changed, TTD_CONFIG_MAX_OPTIONS);
    for (int i = 0; i < n; i++) {
      TTD_LOG(TTD_LOG_WARN, "event=reload-ignored option=%s reason=\"--%s changed, but only a restart applies it; "
              "the running value stays\"", changed[i], changed[i]);
    }
    TTD_LOG(TTD_LOG_INFO, "event=reloaded tokens=%s quota=%llu", fresh.tokens_file ? fresh.tokens_file : "none",
            (unsigned long long)fresh.quota);
    ttd_notify_status("reloaded tokens and quotas");
  }
  ttd_status_free(status);
  ttd_config_clear(&fresh);
}

static void on_sweep(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  service *svc = arg;
  /* A full batch: more may have expired; the loop runs other events, then this again. */
  if (ttd_session_table_sweep(&svc->core->sessions, ttd_now_ms()) == TTD_SWEEP_MAX_CLOSE) {
    event_active(svc->sweep, EV_TIMEOUT, 0);
  }
}

/* For a unix: address: makes its folder, refuses one a live daemon serves, removes a
 * stale socket file. */
static ttd_status_t prepare_unix_address(const char *address) {
  if (strncmp(address, "unix:", 5) != 0) return TTD_OK;
  const char *path = address + 5;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof(sa.sun_path)) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "--listen %s: the socket path is longer than %zu bytes",
                           address, sizeof(sa.sun_path) - 1);
  }
  char dir[sizeof(sa.sun_path)];
  snprintf(dir, sizeof(dir), "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash && slash != dir) {
    *slash = '\0';
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
      return ttd_make_status(GRPC_STATUS_FAILED_PRECONDITION, "--listen %s: cannot create %s: %s", address, dir,
                             strerror(errno));
    }
    /* Whoever can write the folder can put their own socket in ttd's place and collect the
     * tokens clients send: it must be ours (or root's), or sticky like /tmp. */
    struct stat st;
    if (lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode) || (st.st_uid != geteuid() && st.st_uid != 0) ||
        ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX))) {
      return ttd_make_status(GRPC_STATUS_FAILED_PRECONDITION,
                             "--listen %s: the folder %s is not a directory owned by this user or root, or others "
                             "may write it without the sticky bit: another user could replace the socket",
                             address, dir);
    }
  }
  struct stat existing;
  if (lstat(path, &existing) == 0 && !S_ISSOCK(existing.st_mode)) {
    return ttd_make_status(GRPC_STATUS_FAILED_PRECONDITION, "--listen %s: %s exists and is not a socket", address,
                           path);
  }
  strcpy(sa.sun_path, path);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "socket: %s", strerror(errno));
  int live = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
  close(fd);
  if (live) {
    return ttd_make_status(GRPC_STATUS_ALREADY_EXISTS,
                           "--listen %s: address in use: another ttd is serving this socket", address);
  }
  unlink(path);
  return TTD_OK;
}

/* The same-host fast path's side socket, beside the first unix: listener; without it ttd
 * serves everything over gRPC. */
static ttd_shm_listener *start_shm_listener(struct event_base *base, ttd_core *core, const ttd_config *config) {
  for (int i = 0; i < config->listen_count && config->shm; i++) {
    if (strncmp(config->listen[i], "unix:", 5) != 0) continue;
    char path[sizeof(core->shm_socket)];
    snprintf(path, sizeof(path), "%s.shm", config->listen[i] + 5);
    ttd_shm_listener *shm = NULL;
    ttd_status_t status = ttd_shm_listener_start(base, core, path, config->socket_group, &shm);
    if (status) { /* an optimisation: serve without it */
      TTD_LOG(TTD_LOG_WARN, "event=shm-unavailable message=\"%s\"", ttd_status_message(status));
      ttd_status_free(status);
      return NULL;
    }
    snprintf(core->shm_socket, sizeof(core->shm_socket), "%s", path);
    return shm;
  }
  return NULL;
}

/* Without --listen, ttd serves the runtime's default address (the one clients try). */
static int default_listen(ttd_config *config) {
  if (config->listen_count) return 0;
  char target[256];
  if (ttd_default_address(target, sizeof(target)) != 0) return -1;
  ttd_status_t status = ttd_config_set(config, "listen", target);
  ttd_status_free(status);
  return status ? -1 : 0;
}

static void print_version(void) {
  printf("ttd %s (protocol ttd.v1, version %d)\n", TTD_VERSION, TTD_PROTOCOL_VERSION);
}

/* Reads the flags and the config file. Returns -1 to go on, else the exit code: 0 after
 * --help or --version, 2 for a usage error (one line naming it, and where help is). */
static int service_configure(service *svc, int argc, char **argv) {
  svc->argc = argc;
  svc->argv = argv;
  ttd_config_defaults(&svc->config);
  ttd_config_action action;
  ttd_status_t status = ttd_config_load(&svc->config, argc, argv, &action);
  if (status) {
    fprintf(stderr, "ttd: %s; see ttd --help\n", ttd_status_message(status));
    ttd_status_free(status);
    return 2;
  }
  if (action == TTD_CONFIG_HELP) {
    ttd_config_usage(stdout);
    return 0;
  }
  if (action == TTD_CONFIG_VERSION) {
    print_version();
    return 0;
  }
  int level = ttd_log_level_parse(svc->config.log_level);
  if (level < 0) {
    fprintf(stderr, "ttd: --log-level must be debug, info, warn or error, got '%s'; see ttd --help\n",
            svc->config.log_level);
    return 2;
  }
  ttd_log_threshold = level;
  if (default_listen(&svc->config) != 0) {
    fprintf(stderr, "ttd: cannot work out the default socket path; pass --listen\n");
    return 2;
  }
  return -1;
}

/* Starts everything in order: the Unix socket files, the core, the event loop, the
 * shared-memory side socket (before the server: OpenSession names it from the first call
 * on), the gRPC listeners, the admin listener, the signal and timer events. "ready" is
 * logged and sent to systemd only when every listener is bound. */
static ttd_status_t service_start(service *svc) {
  const ttd_config *config = &svc->config;
  /* SIGHUP is handled once the loop runs; until then a reload request must not kill ttd. */
  signal(SIGHUP, SIG_IGN);
  signal(SIGTERM, on_early_stop);
  signal(SIGINT, on_early_stop);
  signal(SIGPIPE, SIG_IGN);
  TTD_RETURN_IF_ERROR(ttd_config_check(config));
  for (int i = 0; i < config->listen_count; i++) TTD_RETURN_IF_ERROR(prepare_unix_address(config->listen[i]));
  /* Big tensor buffers: keep freed memory mapped instead of returning and refaulting it. */
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  /* One arena: tensors are allocated on whichever RPC or executor thread serves the call, and
   * malloc_trim (idle_trim.h) returns the free top of the main arena only; memory left at the
   * top of a thread's own arena would stay resident for good. Small allocations still go
   * through each thread's tcache without the lock. */
  mallopt(M_ARENA_MAX, 1);
  ttd_absl_deadlock_detection_off();
  grpc_init();
  TTD_RETURN_IF_ERROR(ttd_core_create(config, &svc->core));
  if (config->state_dir) TTD_RETURN_IF_ERROR(ttd_state_open(svc->core, config->state_dir, &svc->state));
  ttd_admin_route_libevent_log();
  svc->base = event_base_new();
  if (!svc->base) return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "cannot create the event loop");
  svc->shm = start_shm_listener(svc->base, svc->core, config);
  svc->bound = true;
  TTD_RETURN_IF_ERROR(ttd_server_start(svc->core, (const char *const *)config->listen, config->listen_count,
                                       config->threads, &svc->server));
  ttd_shm_listener_set_lanes(svc->shm, ttd_server_lanes(svc->server));
  if (strcmp(config->admin, "off") != 0) {
    TTD_RETURN_IF_ERROR(ttd_admin_start(svc->base, svc->core, config->admin, config->admin_timeout_ms,
                                        config->admin_max_connections, &svc->admin));
  }
  svc->sigterm = evsignal_new(svc->base, SIGTERM, on_stop_signal, svc);
  svc->sigint = evsignal_new(svc->base, SIGINT, on_stop_signal, svc);
  svc->sighup = evsignal_new(svc->base, SIGHUP, on_reload, svc);
  svc->sweep = event_new(svc->base, -1, EV_PERSIST, on_sweep, svc);
  if (!svc->sigterm || !svc->sigint || !svc->sighup || !svc->sweep) {
    return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "cannot create the loop's signal and timer events");
  }
  int64_t sweep_ms = config->lease_ms / 4 < 1000 ? config->lease_ms / 4 : 1000;
  struct timeval every = {.tv_sec = sweep_ms / 1000, .tv_usec = (sweep_ms % 1000) * 1000};
  evsignal_add(svc->sigterm, NULL);
  evsignal_add(svc->sigint, NULL);
  evsignal_add(svc->sighup, NULL);
  event_add(svc->sweep, &every);
  char serving[1024] = "";
  for (int i = 0; i < config->listen_count; i++) {
    size_t used = strlen(serving);
    snprintf(serving + used, sizeof(serving) - used, "%s%s", i ? ", " : "", config->listen[i]);
  }
  TTD_LOG(TTD_LOG_INFO, "event=ready instance=%s backend=%s devices=%d dram=%llu l1=%llu lease_ms=%lld threads=%d "
          "admin=%s host_bf16_products=%s host_bf16_dot_gain=%.2f", svc->core->instance_id, config->backend,
          config->devices, (unsigned long long)config->dram, (unsigned long long)config->l1,
          (long long)config->lease_ms, config->threads, config->admin, ttd_k_matmul_bf16_path(), ttd_k_bf16_dot_gain());
  ttd_admin_set_ready(svc->admin, true);
  ttd_notify_ready("serving %d device%s on %s", config->devices, config->devices == 1 ? "" : "s", serving);
  svc->watchdog = ttd_notify_watchdog_timer_create(svc->base); /* WATCHDOG=1 pings follow READY=1 */
  svc->trim = ttd_idle_trim_create(svc->base, &svc->core->metrics);
  svc->serving = true;
  return TTD_OK;
}

/* Serves until SIGTERM or SIGINT (or one that came while starting). */
static void service_run(service *svc) {
  if (early_stop_signal) svc->stop_signal = early_stop_signal;
  else event_base_dispatch(svc->base);
}

/* The one stop path, after a run or a failed start alike: it stops whatever was started,
 * in order (admin, then the server drains its calls, then the side socket, then the sessions are
 * saved (--state-dir), then sessions and tensors go with the core, then the loop), and
 * removes the socket files ttd bound. */
static void service_stop(service *svc) {
  if (svc->serving) {
    TTD_LOG(TTD_LOG_INFO, "event=stopping signal=%d drain_ms=%lld", svc->stop_signal,
            (long long)svc->config.drain_timeout_ms);
    ttd_notify_stopping("draining");
  }
  ttd_admin_set_ready(svc->admin, false);
  ttd_admin_stop(svc->admin);
  /* The side socket stays open while the server drains: a client waiting on its call lane
   * takes the socket's hang-up for ttd gone, and its call may still be answered. The loop
   * has stopped, so no registration comes meanwhile. */
  ttd_server_stop(svc->server, svc->config.drain_timeout_ms);
  ttd_shm_listener_stop(svc->shm);
  /* No call runs now: what the sessions hold is what their clients last saw. */
  if (svc->state && svc->serving) {
    ttd_notify_status("saving sessions to %s", svc->config.state_dir);
    ttd_status_free(ttd_state_save(svc->state)); /* logged */
  }
  ttd_state_close(svc->state);
  ttd_core_destroy(svc->core);
  ttd_notify_watchdog_timer_free(svc->watchdog);
  ttd_idle_trim_free(svc->trim);
  struct event *events[] = {svc->sweep, svc->sigint, svc->sighup, svc->sigterm};
  for (size_t i = 0; i < sizeof(events) / sizeof(events[0]); i++) {
    if (events[i]) event_free(events[i]);
  }
  if (svc->base) event_base_free(svc->base);
  /* No grpc_shutdown() here: every gRPC object of ours is destroyed by now, and in gRPC
   * 1.51 the library teardown blocks for its 10 s iomgr deadline after the server has sent
   * large messages (11 s after one 800 KB Download, 1.3 s otherwise). The process exits
   * next, which releases the library's memory at once. */
  for (int i = 0; svc->bound && i < svc->config.listen_count; i++) {
    if (strncmp(svc->config.listen[i], "unix:", 5) == 0) unlink(svc->config.listen[i] + 5);
  }
  if (svc->serving) TTD_LOG(TTD_LOG_INFO, "event=stopped");
  ttd_config_clear(&svc->config);
}

int main(int argc, char **argv) {
  service svc = {0};
  int code = service_configure(&svc, argc, argv);
  if (code >= 0) {
    ttd_config_clear(&svc.config);
    return code;
  }
  ttd_status_t status = service_start(&svc);
  if (status) {
    TTD_LOG(TTD_LOG_ERROR, "event=start-failed message=\"%s\"", ttd_status_message(status));
    ttd_notify_status("start failed: %s", ttd_status_message(status));
    ttd_status_free(status);
    service_stop(&svc);
    return 1;
  }
  service_run(&svc);
  service_stop(&svc);
  return 0;
}
