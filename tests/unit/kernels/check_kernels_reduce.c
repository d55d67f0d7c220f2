/* kernels/reduce.c: sum and mean over any axis subset, and permute. Forwards are checked
 * against double-precision references written here; backwards against central differences
 * of those references. */

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"
#include "kernel_testing.h"
#include "suites.h"

typedef struct red_ctx {
  ttd_reduce_op op;
  ttd_kshape xs, ys;
  uint32_t mask;
} red_ctx;

static red_ctx make_red(ttd_reduce_op op, ttd_kshape xs, uint32_t mask) {
  red_ctx c = {op, xs, xs, mask};
  for (int i = 0; i < xs.ndim; i++)
    if ((mask >> i) & 1u) c.ys.d[i] = 1;
  return c;
}

static void ref_reduce(const void *ctx, double *const *in, double *out) {
  const red_ctx *c = ctx;
  int64_t ny = kt_count(&c->ys), nx = kt_count(&c->xs), idx[TTD_MAX_DIMS];
  for (int64_t i = 0; i < ny; i++) out[i] = 0.0;
  for (int64_t i = 0; i < nx; i++) {
    kt_unravel(&c->xs, i, idx);
    out[kt_bcast_offset(&c->ys, c->xs.ndim, idx)] += in[0][i];
  }
  if (c->op == TTD_RED_MEAN)
    for (int64_t i = 0; i < ny; i++) out[i] /= (double)(nx / ny);
}

/* Checks a reduction against the reference with an error bound scaled by sum |x|. */
static void check_reduce(red_ctx *c, const float *x) {
  int64_t nx = kt_count(&c->xs), ny = kt_count(&c->ys);
  float *y = kt_fbuf(ny);
  double *in[1] = {kt_to_double(x, nx)}, *want = kt_dbuf(ny), *mag = kt_dbuf(ny);
  ref_reduce(c, in, want);
  for (int64_t i = 0; i < nx; i++) in[0][i] = fabs(in[0][i]);
  ref_reduce(c, in, mag);
  ttd_k_reduce(kt_pool, c->op, x, &c->xs, c->mask, y);
  for (int64_t i = 0; i < ny; i++)
    if (!(fabs(y[i] - want[i]) <= 4e-6 * mag[i] + 1e-7))
      ck_abort_msg("%s ndim %d mask %#x y[%lld]: %.9g vs %.9g", c->op == TTD_RED_SUM ? "sum" : "mean", c->xs.ndim,
                   c->mask, (long long)i, (double)y[i], want[i]);
}

/* Sum and mean over every axis subset of small shapes (size-1 dims, 0-d, odd sizes) match the reference. */
START_TEST(test_reduce_forward) {
  ttd_kshape shapes[] = {kt_shp(0),          kt_shp(1, 1),          kt_shp(1, 1023),       kt_shp(2, 7, 33),
                         kt_shp(3, 3, 1, 5), kt_shp(4, 2, 3, 4, 5), kt_shp(4, 5, 1, 1, 7), kt_shp(5, 2, 1, 3, 1, 2)};
  uint64_t st = 8;
  for (size_t s = 0; s < sizeof(shapes) / sizeof(*shapes); s++) {
    float *x = kt_random_floats(&st, kt_count(&shapes[s]), -3, 3);
    for (uint32_t mask = 0; mask < (1u << shapes[s].ndim) || mask < 2; mask++) {
      for (int op = TTD_RED_SUM; op <= TTD_RED_MEAN; op++) {
        red_ctx c = make_red((ttd_reduce_op)op, shapes[s], mask);
        check_reduce(&c, x);
      }
    }
  }
}
END_TEST

