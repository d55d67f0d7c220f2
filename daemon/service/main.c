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
#include "service/admin_http.h"
#include "service/idle_trim.h"
#include "telemetry/log.h"
#include "rpc/server.h"
#include "service/service_notify.h"
#include "service/shm_listener.h"

typedef struct loop_state {
  struct event_base *base;
  ttd_core *core;
  int argc;
  char **argv;
  int stop_signal;
} loop_state;

/* SIGTERM or SIGINT before the loop's handlers are in place (ttd already listens by then):
 * remembered, and the loop is skipped, so the stop is as graceful as a later one. */
static volatile sig_atomic_t early_stop_signal;

static void on_early_stop(int sig) { early_stop_signal = sig; }

static void on_stop_signal(evutil_socket_t sig, short what, void *arg) {
  (void)what;
  loop_state *st = arg;
  st->stop_signal = (int)sig;
  event_base_loopbreak(st->base);
}

/* SIGHUP: reads the flags and the config file again and applies what can change while
 * serving (tokens and quotas); sessions stay. A broken file keeps the running settings. */
static void on_reload(evutil_socket_t sig, short what, void *arg) {
  (void)sig;
  (void)what;
  loop_state *st = arg;
  ttd_config fresh;
  ttd_config_defaults(&fresh);
  int help = 0;
  ttd_status_t status = ttd_config_load(&fresh, st->argc, st->argv, &help);
  if (!status) status = ttd_config_check(&fresh);
  if (!status) status = ttd_core_reload(st->core, &fresh);
  if (status) {
    TTD_LOG(TTD_LOG_ERROR, "event=reload-failed action=kept-previous-settings message=\"%s\"", ttd_status_message(status));
    ttd_notify_status("reload failed, previous settings kept: %s", ttd_status_message(status));
  } else {
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
  loop_state *st = arg;
  ttd_session_table_sweep(&st->core->sessions, ttd_now_ms());
}

/* For a unix: address: makes its folder, refuses one a live daemon serves, removes a
 * stale socket file. */
static int prepare_unix_address(const char *address) {
  if (strncmp(address, "unix:", 5) != 0) return 0;
  const char *path = address + 5;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof(sa.sun_path)) {
    TTD_LOG(TTD_LOG_ERROR, "event=bad-address address=%s reason=\"socket path longer than %zu bytes\"", address,
            sizeof(sa.sun_path) - 1);
    return -1;
  }
  char dir[sizeof(sa.sun_path)];
  snprintf(dir, sizeof(dir), "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash && slash != dir) {
    *slash = '\0';
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
      TTD_LOG(TTD_LOG_ERROR, "event=bad-address address=%s reason=\"cannot create %s: %s\"", address, dir,
              strerror(errno));
      return -1;
    }
    /* Whoever can write the folder can put their own socket in ttd's place and collect the
     * tokens clients send: it must be ours (or root's), or sticky like /tmp. */
    struct stat st;
    if (lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode) || (st.st_uid != geteuid() && st.st_uid != 0) ||
        ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX))) {
      TTD_LOG(TTD_LOG_ERROR, "event=bad-address address=%s reason=\"the folder %s is not a directory owned by this "
              "user or root, or others may write it without the sticky bit: another user could replace the "
              "socket\"", address, dir);
      return -1;
    }
  }
  struct stat existing;
  if (lstat(path, &existing) == 0 && !S_ISSOCK(existing.st_mode)) {
    TTD_LOG(TTD_LOG_ERROR, "event=bad-address address=%s reason=\"%s exists and is not a socket\"", address, path);
    return -1;
  }
  strcpy(sa.sun_path, path);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int live = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
  close(fd);
  if (live) {
    TTD_LOG(TTD_LOG_ERROR, "event=address-in-use address=%s reason=\"another ttd is serving this socket\"", address);
    return -1;
  }
  unlink(path);
  return 0;
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

