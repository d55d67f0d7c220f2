/* kernels/embedding.c: the gather by index, bad indices, and the scatter-add backward
 * (the pool must not change it). */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "kernel_testing.h"
#include "suites.h"

/* Rows are gathered by index, repeats included. */
START_TEST(test_embedding_forward) {
  const int64_t vocab = 11, dim = 7, n = 9;
  uint64_t rng = 17;
  float *table = kt_rand_buf(&rng, vocab * dim, -1, 1), *y = kt_nan_buf(n * dim);
  int32_t idx[9] = {3, 0, 10, 3, 7, 7, 1, 10, 5};
  int64_t bad = 123;
  ck_assert_int_eq(ttd_k_embedding(NULL, table, idx, n, vocab, dim, y, &bad), 0);
  for (int64_t i = 0; i < n; i++)
    for (int64_t d = 0; d < dim; d++)
      KT_CHECK_EACH(y[i * dim + d] == table[idx[i] * dim + d], "y[%lld][%lld] is not table row %d", (long long)i,
                 (long long)d, idx[i]);
  free(table), free(y);
}
END_TEST

/* An index of -1 or vocab returns -1 with the position of the first bad one. */
START_TEST(test_embedding_bad_index) {
  const int64_t vocab = 5, dim = 3;
  float table[15] = {0}, y[18];
  int32_t idx1[6] = {0, 4, 2, 5, -1, 1}, idx2[6] = {1, -1, 2, 3, 9, 0};
  int64_t bad = 123;
  ck_assert_int_eq(ttd_k_embedding(NULL, table, idx1, 6, vocab, dim, y, &bad), -1);
  ck_assert_int_eq(bad, 3);
  ck_assert_int_eq(ttd_k_embedding(NULL, table, idx2, 6, vocab, dim, y, &bad), -1);
  ck_assert_int_eq(bad, 1);
  ck_assert_int_eq(ttd_k_embedding(NULL, table, idx2, 1, vocab, dim, y, &bad), 0);
}
END_TEST

/* dtable is the scatter-add of dy (repeats summed, zero elsewhere), identical with 4 threads. */
START_TEST(test_embedding_backward) {
  const int64_t vocab = 11, dim = 150, n = 9;
  uint64_t rng = 18;
  int32_t idx[9] = {3, 0, 10, 3, 7, 7, 1, 3, 5};
  float *dy = kt_rand_buf(&rng, n * dim, -1, 1), *dt = kt_nan_buf(vocab * dim), *dt4 = kt_nan_buf(vocab * dim);
  double *want = kt_dzeros(vocab * dim);
  for (int64_t i = 0; i < n; i++)
    for (int64_t d = 0; d < dim; d++) want[idx[i] * dim + d] += dy[i * dim + d];
  ttd_k_embedding_backward(NULL, idx, dy, n, vocab, dim, dt);
  kt_expect_close("dtable", dt, want, vocab * dim, 1e-6, 1e-6);
  ttd_pool *pool = ttd_pool_create(4);
  ck_assert_ptr_nonnull(pool);
  ttd_k_embedding_backward(pool, idx, dy, n, vocab, dim, dt4);
  ck_assert(memcmp(dt, dt4, (size_t)(vocab * dim) * sizeof(float)) == 0);
  ttd_pool_destroy(pool);
  free(dy), free(dt), free(dt4), free(want);
}
END_TEST

/* Indices rewritten by another thread during the call, between a good index and one far
 * past the table (as a racing Upload would): every call either gathers the good row
 * everywhere or refuses with a position in range, and never reads outside the table. */
START_TEST(test_embedding_indices_changing_under_the_kernel) {
  enum { N = 4096, VOCAB = 8, DIM = 4, CALLS = 3000 };
  float table[VOCAB * DIM], *y = malloc(sizeof(float) * N * DIM);
  int32_t *idx = malloc(sizeof(int32_t) * N);
  for (int i = 0; i < VOCAB * DIM; i++) table[i] = (float)i;
  for (int i = 0; i < N; i++) idx[i] = 1;
  ttd_pool *pool = ttd_pool_create(2);
  kt_flipper *f = kt_flipper_start(idx, N, 1, 0x3fffffff);
  int ok = 0, refused = 0;
  for (int call = 0; call < CALLS; call++) {
    int64_t bad = -2;
    if (ttd_k_embedding(pool, table, idx, N, VOCAB, DIM, y, &bad) == 0) {
      ok++;
      for (int i = 0; i < N * DIM; i++) ck_assert_float_eq(y[i], table[DIM + i % DIM]);
    } else {
      refused++;
      ck_assert(bad >= 0 && bad < N);
    }
  }
  kt_flipper_stop(f);
  ck_assert_int_eq(ok + refused, CALLS);
  ck_assert_int_gt(refused, 0);
  ttd_pool_destroy(pool);
  free(y), free(idx);
}
END_TEST

Suite *kernels_embedding_suite(void) {
  Suite *s = suite_create("kernels_embedding");
  TCase *tc = tcase_create("embedding");
  tcase_add_test(tc, test_embedding_forward);
  tcase_add_test(tc, test_embedding_bad_index);
  tcase_add_test(tc, test_embedding_backward);
  tcase_add_test(tc, test_embedding_indices_changing_under_the_kernel);
  tcase_set_timeout(tc, 60);
  suite_add_tcase(s, tc);
  return s;
}