/* Big reductions (all, long rows, long columns, middle axes) cut into blocks match the reference. */
START_TEST(test_reduce_forward_large) {
  struct {
    ttd_kshape s;
    uint32_t mask;
  } cases[] = {
      {kt_shp(1, 1000003), 1},    {kt_shp(2, 3, 200001), 2}, {kt_shp(2, 200001, 3), 1},   {kt_shp(3, 7, 5000, 9), 2},
      {kt_shp(3, 7, 5000, 9), 5}, {kt_shp(2, 300, 1000), 3}, {kt_shp(3, 40, 3, 5000), 5}, {kt_shp(2, 2000, 700), 1},
  };
  uint64_t st = 9;
  for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
    float *x = kt_random_floats(&st, kt_count(&cases[i].s), -1, 3);
    for (int op = TTD_RED_SUM; op <= TTD_RED_MEAN; op++) {
      red_ctx c = make_red((ttd_reduce_op)op, cases[i].s, cases[i].mask);
      check_reduce(&c, x);
    }
  }
}
END_TEST

/* Reducing an empty dim gives 0 for a sum and NaN for a mean (as torch). */
START_TEST(test_reduce_empty) {
  ttd_kshape xs = kt_shp(2, 0, 3);
  float y[3] = {7, 7, 7};
  ttd_k_reduce(kt_pool, TTD_RED_SUM, NULL, &xs, 1, y);
  ck_assert(y[0] == 0.0f && y[1] == 0.0f && y[2] == 0.0f);
  ttd_k_reduce(kt_pool, TTD_RED_MEAN, NULL, &xs, 1, y);
  ck_assert(isnan(y[0]) && isnan(y[1]) && isnan(y[2]));
}
END_TEST

/* The reduce backward matches central differences for every axis subset, sum and mean. */
START_TEST(test_reduce_backward) {
  ttd_kshape shapes[] = {kt_shp(0), kt_shp(1, 7), kt_shp(2, 5, 3), kt_shp(3, 3, 1, 5), kt_shp(4, 2, 3, 1, 4)};
  uint64_t st = 10;
  for (size_t s = 0; s < sizeof(shapes) / sizeof(*shapes); s++) {
    int64_t nx = kt_count(&shapes[s]);
    float *x = kt_random_floats(&st, nx, -3, 3), *dx = kt_fbuf(nx);
    double *in[1] = {kt_to_double(x, nx)};
    for (uint32_t mask = 0; mask < (1u << shapes[s].ndim); mask++) {
      for (int op = TTD_RED_SUM; op <= TTD_RED_MEAN; op++) {
        red_ctx c = make_red((ttd_reduce_op)op, shapes[s], mask);
        int64_t ny = kt_count(&c.ys);
        float *dy = kt_random_floats(&st, ny, -1, 1);
        ttd_k_reduce_backward(kt_pool, c.op, dy, &c.xs, mask, dx);
        kt_expect_close("reduce dx", dx, kt_fd_grad(ref_reduce, &c, in, 0, nx, kt_to_double(dy, ny), ny), nx,
                        KT_GRAD_RTOL, KT_GRAD_ATOL);
      }
    }
  }
}
END_TEST

/* Next permutation in lexicographic order; 0 after the last. */
static int next_perm(int *p, int n) {
  int i = n - 2;
  while (i >= 0 && p[i] >= p[i + 1]) i--;
  if (i < 0) return 0;
  int j = n - 1;
  while (p[j] <= p[i]) j--;
  int t = p[i];
  p[i] = p[j], p[j] = t;
  for (int a = i + 1, b = n - 1; a < b; a++, b--) t = p[a], p[a] = p[b], p[b] = t;
  return 1;
}

static ttd_kshape permuted(const ttd_kshape *xs, const int *perm) {
  ttd_kshape ys = *xs;
  for (int i = 0; i < xs->ndim; i++) ys.d[i] = xs->d[perm[i]];
  return ys;
}

/* y = x permuted, by index arithmetic: y[idx] = x[idx'] with idx'[perm[i]] = idx[i]. */
static void ref_permute(const float *x, const ttd_kshape *xs, const int *perm, float *y) {
  ttd_kshape ys = permuted(xs, perm);
  int64_t idx[TTD_MAX_DIMS], xi[TTD_MAX_DIMS];
  for (int64_t o = 0; o < kt_count(&ys); o++) {
    kt_unravel(&ys, o, idx);
    for (int i = 0; i < xs->ndim; i++) xi[perm[i]] = idx[i];
    int64_t off = 0;
    for (int i = 0; i < xs->ndim; i++) off = off * xs->d[i] + xi[i];
    y[o] = x[off];
  }
}

