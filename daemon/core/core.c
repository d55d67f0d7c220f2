#include "core/core.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/random.h"
#include "telemetry/log.h"

/* Loads the tokens file, warning when everyone may read it (its digests are not secrets
 * in themselves, but a guessable token's digest is a dictionary away from the token). */
static ttd_status_t load_tokens(const char *path, ttd_tokens **out_tokens) {
  TTD_RETURN_IF_ERROR(ttd_tokens_load(path, out_tokens));
  if (ttd_file_world_readable(path)) {
    TTD_LOG(TTD_LOG_WARN, "event=unsafe-file file=%s what=\"tokens file\" problem=\"readable by everyone: chmod o-r it\"",
            path);
  }
  return TTD_OK;
}

/* The scheduler's view of the backend: programs of different sessions together where the
 * backend can run them so. */
static int card_at_once(void *ctx, int device) {
  ttd_core *core = ctx;
  ttd_backend *backend = core->backend;
  int can = backend->vtable->programs_at_once && backend->vtable->run_together
                ? backend->vtable->programs_at_once(backend, device)
                : 1;
  int asked = core->config->programs_at_once; /* --programs-at-once; 0: what the card can */
  return asked > 0 && asked < can ? asked : can;
}

static void card_run_together(void *ctx, int device, size_t n, void (*run)(void *arg, size_t i), void *arg) {
  ttd_backend *backend = ((ttd_core *)ctx)->backend;
  backend->vtable->run_together(backend, device, n, run, arg);
}

ttd_status_t ttd_core_create(const ttd_config *config, ttd_core **out_core) {
  *out_core = NULL;
  ttd_tokens *tokens = NULL;
  if (config->tokens_file) TTD_RETURN_IF_ERROR(load_tokens(config->tokens_file, &tokens));
  ttd_core *core = calloc(1, sizeof(*core));
  if (!core) {
    ttd_tokens_release(tokens);
    return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
  }
  ttd_backend_options options = {
      .devices = config->devices, .dram_bytes = config->dram, .l1_bytes = config->l1, .cores = config->cores};
  ttd_status_t status = ttd_backend_create(config->backend, &options, &core->backend);
  if (status) {
    ttd_tokens_release(tokens);
    free(core);
    return status;
  }
  ttd_auth_init(&core->auth, tokens, config->quota, (uint32_t)config->max_sessions);
  pthread_rwlock_init(&core->reload_lock, NULL);
  pthread_mutex_init(&core->metrics.tenants_lock, NULL);
  core->config = config;
  ttd_scheduler_card card = {.at_once = card_at_once, .run_together = card_run_together, .ctx = core};
  status = ttd_scheduler_create(core->backend->vtable->device_count(core->backend), &card, &core->scheduler);
  if (status) {
    ttd_auth_destroy(&core->auth);
    ttd_backend_destroy(core->backend);
    free(core);
    return status;
  }
  ttd_session_table_init(&core->sessions, config->lease_ms);
  ttd_program_cache_init(&core->programs);
  ttd_cq_spin_init(&core->poll_spin, config->spin_us);
  ttd_cq_spin_init(&core->device_spin, config->device_spin_us);
  snprintf(core->instance_id, sizeof(core->instance_id), "%016" PRIx64, ttd_random_u64());
  *out_core = core;
  return TTD_OK;
}

void ttd_core_destroy(ttd_core *core) {
  if (!core) return;
  ttd_scheduler_destroy(core->scheduler); /* runs what is queued; no new work arrives by now */
  ttd_session_table_destroy(&core->sessions);
  ttd_program_cache_destroy(&core->programs);
  ttd_backend_destroy(core->backend);
  ttd_auth_destroy(&core->auth);
  pthread_rwlock_destroy(&core->reload_lock);
  pthread_mutex_destroy(&core->metrics.tenants_lock);
  free(core);
}

ttd_status_t ttd_core_reload(ttd_core *core, const ttd_config *fresh) {
  ttd_tokens *tokens = NULL;
  if (fresh->tokens_file) TTD_RETURN_IF_ERROR(load_tokens(fresh->tokens_file, &tokens));
  pthread_rwlock_wrlock(&core->reload_lock);
  ttd_session **sessions;
  size_t n;
  ttd_status_t status = ttd_session_table_snapshot(&core->sessions, &sessions, &n);
  if (status) {
    pthread_rwlock_unlock(&core->reload_lock);
    ttd_tokens_release(tokens);
    return status;
  }
  /* A session whose tenant, or the token it was opened with, the new settings no longer
   * admit ends now (whatever renews it, the side socket included), its memory freed; its
   * client's next call is told why. */
  for (size_t i = 0; i < n; i++) {
    if (ttd_auth_admits_session(tokens, sessions[i])) continue;
    uint64_t tensors = 0, bytes = 0;
    ttd_session_table_revoke(&core->sessions, sessions[i], &tensors, &bytes);
    TTD_LOG(TTD_LOG_INFO, "session=%016" PRIx64 " event=session-revoked tenant=%s tensors_freed=%" PRIu64
            " bytes_freed=%" PRIu64, sessions[i]->id, sessions[i]->tenant, tensors, bytes);
  }
  ttd_auth_replace(&core->auth, tokens, fresh->quota, (uint32_t)fresh->max_sessions);
  for (size_t i = 0; i < n; i++) {
    atomic_store(&sessions[i]->weight, ttd_auth_weight(&core->auth, sessions[i]->tenant));
    uint64_t cap = 0;
    ttd_status_t s = ttd_auth_session_quota(&core->auth, sessions[i]->tenant, 0, &cap);
    ttd_status_free(s);
    uint64_t asked = sessions[i]->quota_asked;
    ttd_quota_set_limit(sessions[i]->quota, asked && (cap == 0 || asked < cap) ? asked : cap);
  }
  ttd_session_table_snapshot_free(sessions, n);
  pthread_rwlock_unlock(&core->reload_lock);
  return TTD_OK;
}

ttd_status_t ttd_core_parse_device(const ttd_core *core, const char *name, int *out_device) {
  int count = core->backend->vtable->device_count(core->backend);
  *out_device = 0;
  if (name == NULL || name[0] == '\0') return TTD_OK;
  if (strncmp(name, "tt:", 3) == 0 && name[3] >= '0' && name[3] <= '9') {
    errno = 0;
    char *end;
    long v = strtol(name + 3, &end, 10);
    if (!errno && *end == '\0' && v < count) {
      *out_device = (int)v;
      return TTD_OK;
    }
  }
  char have[32];
  if (count > 1) snprintf(have, sizeof(have), "tt:0 .. tt:%d", count - 1);
  else snprintf(have, sizeof(have), "only tt:0");
  return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "device '%.64s' does not exist; this daemon has %s",
                         name, have);
}
