/* The driver's checks and helpers: failed checks counted, client processes started, what a
 * session holds, and the card holding exactly what the open sessions hold. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "faults.h"
#include "ft_metrics.h"
#include "scripts/bench/bench_common.h"

int faults_check(faults_ctx *ctx, int ok, const char *fmt, ...) {
  if (ok) return 1;
  va_list ap;
  va_start(ap, fmt);
  printf("faults: FAIL: ");
  vprintf(fmt, ap);
  printf("\n");
  fflush(stdout);
  va_end(ap);
  ctx->failures++;
  return 0;
}

faults_tally *faults_tally_add(faults_ctx *ctx, const char *name) {
  faults_tally *t = &ctx->tally[ctx->kinds < FAULTS_MAX_KINDS - 1 ? ctx->kinds++ : ctx->kinds];
  memset(t, 0, sizeof(*t));
  snprintf(t->name, sizeof(t->name), "%s", name);
  return t;
}

int faults_spawn(faults_ctx *ctx, ft_proc *p, const char *role, int tenant, int n, int shm) {
  char nbuf[16], shmbuf[4];
  snprintf(nbuf, sizeof(nbuf), "%d", n);
  snprintf(shmbuf, sizeof(shmbuf), "%d", shm);
  char *argv[] = {(char *)ctx->self, "--child", (char *)role, "--target", ctx->daemon.target,
                  "--n", nbuf, "--shm", shmbuf, NULL};
  char *env[] = {ctx->tenants[tenant].env, NULL};
  int rc = ft_proc_start(p, argv, env);
  faults_check(ctx, rc == 0, "starting a %s client failed", role);
  return rc;
}

int64_t faults_session_bytes(faults_ctx *ctx, uint64_t session) {
  tt_session_info *list = NULL;
  size_t n = 0;
  if (tt_list_sessions(ctx->admin, &list, &n) != TT_OK) return -2;
  int64_t bytes = -1;
  for (size_t i = 0; i < n; i++) {
    if (list[i].session_id == session) bytes = (int64_t)list[i].used_bytes;
  }
  tt_session_list_free(list);
  return bytes;
}

/* What the open sessions hold, and whether any is not an admin's or the bystander's. */
static int sessions_hold(faults_ctx *ctx, uint64_t *out_bytes, int *out_strangers, int print) {
  tt_session_info *list = NULL;
  size_t n = 0;
  *out_bytes = 0;
  *out_strangers = 0;
  if (tt_list_sessions(ctx->admin, &list, &n) != TT_OK) return -1;
  for (size_t i = 0; i < n; i++) {
    *out_bytes += list[i].used_bytes;
    int known = !strcmp(list[i].tenant, ctx->tenants[FT_ADMIN].name) ||
                !strcmp(list[i].tenant, ctx->tenants[FT_BYSTANDER].name);
    *out_strangers += !known;
    if (print) {
      printf("faults:   session %016" PRIx64 " tenant %s client %s holds %" PRIu64 " bytes\n", list[i].session_id,
             list[i].tenant, list[i].client_name, list[i].used_bytes);
    }
  }
  tt_session_list_free(list);
  return 0;
}

double faults_check_memory(faults_ctx *ctx, const char *after, double timeout_s, uint64_t allowed,
                           uint64_t *out_in_flight) {
  ft_msg msg;
  int paused = ctx->bystander.pid > 0;
  if (paused && (ft_proc_send(&ctx->bystander, 'p') || ft_proc_expect(&ctx->bystander, FT_MSG_PAUSED, &msg, 60) != 1)) {
    faults_check(ctx, 0, "after %s: the bystander did not pause at a step boundary", after);
    return -1;
  }
  double until = bench_now() + timeout_s;
  uint64_t held = 0;
  int strangers = 0, ok = 0;
  ft_metrics m = {0};
  double at = -1;
  while (!ok) {
    int read = ft_metrics_read(ctx->daemon.admin_port, &m) == 0 && sessions_hold(ctx, &held, &strangers, 0) == 0;
    ok = read && m.used_bytes == held && m.in_flight_bytes <= allowed && strangers == 0;
    if (ok) at = bench_now();
    if (ok || bench_now() > until) break;
    ft_sleep(0.01);
  }
  if (!ok) {
    faults_check(ctx, 0, "after %s: the card holds %" PRIu64 " bytes, the open sessions %" PRIu64
                 " (%d not the admin's or the bystander's); sends pin %" PRIu64 " host bytes of freed tensors (%" PRIu64
                 " allowed)", after, m.used_bytes, held, strangers, m.in_flight_bytes, allowed);
    sessions_hold(ctx, &held, &strangers, 1);
  }
  if (paused) ft_proc_send(&ctx->bystander, 'r');
  if (out_in_flight) *out_in_flight = m.in_flight_bytes;
  return at;
}

double faults_check_quiescent(faults_ctx *ctx, const char *after, double timeout_s) {
  return faults_check_memory(ctx, after, timeout_s, 0, NULL);
}

tt_status faults_admin_open(faults_ctx *ctx, const char *name, tt_client **out_client) {
  tt_connect_options o;
  tt_connect_options_init(&o);
  o.client_name = name;
  o.token = ctx->tenants[FT_ADMIN].token;
  return tt_connect(ctx->daemon.target, &o, out_client);
}

int faults_admin_connect(faults_ctx *ctx) {
  tt_disconnect(ctx->admin);
  ctx->admin = NULL;
  tt_status st = faults_admin_open(ctx, "faults", &ctx->admin);
  return faults_check(ctx, st == TT_OK, "the driver's admin session: %s", tt_last_error(ctx->admin)) ? 0 : -1;
}
