/* Layer daemon/core: the server's state that every front end is handed. Calls daemon/work,
 * daemon/session, daemon/telemetry and the runtime.
 *
 * The daemon core: configuration, the device backend, the session table and the
 * instance id. Everything an RPC handler needs, with no gRPC in it, so the same core
 * runs under the server, the tests and (later) fuzz harnesses. */
#ifndef TTD_CORE_H
#define TTD_CORE_H

#include <stdint.h>

#include "session/auth.h"
#include "backends/backend.h"
#include "base/clock.h"
#include "base/config.h"
#include "wire/cq_spin.h"
#include "telemetry/metrics.h"
#include "work/program_cache.h"
#include "work/scheduler.h"
#include "session/session_table.h"

typedef struct ttd_core {
  const ttd_config *config;
  ttd_backend *backend;
  ttd_session_table sessions;
  ttd_program_cache programs;
  ttd_metrics metrics;
  ttd_auth auth;
  /* Held shared while OpenSession works out and grants a quota, exclusive while a reload
   * swaps the tables and recomputes every session's quota: no session misses a reload. */
  pthread_rwlock_t reload_lock;
  ttd_scheduler *scheduler; /* device work, round-robin between sessions */
  ttd_cq_spin poll_spin;    /* the RPC poller's wait after a light call (--spin-us), with its counters */
  ttd_cq_spin device_spin;  /* its wait after answering device work (--device-spin-us) */
  char instance_id[17]; /* 16 hex digits, new at every start */
  char shm_socket[108]; /* the side socket's path for OpenSession, "" when there is none */
} ttd_core;

/* Creates the backend named by config and an empty session table. config must outlive the
 * core. The caller owns *out_core. */
ttd_status_t ttd_core_create(const ttd_config *config, ttd_core **out_core);

/* Applies what a SIGHUP reload may change, read afresh into fresh: the tokens file and
 * the default quota. Every open session's quota is recomputed (tensors already held stay;
 * a lowered quota refuses new allocations). On error nothing changes. */
ttd_status_t ttd_core_reload(ttd_core *core, const ttd_config *fresh);

/* Closes every session (freeing their tensors), then destroys the backend. NULL ok. */
void ttd_core_destroy(ttd_core *core);

/* Parses a device name "tt:N" (or "" for tt:0) against the backend's devices.
 * INVALID_ARGUMENT naming the devices that exist. */
ttd_status_t ttd_core_parse_device(const ttd_core *core, const char *name, int *out_device);

#endif
