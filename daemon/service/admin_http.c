#include "service/admin_http.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/http.h>
#include <event2/listener.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "telemetry/log.h"
#include "rpc/method.h"

struct ttd_admin {
  struct evhttp *http;
  struct evconnlistener *listener; /* evhttp's, for pausing after a failed accept */
  struct event *resume;            /* re-enables it */
  ttd_core *core;
  int port; /* the one bound: the kernel's choice for port 0 */
  bool ready;
  /* Connections evhttp made this turn of the loop, each with a reference of ours, waiting for
   * adopt_connections to count them: evhttp makes its connection object after on_new_connection. */
  struct event *adopt;
  struct bufferevent **fresh;
  size_t n_fresh, cap_fresh;
  int connections, max_connections; /* open now, and the bound */
};

/* At most one line a second for a repeating message, then the count of those left out. */
typedef struct log_limit {
  time_t second;
  uint64_t suppressed;
} log_limit;

static bool log_allowed(log_limit *l, uint64_t *out_suppressed) {
  time_t now = time(NULL);
  if (now == l->second) {
    l->suppressed++;
    return false;
  }
  l->second = now;
  *out_suppressed = l->suppressed;
  l->suppressed = 0;
  return true;
}

static log_limit libevent_limit, accept_limit; /* the loop's thread only */

/* The admin listener whose accept failed: libevent hands the error callback evhttp's own
 * argument, and a process has one admin listener. */
static ttd_admin *accepting_admin;

static void libevent_log(int severity, const char *msg) {
  uint64_t left_out;
  if (!log_allowed(&libevent_limit, &left_out)) return;
  ttd_log_level level = severity >= EVENT_LOG_ERR ? TTD_LOG_ERROR : severity >= EVENT_LOG_WARN ? TTD_LOG_WARN : TTD_LOG_DEBUG;
  TTD_LOG(level, "event=libevent message=\"%s\" left_out=%llu", msg, (unsigned long long)left_out);
}

void ttd_admin_route_libevent_log(void) { event_set_log_callback(libevent_log); }

static void resume_accepting(evutil_socket_t fd, short what, void *arg) {
  (void)fd, (void)what;
  ttd_admin *admin = arg;
  evconnlistener_enable(admin->listener);
}

/* accept failed (EMFILE, ENFILE, ENOBUFS, ...): pause rather than spin, then go on. */
static void on_accept_error(struct evconnlistener *listener, void *arg) {
  (void)arg; /* evhttp's */
  ttd_admin *admin = accepting_admin;
  int err = EVUTIL_SOCKET_ERROR();
  uint64_t left_out;
  if (log_allowed(&accept_limit, &left_out)) {
    TTD_LOG(TTD_LOG_WARN, "event=admin-accept-failed error=\"%s\" retry_ms=%d left_out=%llu",
            evutil_socket_error_to_string(err), ADMIN_ACCEPT_RETRY_MS, (unsigned long long)left_out);
  }
  if (!admin) return;
  evconnlistener_disable(listener);
  struct timeval tv = {0, ADMIN_ACCEPT_RETRY_MS * 1000};
  event_add(admin->resume, &tv);
}

/* A growing text buffer. */
typedef struct text {
  char *data;
  size_t len, cap;
} text;

static void put(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *t, const char *fmt, ...) {
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->data ? t->data + t->len : NULL, t->data ? t->cap - t->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (t->data && t->len + (size_t)n < t->cap) {
      t->len += (size_t)n;
      return;
    }
    size_t cap = (t->cap ? t->cap * 2 : 8192) + (size_t)n;
    char *grown = realloc(t->data, cap);
    if (!grown) return;
    t->data = grown;
    t->cap = cap;
  }
}

