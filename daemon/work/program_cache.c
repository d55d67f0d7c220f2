#include "work/program_cache.h"

#include <stdlib.h>
#include <string.h>

void ttd_program_cache_init(ttd_program_cache *cache) {
  memset(cache, 0, sizeof(*cache));
  pthread_mutex_init(&cache->lock, NULL);
}

static void drop_all(ttd_program_cache *cache) {
  for (size_t i = 0; i < cache->by_hash.capacity; i++) {
    if (cache->by_hash.keys[i]) ttd_program_release(cache->by_hash.values[i]);
  }
  ttd_handle_map_clear(&cache->by_hash);
}

void ttd_program_cache_destroy(ttd_program_cache *cache) {
  drop_all(cache);
  pthread_mutex_destroy(&cache->lock);
}

static uint64_t fnv1a(const unsigned char *p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
  return h ? h : 1;
}

ttd_status_t ttd_program_cache_get(ttd_program_cache *cache, const char *tenant, const Ttd__V1__Graph *graph,
                                   ttd_program **out_program, bool *out_cached) {
  *out_program = NULL;
  *out_cached = false;
  if (!graph) return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "the graph is missing");
  size_t prefix = strlen(tenant) + 1; /* the key: tenant, NUL, packed graph */
  size_t len = prefix + protobuf_c_message_get_packed_size(&graph->base);
  unsigned char *key = malloc(len);
  if (!key) return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  memcpy(key, tenant, prefix);
  protobuf_c_message_pack(&graph->base, key + prefix);
  uint64_t hash = fnv1a(key, len);

  pthread_mutex_lock(&cache->lock);
  ttd_program *hit = ttd_handle_map_get(&cache->by_hash, hash);
  if (hit && hit->key_len == len && memcmp(hit->key, key, len) == 0) {
    cache->hits++;
    *out_program = ttd_program_retain(hit);
  }
  pthread_mutex_unlock(&cache->lock);
  if (*out_program) {
    free(key);
    *out_cached = true;
    return TTD_OK;
  }

  ttd_program *program = NULL;
  ttd_status_t status = ttd_program_compile(graph, &program);
  if (status) {
    free(key);
    return status;
  }
  program->key = key;
  program->key_len = len;
  program->host_bytes += len;
  program->hash = hash;
  pthread_mutex_lock(&cache->lock);
  cache->misses++;
  if (cache->by_hash.count >= TTD_PROGRAM_CACHE_MAX) drop_all(cache); /* simple bound: start afresh */
  if (!ttd_handle_map_get(&cache->by_hash, hash) && ttd_handle_map_put(&cache->by_hash, hash, program) == 0) {
    ttd_program_retain(program);
  }
  pthread_mutex_unlock(&cache->lock);
  *out_program = program;
  return TTD_OK;
}

const unsigned char *ttd_program_cache_graph(const ttd_program *program, size_t *out_len) {
  size_t prefix = strnlen((const char *)program->key, program->key_len) + 1;
  *out_len = program->key_len - prefix;
  return program->key + prefix;
}
