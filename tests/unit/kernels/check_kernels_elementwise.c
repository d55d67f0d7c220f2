/* kernels/elementwise.c: binary ops with broadcasting and unary ops. Forwards are checked
 * against naive double-precision references written here; backwards against central
 * differences of those references. */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "kernel_testing.h"
#include "suites.h"

/* ======================================================================================
 * binary elementwise
 * ====================================================================================== */

typedef struct bin_ctx {
  ttd_binary_op op;
  ttd_kshape as, bs, os;
} bin_ctx;

static double ref_bin_op(ttd_binary_op op, double a, double b) {
  switch (op) {
    case TTD_BIN_ADD: return a + b;
    case TTD_BIN_SUB: return a - b;
    case TTD_BIN_MUL: return a * b;
    case TTD_BIN_DIV: return a / b;
  }
  return NAN;
}

static void ref_binary(const void *ctx, double *const *in, double *out) {
  const bin_ctx *c = ctx;
  int64_t idx[TTD_MAX_DIMS];
  for (int64_t o = 0; o < kt_count(&c->os); o++) {
    kt_unravel(&c->os, o, idx);
    out[o] = ref_bin_op(c->op, in[0][kt_bcast_offset(&c->as, c->os.ndim, idx)],
                        in[1][kt_bcast_offset(&c->bs, c->os.ndim, idx)]);
  }
}

typedef struct shape_pair {
  ttd_kshape a, b;
} shape_pair;

/* Shape pairs that exercise every broadcast path; `small` ones are cheap enough for
 * central differences. */
static const shape_pair *binary_shapes(int small, size_t *n) {
  static shape_pair small_pairs[14], big_pairs[6];
  shape_pair s[] = {
      {kt_shp(1, 1), kt_shp(1, 1)},
      {kt_shp(1, 7), kt_shp(1, 7)},
      {kt_shp(0), kt_shp(0)},
      {kt_shp(1, 5), kt_shp(0)},
      {kt_shp(0), kt_shp(1, 5)},
      {kt_shp(3, 3, 1, 5), kt_shp(2, 4, 1)},
      {kt_shp(2, 4, 1), kt_shp(3, 3, 1, 5)},
      {kt_shp(2, 2, 3), kt_shp(1, 3)},
      {kt_shp(2, 2, 3), kt_shp(2, 2, 1)},
      {kt_shp(2, 1, 3), kt_shp(2, 2, 1)},
      {kt_shp(1, 33), kt_shp(1, 1)},
      {kt_shp(1, 1), kt_shp(1, 33)},
      {kt_shp(4, 2, 1, 3, 1), kt_shp(3, 3, 1, 2)},
      {kt_shp(3, 2, 3, 4), kt_shp(3, 2, 3, 4)},
  };
  shape_pair b[] = {
      {kt_shp(1, 1023), kt_shp(1, 1023)},
      {kt_shp(1, 100003), kt_shp(0)},
      {kt_shp(0), kt_shp(1, 1023)},
      {kt_shp(2, 333, 301), kt_shp(1, 301)},
      {kt_shp(2, 301, 333), kt_shp(2, 301, 1)},
      {kt_shp(3, 7, 1, 999), kt_shp(2, 5, 1)},
  };
  memcpy(small_pairs, s, sizeof(s));
  memcpy(big_pairs, b, sizeof(b));
  *n = small ? sizeof(s) / sizeof(*s) : sizeof(b) / sizeof(*b);
  return small ? small_pairs : big_pairs;
}

static float *binary_operand(uint64_t *st, ttd_binary_op op, int is_b, int64_t n) {
  /* divisors stay away from 0, so quotients and their derivatives stay tame */
  return op == TTD_BIN_DIV && is_b ? kt_random_away_from_zero(st, n, 1.0, 2.0) : kt_random_floats(st, n, -2, 2);
}

