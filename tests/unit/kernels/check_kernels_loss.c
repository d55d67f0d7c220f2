/* kernels/loss.c: cross entropy, mse and l1 losses, checked against double-precision
 * references and their backwards against central differences of them. */

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"
#include "kernel_testing.h"
#include "suites.h"

typedef struct ce_ctx {
  int64_t n, c;
  const int32_t *labels;
} ce_ctx;

static void ref_cross_entropy(const void *ctx, double *const *in, double *out) {
  const ce_ctx *c = ctx;
  double total = 0.0;
  for (int64_t r = 0; r < c->n; r++) {
    const double *x = in[0] + r * c->c;
    double m = x[0], s = 0.0;
    for (int64_t j = 1; j < c->c; j++) m = fmax(m, x[j]);
    for (int64_t j = 0; j < c->c; j++) s += exp(x[j] - m);
    total += m + log(s) - x[c->labels[r]];
  }
  out[0] = total / (double)c->n;
}

static int32_t *random_labels(uint64_t *st, int64_t n, int64_t c) {
  int32_t *l = kt_alloc((size_t)n * sizeof(int32_t));
  for (int64_t i = 0; i < n; i++) l[i] = (int32_t)(kt_next_random(st) % (uint64_t)c);
  return l;
}

/* cross_entropy (mean over samples) matches the reference for odd sizes and large logits. */
START_TEST(test_cross_entropy_forward) {
  int64_t shapes[][2] = {{1, 1}, {1, 7}, {7, 3}, {33, 10}, {1023, 5}, {500, 1000}};
  uint64_t st = 15;
  for (size_t i = 0; i < sizeof(shapes) / sizeof(*shapes); i++) {
    for (int big = 0; big <= 1; big++) {
      ce_ctx c = {shapes[i][0], shapes[i][1], random_labels(&st, shapes[i][0], shapes[i][1])};
      float *x = kt_random_floats(&st, c.n * c.c, big ? 90 : -4, big ? 110 : 4);
      float loss = -1.0f;
      int64_t bad = 123;
      double *in[1] = {kt_to_double(x, c.n * c.c)}, want;
      ref_cross_entropy(&c, in, &want);
      ck_assert_int_eq(ttd_k_cross_entropy(kt_pool, x, c.labels, c.n, c.c, &loss, &bad), 0);
      kt_expect_close("cross_entropy", &loss, &want, 1, 1e-5, 1e-6);
    }
  }
}
END_TEST

/* A label below 0 or >= classes fails with -1 and the index of the first bad sample. */
START_TEST(test_cross_entropy_bad_label) {
  float x[12] = {0};
  int64_t bad = 99;
  float loss = 5.0f;
  int32_t neg[4] = {0, 1, -1, 2}, high[4] = {0, 3, 2, 1}, two_bad[4] = {2, 7, 1, -4}, ok[4] = {2, 0, 1, 2};
  ck_assert_int_eq(ttd_k_cross_entropy(kt_pool, x, neg, 4, 3, &loss, &bad), -1);
  ck_assert_int_eq(bad, 2);
  ck_assert_int_eq(ttd_k_cross_entropy(kt_pool, x, high, 4, 3, &loss, &bad), -1);
  ck_assert_int_eq(bad, 1);
  ck_assert_int_eq(ttd_k_cross_entropy(kt_pool, x, two_bad, 4, 3, &loss, &bad), -1);
  ck_assert_int_eq(bad, 1);
  ck_assert(loss == 5.0f);
  ck_assert_int_eq(ttd_k_cross_entropy(kt_pool, x, ok, 4, 3, &loss, &bad), 0);
  ck_assert_float_eq_tol(loss, logf(3.0f), 1e-6f);
}
END_TEST

/* cross_entropy backward, dloss * (softmax - onehot) / n, matches central differences. */
START_TEST(test_cross_entropy_backward) {
  int64_t shapes[][2] = {{1, 1}, {1, 7}, {7, 3}, {9, 11}};
  uint64_t st = 16;
  for (size_t i = 0; i < sizeof(shapes) / sizeof(*shapes); i++) {
    ce_ctx c = {shapes[i][0], shapes[i][1], random_labels(&st, shapes[i][0], shapes[i][1])};
    int64_t n = c.n * c.c;
    float *x = kt_random_floats(&st, n, -3, 3), *dx = kt_fbuf(n);
    double *in[1] = {kt_to_double(x, n)}, dloss = -1.7;
    ttd_k_cross_entropy_backward(kt_pool, x, c.labels, c.n, c.c, (float)dloss, dx);
    kt_expect_close("cross_entropy dx", dx, kt_fd_grad(ref_cross_entropy, &c, in, 0, n, &dloss, 1), n, KT_GRAD_RTOL,
                    KT_GRAD_ATOL);
  }
}
END_TEST

typedef struct pair_ctx {
  int64_t n;
  int l1;
} pair_ctx;

static void ref_pair_loss(const void *ctx, double *const *in, double *out) {
  const pair_ctx *c = ctx;
  double s = 0.0;
  for (int64_t i = 0; i < c->n; i++) {
    double d = in[0][i] - in[1][i];
    s += c->l1 ? fabs(d) : d * d;
  }
  out[0] = s / (double)c->n;
}

/* b = a + a gap of at least `gap` with a random sign: l1 stays away from its kink. */
static float *offset_from(uint64_t *st, const float *a, int64_t n, double gap) {
  float *b = kt_random_away_from_zero(st, n, gap, 2);
  for (int64_t i = 0; i < n; i++) b[i] += a[i];
  return b;
}