/* The counters of one of the RPC poller's spins (cq_spin.h): ttd_NAME_{hits,misses,seconds}_total. */
static void put_spin(text *t, const char *name, const char *after, const char *flag, const ttd_cq_spin *spin) {
  put(t, "# HELP ttd_%s_hits_total Waits of the RPC poller after %s whose next event came while it polled (%s).\n"
         "# TYPE ttd_%s_hits_total counter\nttd_%s_hits_total %llu\n",
      name, after, flag, name, name, (unsigned long long)atomic_load(&spin->hits));
  put(t, "# HELP ttd_%s_misses_total Waits of the RPC poller after %s that polled, then slept.\n"
         "# TYPE ttd_%s_misses_total counter\nttd_%s_misses_total %llu\n",
      name, after, name, name, (unsigned long long)atomic_load(&spin->misses));
  put(t, "# HELP ttd_%s_seconds_total CPU time the RPC poller spent polling after %s before sleeping.\n"
         "# TYPE ttd_%s_seconds_total counter\nttd_%s_seconds_total %.6f\n",
      name, after, name, name, (double)atomic_load(&spin->spin_ns) / 1e9);
}

static const char *method_name(size_t i) {
  if (i >= ttd_method_count) return "unknown";
  const char *slash = strrchr(ttd_methods[i].path, '/');
  return slash ? slash + 1 : ttd_methods[i].path;
}

/* One gauge per device and memory location: the uint64_t at `field` of ttd_device_memory. */
static void put_memory_gauge(text *t, const char *name, const char *help, const ttd_device_info *info, int devices,
                             size_t field) {
  put(t, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name);
  for (int d = 0; d < devices; d++) {
    for (int m = 0; m < TTD_MEM_COUNT; m++) {
      const ttd_device_memory *mem = &info[d].memory[m];
      put(t, "%s{device=\"tt:%d\",location=\"%s\"} %llu\n", name, d, ttd_memloc_name(mem->location),
          (unsigned long long)*(const uint64_t *)((const char *)mem + field));
    }
  }
}

/* Per tenant: open sessions and the device bytes they hold (read live), and the card time
 * and programs its sessions ran (counters kept by the scheduler's callers). */
static void put_tenants(text *t, ttd_core *core) {
  typedef struct {
    const char *name;
    uint64_t sessions, bytes;
  } use;
  use uses[TTD_METRICS_MAX_TENANTS];
  int n_uses = 0;
  ttd_session **sessions = NULL;
  size_t n = 0;
  if (ttd_session_table_snapshot(&core->sessions, &sessions, &n) != TTD_OK) n = 0;
  for (size_t i = 0; i < n; i++) {
    int k = 0;
    while (k < n_uses && strcmp(uses[k].name, sessions[i]->tenant) != 0) k++;
    if (k == n_uses) {
      if (n_uses == TTD_METRICS_MAX_TENANTS) continue;
      uses[n_uses++] = (use){.name = sessions[i]->tenant};
    }
    uses[k].sessions++;
    uses[k].bytes += atomic_load(&sessions[i]->quota->used);
  }
  put(t, "# HELP ttd_tenant_sessions Open sessions of each tenant.\n# TYPE ttd_tenant_sessions gauge\n");
  for (int k = 0; k < n_uses; k++) {
    put(t, "ttd_tenant_sessions{tenant=\"%s\"} %llu\n", uses[k].name, (unsigned long long)uses[k].sessions);
  }
  put(t, "# HELP ttd_tenant_device_bytes Device memory held by each tenant's sessions.\n"
         "# TYPE ttd_tenant_device_bytes gauge\n");
  for (int k = 0; k < n_uses; k++) {
    put(t, "ttd_tenant_device_bytes{tenant=\"%s\"} %llu\n", uses[k].name, (unsigned long long)uses[k].bytes);
  }
  ttd_session_table_snapshot_free(sessions, n);
  ttd_metrics *m = &core->metrics;
  int tenants = ttd_metrics_tenant_count(m);
  put(t, "# HELP ttd_tenant_card_seconds_total Time each tenant's programs held a card (one run beside others: "
         "its share of the card's cores); a tenant's share of the cards is the rate of its series over the sum of "
         "all.\n# TYPE ttd_tenant_card_seconds_total counter\n");
  for (int k = 0; k < tenants; k++) {
    put(t, "ttd_tenant_card_seconds_total{tenant=\"%s\"} %.6f\n", m->tenants[k].name,
        (double)atomic_load(&m->tenants[k].card_ns) / 1e9);
  }
  put(t, "# HELP ttd_tenant_programs_total Device calls (Execute, Backward, ...) each tenant's sessions ran.\n"
         "# TYPE ttd_tenant_programs_total counter\n");
  for (int k = 0; k < tenants; k++) {
    put(t, "ttd_tenant_programs_total{tenant=\"%s\"} %llu\n", m->tenants[k].name,
        (unsigned long long)atomic_load(&m->tenants[k].programs));
  }
}