static void check_binary_forward(int small) {
  uint64_t st = 2;
  size_t np;
  const shape_pair *pairs = binary_shapes(small, &np);
  for (int op = TTD_BIN_ADD; op <= TTD_BIN_DIV; op++) {
    for (size_t p = 0; p < np; p++) {
      bin_ctx c = {.op = (ttd_binary_op)op, .as = pairs[p].a, .bs = pairs[p].b};
      ck_assert_int_eq(ttd_broadcast_shape(&c.as, &c.bs, &c.os), 0);
      int64_t na = kt_count(&c.as), nb = kt_count(&c.bs), no = kt_count(&c.os);
      float *a = binary_operand(&st, c.op, 0, na), *b = binary_operand(&st, c.op, 1, nb), *y = kt_fbuf(no);
      double *in[2] = {kt_to_double(a, na), kt_to_double(b, nb)}, *want = kt_dbuf(no);
      ref_binary(&c, in, want);
      ttd_k_binary(kt_pool, c.op, a, &c.as, b, &c.bs, y, &c.os);
      kt_expect_close(op == 0 ? "add" : op == 1 ? "sub" : op == 2 ? "mul" : "div", y, want, no, 1e-6, 1e-30);
    }
  }
}

/* Every op on broadcast shapes ([3,1,5] with [4,1], scalars, 0-d, rows, columns) matches a double reference. */
START_TEST(test_binary_forward) { check_binary_forward(1); }
END_TEST

/* The same on big inputs split across threads (flat, scalar, row and column broadcasts). */
START_TEST(test_binary_forward_large) { check_binary_forward(0); }
END_TEST

/* da and db (summed over broadcast dims) match central differences of sum(dy * (a op b)). */
START_TEST(test_binary_backward) {
  uint64_t st = 3;
  size_t np;
  const shape_pair *pairs = binary_shapes(1, &np);
  for (int op = TTD_BIN_ADD; op <= TTD_BIN_DIV; op++) {
    for (size_t p = 0; p < np; p++) {
      bin_ctx c = {.op = (ttd_binary_op)op, .as = pairs[p].a, .bs = pairs[p].b};
      ck_assert_int_eq(ttd_broadcast_shape(&c.as, &c.bs, &c.os), 0);
      int64_t na = kt_count(&c.as), nb = kt_count(&c.bs), no = kt_count(&c.os);
      float *a = binary_operand(&st, c.op, 0, na), *b = binary_operand(&st, c.op, 1, nb);
      float *dy = kt_random_floats(&st, no, -1, 1), *da = kt_fbuf(na), *db = kt_fbuf(nb);
      double *in[2] = {kt_to_double(a, na), kt_to_double(b, nb)}, *ddy = kt_to_double(dy, no);
      ttd_k_binary_backward(kt_pool, c.op, a, &c.as, b, &c.bs, dy, &c.os, da, db);
      kt_expect_close("da", da, kt_fd_grad(ref_binary, &c, in, 0, na, ddy, no), na, KT_GRAD_RTOL, KT_GRAD_ATOL);
      kt_expect_close("db", db, kt_fd_grad(ref_binary, &c, in, 1, nb, ddy, no), nb, KT_GRAD_RTOL, KT_GRAD_ATOL);
    }
  }
}
END_TEST

