/* Compiled programs shared across the sessions of one tenant, keyed by tenant and packed
 * graph: the same graph compiled twice is not rebuilt. Tenants never share entries, so a
 * cache hit (or its speed) tells nothing about another tenant's models. Thread-safe. */
#ifndef TTD_PROGRAM_CACHE_H
#define TTD_PROGRAM_CACHE_H

#include <pthread.h>

#include "session/handle_map.h"
#include "graph/program.h"

#define TTD_PROGRAM_CACHE_MAX 256

typedef struct ttd_program_cache {
  pthread_mutex_t lock;
  ttd_handle_map by_hash; /* hash -> ttd_program* (one reference each) */
  uint64_t hits, misses;
} ttd_program_cache;

void ttd_program_cache_init(ttd_program_cache *cache);
void ttd_program_cache_destroy(ttd_program_cache *cache);

/* A reference to the program of graph: from the cache, or compiled and cached.
 * *out_cached tells which. Compile errors are returned as they are. */
ttd_status_t ttd_program_cache_get(ttd_program_cache *cache, const char *tenant, const Ttd__V1__Graph *graph,
                                   ttd_program **out_program, bool *out_cached);

/* The packed Graph a program of the cache was compiled from (within its key, after the
 * tenant's name): what compiling it again takes. */
const unsigned char *ttd_program_cache_graph(const ttd_program *program, size_t *out_len);

#endif