/* One series of the nodes' counters by op and pass (ops that ran only): their seconds, or
 * their runs. */
static void put_nodes(text *t, const ttd_metrics *mt, const char *name, const char *help, bool seconds) {
  static const char *const passes[2] = {"forward", "backward"};
  put(t, "# HELP %s %s\n# TYPE %s counter\n", name, help, name);
  for (int op = 0; op < TTD_OP_COUNT; op++) {
    for (int p = 0; p < 2; p++) {
      unsigned long long runs = atomic_load(&mt->ops[op].runs[p]);
      if (!runs) continue;
      put(t, "%s{op=\"%s\",pass=\"%s\"} ", name, ttd_op_name((ttd_op)op), passes[p]);
      if (seconds) put(t, "%.9f\n", (double)atomic_load(&mt->ops[op].ns[p]) / 1e9);
      else put(t, "%llu\n", runs);
    }
  }
}

/* Where the cards' time goes: by op and pass, optimizer updates, and the phases of device
 * calls. */
static void put_card_time(text *t, const ttd_metrics *mt) {
  put_nodes(t, mt, "ttd_node_seconds_total",
            "Wall time of program nodes on the cards' threads (their kernels' threads with them), by op and pass.",
            true);
  put_nodes(t, mt, "ttd_node_runs_total", "Program nodes run on the cards, by op and pass.", false);
  put(t, "# HELP ttd_optimizer_seconds_total Time of optimizer updates on the cards, one parameter each.\n"
         "# TYPE ttd_optimizer_seconds_total counter\nttd_optimizer_seconds_total %.9f\n"
         "# HELP ttd_optimizer_updates_total Optimizer updates on the cards, one parameter each.\n"
         "# TYPE ttd_optimizer_updates_total counter\nttd_optimizer_updates_total %llu\n",
      (double)atomic_load(&mt->optimizer_ns) / 1e9, (unsigned long long)atomic_load(&mt->optimizer_steps));
  static const char *const phases[TTD_PHASE_COUNT] = {"waiting", "running", "answering"};
  put(t, "# HELP ttd_device_call_seconds_total Device calls' time by phase: waiting (arrival to the turn on the "
         "card), running (the method on the card's thread), answering (packing and handing the answer to gRPC on "
         "the card's thread).\n# TYPE ttd_device_call_seconds_total counter\n");
  for (int p = 0; p < TTD_PHASE_COUNT; p++)
    put(t, "ttd_device_call_seconds_total{phase=\"%s\"} %.9f\n", phases[p], (double)atomic_load(&mt->phase_ns[p]) / 1e9);
  put(t, "# HELP ttd_device_calls_total Device calls that had their turn on a card.\n"
         "# TYPE ttd_device_calls_total counter\nttd_device_calls_total %llu\n",
      (unsigned long long)atomic_load(&mt->device_calls));
  put(t, "# HELP ttd_lanes Same-host call lanes registered now (one per session at most).\n"
         "# TYPE ttd_lanes gauge\nttd_lanes %lld\n"
         "# HELP ttd_lane_calls_total Calls answered on a call lane rather than over gRPC, refused ones included.\n"
         "# TYPE ttd_lane_calls_total counter\nttd_lane_calls_total %llu\n",
      (long long)atomic_load(&mt->lanes_open), (unsigned long long)atomic_load(&mt->lane_calls));
}

