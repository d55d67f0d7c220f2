/* kernels/optimizer.c: SGD and Adam/AdamW steps against torch's documented update rules,
 * run in double. */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "kernels.h"
#include "kernel_testing.h"
#include "suites.h"

/* torch.optim.SGD, in double:
 *   g = grad + wd * p;  if momentum: buf = (t == 1) ? g : momentum * buf + (1 - dampening) * g
 *   g = nesterov ? g + momentum * buf : buf;  p -= lr * g */
static void ref_sgd(const ttd_sgd_params *p, int64_t t, double *param, const double *grad, double *buf, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    double g = grad[i] + (double)p->weight_decay * param[i];
    if (p->momentum != 0.0f) {
      buf[i] = t == 1 ? g : (double)p->momentum * buf[i] + (1.0 - (double)p->dampening) * g;
      g = p->nesterov ? g + (double)p->momentum * buf[i] : buf[i];
    }
    param[i] -= (double)p->lr * g;
  }
}

/* torch.optim.Adam / AdamW, in double:
 *   AdamW: p *= 1 - lr * wd;  Adam: g = grad + wd * p
 *   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
 *   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps) */
static void ref_adam(const ttd_adam_params *p, int64_t t, double *param, const double *grad, double *m, double *v,
                     int64_t n) {
  double b1 = p->beta1, b2 = p->beta2, lr = p->lr, wd = p->weight_decay;
  for (int64_t i = 0; i < n; i++) {
    double g = grad[i];
    if (p->decoupled) param[i] *= 1.0 - lr * wd;
    else g += wd * param[i];
    m[i] = b1 * m[i] + (1.0 - b1) * g;
    v[i] = b2 * v[i] + (1.0 - b2) * g * g;
    double denom = sqrt(v[i]) / sqrt(1.0 - pow(b2, (double)t)) + (double)p->eps;
    param[i] -= lr / (1.0 - pow(b1, (double)t)) * m[i] / denom;
  }
}

#define OPT_N 1031
#define OPT_STEPS 6

/* SGD (plain, momentum, dampening, nesterov, weight decay) over several steps matches torch's rule. */
START_TEST(test_sgd_steps) {
  ttd_sgd_params cases[] = {
      {.lr = 0.1f},
      {.lr = 0.05f, .weight_decay = 0.1f},
      {.lr = 0.05f, .momentum = 0.9f},
      {.lr = 0.05f, .momentum = 0.9f, .dampening = 0.5f},
      {.lr = 0.02f, .momentum = 0.8f, .nesterov = 1},
      {.lr = 0.02f, .momentum = 0.9f, .weight_decay = 0.01f, .nesterov = 1},
      {.lr = 0.03f, .momentum = 0.7f, .dampening = 0.3f, .weight_decay = 0.05f},
  };
  uint64_t st = 19;
  for (size_t k = 0; k < sizeof(cases) / sizeof(*cases); k++) {
    float *param = kt_random_floats(&st, OPT_N, -2, 2), *buf = kt_fbuf(OPT_N);
    for (int i = 0; i < OPT_N; i++) buf[i] = cases[k].momentum != 0.0f ? 0.0f : 1234.5f;
    double *rp = kt_to_double(param, OPT_N), *rbuf = kt_dbuf(OPT_N);
    for (int step = 1; step <= OPT_STEPS; step++) {
      float *grad = kt_random_floats(&st, OPT_N, -1, 1);
      ttd_k_sgd_step(kt_pool, &cases[k], step, param, grad, buf, OPT_N, false);
      ref_sgd(&cases[k], step, rp, kt_to_double(grad, OPT_N), rbuf, OPT_N);
      kt_expect_close("sgd param", param, rp, OPT_N, 1e-5, 1e-6);
      if (cases[k].momentum != 0.0f) kt_expect_close("sgd momentum", buf, rbuf, OPT_N, 1e-5, 1e-6);
      else
        for (int i = 0; i < OPT_N; i++)
          if (buf[i] != 1234.5f) ck_abort_msg("momentum 0 wrote buf[%d]", i);
    }
  }
}
END_TEST

