/* Optimizer steps in place, following torch.optim.SGD and torch.optim.Adam/AdamW
 * (_single_tensor_* paths) operation by operation. Scalars that torch computes in Python
 * (bias corrections, step size, 1 - lr * wd) are computed in double and rounded once.
 * With zero_grad, each gradient element is set to 0 once read, as torch's step() then
 * zero_grad() leave it, in the one pass over it. A bfloat16 parameter is widened a chunk at a
 * time into float32 on the stack, updated there by the same loops, and rounded back, so its
 * step is one pass over it too. */
#include <math.h>

#include "kernel_internal.h"
#include "kernels.h"

enum { BF16_CHUNK = 1024 }; /* elements of a bfloat16 parameter updated at once */

/* Updates elements [off, off + n) of a job's parameter, held at `param` as float32. */
typedef void (*update_fn)(void *job, float *param, size_t off, size_t n);

/* Elements [begin, end) of a job: straight on a float32 parameter, or chunk by chunk through
 * float32 on a bfloat16 one (param16 not NULL). */
static void update_range(void *job, float *param, uint16_t *param16, size_t begin, size_t end, update_fn update) {
  if (!param16) {
    update(job, param + begin, begin, end - begin);
    return;
  }
  float wide[BF16_CHUNK];
  for (size_t i = begin; i < end; i += BF16_CHUNK) {
    size_t len = end - i < BF16_CHUNK ? end - i : BF16_CHUNK;
    ttd_f32_from_bf16_n(wide, param16 + i, len);
    update(job, wide, i, len);
    ttd_bf16_from_f32_n(param16 + i, wide, len);
  }
}

/* ---- SGD ---- */

typedef struct sgd_job {
  const ttd_sgd_params *p;
  bool first;     /* step 1: the momentum buffer starts as the gradient */
  bool zero_grad; /* grad[i] = 0 once read */
  float *param, *buf, *grad;
  uint16_t *param16; /* a bfloat16 parameter (param NULL), or NULL */
} sgd_job;

/* The plain loop takes zero_grad as a constant from its two callers below, so it is
 * compiled twice, without a test in the loop; the momentum and Adam loops test it, as they
 * test their other flags, per element. */
static inline __attribute__((always_inline)) void sgd_plain(float lr, float wd, float *restrict param,
                                                            float *restrict grad, int64_t n, bool zero_grad) {
  for (int64_t i = 0; i < n; i++) {
    float g = wd != 0.0f ? grad[i] + wd * param[i] : grad[i];
    param[i] = param[i] - lr * g;
    if (zero_grad) grad[i] = 0.0f;
  }
}

TTD_KHOT static void sgd_plain_loop(float lr, float wd, float *restrict param, float *restrict grad, int64_t n) {
  sgd_plain(lr, wd, param, grad, n, false);
}

TTD_KHOT static void sgd_plain_zero_loop(float lr, float wd, float *restrict param, float *restrict grad, int64_t n) {
  sgd_plain(lr, wd, param, grad, n, true);
}

TTD_KHOT static void sgd_momentum_loop(float lr, float momentum, float dampening, float wd, bool nesterov,
                                       bool first, bool zero_grad, float *restrict param, float *restrict grad,
                                       float *restrict buf, int64_t n) {
  float keep = 1.0f - dampening;
  for (int64_t i = 0; i < n; i++) {
    float g = wd != 0.0f ? grad[i] + wd * param[i] : grad[i];
    if (zero_grad) grad[i] = 0.0f;
    float b = first ? g : momentum * buf[i] + keep * g;
    buf[i] = b;
    g = nesterov ? g + momentum * b : b;
    param[i] = param[i] - lr * g;
  }
}

static void sgd_update(void *ctx, float *param, size_t off, size_t len) {
  sgd_job *job = ctx;
  const ttd_sgd_params *p = job->p;
  int64_t n = (int64_t)len;
  if (p->momentum == 0.0f) {
    (job->zero_grad ? sgd_plain_zero_loop : sgd_plain_loop)(p->lr, p->weight_decay, param, job->grad + off, n);
  } else {
    sgd_momentum_loop(p->lr, p->momentum, p->dampening, p->weight_decay, p->nesterov, job->first, job->zero_grad,
                      param, job->grad + off, job->buf + off, n);
  }
}

static void sgd_run(void *ctx, size_t begin, size_t end) {
  sgd_job *job = ctx;
  update_range(job, job->param, job->param16, begin, end, sgd_update);
}

void ttd_k_sgd_step(ttd_pool *pool, const ttd_sgd_params *p, int64_t step, float *param, float *grad,
                    float *momentum_buf, int64_t n, bool zero_grad) {
  ttd_k_sgd_step_dt(pool, p, step, param, TTD_DTYPE_FLOAT32, grad, momentum_buf, n, zero_grad);
}