char *ttd_admin_render_metrics(ttd_core *core) {
  text t = {0};
  ttd_backend *b = core->backend;
  int devices = b->vtable->device_count(b);
  devices = devices < 64 ? devices : 64;
  ttd_device_info info[64];
  for (int d = 0; d < devices; d++) b->vtable->device_info(b, d, &info[d]);
  put_memory_gauge(&t, "ttd_device_memory_capacity_bytes", "Capacity of each device memory.", info, devices,
                   offsetof(ttd_device_memory, capacity_bytes));
  put_memory_gauge(&t, "ttd_device_memory_used_bytes", "Bytes held by tensors in each device memory.", info, devices,
                   offsetof(ttd_device_memory, used_bytes));
  put_memory_gauge(&t, "ttd_device_memory_in_flight_bytes",
                   "Host bytes of freed tensors that sends to a slow client still point into (not in used_bytes).",
                   info, devices, offsetof(ttd_device_memory, in_flight_bytes));
  uint64_t sessions, tensors;
  ttd_session_table_stats(&core->sessions, &sessions, &tensors);
  put(&t, "# HELP ttd_sessions Open sessions.\n# TYPE ttd_sessions gauge\nttd_sessions %llu\n",
      (unsigned long long)sessions);
  put(&t, "# HELP ttd_tensors Tensors held by open sessions.\n# TYPE ttd_tensors gauge\nttd_tensors %llu\n",
      (unsigned long long)tensors);
  const ttd_metrics *mt = &core->metrics;
  put(&t, "# HELP ttd_device_queue_depth Programs waiting for their turn on each device (the running ones not counted).\n"
          "# TYPE ttd_device_queue_depth gauge\n");
  for (int d = 0; d < devices; d++) {
    put(&t, "ttd_device_queue_depth{device=\"tt:%d\"} %zu\n", d, ttd_scheduler_queued(core->scheduler, d));
  }
  put(&t, "# HELP ttd_device_programs_together_total Programs each device ran beside programs of other sessions, "
          "each on one of its threads (--programs-at-once).\n# TYPE ttd_device_programs_together_total counter\n");
  for (int d = 0; d < devices; d++) {
    put(&t, "ttd_device_programs_together_total{device=\"tt:%d\"} %llu\n", d,
        (unsigned long long)ttd_scheduler_together(core->scheduler, d));
  }
  put_tenants(&t, core);
  put_card_time(&t, mt);
  put(&t, "# HELP ttd_rpc_in_flight RPCs arrived and not yet answered (the queue depth).\n"
          "# TYPE ttd_rpc_in_flight gauge\nttd_rpc_in_flight %lld\n",
      (long long)atomic_load(&mt->in_flight));
  put(&t, "# HELP ttd_connections_refused_total Connections the listeners closed at once: past "
          "--max-connections or --max-peer-connections, or no descriptor left.\n"
          "# TYPE ttd_connections_refused_total counter\nttd_connections_refused_total %llu\n"
          "# HELP ttd_connections_handshake_timeouts_total Connections closed without an HTTP/2 preface within "
          "--handshake-timeout.\n# TYPE ttd_connections_handshake_timeouts_total counter\n"
          "ttd_connections_handshake_timeouts_total %llu\n"
          "# HELP ttd_connections_reset_closed_total Connections closed for resetting streams too fast (HTTP/2 rapid "
          "reset).\n# TYPE ttd_connections_reset_closed_total counter\nttd_connections_reset_closed_total %llu\n"
          "# HELP ttd_connections_protocol_closed_total Connections closed for HTTP/2 ttd refuses: no client "
          "preface, or more new streams than allowed before the SETTINGS are acknowledged.\n"
          "# TYPE ttd_connections_protocol_closed_total counter\nttd_connections_protocol_closed_total %llu\n"
          "# HELP ttd_admin_connections Connections the admin HTTP listener holds open.\n"
          "# TYPE ttd_admin_connections gauge\nttd_admin_connections %lld\n"
          "# HELP ttd_admin_connections_refused_total Admin HTTP connections closed at once, past "
          "--admin-max-connections.\n# TYPE ttd_admin_connections_refused_total counter\n"
          "ttd_admin_connections_refused_total %llu\n"
          "# HELP ttd_listeners_down Listeners that did not answer the last probe (/healthz fails while any).\n"
          "# TYPE ttd_listeners_down gauge\nttd_listeners_down %d\n",
      (unsigned long long)atomic_load(&mt->connections_refused),
      (unsigned long long)atomic_load(&mt->connections_timed_out),
      (unsigned long long)atomic_load(&mt->connections_reset_closed),
      (unsigned long long)atomic_load(&mt->connections_protocol_closed),
      (long long)atomic_load(&mt->admin_connections),
      (unsigned long long)atomic_load(&mt->admin_connections_refused), __builtin_popcount(atomic_load(&mt->listeners_down)));
  put(&t, "# HELP ttd_bytes_to_device_total Tensor bytes received from clients (uploads, inline tensors).\n"
          "# TYPE ttd_bytes_to_device_total counter\nttd_bytes_to_device_total %llu\n",
      (unsigned long long)atomic_load(&mt->bytes_to_device));
  put(&t, "# HELP ttd_bytes_to_host_total Tensor bytes sent to clients (downloads, inline outputs).\n"
          "# TYPE ttd_bytes_to_host_total counter\nttd_bytes_to_host_total %llu\n",
      (unsigned long long)atomic_load(&mt->bytes_to_host));
  put_spin(&t, "poll_spin", "a light call", "--spin-us", &core->poll_spin);
  put_spin(&t, "device_spin", "answering device work", "--device-spin-us", &core->device_spin);
  put(&t, "# HELP ttd_rpc_total RPCs answered, by method and status code.\n# TYPE ttd_rpc_total counter\n");
  for (size_t i = 0; i <= ttd_method_count && i < TTD_METRICS_MAX_METHODS; i++) {
    for (int c = 0; c < TTD_METRICS_CODES; c++) {
      unsigned long long n = atomic_load(&mt->methods[i].by_code[c]);
      if (n) put(&t, "ttd_rpc_total{method=\"%s\",code=\"%s\"} %llu\n", method_name(i), ttd_code_name(c), n);
    }
  }
  put(&t, "# HELP ttd_rpc_duration_seconds Time from a call's arrival to its status.\n"
          "# TYPE ttd_rpc_duration_seconds histogram\n");
  for (size_t i = 0; i <= ttd_method_count && i < TTD_METRICS_MAX_METHODS; i++) {
    unsigned long long cumulative = 0;
    for (int k = 0; k <= TTD_LATENCY_BUCKETS; k++) cumulative += atomic_load(&mt->methods[i].latency[k]);
    if (!cumulative) continue;
    unsigned long long total = cumulative;
    cumulative = 0;
    for (int k = 0; k < TTD_LATENCY_BUCKETS; k++) {
      cumulative += atomic_load(&mt->methods[i].latency[k]);
      put(&t, "ttd_rpc_duration_seconds_bucket{method=\"%s\",le=\"%g\"} %llu\n", method_name(i), ttd_latency_bounds[k],
          cumulative);
    }
    put(&t, "ttd_rpc_duration_seconds_bucket{method=\"%s\",le=\"+Inf\"} %llu\n", method_name(i), total);
    put(&t, "ttd_rpc_duration_seconds_sum{method=\"%s\"} %.9f\n", method_name(i),
        (double)atomic_load(&mt->methods[i].latency_sum_ns) / 1e9);
    put(&t, "ttd_rpc_duration_seconds_count{method=\"%s\"} %llu\n", method_name(i), total);
  }
  return t.data;
}

