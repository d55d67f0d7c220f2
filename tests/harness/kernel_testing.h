/* Helpers shared by the kernel suites (check_thread_pool.c, check_kernels_*.c): a fixture
 * with a 4-thread pool and tracked allocations, deterministic random data, shapes and
 * broadcast indexing, tolerance checks, and central differences of double references
 * (kt_fd_grad) or of the float forward under test (kt_check_grad). */
#ifndef TTD_TESTS_KERNEL_TESTING_H
#define TTD_TESTS_KERNEL_TESTING_H

#include <check.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

/* A check inside a per-element loop: Check reports every passing ck_assert through a pipe,
 * which millions of elements make slow, so only a failing one reaches Check. */
#define KT_CHECK_EACH(cond, ...)            \
  do {                                      \
    if (!(cond)) ck_abort_msg(__VA_ARGS__); \
  } while (0)

/* ---- fixture: a 4-thread pool and tracked allocations (freed in teardown, so leak
 * checking stays quiet) ---- */

extern ttd_pool *kt_pool;

void kt_setup(void);
void kt_teardown(void);

/* malloc that teardown frees; never NULL (0 bytes gives a 1-byte block). */
void *kt_alloc(size_t bytes);
float *kt_fbuf(int64_t n);
double *kt_dbuf(int64_t n);

/* ---- random data ---- */

/* splitmix64: a deterministic stream for the randomised tests. */
uint64_t kt_next_random(uint64_t *state);
/* Tracked floats uniform in [lo, hi), drawn in double. */
float *kt_random_floats(uint64_t *st, int64_t n, double lo, double hi);
/* |x| in [lo, hi] with a random sign: away from kinks and poles at 0. */
float *kt_random_away_from_zero(uint64_t *st, int64_t n, double lo, double hi);
/* A tracked double copy of x. */
double *kt_to_double(const float *x, int64_t n);

/* Untracked (the caller frees): floats uniform in [lo, hi), drawn in float. */
float *kt_rand_buf(uint64_t *state, int64_t n, float lo, float hi);
/* Untracked: a buffer full of NaN, so that anything a kernel forgets to write shows. */
float *kt_nan_buf(int64_t n);
/* Untracked: n zeroed doubles. */
double *kt_dzeros(int64_t n);

/* ---- shapes ---- */

ttd_kshape kt_shp(int ndim, ...);
int64_t kt_count(const ttd_kshape *s);
void kt_unravel(const ttd_kshape *s, int64_t flat, int64_t *idx);
/* Flat offset in s (aligned right against the output's ndim, broadcast where s has 1). */
int64_t kt_bcast_offset(const ttd_kshape *s, int out_ndim, const int64_t *idx);

/* ---- comparison ---- */

/* Every got[i] within atol + rtol * |want[i]| of want[i]. */
void kt_expect_close(const char *what, const float *got, const double *want, int64_t n, double rtol, double atol);

/* Tolerance for a float dot product of length k of values in [-1, 1]. */
double kt_dot_tol(int64_t k);

/* ---- central differences of a double reference ---- */

/* A double-precision reference: out = f(in[0], in[1], ...), its sizes fixed by ctx. */
typedef void (*kt_ref_fn)(const void *ctx, double *const *in, double *out);

#define KT_GRAD_RTOL 1e-4
#define KT_GRAD_ATOL 1e-4

/* d/d in[which][i] of sum(dy * f(in)) by central differences, for every i < nin (tracked). */
double *kt_fd_grad(kt_ref_fn f, const void *ctx, double **in, int which, int64_t nin, const double *dy, int64_t nout);

/* ---- matmul references ---- */

/* C = op(A) op(B) for one problem in double: A stored [m,k] (or [k,m] when ta), B [k,n] (or [n,k]). */
void kt_ref_matmul(const float *a, const float *b, double *c, int64_t m, int64_t n, int64_t k, int ta, int tb);

/* n random bfloat16 in [-1, 1] (untracked, free()), and their float32 widening in *out_f. */
uint16_t *kt_bf16_rand_buf(uint64_t *rng, int64_t n, float **out_f);

/* C of an m x n x k product (float32, or bfloat16 operands) on the caller alone and on a pool
 * of `threads`, all four transpose combinations: the same bits, and written. */
void kt_check_matmul_pool_identical(int threads, int64_t m, int64_t n, int64_t k, uint64_t rng, bool bf16);

/* ---- central differences through the float forward ---- */

/* Runs the float forward under test, writing y. */
typedef void (*kt_forward_fn)(void *ctx, float *y);

/* The analytic gradient grad[np] of sum(dy * f) with respect to param[np] (an input that
 * f reads) against central differences with step h; param is restored. */
void kt_check_grad(const char *what, void *ctx, kt_forward_fn f, int64_t ny, const float *dy, float *param, int64_t np,
                   const float *grad, float h);

/* ---- hostile client memory ----
 * A thread that rewrites n int32 values without pause, each between good and bad, as an
 * Upload from a racing client would while a kernel reads them; stop it with kt_flipper_stop. */
typedef struct kt_flipper kt_flipper;
kt_flipper *kt_flipper_start(int32_t *values, int64_t n, int32_t good, int32_t bad);
void kt_flipper_stop(kt_flipper *f);

#endif
