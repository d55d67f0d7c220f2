/* Dropout (kernels.h). Element i of the forward at `step` is kept when u(key, i) >= p, where
 * key = mix(mix(seed ^ c) + mix(step)) and u is the top 24 bits of splitmix64's finaliser
 * applied to the key plus i times its increment, read as a float in [0, 1). The mask is a
 * pure function of (seed, step, i), so the backward and any split over the pool regenerate
 * it exactly; mix(0) = 0, so step 0 gives the mask of mix(seed ^ c) alone. */
#include <stdint.h>

#include "kernels.h"

enum { DROPOUT_GRAIN = 1 << 14 };

static uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* uniform in [0, 1) with 24 random bits: exactly representable in a float. */
static float uniform(uint64_t key, uint64_t i) {
  return (float)(mix64(key + (i + 1) * 0x9E3779B97F4A7C15ull) >> 40) * 0x1.0p-24f;
}

typedef struct dropout_job {
  const float *in;
  float *out;
  float p, scale;
  uint64_t key;
} dropout_job;

static void dropout_range(void *ctx, size_t begin, size_t end) {
  const dropout_job *j = ctx;
  for (size_t i = begin; i < end; i++) j->out[i] = uniform(j->key, i) >= j->p ? j->in[i] * j->scale : 0.0f;
}

/* y = in * mask / (1 - p); the forward and backward are the same map. p >= 1 drops all. */
static void dropout_apply(ttd_pool *pool, const float *in, int64_t n, float p, uint64_t seed, uint64_t step,
                          float *out) {
  if (n <= 0) return;
  dropout_job j = {.in = in, .out = out, .p = p, .key = mix64((seed ^ 0x6A09E667F3BCC909ull) + mix64(step))};
  j.scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  ttd_pool_parallel_for(pool, (size_t)n, DROPOUT_GRAIN, dropout_range, &j);
}

void ttd_k_dropout(ttd_pool *pool, const float *x, int64_t n, float p, uint64_t seed, uint64_t step, float *y) {
  dropout_apply(pool, x, n, p, seed, step, y);
}

void ttd_k_dropout_backward(ttd_pool *pool, const float *dy, int64_t n, float p, uint64_t seed, uint64_t step,
                            float *dx) {
  dropout_apply(pool, dy, n, p, seed, step, dx);
}
