#include "sim_internal.h"

#include "dtype.h"

#include <inttypes.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

static sim_backend *sim_of(ttd_backend *backend) { return (sim_backend *)backend; }

static int loc_index(ttd_memloc loc) { return loc == TTD_MEM_L1 ? 1 : 0; }

static void sim_destroy(ttd_backend *backend) {
  sim_backend *sim = sim_of(backend);
  ttd_pool_destroy(sim->pool);
  for (int i = 0; i < sim->device_count; i++) {
    sim_device *dev = &sim->devices[i];
    pthread_mutex_lock(&dev->lock);
    bool pinned = dev->in_flight[0] || dev->in_flight[1];
    pthread_mutex_unlock(&dev->lock);
    /* gRPC may still hold a send into a freed buffer (its writes outlive the server at
     * exit): its release must find the device, so the devices stay (the process ends). */
    if (pinned) return;
  }
  for (int i = 0; i < sim->device_count; i++) {
    ttd_block_cache_destroy(&sim->devices[i].blocks);
    pthread_mutex_destroy(&sim->devices[i].lock);
  }
  free(sim->devices);
  free(sim);
}

static int sim_device_count(ttd_backend *backend) { return sim_of(backend)->device_count; }

static void sim_device_info(ttd_backend *backend, int device, ttd_device_info *out_info) {
  sim_device *dev = &sim_of(backend)->devices[device];
  memset(out_info, 0, sizeof(*out_info));
  strcpy(out_info->kind, "sim-wormhole-n150");
  out_info->cores = TTD_SIM_CORES_PER_CARD;
  pthread_mutex_lock(&dev->lock);
  for (int i = 0; i < TTD_MEM_COUNT; i++) {
    out_info->memory[i].location = i == 0 ? TTD_MEM_DRAM : TTD_MEM_L1;
    out_info->memory[i].capacity_bytes = dev->capacity[i];
    out_info->memory[i].used_bytes = dev->used[i];
    out_info->memory[i].in_flight_bytes = dev->in_flight[i];
  }
  pthread_mutex_unlock(&dev->lock);
}

static void release_pin(ttd_host_pin *pin);

static void unreserve(sim_device *dev, int li, uint64_t bytes) {
  pthread_mutex_lock(&dev->lock);
  dev->used[li] -= bytes;
  pthread_mutex_unlock(&dev->lock);
}

static ttd_status_t sim_buffer_alloc(ttd_backend *backend, int device, ttd_memloc loc,
                                     uint64_t bytes, ttd_backend_buffer **out_buffer) {
  *out_buffer = NULL;
  sim_device *dev = &sim_of(backend)->devices[device];
  int li = loc_index(loc);
  pthread_mutex_lock(&dev->lock);
  uint64_t free_bytes = dev->capacity[li] - dev->used[li];
  if (bytes > free_bytes) {
    uint64_t capacity = dev->capacity[li];
    pthread_mutex_unlock(&dev->lock);
    return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED,
                           "tt:%d %s is full: requested %" PRIu64 " bytes, %" PRIu64
                           " bytes free of %" PRIu64 "; free tensors or use another location",
                           device, ttd_memloc_name(loc), bytes, free_bytes, capacity);
  }
  dev->used[li] += bytes;
  pthread_mutex_unlock(&dev->lock);

  ttd_backend_buffer *buf = malloc(sizeof(*buf));
  size_t block = 0;
  /* 64-byte alignment, like a card's DRAM pages. */
  void *data = buf && bytes <= SIZE_MAX - 64 ? ttd_block_cache_alloc(&dev->blocks, (size_t)bytes, &block) : NULL;
  if (!data) {
    free(buf);
    unreserve(dev, li, bytes);
    return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED,
                           "host memory backing simulated tt:%d %s is exhausted: could not "
                           "take %" PRIu64 " bytes",
                           device, ttd_memloc_name(loc), bytes);
  }
  memset(buf, 0, sizeof(*buf));
  buf->device = device;
  buf->loc = loc;
  buf->bytes = bytes;
  buf->block_bytes = block;
  buf->data = data;
  buf->dev = dev;
  buf->pin.release = release_pin;
  *out_buffer = buf;
  return TTD_OK;
}

static void release_block(ttd_backend_buffer *buffer) {
  ttd_block_cache_free(&buffer->dev->blocks, buffer->data, (size_t)buffer->block_bytes);
  free(buffer);
}