/* Big broadcast backwards (threaded reductions) match a double sum of the analytic gradient. */
START_TEST(test_binary_backward_large) {
  uint64_t st = 4;
  size_t np;
  const shape_pair *pairs = binary_shapes(0, &np);
  for (int op = TTD_BIN_ADD; op <= TTD_BIN_DIV; op++) {
    for (size_t p = 0; p < np; p++) {
      bin_ctx c = {.op = (ttd_binary_op)op, .as = pairs[p].a, .bs = pairs[p].b};
      ck_assert_int_eq(ttd_broadcast_shape(&c.as, &c.bs, &c.os), 0);
      int64_t na = kt_count(&c.as), nb = kt_count(&c.bs), no = kt_count(&c.os);
      float *a = binary_operand(&st, c.op, 0, na), *b = binary_operand(&st, c.op, 1, nb);
      float *dy = kt_random_floats(&st, no, -1, 1), *da = kt_fbuf(na), *db = kt_fbuf(nb);
      double *wa = kt_dbuf(na), *wb = kt_dbuf(nb), *sa = kt_dbuf(na), *sb = kt_dbuf(nb);
      memset(wa, 0, (size_t)na * sizeof(double)), memset(sa, 0, (size_t)na * sizeof(double));
      memset(wb, 0, (size_t)nb * sizeof(double)), memset(sb, 0, (size_t)nb * sizeof(double));
      int64_t idx[TTD_MAX_DIMS];
      for (int64_t o = 0; o < no; o++) {
        kt_unravel(&c.os, o, idx);
        int64_t ia = kt_bcast_offset(&c.as, c.os.ndim, idx), ib = kt_bcast_offset(&c.bs, c.os.ndim, idx);
        double av = a[ia], bv = b[ib], g = dy[o], ga, gb;
        switch (c.op) {
          case TTD_BIN_ADD: ga = g, gb = g; break;
          case TTD_BIN_SUB: ga = g, gb = -g; break;
          case TTD_BIN_MUL: ga = g * bv, gb = g * av; break;
          default: ga = g / bv, gb = -g * av / (bv * bv); break;
        }
        wa[ia] += ga, sa[ia] += fabs(ga);
        wb[ib] += gb, sb[ib] += fabs(gb);
      }
      ttd_k_binary_backward(kt_pool, c.op, a, &c.as, b, &c.bs, dy, &c.os, da, db);
      for (int64_t i = 0; i < na; i++)
        if (!(fabs(da[i] - wa[i]) <= 4e-6 * sa[i] + 1e-6))
          ck_abort_msg("op %d pair %zu da[%lld]: %g vs %g", op, p, (long long)i, (double)da[i], wa[i]);
      for (int64_t i = 0; i < nb; i++)
        if (!(fabs(db[i] - wb[i]) <= 4e-6 * sb[i] + 1e-6))
          ck_abort_msg("op %d pair %zu db[%lld]: %g vs %g", op, p, (long long)i, (double)db[i], wb[i]);
    }
  }
}
END_TEST

/* Asking for only da or only db gives the same values as asking for both. */
START_TEST(test_binary_backward_one_side) {
  uint64_t st = 5;
  ttd_kshape as = kt_shp(3, 3, 1, 5), bs = kt_shp(2, 4, 1), os = kt_shp(3, 3, 4, 5);
  float *a = kt_random_floats(&st, 15, -2, 2), *b = kt_random_away_from_zero(&st, 4, 1, 2),
        *dy = kt_random_floats(&st, 60, -1, 1);
  float da[15], db[4], da1[15], db1[4];
  for (int op = TTD_BIN_ADD; op <= TTD_BIN_DIV; op++) {
    ttd_k_binary_backward(kt_pool, (ttd_binary_op)op, a, &as, b, &bs, dy, &os, da, db);
    ttd_k_binary_backward(kt_pool, (ttd_binary_op)op, a, &as, b, &bs, dy, &os, da1, NULL);
    ttd_k_binary_backward(kt_pool, (ttd_binary_op)op, a, &as, b, &bs, dy, &os, NULL, db1);
    ck_assert_int_eq(memcmp(da, da1, sizeof(da)), 0);
    ck_assert_int_eq(memcmp(db, db1, sizeof(db)), 0);
  }
}
END_TEST

/* ======================================================================================
 * unary elementwise
 * ====================================================================================== */

static const char *unary_name(ttd_unary_op op) {
  static const char *names[] = {"relu", "gelu", "sigmoid", "tanh", "exp", "log"};
  return names[op];
}

static double ref_unary_op(ttd_unary_op op, double x) {
  switch (op) {
    case TTD_UN_RELU: return x > 0 ? x : 0;
    case TTD_UN_GELU: return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    case TTD_UN_SIGMOID: return 1.0 / (1.0 + exp(-x));
    case TTD_UN_TANH: return tanh(x);
    case TTD_UN_EXP: return exp(x);
    case TTD_UN_LOG: return log(x);
  }
  return NAN;
}

typedef struct un_ctx {
  ttd_unary_op op;
  int64_t n;
} un_ctx;

static void ref_unary(const void *ctx, double *const *in, double *out) {
  const un_ctx *c = ctx;
  for (int64_t i = 0; i < c->n; i++) out[i] = ref_unary_op(c->op, in[0][i]);
}