static void on_connection_closed(struct evhttp_connection *evcon, void *arg) {
  (void)evcon;
  ttd_admin *admin = arg;
  admin->connections--;
  atomic_store(&admin->core->metrics.admin_connections, admin->connections);
}

/* evhttp's connection objects of this turn's accepts: past max_connections one is closed at
 * once; the others count until they close. */
static void adopt_connections(evutil_socket_t fd, short what, void *arg) {
  (void)fd, (void)what;
  ttd_admin *admin = arg;
  for (size_t i = 0; i < admin->n_fresh; i++) {
    struct bufferevent *bev = admin->fresh[i];
    void *evcon = NULL; /* evhttp's callbacks' argument; NULL once evhttp freed the connection */
    bufferevent_getcb(bev, NULL, NULL, NULL, &evcon);
    if (evcon && admin->connections >= admin->max_connections) {
      atomic_fetch_add(&admin->core->metrics.admin_connections_refused, 1);
      evhttp_connection_free(evcon);
    } else if (evcon) {
      admin->connections++;
      evhttp_connection_set_closecb(evcon, on_connection_closed, admin);
    }
    bufferevent_decref(bev);
  }
  admin->n_fresh = 0;
  atomic_store(&admin->core->metrics.admin_connections, admin->connections);
}

/* evhttp's source of a new connection's bufferevent. Reading stops while ADMIN_MAX_INPUT_BYTES
 * wait in it: evhttp parses one request at a time and reads the next only after its answer is
 * sent, so a peer that pipelines requests without reading the answers is held to that much
 * input and one answer until --admin-timeout closes it. */