/* Every permutation of small shapes and big (batched, tiled) transposes match the reference exactly. */
START_TEST(test_permute_forward) {
  ttd_kshape shapes[] = {kt_shp(0),           kt_shp(1, 7),          kt_shp(2, 7, 33),
                         kt_shp(3, 3, 1, 5),  kt_shp(4, 2, 3, 4, 5), kt_shp(4, 1, 3, 1, 5),
                         kt_shp(2, 333, 517), kt_shp(3, 5, 67, 129), kt_shp(4, 3, 40, 2, 70)};
  uint64_t st = 11;
  for (size_t s = 0; s < sizeof(shapes) / sizeof(*shapes); s++) {
    int64_t n = kt_count(&shapes[s]);
    float *x = kt_random_floats(&st, n, -1, 1), *y = kt_fbuf(n), *want = kt_fbuf(n);
    int perm[TTD_MAX_DIMS];
    for (int i = 0; i < shapes[s].ndim; i++) perm[i] = i;
    do {
      ref_permute(x, &shapes[s], perm, want);
      ttd_k_permute(kt_pool, x, &shapes[s], perm, y);
      ck_assert_msg(memcmp(y, want, (size_t)n * sizeof(float)) == 0, "shape %zu: a permutation differs", s);
    } while (next_perm(perm, shapes[s].ndim));
  }
}
END_TEST

/* The backward of a permute (the inverse permutation) gives back the input exactly. */
START_TEST(test_permute_inverse_roundtrip) {
  ttd_kshape xs = kt_shp(4, 3, 4, 5, 6);
  uint64_t st = 12;
  float *x = kt_random_floats(&st, 360, -1, 1), *y = kt_fbuf(360), *back = kt_fbuf(360);
  int perm[4] = {0, 1, 2, 3};
  do {
    int inv[4];
    for (int i = 0; i < 4; i++) inv[perm[i]] = i;
    ttd_kshape ys = permuted(&xs, perm);
    ttd_k_permute(kt_pool, x, &xs, perm, y);
    ttd_k_permute(kt_pool, y, &ys, inv, back);
    ck_assert_int_eq(memcmp(x, back, 360 * sizeof(float)), 0);
  } while (next_perm(perm, 4));
}
END_TEST

/* A perm that is not a permutation (repeat, out of range) writes nothing. */
START_TEST(test_permute_rejects_bad_perm) {
  ttd_kshape xs = kt_shp(3, 2, 3, 4);
  float x[24] = {0}, y[24];
  int repeat[3] = {0, 0, 1}, out_of_range[3] = {0, 1, 3}, negative[3] = {-1, 1, 2};
  for (int i = 0; i < 24; i++) y[i] = 42.0f;
  ttd_k_permute(kt_pool, x, &xs, repeat, y);
  ttd_k_permute(kt_pool, x, &xs, out_of_range, y);
  ttd_k_permute(kt_pool, x, &xs, negative, y);
  for (int i = 0; i < 24; i++) ck_assert(y[i] == 42.0f);
}
END_TEST

Suite *kernels_reduce_suite(void) {
  Suite *s = suite_create("kernels_reduce");
  TCase *tc = tcase_create("reduce_permute");
  tcase_add_checked_fixture(tc, kt_setup, kt_teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_reduce_forward);
  tcase_add_test(tc, test_reduce_forward_large);
  tcase_add_test(tc, test_reduce_empty);
  tcase_add_test(tc, test_reduce_backward);
  tcase_add_test(tc, test_permute_forward);
  tcase_add_test(tc, test_permute_inverse_roundtrip);
  tcase_add_test(tc, test_permute_rejects_bad_perm);
  suite_add_tcase(s, tc);
  return s;
}