int main(int argc, char **argv) {
  ttd_config config;
  ttd_config_defaults(&config);
  int help = 0;
  ttd_status_t status = ttd_config_load(&config, argc, argv, &help);
  if (status || help) {
    if (status) fprintf(stderr, "ttd: %s\n", ttd_status_message(status));
    ttd_config_usage(status ? stderr : stdout);
    ttd_status_free(status);
    ttd_config_clear(&config);
    return status ? 2 : 0;
  }
  int level = ttd_log_level_parse(config.log_level);
  if (level < 0) {
    fprintf(stderr, "ttd: --log-level must be debug, info, warn or error, got '%s'\n", config.log_level);
    ttd_config_clear(&config);
    return 2;
  }
  ttd_log_threshold = level;
  if (config.listen_count == 0) {
    char target[256];
    if (ttd_default_address(target, sizeof(target)) != 0 || ttd_config_set(&config, "listen", target) != TTD_OK) {
      fprintf(stderr, "ttd: cannot work out the default socket path; pass --listen\n");
      return 2;
    }
  }
  status = ttd_config_check(&config);
  if (status) {
    TTD_LOG(TTD_LOG_ERROR, "event=start-failed message=\"%s\"", ttd_status_message(status));
    ttd_status_free(status);
    ttd_config_clear(&config);
    return 1;
  }
  /* SIGHUP is handled once the loop runs; until then a reload request must not kill ttd. */
  signal(SIGHUP, SIG_IGN);
  signal(SIGTERM, on_early_stop);
  signal(SIGINT, on_early_stop);
  for (int i = 0; i < config.listen_count; i++) {
    if (prepare_unix_address(config.listen[i]) != 0) {
      ttd_config_clear(&config);
      return 1;
    }
  }
  signal(SIGPIPE, SIG_IGN);
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
  ttd_core *core = NULL;
  ttd_server *server = NULL;
  status = ttd_core_create(&config, &core);
  /* The loop and the shared-memory side socket come before the server: OpenSession names
   * the side socket from its first call on. */
  struct event_base *base = event_base_new();
  if (!status && !base) status = ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "cannot create the event loop");
  ttd_shm_listener *shm = NULL;
  if (!status) shm = start_shm_listener(base, core, &config);
  if (!status) status = ttd_server_start(core, (const char *const *)config.listen, config.listen_count,
                                         config.threads, &server);
  if (status) {
    TTD_LOG(TTD_LOG_ERROR, "event=start-failed message=\"%s\"", ttd_status_message(status));
    ttd_status_free(status);
    ttd_shm_listener_stop(shm);
    ttd_core_destroy(core);
    if (base) event_base_free(base);
    grpc_shutdown();
    ttd_config_clear(&config);
    return 1;
  }
  TTD_LOG(TTD_LOG_INFO, "event=ready instance=%s backend=%s devices=%d dram=%llu l1=%llu lease_ms=%lld threads=%d",
          core->instance_id, config.backend, config.devices, (unsigned long long)config.dram,
          (unsigned long long)config.l1, (long long)config.lease_ms, config.threads);

  loop_state st = {.base = base, .core = core, .argc = argc, .argv = argv};
  ttd_admin *admin = NULL;
  if (strcmp(config.admin, "off") != 0) {
    status = ttd_admin_start(st.base, core, config.admin, &admin);
    if (status) {
      TTD_LOG(TTD_LOG_ERROR, "event=start-failed message=\"%s\"", ttd_status_message(status));
      ttd_status_free(status);
      ttd_server_stop(server, 0);
      ttd_shm_listener_stop(shm);
      ttd_core_destroy(core);
      event_base_free(st.base);
      ttd_config_clear(&config);
      return 1;
    }
  }
  ttd_admin_set_ready(admin, true);
  struct event *sigterm = evsignal_new(st.base, SIGTERM, on_stop_signal, &st);
  struct event *sigint = evsignal_new(st.base, SIGINT, on_stop_signal, &st);
  struct event *sighup = evsignal_new(st.base, SIGHUP, on_reload, &st);
  struct event *sweep = event_new(st.base, -1, EV_PERSIST, on_sweep, &st);
  int64_t sweep_ms = config.lease_ms / 4 < 1000 ? config.lease_ms / 4 : 1000;
  struct timeval every = {.tv_sec = sweep_ms / 1000, .tv_usec = (sweep_ms % 1000) * 1000};
  evsignal_add(sigterm, NULL);
  evsignal_add(sigint, NULL);
  evsignal_add(sighup, NULL);
  event_add(sweep, &every);
  /* READY=1 once every listener serves and every signal handler is in place. */
  char serving[1024] = "";
  for (int i = 0; i < config.listen_count; i++) {
    size_t used = strlen(serving);
    snprintf(serving + used, sizeof(serving) - used, "%s%s", i ? ", " : "", config.listen[i]);
  }
  ttd_notify_ready("serving %d device%s on %s", config.devices, config.devices == 1 ? "" : "s", serving);
  ttd_notify_watchdog_timer *watchdog = ttd_notify_watchdog_timer_create(st.base);
  ttd_idle_trim *trim = ttd_idle_trim_create(st.base, &core->metrics);
  if (early_stop_signal) st.stop_signal = early_stop_signal; /* asked to stop while starting */
  else event_base_dispatch(st.base);

  TTD_LOG(TTD_LOG_INFO, "event=stopping signal=%d drain_ms=%lld", st.stop_signal, (long long)config.drain_timeout_ms);
  ttd_notify_stopping("draining");
  ttd_admin_set_ready(admin, false);
  ttd_admin_stop(admin);
  ttd_shm_listener_stop(shm);
  ttd_server_stop(server, config.drain_timeout_ms);
  TTD_LOG(TTD_LOG_DEBUG, "event=server-stopped");
  ttd_core_destroy(core);
  ttd_notify_watchdog_timer_free(watchdog);
  ttd_idle_trim_free(trim);
  event_free(sweep);
  event_free(sigint);
  event_free(sighup);
  event_free(sigterm);
  event_base_free(st.base);
  /* No grpc_shutdown() here: every gRPC object of ours is destroyed by now, and in gRPC
   * 1.51 the library teardown blocks for its 10 s iomgr deadline after the server has sent
   * large messages (measured: 11 s after one 800 KB Download, 1.3 s otherwise). The
   * process exits next, which releases the library's memory at once. */
  for (int i = 0; i < config.listen_count; i++) {
    if (strncmp(config.listen[i], "unix:", 5) == 0) unlink(config.listen[i] + 5);
  }
  TTD_LOG(TTD_LOG_INFO, "event=stopped");
  ttd_config_clear(&config);
  return 0;
}
