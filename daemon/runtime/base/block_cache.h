/* A few freed large memory blocks kept for the next allocation of a similar size. Big
 * buffers (a card's simulated DRAM, a client's host tensors) would otherwise go back to
 * the kernel at free and be page-faulted in again at the next transfer, which costs more
 * than the copy itself; glibc's mmap threshold cannot be raised past 32 MiB. Thread-safe.
 * Shared by ttd and libttclient. */
#ifndef TTD_BLOCK_CACHE_H
#define TTD_BLOCK_CACHE_H

#include <pthread.h>
#include <stddef.h>

#define TTD_BLOCK_CACHE_SLOTS 8
#define TTD_BLOCK_CACHE_MIN_BYTES ((size_t)1 << 20) /* smaller blocks are malloc's business */
#define TTD_BLOCK_HUGE_MIN_BYTES ((size_t)8 << 20)  /* new blocks this big ask for 2 MiB pages */

typedef struct ttd_block_cache {
  pthread_mutex_t lock;
  void *blocks[TTD_BLOCK_CACHE_SLOTS];
  size_t sizes[TTD_BLOCK_CACHE_SLOTS];
} ttd_block_cache;

void ttd_block_cache_init(ttd_block_cache *cache);
void ttd_block_cache_destroy(ttd_block_cache *cache); /* frees the blocks kept */

/* 64-byte aligned memory of at least bytes: the smallest kept block of bytes..2*bytes, or a
 * new one; *out_size is the block's real size (pass it back to ttd_block_cache_free). NULL
 * when out of memory. The cache keeps at most TTD_BLOCK_CACHE_SLOTS blocks. */
void *ttd_block_cache_alloc(ttd_block_cache *cache, size_t bytes, size_t *out_size);

/* Keeps the block (evicting the smallest kept one if it is smaller) or frees it. */
void ttd_block_cache_free(ttd_block_cache *cache, void *block, size_t size);

#endif
