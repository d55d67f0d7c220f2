#include "base/block_cache.h"

#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#define HUGE_ALIGN ((uintptr_t)2 << 20)

void ttd_block_cache_init(ttd_block_cache *cache) {
  pthread_mutex_init(&cache->lock, NULL);
  for (int k = 0; k < TTD_BLOCK_CACHE_SLOTS; k++) {
    cache->blocks[k] = NULL;
    cache->sizes[k] = 0;
  }
}

void ttd_block_cache_destroy(ttd_block_cache *cache) {
  for (int k = 0; k < TTD_BLOCK_CACHE_SLOTS; k++) free(cache->blocks[k]);
  pthread_mutex_destroy(&cache->lock);
}

void *ttd_block_cache_alloc(ttd_block_cache *cache, size_t bytes, size_t *out_size) {
  *out_size = bytes;
  if (bytes >= TTD_BLOCK_CACHE_MIN_BYTES) {
    pthread_mutex_lock(&cache->lock);
    int best = -1;
    for (int k = 0; k < TTD_BLOCK_CACHE_SLOTS; k++) {
      size_t have = cache->sizes[k];
      if (cache->blocks[k] && have >= bytes && have - bytes <= bytes && (best < 0 || have < cache->sizes[best])) best = k;
    }
    void *block = NULL;
    if (best >= 0) {
      block = cache->blocks[best];
      *out_size = cache->sizes[best];
      cache->blocks[best] = NULL;
    }
    pthread_mutex_unlock(&cache->lock);
    if (block) return block;
  }
  void *block = NULL;
  if (posix_memalign(&block, 64, bytes ? bytes : 1) != 0) return NULL;
  /* Big blocks in 2 MiB pages where the kernel has them: a fresh tensor's first touch then
   * faults once per 2 MiB rather than once per 4 KiB. */
  if (bytes >= TTD_BLOCK_HUGE_MIN_BYTES) {
    uintptr_t from = ((uintptr_t)block + HUGE_ALIGN - 1) & ~(uintptr_t)(HUGE_ALIGN - 1);
    uintptr_t to = ((uintptr_t)block + bytes) & ~(uintptr_t)(HUGE_ALIGN - 1);
    if (to > from) madvise((void *)from, to - from, MADV_HUGEPAGE); /* a hint: refused is fine */
  }
  return block;
}

void ttd_block_cache_free(ttd_block_cache *cache, void *block, size_t size) {
  if (!block) return;
  void *evicted = block;
  if (size >= TTD_BLOCK_CACHE_MIN_BYTES) {
    pthread_mutex_lock(&cache->lock);
    int slot = 0; /* an empty slot, else the one holding the smallest block */
    for (int k = 0; k < TTD_BLOCK_CACHE_SLOTS && cache->blocks[slot]; k++) {
      if (!cache->blocks[k] || cache->sizes[k] < cache->sizes[slot]) slot = k;
    }
    if (!cache->blocks[slot] || cache->sizes[slot] < size) {
      evicted = cache->blocks[slot];
      cache->blocks[slot] = block;
      cache->sizes[slot] = size;
    }
    pthread_mutex_unlock(&cache->lock);
  }
  free(evicted);
}