/* Inputs inside each op's domain, away from relu's kink. */
static float *unary_input(uint64_t *st, ttd_unary_op op, int64_t n) {
  switch (op) {
    case TTD_UN_RELU: return kt_random_away_from_zero(st, n, 0.05, 3);
    case TTD_UN_GELU: return kt_random_floats(st, n, -5, 5);
    case TTD_UN_SIGMOID: return kt_random_floats(st, n, -8, 8);
    case TTD_UN_TANH: return kt_random_floats(st, n, -3, 3);
    case TTD_UN_EXP: return kt_random_floats(st, n, -4, 4);
    case TTD_UN_LOG: return kt_random_floats(st, n, 0.25, 4);
  }
  return NULL;
}

/* Every unary op (gelu in its exact erf form) matches the double reference for sizes 1 to 100003. */
START_TEST(test_unary_forward) {
  static const int64_t sizes[] = {1, 7, 33, 1023, 100003};
  uint64_t st = 6;
  for (int op = TTD_UN_RELU; op <= TTD_UN_LOG; op++) {
    for (size_t s = 0; s < sizeof(sizes) / sizeof(*sizes); s++) {
      un_ctx c = {(ttd_unary_op)op, sizes[s]};
      float *x = unary_input(&st, c.op, c.n), *y = kt_fbuf(c.n);
      double *in[1] = {kt_to_double(x, c.n)}, *want = kt_dbuf(c.n);
      ref_unary(&c, in, want);
      ttd_k_unary(kt_pool, c.op, x, y, c.n);
      kt_expect_close(unary_name(c.op), y, want, c.n, 4e-6, 1e-7);
    }
  }
}
END_TEST

/* Every unary backward matches central differences, with y given and with y == NULL. */
START_TEST(test_unary_backward) {
  uint64_t st = 7;
  for (int op = TTD_UN_RELU; op <= TTD_UN_LOG; op++) {
    un_ctx c = {(ttd_unary_op)op, 65};
    float *x = unary_input(&st, c.op, c.n), *y = kt_fbuf(c.n), *dy = kt_random_floats(&st, c.n, -1, 1);
    float *dx = kt_fbuf(c.n), *dx2 = kt_fbuf(c.n);
    double *in[1] = {kt_to_double(x, c.n)};
    ttd_k_unary(kt_pool, c.op, x, y, c.n);
    ttd_k_unary_backward(kt_pool, c.op, x, y, dy, dx, c.n);
    kt_expect_close(unary_name(c.op), dx, kt_fd_grad(ref_unary, &c, in, 0, c.n, kt_to_double(dy, c.n), c.n), c.n,
                    KT_GRAD_RTOL, KT_GRAD_ATOL);
    ttd_k_unary_backward(kt_pool, c.op, x, NULL, dy, dx2, c.n);
    double *dxd = kt_to_double(dx, c.n);
    kt_expect_close(unary_name(c.op), dx2, dxd, c.n, 1e-6, 1e-7);
  }
}
END_TEST

/* exp is within 2 ulp over its whole range (subnormals too), overflows to Inf, underflows to 0, keeps NaN. */
START_TEST(test_unary_exp_range) {
  const int64_t n = 1 << 20;
  float *x = kt_fbuf(n), *y = kt_fbuf(n);
  for (int64_t i = 0; i < n; i++) x[i] = (float)(-110.0 + 200.0 * (double)i / (double)n);
  ttd_k_unary(kt_pool, TTD_UN_EXP, x, y, n);
  for (int64_t i = 0; i < n; i++) {
    double want = exp((double)x[i]);
    if (want > 3.4028234663852886e38) {
      if (!isinf(y[i])) ck_abort_msg("exp(%.9g) = %.9g, want inf", (double)x[i], (double)y[i]);
      continue;
    }
    int e;
    frexp(want, &e);
    double ulp = ldexp(1.0, (e - 24 < -149 ? -149 : e - 24));
    if (!(fabs((double)y[i] - want) <= 2.0 * ulp))
      ck_abort_msg("exp(%.9g) = %.9g, want %.9g (%.2f ulp)", (double)x[i], (double)y[i], want,
                   fabs((double)y[i] - want) / ulp);
  }
  /* 26 values: the first 16 take the 16-wide path, the last 10 the scalar tail */
  const float edge[10] = {-1000.0f, -200.0f, -104.5f, 0.0f, -0.0f, 89.0f, 1000.0f, INFINITY, -INFINITY, NAN};
  float in[26], out[26];
  for (int i = 0; i < 26; i++) in[i] = edge[i % 10];
  ttd_k_unary(NULL, TTD_UN_EXP, in, out, 26);
  for (int i = 0; i < 26; i++) {
    int k = i % 10;
    int ok = k <= 2 || k == 8 ? out[i] == 0.0f
             : k <= 4         ? out[i] == 1.0f
             : k <= 7         ? isinf(out[i]) && out[i] > 0
                              : isnan(out[i]);
    if (!ok) ck_abort_msg("exp(%g) = %g at %d", (double)in[i], (double)out[i], i);
  }
}
END_TEST

