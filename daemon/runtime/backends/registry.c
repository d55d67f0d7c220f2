/* The table of backends. A new backend adds its create function here. */
#include <string.h>

#include "backends/backend.h"
#include "backends/sim/sim_backend.h"

typedef struct backend_entry {
  const char *name;
  ttd_status_t (*create)(const ttd_backend_options *options, ttd_backend **out_backend);
} backend_entry;

static const backend_entry backends[] = {
    {"sim", ttd_sim_backend_create},
};

const char *ttd_backend_names(void) { return "sim"; }

const char *ttd_memloc_name(ttd_memloc loc) {
  switch (loc) {
    case TTD_MEM_DRAM: return "dram";
    case TTD_MEM_L1: return "l1";
    default: return "invalid";
  }
}

ttd_status_t ttd_backend_create(const char *name, const ttd_backend_options *options,
                                ttd_backend **out_backend) {
  *out_backend = NULL;
  for (size_t i = 0; i < sizeof(backends) / sizeof(backends[0]); i++) {
    if (strcmp(backends[i].name, name) == 0) return backends[i].create(options, out_backend);
  }
  return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "unknown backend '%s'; known backends: %s",
                         name, ttd_backend_names());
}

void ttd_backend_destroy(ttd_backend *backend) {
  if (backend) backend->vtable->destroy(backend);
}
