/* Phase 4: the daemon stopped gracefully (SIGTERM) under load and started again on the same
 * socket and state folder. Clients (fc_resume.c) train the bench MLP and are caught around
 * one call each: the upload of their batch, a forward, a backward (let go just before the
 * SIGTERM, the upload last as the shortest, so that the call is in flight or meets the
 * stopping daemon), or between a forward and its backward (let go once the old ttd has
 * exited, so that its run is saved waiting for the backward). Every client must finish all its steps with no error, in the same session
 * under the new instance, with losses bit-identical to its run alone; the bystander and the
 * driver's admin session resume too. The old ttd must exit 0 having logged state-saved, the
 * new one state-loaded and a resumed for each session saved; once the clients are gone the
 * card holds only what the bystander and the admin hold, and no session's files are left. */
#include <dirent.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "faults.h"
#include "scripts/bench/bench_common.h"

#define STEPS 10

enum { UPLOAD, FORWARD, BETWEEN, BACKWARD, KINDS };

static const struct {
  const char *role;
  const char *what;
} KIND[KINDS] = {{"resume-upload", "mid-upload"},
                 {"resume-forward", "inside a forward"},
                 {"resume-between", "between forward and backward"},
                 {"resume-backward", "inside a backward"}};

typedef struct client {
  ft_proc proc;
  int kind, shm;
  uint64_t session;
  double call_s;            /* its stopped call's usual seconds */
  ft_msg end, result;
  int ended, finished;
} client;

/* The size of a file, 0 if missing. */
static long long file_size(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 ? (long long)st.st_size : 0;
}

/* ttd's log from offset on, NUL-terminated (the caller frees); NULL if unreadable. */
static char *log_since(const char *path, long long offset) {
  FILE *f = fopen(path, "r");
  if (!f) return NULL;
  long long size = file_size(path);
  size_t len = size > offset ? (size_t)(size - offset) : 0;
  char *text = malloc(len + 1);
  if (text && fseek(f, (long)offset, SEEK_SET) == 0) len = fread(text, 1, len, f);
  if (text) text[len] = '\0';
  fclose(f);
  return text;
}

/* The number after "key=" on the first line of text holding event; -1 if absent. */
static long long event_field(const char *text, const char *event, const char *key) {
  const char *line = text ? strstr(text, event) : NULL;
  if (!line) return -1;
  const char *end = strchr(line, '\n'), *field = strstr(line, key);
  return field && (!end || field < end) ? strtoll(field + strlen(key), NULL, 10) : -1;
}

static int count_lines(const char *text, const char *what) {
  int n = 0;
  for (const char *p = text; p && (p = strstr(p, what)); p += strlen(what)) n++;
  return n;
}

/* Session files (ID.session, ID.safetensors) left in the state folder. */
static int session_files(const char *state_dir) {
  char path[600];
  snprintf(path, sizeof(path), "%s/state", state_dir);
  DIR *d = opendir(path);
  if (!d) return 0;
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) n += strstr(e->d_name, ".session") || strstr(e->d_name, ".safetensors");
  closedir(d);
  return n;
}

/* The client's records up to its RESULT (its END, if any, on the way): 1, or 0 if it hung
 * or died first. */
static int collect(client *c) {
  ft_msg m;
  double until = bench_now() + 120;
  while (!c->finished && bench_now() < until && ft_proc_recv(&c->proc, &m, until - bench_now()) == 1) {
    if (m.kind == FT_MSG_END) c->end = m, c->ended = 1;
    else if (m.kind == FT_MSG_RESULT) c->result = m, c->finished = 1;
    else if (m.kind == FT_MSG_EVENT) printf("faults:   event: %s: %s\n", tt_status_name(m.code), m.text);
  }
  return c->finished;
}

