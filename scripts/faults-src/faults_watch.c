/* Watching faulted clients' sessions go: a thread of the driver's polls ListSessions every
 * 10 ms on an admin session of its own, so each session's last call (the idle time the
 * daemon reports) and the moment it left the list are known even while the driver is busy
 * aiming the next fault. */
#include <pthread.h>
#include <stdlib.h>

#include "faults.h"
#include "scripts/bench/bench_common.h"

typedef struct watched {
  uint64_t session;
  double faulted_at, last_call, gone;
} watched;

struct faults_watch {
  tt_client *admin;
  pthread_t thread;
  pthread_mutex_t lock;
  watched items[FAULTS_MAX_REPS];
  int count, stop, list_failed;
};

static void *watch_main(void *arg) {
  faults_watch *w = arg;
  for (;;) {
    pthread_mutex_lock(&w->lock);
    int stop = w->stop;
    pthread_mutex_unlock(&w->lock);
    if (stop) return NULL;
    tt_session_info *list = NULL;
    size_t n = 0;
    tt_status st = tt_list_sessions(w->admin, &list, &n);
    double now = bench_now();
    pthread_mutex_lock(&w->lock);
    w->list_failed += st != TT_OK;
    for (int i = 0; st == TT_OK && i < w->count; i++) {
      watched *x = &w->items[i];
      if (x->gone > 0) continue;
      size_t k = 0;
      while (k < n && list[k].session_id != x->session) k++;
      if (k == n) x->gone = now;
      else x->last_call = now - (double)list[k].idle_ms / 1000;
    }
    pthread_mutex_unlock(&w->lock);
    tt_session_list_free(list);
    ft_sleep(0.01);
  }
}

faults_watch *faults_watch_start(faults_ctx *ctx) {
  faults_watch *w = calloc(1, sizeof(*w));
  if (!w) return NULL;
  pthread_mutex_init(&w->lock, NULL);
  if (faults_admin_open(ctx, "faults-watch", &w->admin) != TT_OK || pthread_create(&w->thread, NULL, watch_main, w)) {
    faults_check(ctx, 0, "starting the session watch: %s", tt_last_error(w->admin));
    tt_disconnect(w->admin);
    pthread_mutex_destroy(&w->lock);
    free(w);
    return NULL;
  }
  return w;
}

void faults_watch_add(faults_watch *w, uint64_t session, double faulted_at) {
  if (!w) return;
  pthread_mutex_lock(&w->lock);
  if (w->count < FAULTS_MAX_REPS) w->items[w->count++] = (watched){session, faulted_at, faulted_at, 0};
  pthread_mutex_unlock(&w->lock);
}

int faults_watch_finish(faults_ctx *ctx, faults_watch *w, faults_tally *t) {
  if (!w) return -1;
  int ok = 1;
  for (int left = 1; left;) {
    pthread_mutex_lock(&w->lock);
    left = 0;
    double now = bench_now();
    for (int i = 0; i < w->count; i++) {
      if (w->items[i].gone > 0) continue;
      left++;
      if (now > w->items[i].faulted_at + FAULTS_HANG_S) left = -1000; /* a hang: give up */
    }
    pthread_mutex_unlock(&w->lock);
    if (left < 0) ok = faults_check(ctx, 0, "%s: a session was still open %.0f s after its client's fault", t->name,
                                    FAULTS_HANG_S), left = 0;
    if (left) ft_sleep(0.01);
  }
  pthread_mutex_lock(&w->lock);
  w->stop = 1;
  pthread_mutex_unlock(&w->lock);
  pthread_join(w->thread, NULL);
  for (int i = 0; ok && i < w->count; i++) {
    watched *x = &w->items[i];
    double after_call = x->gone - x->last_call, after_fault = x->gone - x->faulted_at;
    t->after_call_max_s = after_call > t->after_call_max_s ? after_call : t->after_call_max_s;
    t->recover_max_s = after_fault > t->recover_max_s ? after_fault : t->recover_max_s;
    ok &= faults_check(ctx, after_call <= ctx->recover_bound_s,
                       "%s: a session closed %.2f s after its last call (bound %.2f s)", t->name, after_call,
                       ctx->recover_bound_s);
  }
  ok &= faults_check(ctx, w->list_failed == 0, "%s: ListSessions failed %d times", t->name, w->list_failed);
  tt_disconnect(w->admin);
  pthread_mutex_destroy(&w->lock);
  free(w);
  return ok ? 0 : -1;
}