/* The device's bytes go back now; the host block once no view is pinned. */
static void sim_buffer_free(ttd_backend *backend, ttd_backend_buffer *buffer) {
  (void)backend;
  if (!buffer) return;
  sim_device *dev = buffer->dev;
  int li = loc_index(buffer->loc);
  pthread_mutex_lock(&dev->lock);
  dev->used[li] -= buffer->bytes;
  buffer->freed = true;
  bool last = buffer->pins == 0;
  if (!last) dev->in_flight[li] += buffer->bytes;
  pthread_mutex_unlock(&dev->lock);
  if (last) release_block(buffer);
}

static void release_pin(ttd_host_pin *pin) {
  ttd_backend_buffer *buffer = (ttd_backend_buffer *)((char *)pin - offsetof(ttd_backend_buffer, pin));
  sim_device *dev = buffer->dev;
  pthread_mutex_lock(&dev->lock);
  bool last = --buffer->pins == 0 && buffer->freed;
  if (last) dev->in_flight[loc_index(buffer->loc)] -= buffer->bytes;
  pthread_mutex_unlock(&dev->lock);
  if (last) release_block(buffer);
}

static const void *sim_buffer_host_view(ttd_backend *backend, ttd_backend_buffer *buffer, uint64_t offset,
                                        uint64_t bytes, ttd_host_pin **out_pin) {
  (void)backend;
  *out_pin = NULL;
  if (offset > buffer->bytes || bytes > buffer->bytes - offset) return NULL;
  pthread_mutex_lock(&buffer->dev->lock);
  buffer->pins++;
  pthread_mutex_unlock(&buffer->dev->lock);
  *out_pin = &buffer->pin;
  return buffer->data + offset;
}

static void *sim_buffer_host_map(ttd_backend *backend, ttd_backend_buffer *buffer, uint64_t offset, uint64_t bytes) {
  (void)backend;
  if (offset > buffer->bytes || bytes > buffer->bytes - offset) return NULL;
  return buffer->data + offset;
}

/* A big copy between the host and the card's memory is spread over the card's cores, as
 * a card's DMA engines spread one over their channels: a 64 MiB copy then beats one
 * thread's memcpy. Pieces are claimed one by one, so a core the host has taken away holds
 * up one piece only; and while a kernel has the cores, the copy runs on the calling thread
 * instead of waiting for them. */
#define PARALLEL_COPY_BYTES ((uint64_t)4 << 20)
#define COPY_PIECE_BYTES ((size_t)1 << 20)

typedef struct copy_job {
  unsigned char *dst;
  const unsigned char *src;
} copy_job;

static void copy_range(void *ctx, size_t begin, size_t end) {
  copy_job *job = ctx;
  memcpy(job->dst + begin, job->src + begin, end - begin);
}

static void sim_copy(ttd_backend *backend, void *dst, const void *src, uint64_t bytes) {
  if (bytes < PARALLEL_COPY_BYTES) {
    if (bytes) memcpy(dst, src, bytes);
    return;
  }
  copy_job job = {dst, src};
  ttd_pool_parallel_for_nowait(sim_of(backend)->pool, (size_t)bytes, COPY_PIECE_BYTES, copy_range, &job);
}

static ttd_status_t sim_buffer_write(ttd_backend *backend, ttd_backend_buffer *dst,
                                     uint64_t offset, const void *src, uint64_t bytes) {
  sim_copy(backend, dst->data + offset, src, bytes);
  return TTD_OK;
}

static ttd_status_t sim_buffer_read(ttd_backend *backend, ttd_backend_buffer *src,
                                    uint64_t offset, void *dst, uint64_t bytes) {
  sim_copy(backend, dst, src->data + offset, bytes);
  return TTD_OK;
}

static ttd_status_t sim_buffer_zero(ttd_backend *backend, ttd_backend_buffer *buffer) {
  (void)backend;
  if (buffer->bytes) memset(buffer->data, 0, buffer->bytes);
  return TTD_OK;
}

static ttd_status_t sim_buffer_copy(ttd_backend *backend, ttd_backend_buffer *src,
                                    ttd_backend_buffer *dst) {
  if (src->bytes != dst->bytes) {
    return ttd_make_status(GRPC_STATUS_INTERNAL, "buffer copy between sizes %" PRIu64 " and %" PRIu64,
                           src->bytes, dst->bytes);
  }
  sim_copy(backend, dst->data, src->data, src->bytes);
  return TTD_OK;
}