/* relu's gradient is 0 at x == 0 (and for negatives), dy for positives. */
START_TEST(test_relu_backward_at_zero) {
  float x[4] = {0.0f, -0.0f, -1.0f, 2.0f}, y[4], dy[4] = {5, 6, 7, 8}, dx[4];
  ttd_k_unary(NULL, TTD_UN_RELU, x, y, 4);
  ck_assert(y[0] == 0.0f && y[1] == 0.0f && y[2] == 0.0f && y[3] == 2.0f);
  ttd_k_unary_backward(NULL, TTD_UN_RELU, x, y, dy, dx, 4);
  ck_assert(dx[0] == 0.0f && dx[1] == 0.0f && dx[2] == 0.0f && dx[3] == 8.0f);
}
END_TEST

/* relu's gradient as torch's threshold_backward(dy, relu(x), 0) gives it: dy where relu(x) is
 * not <= 0, so at a NaN input (relu(NaN) = NaN) dy passes through, also a NaN dy; 0 at 0, -0
 * and -inf, even for a NaN dy. The same from y alone (x NULL) and over every vector path. */
START_TEST(test_relu_backward_at_nan) {
  enum { N = 40000 };
  const float in[8] = {NAN, -NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 3.0f, -2.0f};
  const float want_dx[8] = {5.0f, 6.0f, 7.0f, 0.0f, 0.0f, 0.0f, NAN, 0.0f}; /* torch, for dy below */
  float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float)), *dy = malloc(N * sizeof(float));
  float *dx = malloc(N * sizeof(float));
  ck_assert(x && y && dy && dx);
  for (int i = 0; i < N; i++) {
    x[i] = in[i % 8];
    dy[i] = i % 8 == 6 || i % 8 == 7 ? NAN : (float)(5 + i % 8);
  }
  ttd_k_unary(kt_pool, TTD_UN_RELU, x, y, N);
  for (int from_y = 0; from_y < 2; from_y++) {
    ttd_k_unary_backward(kt_pool, TTD_UN_RELU, from_y ? NULL : x, y, dy, dx, N);
    for (int i = 0; i < N; i++) {
      float want = want_dx[i % 8];
      int ok = isnan(want) ? isnan(dx[i]) : dx[i] == want && !signbit(dx[i]);
      if (!ok) ck_abort_msg("relu backward at x = %g, dy = %g gave %g, want %g (from %s)", (double)x[i], (double)dy[i],
                            (double)dx[i], (double)want, from_y ? "y" : "x");
    }
  }
  ck_assert(isnan(y[0]) && isnan(y[1]));
  free(x), free(y), free(dy), free(dx);
}
END_TEST

Suite *kernels_elementwise_suite(void) {
  Suite *s = suite_create("kernels_elementwise");
  TCase *tc = tcase_create("elementwise");
  tcase_add_checked_fixture(tc, kt_setup, kt_teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_binary_forward);
  tcase_add_test(tc, test_binary_forward_large);
  tcase_add_test(tc, test_binary_backward);
  tcase_add_test(tc, test_binary_backward_large);
  tcase_add_test(tc, test_binary_backward_one_side);
  tcase_add_test(tc, test_unary_forward);
  tcase_add_test(tc, test_unary_backward);
  tcase_add_test(tc, test_unary_exp_range);
  tcase_add_test(tc, test_relu_backward_at_zero);
  tcase_add_test(tc, test_relu_backward_at_nan);
  suite_add_tcase(s, tc);
  return s;
}