/* Adam (L2 decay) and AdamW (decoupled decay) over several steps match torch's rule, moments too. */
START_TEST(test_adam_steps) {
  ttd_adam_params cases[] = {
      {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f},
      {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.1f},
      {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.1f, .decoupled = 1},
      {.lr = 3e-3f, .beta1 = 0.8f, .beta2 = 0.99f, .eps = 1e-6f, .weight_decay = 0.5f, .decoupled = 1},
      {.lr = 1e-3f, .beta1 = 0.3f, .beta2 = 0.9f, .eps = 1e-3f},
  };
  uint64_t st = 20;
  for (size_t k = 0; k < sizeof(cases) / sizeof(*cases); k++) {
    float *param = kt_random_floats(&st, OPT_N, -2, 2), *m = kt_fbuf(OPT_N), *v = kt_fbuf(OPT_N);
    memset(m, 0, OPT_N * sizeof(float));
    memset(v, 0, OPT_N * sizeof(float));
    double *rp = kt_to_double(param, OPT_N), *rm = kt_dbuf(OPT_N), *rv = kt_dbuf(OPT_N);
    memset(rm, 0, OPT_N * sizeof(double));
    memset(rv, 0, OPT_N * sizeof(double));
    for (int step = 1; step <= OPT_STEPS; step++) {
      float *grad = kt_random_away_from_zero(&st, OPT_N, 0.05, 1);
      ttd_k_adam_step(kt_pool, &cases[k], step, param, grad, m, v, OPT_N, false);
      ref_adam(&cases[k], step, rp, kt_to_double(grad, OPT_N), rm, rv, OPT_N);
      kt_expect_close("adam param", param, rp, OPT_N, 1e-5, 1e-6);
      kt_expect_close("adam m", m, rm, OPT_N, 1e-5, 1e-7);
      kt_expect_close("adam v", v, rv, OPT_N, 1e-5, 1e-9);
    }
  }
}
END_TEST

/* Bias correction makes the first Adam step move each parameter by about lr against its gradient. */
START_TEST(test_adam_first_step_is_lr) {
  ttd_adam_params p = {.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
  float param[3] = {1, 1, 1}, grad[3] = {0.5f, -3.0f, 1e-3f}, m[3] = {0}, v[3] = {0};
  ttd_k_adam_step(NULL, &p, 1, param, grad, m, v, 3, false);
  ck_assert_float_eq_tol(param[0], 0.99f, 1e-6f);
  ck_assert_float_eq_tol(param[1], 1.01f, 1e-6f);
  ck_assert_float_eq_tol(param[2], 0.99f, 1e-5f);
}
END_TEST

/* Whether the n floats at a and b are the same bits. */
static int same_bits(const float *a, const float *b, int64_t n) { return memcmp(a, b, (size_t)n * sizeof(float)) == 0; }

/* zero_grad: the step leaves parameter and state bit for bit as without it, and the
 * gradient all zeros (without it, untouched), for SGD with and without momentum and for
 * Adam, over three steps on the pool (several chunks) and on the caller. */
START_TEST(test_step_zero_grad) {
  ttd_sgd_params sgds[] = {{.lr = 0.1f}, {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 0.01f, .nesterov = 1}};
  ttd_adam_params adam = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.1f};
  const int64_t n = 3 * 16384 + 5; /* several of the pool's chunks (TTD_KGRAIN, 16384), and a tail */
  uint64_t st = 23;
  for (int c = 0; c < 3; c++)
    for (int pooled = 0; pooled < 2; pooled++) {
      float *p0 = kt_random_floats(&st, n, -2, 2), *p1 = kt_fbuf(n), *s0 = kt_fbuf(2 * n), *s1 = kt_fbuf(2 * n);
      memcpy(p1, p0, (size_t)n * sizeof(float));
      memset(s0, 0, 2 * (size_t)n * sizeof(float));
      memset(s1, 0, 2 * (size_t)n * sizeof(float));
      for (int step = 1; step <= 3; step++) {
        float *g0 = kt_random_floats(&st, n, -1, 1), *g1 = kt_fbuf(n), *g_before = kt_fbuf(n);
        memcpy(g1, g0, (size_t)n * sizeof(float));
        memcpy(g_before, g0, (size_t)n * sizeof(float));
        ttd_pool *pool = pooled ? kt_pool : NULL;
        if (c < 2) {
          ttd_k_sgd_step(pool, &sgds[c], step, p0, g0, s0, n, false);
          ttd_k_sgd_step(pool, &sgds[c], step, p1, g1, s1, n, true);
        } else {
          ttd_k_adam_step(pool, &adam, step, p0, g0, s0, s0 + n, n, false);
          ttd_k_adam_step(pool, &adam, step, p1, g1, s1, s1 + n, n, true);
        }
        ck_assert_msg(same_bits(p0, p1, n), "case %d step %d: the parameter differs with zero_grad", c, step);
        ck_assert_msg(same_bits(s0, s1, 2 * n), "case %d step %d: the state differs with zero_grad", c, step);
        ck_assert_msg(same_bits(g0, g_before, n), "case %d step %d: the gradient changed without zero_grad", c, step);
        for (int64_t i = 0; i < n; i++)
          if (g1[i] != 0.0f || signbit(g1[i]))
            ck_abort_msg("case %d step %d: grad[%lld] = %g, not +0", c, step, (long long)i, g1[i]);
      }
    }
}
END_TEST