/* mse and l1 losses (means) match the reference for 1 to 1000003 elements. */
START_TEST(test_mse_l1_forward) {
  static const int64_t sizes[] = {1, 7, 33, 1023, 1000003};
  uint64_t st = 17;
  for (size_t s = 0; s < sizeof(sizes) / sizeof(*sizes); s++) {
    for (int l1 = 0; l1 <= 1; l1++) {
      pair_ctx c = {sizes[s], l1};
      float *a = kt_random_floats(&st, c.n, -3, 3), *b = kt_random_floats(&st, c.n, -3, 3), loss;
      double *in[2] = {kt_to_double(a, c.n), kt_to_double(b, c.n)}, want;
      ref_pair_loss(&c, in, &want);
      if (l1) ttd_k_l1_loss(kt_pool, a, b, c.n, &loss);
      else ttd_k_mse_loss(kt_pool, a, b, c.n, &loss);
      kt_expect_close(l1 ? "l1" : "mse", &loss, &want, 1, 4e-6, 0);
    }
  }
}
END_TEST

/* mse and l1 backwards give da and db matching central differences; either may be NULL. */
START_TEST(test_mse_l1_backward) {
  static const int64_t sizes[] = {1, 7, 33};
  uint64_t st = 18;
  for (size_t s = 0; s < sizeof(sizes) / sizeof(*sizes); s++) {
    for (int l1 = 0; l1 <= 1; l1++) {
      pair_ctx c = {sizes[s], l1};
      float *a = kt_random_floats(&st, c.n, -3, 3), *b = offset_from(&st, a, c.n, 0.05);
      float *da = kt_fbuf(c.n), *db = kt_fbuf(c.n), *only = kt_fbuf(c.n);
      double *in[2] = {kt_to_double(a, c.n), kt_to_double(b, c.n)}, dloss = 0.6;
      void (*bw)(ttd_pool *, const float *, const float *, int64_t, float, float *, float *) =
          l1 ? ttd_k_l1_loss_backward : ttd_k_mse_loss_backward;
      bw(kt_pool, a, b, c.n, (float)dloss, da, db);
      kt_expect_close("da", da, kt_fd_grad(ref_pair_loss, &c, in, 0, c.n, &dloss, 1), c.n, KT_GRAD_RTOL, KT_GRAD_ATOL);
      kt_expect_close("db", db, kt_fd_grad(ref_pair_loss, &c, in, 1, c.n, &dloss, 1), c.n, KT_GRAD_RTOL, KT_GRAD_ATOL);
      bw(kt_pool, a, b, c.n, (float)dloss, only, NULL);
      ck_assert_int_eq(memcmp(only, da, (size_t)c.n * sizeof(float)), 0);
      bw(kt_pool, a, b, c.n, (float)dloss, NULL, only);
      ck_assert_int_eq(memcmp(only, db, (size_t)c.n * sizeof(float)), 0);
    }
  }
}
END_TEST

/* l1's gradient is 0 where a == b (the subgradient torch picks). */
START_TEST(test_l1_subgradient_at_equality) {
  float a[3] = {1.0f, 2.0f, -1.0f}, b[3] = {1.0f, 1.0f, -1.0f}, da[3], db[3];
  ttd_k_l1_loss_backward(NULL, a, b, 3, 3.0f, da, db);
  ck_assert(da[0] == 0.0f && db[0] == 0.0f);
  ck_assert(da[1] == 1.0f && db[1] == -1.0f);
  ck_assert(da[2] == 0.0f && db[2] == 0.0f);
}
END_TEST

/* Labels rewritten by another thread during the call, between a good label and one far past
 * the row: every call gives the good label's loss or refuses with a row in range, and
 * never reads outside the logits. */
START_TEST(test_cross_entropy_labels_changing_under_the_kernel) {
  enum { N = 4096, C = 4, CALLS = 3000 };
  float *logits = kt_fbuf(N * C);
  int32_t *labels = kt_alloc(sizeof(int32_t) * N);
  for (int i = 0; i < N * C; i++) logits[i] = (float)(i % C);
  for (int i = 0; i < N; i++) labels[i] = 2;
  double want = log(exp(0.0) + exp(1.0) + exp(2.0) + exp(3.0)) - 2.0;
  kt_flipper *f = kt_flipper_start(labels, N, 2, 0x3fffffff);
  int refused = 0;
  for (int call = 0; call < CALLS; call++) {
    float loss = NAN;
    int64_t bad = -2;
    if (ttd_k_cross_entropy(kt_pool, logits, labels, N, C, &loss, &bad) == 0) {
      ck_assert_msg(fabs(loss - want) < 1e-5, "loss %g, want %g", loss, want);
    } else {
      refused++;
      ck_assert(bad >= 0 && bad < N);
    }
  }
  kt_flipper_stop(f);
  ck_assert_int_gt(refused, 0);
}
END_TEST

Suite *kernels_loss_suite(void) {
  Suite *s = suite_create("kernels_loss");
  TCase *tc = tcase_create("loss");
  tcase_add_checked_fixture(tc, kt_setup, kt_teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_cross_entropy_forward);
  tcase_add_test(tc, test_cross_entropy_bad_label);
  tcase_add_test(tc, test_cross_entropy_labels_changing_under_the_kernel);
  tcase_add_test(tc, test_cross_entropy_backward);
  tcase_add_test(tc, test_mse_l1_forward);
  tcase_add_test(tc, test_mse_l1_backward);
  tcase_add_test(tc, test_l1_subgradient_at_equality);
  suite_add_tcase(s, tc);
  return s;
}