static struct bufferevent *on_new_connection(struct event_base *base, void *arg) {
  ttd_admin *admin = arg;
  struct bufferevent *bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
  if (!bev) return NULL;
  bufferevent_setwatermark(bev, EV_READ, 0, ADMIN_MAX_INPUT_BYTES);
  if (admin->n_fresh == admin->cap_fresh) {
    size_t cap = admin->cap_fresh ? admin->cap_fresh * 2 : 16;
    struct bufferevent **grown = realloc(admin->fresh, cap * sizeof(*grown));
    if (!grown) return bev; /* out of memory: this one goes uncounted */
    admin->fresh = grown;
    admin->cap_fresh = cap;
  }
  bufferevent_incref(bev);
  admin->fresh[admin->n_fresh++] = bev;
  event_active(admin->adopt, EV_TIMEOUT, 0);
  return bev;
}

/* A HEAD answer carries no body: evhttp would send one, with no Content-Length, and a client
 * on a kept-alive connection would read it as the start of the next answer. */
static void reply_text(struct evhttp_request *req, int code, const char *reason, const char *content_type,
                       const char *body) {
  struct evbuffer *out = evbuffer_new();
  if (body && evhttp_request_get_command(req) != EVHTTP_REQ_HEAD) evbuffer_add(out, body, strlen(body));
  evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", content_type);
  evhttp_send_reply(req, code, reason, out);
  evbuffer_free(out);
}

static void on_request(struct evhttp_request *req, void *arg) {
  ttd_admin *admin = arg;
  enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
  const char *path = evhttp_uri_get_path(evhttp_request_get_evhttp_uri(req));
  if (!path) path = "/";
  if (cmd != EVHTTP_REQ_GET && cmd != EVHTTP_REQ_HEAD) {
    reply_text(req, 405, "Method Not Allowed", "text/plain", "use GET\n");
  } else if (strcmp(path, "/healthz") == 0) {
    unsigned down = atomic_load(&admin->core->metrics.listeners_down);
    if (!down) {
      reply_text(req, 200, "OK", "text/plain", "ok\n");
    } else { /* a listener that takes no connection serves no one: restart ttd */
      text t = {0};
      const ttd_config *config = admin->core->config;
      for (int i = 0; i < config->listen_count && i < 32; i++) {
        if (down & (1u << i)) put(&t, "listener %s does not answer\n", config->listen[i]);
      }
      reply_text(req, 503, "Service Unavailable", "text/plain", t.data ? t.data : "a listener does not answer\n");
      free(t.data);
    }
  } else if (strcmp(path, "/readyz") == 0) {
    if (admin->ready) reply_text(req, 200, "OK", "text/plain", "ready\n");
    else reply_text(req, 503, "Service Unavailable", "text/plain", "not ready\n");
  } else if (strcmp(path, "/metrics") == 0) {
    char *body = ttd_admin_render_metrics(admin->core);
    if (body) reply_text(req, 200, "OK", "text/plain; version=0.0.4", body);
    else reply_text(req, 500, "Internal Server Error", "text/plain", "out of memory\n");
    free(body);
  } else {
    reply_text(req, 404, "Not Found", "text/plain", "try /healthz, /readyz or /metrics\n");
  }
}