/* With momentum 0 the buffer is neither read nor written (it may be NULL). */
void ttd_k_sgd_step_dt(ttd_pool *pool, const ttd_sgd_params *p, int64_t step, void *param, ttd_dtype param_dtype,
                       float *grad, float *momentum_buf, int64_t n, bool zero_grad) {
  if (n <= 0) return;
  sgd_job job = {p, step <= 1, zero_grad, NULL, p->momentum != 0.0f ? momentum_buf : NULL, grad, NULL};
  if (param_dtype == TTD_DTYPE_BFLOAT16) job.param16 = param;
  else job.param = param;
  ttd_pool_parallel_for(pool, (size_t)n, TTD_KGRAIN, sgd_run, &job);
}

/* ---- Adam / AdamW ---- */

typedef struct adam_scalars {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
  float l2;          /* Adam: grad += l2 * param */
  float decay;       /* AdamW: param *= decay (1 when unused) */
  float step_size;   /* lr / (1 - beta1^step) */
  float bc2_sqrt;    /* sqrt(1 - beta2^step) */
} adam_scalars;

typedef struct adam_job {
  adam_scalars s;
  bool zero_grad;
  float *param, *m, *v, *grad;
  uint16_t *param16; /* a bfloat16 parameter (param NULL), or NULL */
} adam_job;

TTD_KHOT static void adam_loop(const adam_scalars *sp, bool zero_grad, float *restrict param, float *restrict grad,
                               float *restrict m, float *restrict v, int64_t n) {
  const adam_scalars s = *sp;
  for (int64_t i = 0; i < n; i++) {
    float p = param[i] * s.decay;
    float g = s.l2 != 0.0f ? grad[i] + s.l2 * p : grad[i];
    if (zero_grad) grad[i] = 0.0f;
    /* torch's lerp: weight < 0.5 ? m + w (g - m) : g - (g - m)(1 - w) */
    float mi = s.one_minus_beta1 < 0.5f ? m[i] + s.one_minus_beta1 * (g - m[i])
                                        : g - (g - m[i]) * (1.0f - s.one_minus_beta1);
    float vi = v[i] * s.beta2 + s.one_minus_beta2 * (g * g);
    m[i] = mi;
    v[i] = vi;
    float denom = sqrtf(vi) / s.bc2_sqrt + s.eps;
    param[i] = p + (-s.step_size) * (mi / denom);
  }
}

static void adam_update(void *ctx, float *param, size_t off, size_t n) {
  adam_job *job = ctx;
  adam_loop(&job->s, job->zero_grad, param, job->grad + off, job->m + off, job->v + off, (int64_t)n);
}

static void adam_run(void *ctx, size_t begin, size_t end) {
  adam_job *job = ctx;
  update_range(job, job->param, job->param16, begin, end, adam_update);
}

void ttd_k_adam_step(ttd_pool *pool, const ttd_adam_params *p, int64_t step, float *param, float *grad, float *m,
                     float *v, int64_t n, bool zero_grad) {
  ttd_k_adam_step_dt(pool, p, step, param, TTD_DTYPE_FLOAT32, grad, m, v, n, zero_grad);
}

void ttd_k_adam_step_dt(ttd_pool *pool, const ttd_adam_params *p, int64_t step, void *param, ttd_dtype param_dtype,
                        float *grad, float *m, float *v, int64_t n, bool zero_grad) {
  if (n <= 0) return;
  double t = (double)(step < 1 ? 1 : step);
  double bc1 = 1.0 - pow((double)p->beta1, t), bc2 = 1.0 - pow((double)p->beta2, t);
  adam_job job = {.zero_grad = zero_grad, .m = m, .v = v, .grad = grad};
  if (param_dtype == TTD_DTYPE_BFLOAT16) job.param16 = param;
  else job.param = param;
  job.s.beta1 = p->beta1;
  job.s.one_minus_beta1 = (float)(1.0 - (double)p->beta1);
  job.s.beta2 = p->beta2;
  job.s.one_minus_beta2 = (float)(1.0 - (double)p->beta2);
  job.s.eps = p->eps;
  job.s.l2 = p->decoupled ? 0.0f : p->weight_decay;
  job.s.decay = p->decoupled ? (float)(1.0 - (double)p->lr * (double)p->weight_decay) : 1.0f;
  job.s.step_size = (float)((double)p->lr / bc1);
  job.s.bc2_sqrt = (float)sqrt(bc2);
  ttd_pool_parallel_for(pool, (size_t)n, TTD_KGRAIN, adam_run, &job);
}
