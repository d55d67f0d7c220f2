/* Internals of the simulated card shared by its files: the backend state, buffers
 * (plain host memory) and the node executor. */
#ifndef TTD_SIM_INTERNAL_H
#define TTD_SIM_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>

#include "thread_pool.h"
#include "base/block_cache.h"
#include "sim_backend.h"

typedef struct sim_device {
  pthread_mutex_t lock;
  uint64_t capacity[TTD_MEM_COUNT];
  uint64_t used[TTD_MEM_COUNT];
  uint64_t in_flight[TTD_MEM_COUNT]; /* freed buffers' bytes still pinned by sends */
  ttd_block_cache blocks; /* a card's DRAM stays mapped: freed blocks serve the next buffers */
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
  sim_device *dev;
  /* Under dev->lock: views pinned (ttd_host_pin), and whether buffer_free has run; the
   * host block goes back when both are done. */
  int pins;
  bool freed;
  ttd_host_pin pin;
};

/* run_node of the sim backend: the op's kernels on host memory (sim_exec.c). */
ttd_status_t ttd_sim_run_node(ttd_backend *backend, int device, const ttd_node_call *call);

ttd_status_t ttd_sim_run_node_backward(ttd_backend *backend, int device, const ttd_node_call *call);
/* Whether its backward adds input `input`'s gradient (backend.h: backward_adds): linear and matmul. */
bool ttd_sim_backward_adds(ttd_backend *backend, const struct ttd_program_node *node, int input);
/* Whether it reads input `input` as bfloat16 (backend.h: takes_bf16): the operands of linear and matmul. */
bool ttd_sim_takes_bf16(ttd_backend *backend, const struct ttd_program_node *node, int input);
/* Whether it relus the output as it writes it (backend.h: fuses_relu): linear. */
bool ttd_sim_fuses_relu(ttd_backend *backend, const struct ttd_program_node *node);
/* Whether its backward masks x's gradient by the relu before it (backend.h: masks_relu_grad): linear. */
bool ttd_sim_masks_relu_grad(ttd_backend *backend, const struct ttd_program_node *node);
ttd_status_t ttd_sim_buffer_accumulate(ttd_backend *backend, ttd_backend_buffer *dst, ttd_backend_buffer *src);

ttd_status_t ttd_sim_optimizer_step(ttd_backend *backend, int device, const ttd_optimizer_call *call);

#endif