static ttd_status_t sim_buffer_convert(ttd_backend *backend, ttd_backend_buffer *src, ttd_dtype src_dtype,
                                       ttd_backend_buffer *dst, ttd_dtype dst_dtype, uint64_t n) {
  (void)backend;
  if (ttd_dtype_convert(dst->data, dst_dtype, src->data, src_dtype, (size_t)n) != 0) {
    return ttd_make_status(GRPC_STATUS_INTERNAL, "sim backend: cannot convert %s to %s", ttd_dtype_name(src_dtype),
                           ttd_dtype_name(dst_dtype));
  }
  return TTD_OK;
}

static void sim_device_wake(ttd_backend *backend, int device) {
  (void)device; /* the simulated cards share one pool of host threads */
  ttd_pool_wake(((sim_backend *)backend)->pool);
}

/* One program per host thread of the pool, on a single card. Several simulated cards share
 * the pool, which runs one parallel_for at a time: programs run together would hold it for
 * as long as their card has work, and the other cards' programs would wait for all of it,
 * where they now take turns with it kernel by kernel. */
static int sim_programs_at_once(ttd_backend *backend, int device) {
  (void)device;
  sim_backend *sim = (sim_backend *)backend;
  return sim->device_count == 1 ? ttd_pool_threads(sim->pool) : 1;
}

typedef struct together {
  void (*run)(void *arg, size_t i);
  void *arg;
} together;

static void run_together_chunk(void *ctx, size_t begin, size_t end) {
  const together *t = ctx;
  for (size_t i = begin; i < end; i++) t->run(t->arg, i);
}

/* Each program on a thread of the pool: a parallel_for made inside a pool's chunk runs on
 * the thread that makes it (thread_pool.h), so a program's kernels stay on its thread. */
static void sim_run_together(ttd_backend *backend, int device, size_t n, void (*run)(void *arg, size_t i),
                             void *arg) {
  (void)device;
  together t = {.run = run, .arg = arg};
  ttd_pool_parallel_for(((sim_backend *)backend)->pool, n, 1, run_together_chunk, &t);
}

static const ttd_backend_vtable sim_vtable = {
    .destroy = sim_destroy,
    .device_count = sim_device_count,
    .device_info = sim_device_info,
    .buffer_alloc = sim_buffer_alloc,
    .buffer_free = sim_buffer_free,
    .buffer_write = sim_buffer_write,
    .buffer_read = sim_buffer_read,
    .buffer_host_view = sim_buffer_host_view,
    .buffer_host_map = sim_buffer_host_map,
    .buffer_zero = sim_buffer_zero,
    .buffer_copy = sim_buffer_copy,
    .run_node = ttd_sim_run_node,
    .run_node_backward = ttd_sim_run_node_backward,
    .backward_adds = ttd_sim_backward_adds,
    .takes_bf16 = ttd_sim_takes_bf16,
    .fuses_relu = ttd_sim_fuses_relu,
    .masks_relu_grad = ttd_sim_masks_relu_grad,
    .buffer_accumulate = ttd_sim_buffer_accumulate,
    .optimizer_step = ttd_sim_optimizer_step,
    .buffer_convert = sim_buffer_convert,
    .device_wake = sim_device_wake,
    .programs_at_once = sim_programs_at_once,
    .run_together = sim_run_together,
};

ttd_status_t ttd_sim_backend_create(const ttd_backend_options *options, ttd_backend **out_backend) {
  *out_backend = NULL;
  if (options->devices < 1) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "sim backend needs at least 1 device, got %d",
                           options->devices);
  }
  sim_backend *sim = calloc(1, sizeof(*sim));
  sim_device *devices = calloc((size_t)options->devices, sizeof(*devices));
  if (!sim || !devices) {
    free(sim);
    free(devices);
    return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "out of host memory creating sim backend");
  }
  sim->base.vtable = &sim_vtable;
  sim->base.name = "sim";
  sim->device_count = options->devices;
  sim->devices = devices;
  sim->pool = ttd_pool_create(options->cores);
  if (!sim->pool) {
    free(devices);
    free(sim);
    return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "cannot start the simulated cores' threads");
  }
  for (int i = 0; i < options->devices; i++) {
    pthread_mutex_init(&devices[i].lock, NULL);
    ttd_block_cache_init(&devices[i].blocks);
    devices[i].capacity[0] = options->dram_bytes;
    devices[i].capacity[1] = options->l1_bytes;
  }
  *out_backend = &sim->base;
  return TTD_OK;
}