ttd_status_t ttd_admin_start(struct event_base *base, ttd_core *core, const char *address, int64_t timeout_ms,
                             int max_connections, ttd_admin **out_admin) {
  *out_admin = NULL;
  const char *colon = strrchr(address, ':');
  char host[256];
  long port = colon ? strtol(colon + 1, NULL, 10) : -1;
  if (!colon || (size_t)(colon - address) >= sizeof(host) || port < 0 || port > 65535) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "--admin must be host:port or off, got '%s'", address);
  }
  snprintf(host, sizeof(host), "%.*s", (int)(colon - address), address);
  ttd_admin *admin = calloc(1, sizeof(*admin));
  if (!admin) return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
  admin->core = core;
  admin->max_connections = max_connections;
  admin->http = evhttp_new(base);
  admin->resume = evtimer_new(base, resume_accepting, admin);
  admin->adopt = event_new(base, -1, 0, adopt_connections, admin);
  struct evhttp_bound_socket *bound = admin->http && admin->resume && admin->adopt
                                          ? evhttp_bind_socket_with_handle(admin->http, host, (ev_uint16_t)port)
                                          : NULL;
  if (!bound) {
    ttd_admin_stop(admin);
    return ttd_make_status(GRPC_STATUS_UNAVAILABLE, "cannot listen for admin HTTP on %s (in use? use --admin off)",
                           address);
  }
  admin->listener = evhttp_bound_socket_get_listener(bound);
  struct sockaddr_storage sa;
  socklen_t sa_len = sizeof(sa);
  if (getsockname(evhttp_bound_socket_get_fd(bound), (struct sockaddr *)&sa, &sa_len) == 0) {
    admin->port = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                                 : ((struct sockaddr_in *)&sa)->sin_port);
  }
  accepting_admin = admin;
  evconnlistener_set_error_cb(admin->listener, on_accept_error);
  evhttp_set_max_headers_size(admin->http, ADMIN_MAX_HEADER_BYTES);
  evhttp_set_max_body_size(admin->http, ADMIN_MAX_BODY_BYTES);
  struct timeval idle = {(time_t)(timeout_ms / 1000), (suseconds_t)(timeout_ms % 1000) * 1000};
  evhttp_set_timeout_tv(admin->http, &idle);
  evhttp_set_allowed_methods(admin->http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD | EVHTTP_REQ_POST | EVHTTP_REQ_PUT |
                                              EVHTTP_REQ_DELETE);
  evhttp_set_gencb(admin->http, on_request, admin);
  evhttp_set_bevcb(admin->http, on_new_connection, admin);
  TTD_LOG(TTD_LOG_INFO, "event=admin-listening address=%s port=%d max_connections=%d", address, admin->port,
          max_connections);
  *out_admin = admin;
  return TTD_OK;
}

int ttd_admin_port(const ttd_admin *admin) { return admin->port; }

void ttd_admin_set_ready(ttd_admin *admin, bool ready) {
  if (admin) admin->ready = ready;
}

void ttd_admin_stop(ttd_admin *admin) {
  if (!admin) return;
  if (admin->http) evhttp_free(admin->http); /* closes every connection */
  adopt_connections(-1, 0, admin);           /* drops our references to this turn's */
  free(admin->fresh);
  if (admin->adopt) event_free(admin->adopt);
  if (admin->resume) event_free(admin->resume);
  if (accepting_admin == admin) accepting_admin = NULL;
  free(admin);
}
