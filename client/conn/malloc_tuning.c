/* glibc's malloc thresholds in a program that uses libttclient. gRPC receives a big
 * Download's messages into buffers of up to a few MiB, freed as soon as they are copied into
 * the host tensor. With glibc's defaults the heap top they leave free is handed back to the
 * kernel (trimmed) and faulted in again for the next message, which slows large Downloads
 * in some processes and not in others. With the mmap threshold at 32 MiB and the trim
 * threshold at 128 MiB, those buffers stay mapped between messages.
 * Raised once per process, at the first tt_connect; the program keeps its own settings when
 * it asks (TTD_MALLOC_TUNING=0, tt_connect_options.disable_malloc_tuning) or has set glibc's
 * malloc tunables (GLIBC_TUNABLES). */
#include <malloc.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "conn/conn.h"

#define MMAP_THRESHOLD_BYTES (32 << 20)
#define TRIM_THRESHOLD_BYTES (128 << 20)

static atomic_int tuned;

void tt_malloc_tune(const tt_connect_options *options) {
  const char *env = getenv("TTD_MALLOC_TUNING");
  const char *tunables = getenv("GLIBC_TUNABLES");
  if (options->disable_malloc_tuning || (env && strcmp(env, "0") == 0) ||
      (tunables && strstr(tunables, "glibc.malloc."))) {
    return;
  }
  if (atomic_exchange(&tuned, 1)) return;
  mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES);
  mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES);
}