void faults_phase_graceful(faults_ctx *ctx) {
  faults_tally *t = faults_tally_add(ctx, "SIGTERM ttd, resume");
  client clients[FAULTS_MAX_REPS] = {0};
  int n = ctx->resume_clients < FAULTS_MAX_REPS ? ctx->resume_clients : FAULTS_MAX_REPS, started = 0;
  ft_msg m;
  for (; started < n; started++) {
    client *c = &clients[started];
    c->kind = started % KINDS;
    c->shm = (started + started / KINDS) % 2; /* the first upload streams its bytes over gRPC */
    if (faults_spawn(ctx, &c->proc, KIND[c->kind].role, FT_VICTIM, STEPS, c->shm)) break;
  }
  int ready = started == n;
  for (int i = 0; i < started; i++) {
    client *c = &clients[i];
    ready &= faults_check(ctx, ft_proc_expect(&c->proc, FT_MSG_SESSION, &m, 60) == 1, "resume client %d did not "
                          "connect", i);
    c->session = m.session;
    ready &= faults_check(ctx, ft_proc_expect(&c->proc, FT_MSG_READY, &m, 120) == 1 &&
                          ft_proc_expect(&c->proc, FT_MSG_BEGIN, &m, 120) == 1, "resume client %d did not get to its "
                          "call", i);
    c->call_s = m.value[0];
  }
  if (!ready) {
    for (int i = 0; i < started; i++) ft_proc_destroy(&clients[i].proc);
    return;
  }
  /* Every client waits before its call. The calls meant to be in flight go first; the stop
   * comes a third of the shortest such call after the last of them set off. */
  long long log_at = file_size(ctx->daemon.log);
  double wait_s = 0.05;
  for (int pass = 0; pass < 2; pass++) {
    for (int i = 0; i < started; i++) {
      if (clients[i].kind == BETWEEN || (clients[i].kind == UPLOAD) != pass) continue;
      ft_proc_send(&clients[i].proc, 'g');
      wait_s = clients[i].call_s / 3 < wait_s ? clients[i].call_s / 3 : wait_s;
    }
    for (int i = 0; i < started; i++) {
      if (clients[i].kind == BETWEEN || (clients[i].kind == UPLOAD) != pass) continue;
      faults_check(ctx, ft_proc_expect(&clients[i].proc, FT_MSG_BEGIN, &m, 30) == 1, "resume client %d did not set "
                   "off", i);
    }
  }
  ft_sleep(wait_s);
  double stopped_at = bench_now();
  int stopped = ft_daemon_stop(&ctx->daemon, SIGTERM, 30) == 0;
  double down_s = bench_now() - stopped_at;
  faults_check(ctx, stopped && WIFEXITED(ctx->daemon.status) && WEXITSTATUS(ctx->daemon.status) == 0,
               "ttd did not exit 0 within 30 s of SIGTERM under load (status 0x%x)", ctx->daemon.status);
  for (int i = 0; i < started; i++) {
    if (clients[i].kind == BETWEEN) ft_proc_send(&clients[i].proc, 'g');
  }
  char err[256];
  int up = faults_check(ctx, ft_daemon_start(&ctx->daemon, 30, err, sizeof(err)) == 0, "restarting ttd: %s", err);
  double up_s = bench_now() - stopped_at;
  t->injected = 1;
  for (int i = 0; i < started; i++) ft_proc_send(&clients[i].proc, 'g'); /* their call after the restart */

  int resumed = 0, in_flight[KINDS] = {0}, kinds[KINDS] = {0}, drained = 0;
  double longest = 0, usual = 0;
  for (int i = 0; i < started; i++) {
    client *c = &clients[i];
    if (!faults_check(ctx, collect(c), "resume client %d (%s) hung or died", i, KIND[c->kind].what)) continue;
    const double *v = c->result.value;
    faults_check(ctx, c->result.code == TT_OK && v[0] == STEPS && v[1] == 0,
                 "resume client %d (%s): %.0f of %d steps, then %s: %s", i, KIND[c->kind].what, v[0], STEPS,
                 tt_status_name(c->result.code), c->result.text);
    faults_check(ctx, v[2] == 0, "resume client %d (%s): %.0f losses differ from its run alone", i, KIND[c->kind].what,
                 v[2]);
    int same = c->result.session == c->session, changed = v[5] == 1;
    faults_check(ctx, same && changed, "resume client %d (%s): session %016" PRIx64 " -> %016" PRIx64 ", instance %s",
                 i, KIND[c->kind].what, c->session, c->result.session, changed ? "changed" : "unchanged");
    faults_check(ctx, c->ended, "resume client %d (%s): its call did not end", i, KIND[c->kind].what);
    resumed += same && changed && c->result.code == TT_OK;
    /* In flight: set off before the SIGTERM and answered after it. Drained: answered by the
     * old ttd; otherwise run again on the new one. */
    int flying = c->kind != BETWEEN && c->ended && c->end.value[0] < stopped_at && c->end.value[1] > stopped_at;
    int old = c->kind != BETWEEN && c->ended && c->end.value[2] == 1;
    kinds[c->kind]++;
    in_flight[c->kind] += flying;
    drained += old;
    longest = v[3] > longest ? v[3] : longest;
    usual = v[4] > usual ? v[4] : usual;
    char call[120] = "its forward's run saved waiting for its backward";
    if (c->kind != BETWEEN && c->ended) {
      snprintf(call, sizeof(call), "its call %s%s, set off %+.4f s from the SIGTERM, took %.4f s",
               flying ? "in flight, " : "", old ? "answered by the old ttd" : "run again on the new",
               c->end.value[0] - stopped_at, c->end.value[1] - c->end.value[0]);
    }
    printf("faults:   resume client %d (%s, %s): %.0f steps, same session, %s; %s; longest step %.3f s (alone "
           "%.3f s)\n", i, KIND[c->kind].what, c->shm ? "shm" : "no shm", v[0], changed ? "new instance" : "SAME INSTANCE",
           call, v[3], v[4]);
  }
  for (int i = 0; i < started; i++) {
    faults_check(ctx, ft_proc_wait(&clients[i].proc, 30) == 0 && clients[i].proc.status == 0,
                 "resume client %d did not exit", i);
    ft_proc_destroy(&clients[i].proc);
  }
  if (!up) return;
  /* The admin session resumes at its next call; the bystander's card bytes and the admin's
   * are then all the card holds. */
  faults_check_quiescent(ctx, t->name, ctx->lease_s);
  double until = bench_now() + ctx->lease_s;
  while (session_files(ctx->state_dir) && bench_now() < until) ft_sleep(0.01);
  int left = session_files(ctx->state_dir);
  faults_check(ctx, left == 0, "%d session files left in %s/state after every session resumed", left, ctx->state_dir);

  char *log = log_since(ctx->daemon.log, log_at);
  long long saved = event_field(log, "event=state-saved", "sessions="),
            saved_bytes = event_field(log, "event=state-saved", "bytes="),
            save_ms = event_field(log, "event=state-saved", "ms="),
            loaded = event_field(log, "event=state-loaded", "sessions="),
            load_ms = event_field(log, "event=state-loaded", "ms=");
  int expected = started + 1 + (ctx->bystander.pid > 0), resumes = count_lines(log, "event=resumed");
  faults_check(ctx, saved == expected && loaded == expected, "the old ttd saved %lld sessions, the new one loaded %lld; "
               "wanted %d (%d clients, the admin's%s)", saved, loaded, expected, started,
               ctx->bystander.pid > 0 ? ", the bystander's" : "");
  faults_check(ctx, resumes == expected, "the new ttd logged %d resumes, wanted %d", resumes, expected);
  for (int i = 0; i < started; i++) {
    char line[64];
    snprintf(line, sizeof(line), "session=%016" PRIx64 " event=resumed", clients[i].session);
    faults_check(ctx, log && strstr(log, line), "resume client %d: no '%s' in ttd's log", i, line);
  }
  free(log);
  t->in_call = in_flight[UPLOAD] + in_flight[FORWARD] + in_flight[BACKWARD];
  snprintf(t->note, sizeof(t->note), "%d/%d clients resumed; %lld sessions, %.1f MiB saved in %lld ms, loaded in %lld "
           "ms; ttd down %.2f s, back %.2f s after SIGTERM; longest step %.2f s (alone %.3f s)", resumed, started,
           saved, (double)saved_bytes / (1 << 20), save_ms, load_ms, down_s, up_s, longest, usual);
  printf("faults:   calls in flight at the SIGTERM: upload %d/%d, forward %d/%d, backward %d/%d; %d of %d calls "
         "answered by the old ttd, the rest run again on the new\n", in_flight[UPLOAD], kinds[UPLOAD],
         in_flight[FORWARD], kinds[FORWARD], in_flight[BACKWARD], kinds[BACKWARD], drained, started - kinds[BETWEEN]);
}
