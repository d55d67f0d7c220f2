/* Internals of the simulated card shared by its files: the backend state, buffers
 * (plain host memory) and the node executor. */
#ifndef TTD_SIM_INTERNAL_H
#define TTD_SIM_INTERNAL_H

#include <pthread.h>

#include "../../../kernels/thread_pool.h"
#include "sim_backend.h"

/* Freed large blocks kept for the next buffer of a similar size: a card's DRAM stays
 * mapped, and host memory freed and refaulted per transfer would cost more than the copy. */
#define SIM_CACHED_BLOCKS 8
#define SIM_CACHE_MIN_BYTES (1u << 20)

typedef struct sim_device {
  pthread_mutex_t lock;
  uint64_t capacity[TTD_MEM_COUNT];
  uint64_t used[TTD_MEM_COUNT];
  void *cached[SIM_CACHED_BLOCKS]; /* guarded by lock */
  uint64_t cached_bytes[SIM_CACHED_BLOCKS];
} sim_device;

typedef struct sim_backend {
  ttd_backend base;
  int device_count;
  sim_device *devices;
  ttd_pool *pool; /* host threads standing for the cards' cores (--cores) */
} sim_backend;

struct ttd_backend_buffer {
  int device;
  ttd_memloc loc;
  uint64_t bytes;
  uint64_t block_bytes; /* of the host block behind data (a cached block may be larger) */
  unsigned char *data;
};

/* run_node of the sim backend: the op's kernels on host memory (sim_exec.c). */
ttd_status_t ttd_sim_run_node(ttd_backend *backend, int device, const ttd_node_call *call);

ttd_status_t ttd_sim_run_node_backward(ttd_backend *backend, int device, const ttd_node_call *call);
ttd_status_t ttd_sim_buffer_accumulate(ttd_backend *backend, ttd_backend_buffer *dst, ttd_backend_buffer *src);

ttd_status_t ttd_sim_optimizer_step(ttd_backend *backend, int device, const ttd_optimizer_call *call);

#endif