/* A bfloat16 parameter (SGD plain, with momentum and weight decay, Adam, AdamW), stepped
 * in place with its gradient zeroed: bit for bit the bfloat16 of the float32 step of its
 * widened values, state the same bits, on the pool (chunks of the pool and of the bfloat16
 * loop, and tails) and on the caller, over three steps. */
START_TEST(test_step_bf16_param) {
  ttd_sgd_params sgds[] = {{.lr = 0.1f}, {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 0.01f, .nesterov = 1}};
  ttd_adam_params adams[] = {{.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.1f},
                             {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.1f,
                              .decoupled = true}};
  const int64_t n = 2 * 16384 + 3 * 1024 + 7;
  uint64_t st = 29;
  for (int c = 0; c < 4; c++)
    for (int pooled = 0; pooled < 2; pooled++) {
      float *wide = kt_random_floats(&st, n, -2, 2), *s0 = kt_fbuf(2 * n), *s1 = kt_fbuf(2 * n);
      uint16_t *p16 = malloc((size_t)n * sizeof(uint16_t));
      ck_assert_ptr_nonnull(p16);
      for (int64_t i = 0; i < n; i++) p16[i] = ttd_bf16_from_f32(wide[i]);
      memset(s0, 0, 2 * (size_t)n * sizeof(float));
      memset(s1, 0, 2 * (size_t)n * sizeof(float));
      ttd_pool *pool = pooled ? kt_pool : NULL;
      for (int step = 1; step <= 3; step++) {
        float *g0 = kt_random_floats(&st, n, -1, 1), *g1 = kt_fbuf(n);
        memcpy(g1, g0, (size_t)n * sizeof(float));
        for (int64_t i = 0; i < n; i++) wide[i] = ttd_f32_from_bf16(p16[i]);
        if (c < 2) {
          ttd_k_sgd_step(pool, &sgds[c], step, wide, g0, s0, n, false);
          ttd_k_sgd_step_dt(pool, &sgds[c], step, p16, TTD_DTYPE_BFLOAT16, g1, s1, n, true);
        } else {
          ttd_k_adam_step(pool, &adams[c - 2], step, wide, g0, s0, s0 + n, n, false);
          ttd_k_adam_step_dt(pool, &adams[c - 2], step, p16, TTD_DTYPE_BFLOAT16, g1, s1, s1 + n, n, true);
        }
        for (int64_t i = 0; i < n; i++) {
          if (p16[i] != ttd_bf16_from_f32(wide[i]))
            ck_abort_msg("case %d step %d: param[%lld] 0x%04x, want 0x%04x", c, step, (long long)i, p16[i],
                         ttd_bf16_from_f32(wide[i]));
          if (g1[i] != 0.0f) ck_abort_msg("case %d step %d: grad[%lld] = %g, not 0", c, step, (long long)i, g1[i]);
        }
        ck_assert_msg(same_bits(s0, s1, 2 * n), "case %d step %d: the state differs", c, step);
      }
      free(p16);
    }
}
END_TEST

Suite *kernels_optimizer_suite(void) {
  Suite *s = suite_create("kernels_optimizer");
  TCase *tc = tcase_create("optimizer");
  tcase_add_checked_fixture(tc, kt_setup, kt_teardown);
  tcase_add_test(tc, test_sgd_steps);
  tcase_add_test(tc, test_adam_steps);
  tcase_add_test(tc, test_adam_first_step_is_lr);
  tcase_add_test(tc, test_step_zero_grad);
  tcase_add_test(tc, test_step_bf16_param);
  suite_add_tcase(s, tc);
  return s;
}
