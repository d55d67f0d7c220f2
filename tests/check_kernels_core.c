/* kernels: the thread pool, shapes and broadcasting, elementwise ops, reductions, permute,
 * softmax, losses and optimizers. Forwards are checked against naive double-precision
 * references written here; backwards against central differences of those references;
 * optimizers against torch's documented update rules, run in double. */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../kernels/kernels.h"
#include "suites.h"

/* ---- fixture: a 4-thread pool and tracked allocations (freed in teardown, so leak
 * checking stays quiet) ---- */

static ttd_pool *g_pool;
static void **g_allocs;
static size_t g_nallocs, g_cap;

static void *tmalloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) ck_abort_msg("out of memory");
  if (g_nallocs == g_cap) {
    size_t cap = g_cap ? 2 * g_cap : 64;
    void **list = realloc(g_allocs, cap * sizeof(*list));
    ck_assert_ptr_nonnull(list);
    g_allocs = list;
    g_cap = cap;
  }
  g_allocs[g_nallocs++] = p;
  return p;
}

static float *fbuf(int64_t n) { return tmalloc((size_t)n * sizeof(float)); }
static double *dbuf(int64_t n) { return tmalloc((size_t)n * sizeof(double)); }

static void setup(void) {
  g_pool = ttd_pool_create(4);
  ck_assert_ptr_nonnull(g_pool);
}

static void teardown(void) {
  ttd_pool_destroy(g_pool);
  g_pool = NULL;
  for (size_t i = 0; i < g_nallocs; i++) free(g_allocs[i]);
  free(g_allocs);
  g_allocs = NULL;
  g_nallocs = g_cap = 0;
}

/* ---- random data ---- */

/* splitmix64: a deterministic stream for the randomised tests. */
static uint64_t next_random(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static double uniform(uint64_t *st, double lo, double hi) {
  return lo + (hi - lo) * (double)(next_random(st) >> 11) * 0x1.0p-53;
}

static float *random_floats(uint64_t *st, int64_t n, double lo, double hi) {
  float *x = fbuf(n);
  for (int64_t i = 0; i < n; i++) x[i] = (float)uniform(st, lo, hi);
  return x;
}

/* |x| in [lo, hi] with a random sign: away from kinks and poles at 0. */
static float *random_away_from_zero(uint64_t *st, int64_t n, double lo, double hi) {
  float *x = random_floats(st, n, lo, hi);
  for (int64_t i = 0; i < n; i++)
    if (next_random(st) & 1) x[i] = -x[i];
  return x;
}

static double *to_double(const float *x, int64_t n) {
  double *d = dbuf(n);
  for (int64_t i = 0; i < n; i++) d[i] = (double)x[i];
  return d;
}

/* ---- shapes ---- */

static ttd_kshape shp(int ndim, ...) {
  ttd_kshape s;
  memset(&s, 0, sizeof(s));
  s.ndim = ndim;
  va_list ap;
  va_start(ap, ndim);
  for (int i = 0; i < ndim; i++) s.d[i] = va_arg(ap, int);
  va_end(ap);
  return s;
}

static int64_t count(const ttd_kshape *s) {
  int64_t n = 1;
  for (int i = 0; i < s->ndim; i++) n *= s->d[i];
  return n;
}

static void unravel(const ttd_kshape *s, int64_t flat, int64_t *idx) {
  for (int i = s->ndim - 1; i >= 0; i--) {
    idx[i] = flat % s->d[i];
    flat /= s->d[i];
  }
}

/* Flat offset in s (aligned right against the output's ndim, broadcast where s has 1). */
static int64_t bcast_offset(const ttd_kshape *s, int out_ndim, const int64_t *idx) {
  int64_t off = 0;
  for (int j = 0; j < s->ndim; j++) {
    int64_t v = s->d[j] == 1 ? 0 : idx[j + out_ndim - s->ndim];
    off = off * s->d[j] + v;
  }
  return off;
}

/* ---- comparison ---- */

static void expect_close(const char *what, const float *got, const double *want, int64_t n, double rtol, double atol) {
  for (int64_t i = 0; i < n; i++) {
    double err = fabs((double)got[i] - want[i]);
    if (!(err <= atol + rtol * fabs(want[i]))) /* assert only on failure: each check costs a write */
      ck_abort_msg("%s[%lld]: got %.9g, want %.9g (err %.3g)", what, (long long)i, (double)got[i], want[i], err);
  }
}

/* ---- central differences ---- */

/* A double-precision reference: out = f(in[0], in[1], ...), its sizes fixed by ctx. */
typedef void (*ref_fn)(const void *ctx, double *const *in, double *out);

#define FD_STEP 1e-4

static double dot(const double *a, const double *b, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
  return s;
}

/* d/d in[which][i] of sum(dy * f(in)) by central differences, for every i < nin. */
static double *fd_grad(ref_fn f, const void *ctx, double **in, int which, int64_t nin, const double *dy, int64_t nout) {
  double *out = dbuf(nout), *g = dbuf(nin);
  for (int64_t i = 0; i < nin; i++) {
    double v = in[which][i], h = FD_STEP * fmax(1.0, fabs(v));
    double up = v + h, down = v - h;
    in[which][i] = up;
    f(ctx, in, out);
    double lp = dot(dy, out, nout);
    in[which][i] = down;
    f(ctx, in, out);
    double lm = dot(dy, out, nout);
    in[which][i] = v;
    g[i] = (lp - lm) / (up - down);
  }
  return g;
}

#define GRAD_RTOL 1e-4
#define GRAD_ATOL 1e-4

/* ======================================================================================
 * thread pool
 * ====================================================================================== */

typedef struct cover_ctx {
  atomic_int *hits;
  atomic_size_t min_chunk;
  atomic_int calls;
} cover_ctx;

static void cover_fn(void *ctx, size_t begin, size_t end) {
  cover_ctx *c = ctx;
  atomic_fetch_add(&c->calls, 1);
  size_t len = end - begin, cur = atomic_load(&c->min_chunk);
  while (len < cur && !atomic_compare_exchange_weak(&c->min_chunk, &cur, len)) {
  }
  for (size_t i = begin; i < end; i++) atomic_fetch_add(&c->hits[i], 1);
}

/* parallel_for covers every index exactly once in chunks >= min(grain, n), for many threads/n/grain. */
START_TEST(test_pool_covers_each_index_once) {
  static const int threads[] = {1, 2, 3, 4, 7};
  static const size_t sizes[] = {0, 1, 2, 7, 33, 100, 1023, 4096, 12345};
  static const size_t grains[] = {0, 1, 3, 64, 1000, 100000};
  atomic_int *hits = tmalloc(12345 * sizeof(atomic_int));
  for (size_t t = 0; t < sizeof(threads) / sizeof(*threads); t++) {
    ttd_pool *pool = ttd_pool_create(threads[t]);
    ck_assert_ptr_nonnull(pool);
    ck_assert_int_eq(ttd_pool_threads(pool), threads[t]);
    for (size_t si = 0; si < sizeof(sizes) / sizeof(*sizes); si++) {
      for (size_t gi = 0; gi < sizeof(grains) / sizeof(*grains); gi++) {
        size_t n = sizes[si], grain = grains[gi];
        for (size_t i = 0; i < n; i++) atomic_init(&hits[i], 0);
        cover_ctx c = {.hits = hits};
        atomic_init(&c.min_chunk, SIZE_MAX);
        atomic_init(&c.calls, 0);
        ttd_pool_parallel_for(pool, n, grain, cover_fn, &c);
        for (size_t i = 0; i < n; i++)
          if (atomic_load(&hits[i]) != 1)
            ck_abort_msg("threads %d n %zu grain %zu: index %zu hit %d times", threads[t], n, grain, i,
                         atomic_load(&hits[i]));
        if (n == 0) {
          ck_assert_int_eq(atomic_load(&c.calls), 0);
        } else {
          size_t want = grain == 0 ? 1 : (grain < n ? grain : n);
          ck_assert_msg(atomic_load(&c.min_chunk) >= want, "threads %d n %zu grain %zu: a chunk of %zu", threads[t], n,
                        grain, atomic_load(&c.min_chunk));
        }
      }
    }
    ttd_pool_destroy(pool);
  }
}
END_TEST

typedef struct range_ctx {
  int calls;
  size_t begin, end;
} range_ctx;

static void record_range(void *ctx, size_t begin, size_t end) {
  range_ctx *r = ctx;
  r->calls++;
  r->begin = begin;
  r->end = end;
}

/* A NULL pool runs fn(ctx, 0, n) once on the caller, counts as 1 thread, and destroy accepts NULL. */
START_TEST(test_pool_null_runs_inline) {
  range_ctx r = {0};
  ttd_pool_parallel_for(NULL, 1000, 1, record_range, &r);
  ck_assert_int_eq(r.calls, 1);
  ck_assert_uint_eq(r.begin, 0);
  ck_assert_uint_eq(r.end, 1000);
  ck_assert_int_eq(ttd_pool_threads(NULL), 1);
  ttd_pool_destroy(NULL);
}
END_TEST

/* threads <= 0 gives one thread per online core; an explicit count is kept. */
START_TEST(test_pool_thread_count) {
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  ttd_pool *pool = ttd_pool_create(0);
  ck_assert_ptr_nonnull(pool);
  ck_assert_int_eq(ttd_pool_threads(pool), online > 0 ? (int)online : 1);
  ttd_pool_destroy(pool);
  pool = ttd_pool_create(-3);
  ck_assert_ptr_nonnull(pool);
  ck_assert_int_eq(ttd_pool_threads(pool), online > 0 ? (int)online : 1);
  ttd_pool_destroy(pool);
  pool = ttd_pool_create(5);
  ck_assert_int_eq(ttd_pool_threads(pool), 5);
  ttd_pool_destroy(pool);
}
END_TEST

typedef struct serial_shared {
  ttd_pool *pool;
  atomic_int inside[2]; /* chunks of caller k running now */
  atomic_int overlap;   /* a chunk of one caller ran while the other's job was live */
} serial_shared;

typedef struct serial_caller {
  serial_shared *sh;
  int id;
  uint64_t *out;
  int bad; /* a job whose output came back wrong */
} serial_caller;

static void serial_fn(void *ctx, size_t begin, size_t end) {
  serial_caller *c = ctx;
  atomic_fetch_add(&c->sh->inside[c->id], 1);
  for (size_t i = begin; i < end; i++) {
    uint64_t v = i;
    for (int k = 0; k < 20; k++) v = v * 31 + (uint64_t)k; /* some work, so jobs overlap in time */
    c->out[i] = v + (uint64_t)c->id;
  }
  if (atomic_load(&c->sh->inside[1 - c->id]) != 0) atomic_store(&c->sh->overlap, 1);
  atomic_fetch_sub(&c->sh->inside[c->id], 1);
}

#define SERIAL_N 20000

static void *serial_main(void *arg) {
  serial_caller *c = arg;
  for (int job = 0; job < 100; job++) {
    for (size_t i = 0; i < SERIAL_N; i++) c->out[i] = 0;
    ttd_pool_parallel_for(c->sh->pool, SERIAL_N, 100, serial_fn, c);
    for (size_t i = 0; i < SERIAL_N; i++) {
      uint64_t v = i;
      for (int k = 0; k < 20; k++) v = v * 31 + (uint64_t)k;
      if (c->out[i] != v + (uint64_t)c->id) c->bad = 1;
    }
  }
  return NULL;
}

/* Two threads sharing a pool: every job completes and no chunk of one runs during the other's job. */
START_TEST(test_pool_concurrent_callers_serialise) {
  serial_shared sh = {.pool = g_pool};
  atomic_init(&sh.inside[0], 0);
  atomic_init(&sh.inside[1], 0);
  atomic_init(&sh.overlap, 0);
  serial_caller c[2] = {{&sh, 0, tmalloc(SERIAL_N * sizeof(uint64_t)), 0},
                        {&sh, 1, tmalloc(SERIAL_N * sizeof(uint64_t)), 0}};
  pthread_t t[2];
  for (int i = 0; i < 2; i++) ck_assert_int_eq(pthread_create(&t[i], NULL, serial_main, &c[i]), 0);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  ck_assert_int_eq(c[0].bad, 0);
  ck_assert_int_eq(c[1].bad, 0);
  ck_assert_int_eq(atomic_load(&sh.overlap), 0);
}
END_TEST

typedef struct nested_ctx {
  ttd_pool *pool;
  atomic_int *hits;
} nested_ctx;

static void nested_inner(void *ctx, size_t begin, size_t end) {
  nested_ctx *c = ctx;
  for (size_t i = begin; i < end; i++) atomic_fetch_add(&c->hits[i], 1);
}

static void nested_outer(void *ctx, size_t begin, size_t end) {
  nested_ctx *c = ctx;
  for (size_t i = begin; i < end; i++) ttd_pool_parallel_for(c->pool, 64, 1, nested_inner, c);
}

/* A parallel_for made from inside a job runs inline instead of deadlocking. */
START_TEST(test_pool_nested_call_runs_inline) {
  atomic_int *hits = tmalloc(64 * sizeof(atomic_int));
  for (int i = 0; i < 64; i++) atomic_init(&hits[i], 0);
  nested_ctx c = {g_pool, hits};
  ttd_pool_parallel_for(g_pool, 16, 1, nested_outer, &c);
  for (int i = 0; i < 64; i++) ck_assert_int_eq(atomic_load(&hits[i]), 16);
}
END_TEST

/* Runs a batch of kernels on big inputs with `pool` and writes every result to out. */
static void run_kernel_batch(ttd_pool *pool, float *out, int64_t *len) {
  uint64_t st = 99;
  const int rows = 300, cols = 1000;
  const int64_t n = (int64_t)rows * cols;
  float *a = random_floats(&st, n, -2, 2), *b = random_floats(&st, cols, 0.5, 2);
  ttd_kshape as = shp(2, rows, cols), bs = shp(1, cols), scalar = shp(0);
  int32_t *labels = tmalloc((size_t)rows * sizeof(int32_t));
  for (int i = 0; i < rows; i++) labels[i] = (int32_t)(next_random(&st) % (uint64_t)cols);
  float *dy = random_floats(&st, n, -1, 1);
  int64_t o = 0, bad;
  ttd_k_binary(pool, TTD_BIN_DIV, a, &as, b, &bs, out + o, &as), o += n;
  ttd_k_binary(pool, TTD_BIN_MUL, a, &as, b, &scalar, out + o, &as), o += n;
  ttd_k_binary_backward(pool, TTD_BIN_DIV, a, &as, b, &bs, dy, &as, out + o, out + o + n), o += n + cols;
  ttd_k_unary(pool, TTD_UN_GELU, a, out + o, n), o += n;
  ttd_k_reduce(pool, TTD_RED_SUM, a, &as, 3, out + o), o += 1;
  ttd_k_reduce(pool, TTD_RED_MEAN, a, &as, 1, out + o), o += cols;
  ttd_k_reduce(pool, TTD_RED_SUM, a, &as, 2, out + o), o += rows;
  ttd_k_softmax(pool, a, rows, cols, out + o), o += n;
  ttd_k_log_softmax_backward(pool, a, dy, rows, cols, out + o), o += n;
  ck_assert_int_eq(ttd_k_cross_entropy(pool, a, labels, rows, cols, out + o, &bad), 0);
  o += 1;
  ttd_k_cross_entropy_backward(pool, a, labels, rows, cols, 0.7f, out + o), o += n;
  ttd_k_mse_loss(pool, a, dy, n, out + o), o += 1;
  ttd_k_l1_loss(pool, a, dy, n, out + o), o += 1;
  float *param = out + o;
  memcpy(param, a, (size_t)n * sizeof(float)), o += n;
  float *m = out + o, *v = out + o + n;
  memset(m, 0, 2 * (size_t)n * sizeof(float)), o += 2 * n;
  ttd_adam_params ap = {
      .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f, .decoupled = 1};
  for (int step = 1; step <= 3; step++) ttd_k_adam_step(pool, &ap, step, param, dy, m, v, n);
  int perm[2] = {1, 0};
  ttd_k_permute(pool, a, &as, perm, out + o), o += n;
  *len = o;
}

/* Every kernel gives bit-identical results with no pool, a 1-thread pool and a 4-thread pool. */
START_TEST(test_pool_same_results_any_thread_count) {
  const int64_t cap = 16 * 300 * 1000;
  float *r0 = fbuf(cap), *r1 = fbuf(cap), *r4 = fbuf(cap);
  ttd_pool *one = ttd_pool_create(1);
  ck_assert_ptr_nonnull(one);
  int64_t n0, n1, n4;
  run_kernel_batch(NULL, r0, &n0);
  run_kernel_batch(one, r1, &n1);
  run_kernel_batch(g_pool, r4, &n4);
  ttd_pool_destroy(one);
  ck_assert_int_le(n0, cap);
  ck_assert_int_eq(n0, n1);
  ck_assert_int_eq(n0, n4);
  ck_assert_int_eq(memcmp(r0, r1, (size_t)n0 * sizeof(float)), 0);
  ck_assert_int_eq(memcmp(r0, r4, (size_t)n0 * sizeof(float)), 0);
}
END_TEST

/* ======================================================================================
 * shapes
 * ====================================================================================== */

/* numel is the product of the dims, 1 for 0-d and 0 with a zero dim. */
START_TEST(test_numel) {
  ttd_kshape s = shp(0);
  ck_assert_int_eq(ttd_kshape_numel(&s), 1);
  s = shp(1, 7);
  ck_assert_int_eq(ttd_kshape_numel(&s), 7);
  s = shp(4, 2, 3, 4, 5);
  ck_assert_int_eq(ttd_kshape_numel(&s), 120);
  s = shp(3, 2, 0, 5);
  ck_assert_int_eq(ttd_kshape_numel(&s), 0);
  s = shp(8, 2, 2, 2, 2, 2, 2, 2, 3);
  ck_assert_int_eq(ttd_kshape_numel(&s), 384);
}
END_TEST

/* Broadcasting follows numpy; mismatches return -1 and clear the output; the output may alias an input. */
START_TEST(test_broadcast_shape) {
  struct {
    ttd_kshape a, b, want;
    int ok;
  } cases[] = {
      {shp(0), shp(0), shp(0), 1},
      {shp(1, 5), shp(0), shp(1, 5), 1},
      {shp(0), shp(2, 3, 4), shp(2, 3, 4), 1},
      {shp(3, 3, 1, 5), shp(2, 4, 1), shp(3, 3, 4, 5), 1},
      {shp(2, 4, 1), shp(3, 3, 1, 5), shp(3, 3, 4, 5), 1},
      {shp(2, 1, 3), shp(2, 2, 1), shp(2, 2, 3), 1},
      {shp(2, 2, 3), shp(1, 3), shp(2, 2, 3), 1},
      {shp(3, 2, 0, 3), shp(1, 3), shp(3, 2, 0, 3), 1},
      {shp(2, 3, 1), shp(1, 0), shp(2, 3, 0), 1},
      {shp(1, 3), shp(1, 4), shp(0), 0},
      {shp(2, 2, 3), shp(2, 3, 1), shp(0), 0},
      {shp(3, 2, 0, 3), shp(2, 2, 3), shp(0), 0},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
    ttd_kshape out = shp(3, 9, 9, 9);
    int rc = ttd_broadcast_shape(&cases[i].a, &cases[i].b, &out);
    ck_assert_msg(rc == (cases[i].ok ? 0 : -1), "case %zu: rc %d", i, rc);
    ck_assert_msg(memcmp(&out, &cases[i].want, sizeof(out)) == 0, "case %zu: wrong shape (ndim %d)", i, out.ndim);
  }
  ttd_kshape a = shp(2, 4, 1), b = shp(3, 3, 1, 5), want = shp(3, 3, 4, 5);
  ck_assert_int_eq(ttd_broadcast_shape(&a, &b, &a), 0);
  ck_assert_int_eq(memcmp(&a, &want, sizeof(a)), 0);
}
END_TEST

/* accumulate adds src into dst for odd and large sizes, and n = 0 touches nothing. */
START_TEST(test_accumulate) {
  static const int64_t sizes[] = {1, 7, 33, 1023, 100003};
  uint64_t st = 1;
  for (size_t s = 0; s < sizeof(sizes) / sizeof(*sizes); s++) {
    int64_t n = sizes[s];
    float *dst = random_floats(&st, n, -5, 5), *src = random_floats(&st, n, -5, 5);
    double *want = dbuf(n);
    for (int64_t i = 0; i < n; i++) want[i] = (double)(dst[i] + src[i]);
    ttd_k_accumulate(g_pool, dst, src, n);
    expect_close("accumulate", dst, want, n, 0, 0);
  }
  float one = 1.0f, two = 2.0f;
  ttd_k_accumulate(g_pool, &one, &two, 0);
  ck_assert(one == 1.0f);
}
END_TEST

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
  int64_t idx[TTD_KMAX_DIMS];
  for (int64_t o = 0; o < count(&c->os); o++) {
    unravel(&c->os, o, idx);
    out[o] =
        ref_bin_op(c->op, in[0][bcast_offset(&c->as, c->os.ndim, idx)], in[1][bcast_offset(&c->bs, c->os.ndim, idx)]);
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
      {shp(1, 1), shp(1, 1)},
      {shp(1, 7), shp(1, 7)},
      {shp(0), shp(0)},
      {shp(1, 5), shp(0)},
      {shp(0), shp(1, 5)},
      {shp(3, 3, 1, 5), shp(2, 4, 1)},
      {shp(2, 4, 1), shp(3, 3, 1, 5)},
      {shp(2, 2, 3), shp(1, 3)},
      {shp(2, 2, 3), shp(2, 2, 1)},
      {shp(2, 1, 3), shp(2, 2, 1)},
      {shp(1, 33), shp(1, 1)},
      {shp(1, 1), shp(1, 33)},
      {shp(4, 2, 1, 3, 1), shp(3, 3, 1, 2)},
      {shp(3, 2, 3, 4), shp(3, 2, 3, 4)},
  };
  shape_pair b[] = {
      {shp(1, 1023), shp(1, 1023)},    {shp(1, 100003), shp(0)},           {shp(0), shp(1, 1023)},
      {shp(2, 333, 301), shp(1, 301)}, {shp(2, 301, 333), shp(2, 301, 1)}, {shp(3, 7, 1, 999), shp(2, 5, 1)},
  };
  memcpy(small_pairs, s, sizeof(s));
  memcpy(big_pairs, b, sizeof(b));
  *n = small ? sizeof(s) / sizeof(*s) : sizeof(b) / sizeof(*b);
  return small ? small_pairs : big_pairs;
}

static float *binary_operand(uint64_t *st, ttd_binary_op op, int is_b, int64_t n) {
  /* divisors stay away from 0, so quotients and their derivatives stay tame */
  return op == TTD_BIN_DIV && is_b ? random_away_from_zero(st, n, 1.0, 2.0) : random_floats(st, n, -2, 2);
}

static void check_binary_forward(int small) {
  uint64_t st = 2;
  size_t np;
  const shape_pair *pairs = binary_shapes(small, &np);
  for (int op = TTD_BIN_ADD; op <= TTD_BIN_DIV; op++) {
    for (size_t p = 0; p < np; p++) {
      bin_ctx c = {.op = (ttd_binary_op)op, .as = pairs[p].a, .bs = pairs[p].b};
      ck_assert_int_eq(ttd_broadcast_shape(&c.as, &c.bs, &c.os), 0);
      int64_t na = count(&c.as), nb = count(&c.bs), no = count(&c.os);
      float *a = binary_operand(&st, c.op, 0, na), *b = binary_operand(&st, c.op, 1, nb), *y = fbuf(no);
      double *in[2] = {to_double(a, na), to_double(b, nb)}, *want = dbuf(no);
      ref_binary(&c, in, want);
      ttd_k_binary(g_pool, c.op, a, &c.as, b, &c.bs, y, &c.os);
      expect_close(op == 0 ? "add" : op == 1 ? "sub" : op == 2 ? "mul" : "div", y, want, no, 1e-6, 1e-30);
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
      int64_t na = count(&c.as), nb = count(&c.bs), no = count(&c.os);
      float *a = binary_operand(&st, c.op, 0, na), *b = binary_operand(&st, c.op, 1, nb);
      float *dy = random_floats(&st, no, -1, 1), *da = fbuf(na), *db = fbuf(nb);
      double *in[2] = {to_double(a, na), to_double(b, nb)}, *ddy = to_double(dy, no);
      ttd_k_binary_backward(g_pool, c.op, a, &c.as, b, &c.bs, dy, &c.os, da, db);
      expect_close("da", da, fd_grad(ref_binary, &c, in, 0, na, ddy, no), na, GRAD_RTOL, GRAD_ATOL);
      expect_close("db", db, fd_grad(ref_binary, &c, in, 1, nb, ddy, no), nb, GRAD_RTOL, GRAD_ATOL);
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
      int64_t na = count(&c.as), nb = count(&c.bs), no = count(&c.os);
      float *a = binary_operand(&st, c.op, 0, na), *b = binary_operand(&st, c.op, 1, nb);
      float *dy = random_floats(&st, no, -1, 1), *da = fbuf(na), *db = fbuf(nb);
      double *wa = dbuf(na), *wb = dbuf(nb), *sa = dbuf(na), *sb = dbuf(nb);
      memset(wa, 0, (size_t)na * sizeof(double)), memset(sa, 0, (size_t)na * sizeof(double));
      memset(wb, 0, (size_t)nb * sizeof(double)), memset(sb, 0, (size_t)nb * sizeof(double));
      int64_t idx[TTD_KMAX_DIMS];
      for (int64_t o = 0; o < no; o++) {
        unravel(&c.os, o, idx);
        int64_t ia = bcast_offset(&c.as, c.os.ndim, idx), ib = bcast_offset(&c.bs, c.os.ndim, idx);
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
      ttd_k_binary_backward(g_pool, c.op, a, &c.as, b, &c.bs, dy, &c.os, da, db);
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
  ttd_kshape as = shp(3, 3, 1, 5), bs = shp(2, 4, 1), os = shp(3, 3, 4, 5);
  float *a = random_floats(&st, 15, -2, 2), *b = random_away_from_zero(&st, 4, 1, 2),
        *dy = random_floats(&st, 60, -1, 1);
  float da[15], db[4], da1[15], db1[4];
  for (int op = TTD_BIN_ADD; op <= TTD_BIN_DIV; op++) {
    ttd_k_binary_backward(g_pool, (ttd_binary_op)op, a, &as, b, &bs, dy, &os, da, db);
    ttd_k_binary_backward(g_pool, (ttd_binary_op)op, a, &as, b, &bs, dy, &os, da1, NULL);
    ttd_k_binary_backward(g_pool, (ttd_binary_op)op, a, &as, b, &bs, dy, &os, NULL, db1);
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
    case TTD_UN_RELU: return random_away_from_zero(st, n, 0.05, 3);
    case TTD_UN_GELU: return random_floats(st, n, -5, 5);
    case TTD_UN_SIGMOID: return random_floats(st, n, -8, 8);
    case TTD_UN_TANH: return random_floats(st, n, -3, 3);
    case TTD_UN_EXP: return random_floats(st, n, -4, 4);
    case TTD_UN_LOG: return random_floats(st, n, 0.25, 4);
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
      float *x = unary_input(&st, c.op, c.n), *y = fbuf(c.n);
      double *in[1] = {to_double(x, c.n)}, *want = dbuf(c.n);
      ref_unary(&c, in, want);
      ttd_k_unary(g_pool, c.op, x, y, c.n);
      expect_close(unary_name(c.op), y, want, c.n, 4e-6, 1e-7);
    }
  }
}
END_TEST

/* Every unary backward matches central differences, with y given and with y == NULL. */
START_TEST(test_unary_backward) {
  uint64_t st = 7;
  for (int op = TTD_UN_RELU; op <= TTD_UN_LOG; op++) {
    un_ctx c = {(ttd_unary_op)op, 65};
    float *x = unary_input(&st, c.op, c.n), *y = fbuf(c.n), *dy = random_floats(&st, c.n, -1, 1);
    float *dx = fbuf(c.n), *dx2 = fbuf(c.n);
    double *in[1] = {to_double(x, c.n)};
    ttd_k_unary(g_pool, c.op, x, y, c.n);
    ttd_k_unary_backward(g_pool, c.op, x, y, dy, dx, c.n);
    expect_close(unary_name(c.op), dx, fd_grad(ref_unary, &c, in, 0, c.n, to_double(dy, c.n), c.n), c.n, GRAD_RTOL,
                 GRAD_ATOL);
    ttd_k_unary_backward(g_pool, c.op, x, NULL, dy, dx2, c.n);
    double *dxd = to_double(dx, c.n);
    expect_close(unary_name(c.op), dx2, dxd, c.n, 1e-6, 1e-7);
  }
}
END_TEST

/* exp is within 2 ulp over its whole range (subnormals too), overflows to Inf, underflows to 0, keeps NaN. */
START_TEST(test_unary_exp_range) {
  const int64_t n = 1 << 20;
  float *x = fbuf(n), *y = fbuf(n);
  for (int64_t i = 0; i < n; i++) x[i] = (float)(-110.0 + 200.0 * (double)i / (double)n);
  ttd_k_unary(g_pool, TTD_UN_EXP, x, y, n);
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

/* ======================================================================================
 * reductions and permute
 * ====================================================================================== */

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
  int64_t ny = count(&c->ys), nx = count(&c->xs), idx[TTD_KMAX_DIMS];
  for (int64_t i = 0; i < ny; i++) out[i] = 0.0;
  for (int64_t i = 0; i < nx; i++) {
    unravel(&c->xs, i, idx);
    out[bcast_offset(&c->ys, c->xs.ndim, idx)] += in[0][i];
  }
  if (c->op == TTD_RED_MEAN)
    for (int64_t i = 0; i < ny; i++) out[i] /= (double)(nx / ny);
}

/* Checks a reduction against the reference with an error bound scaled by sum |x|. */
static void check_reduce(red_ctx *c, const float *x) {
  int64_t nx = count(&c->xs), ny = count(&c->ys);
  float *y = fbuf(ny);
  double *in[1] = {to_double(x, nx)}, *want = dbuf(ny), *mag = dbuf(ny);
  ref_reduce(c, in, want);
  for (int64_t i = 0; i < nx; i++) in[0][i] = fabs(in[0][i]);
  ref_reduce(c, in, mag);
  ttd_k_reduce(g_pool, c->op, x, &c->xs, c->mask, y);
  for (int64_t i = 0; i < ny; i++)
    if (!(fabs(y[i] - want[i]) <= 4e-6 * mag[i] + 1e-7))
      ck_abort_msg("%s ndim %d mask %#x y[%lld]: %.9g vs %.9g", c->op == TTD_RED_SUM ? "sum" : "mean", c->xs.ndim,
                   c->mask, (long long)i, (double)y[i], want[i]);
}

/* Sum and mean over every axis subset of small shapes (size-1 dims, 0-d, odd sizes) match the reference. */
START_TEST(test_reduce_forward) {
  ttd_kshape shapes[] = {shp(0),          shp(1, 1),          shp(1, 1023),       shp(2, 7, 33),
                         shp(3, 3, 1, 5), shp(4, 2, 3, 4, 5), shp(4, 5, 1, 1, 7), shp(5, 2, 1, 3, 1, 2)};
  uint64_t st = 8;
  for (size_t s = 0; s < sizeof(shapes) / sizeof(*shapes); s++) {
    float *x = random_floats(&st, count(&shapes[s]), -3, 3);
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
      {shp(1, 1000003), 1},    {shp(2, 3, 200001), 2}, {shp(2, 200001, 3), 1},   {shp(3, 7, 5000, 9), 2},
      {shp(3, 7, 5000, 9), 5}, {shp(2, 300, 1000), 3}, {shp(3, 40, 3, 5000), 5}, {shp(2, 2000, 700), 1},
  };
  uint64_t st = 9;
  for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
    float *x = random_floats(&st, count(&cases[i].s), -1, 3);
    for (int op = TTD_RED_SUM; op <= TTD_RED_MEAN; op++) {
      red_ctx c = make_red((ttd_reduce_op)op, cases[i].s, cases[i].mask);
      check_reduce(&c, x);
    }
  }
}
END_TEST

/* Reducing an empty dim gives 0 for a sum and NaN for a mean (as torch). */
START_TEST(test_reduce_empty) {
  ttd_kshape xs = shp(2, 0, 3);
  float y[3] = {7, 7, 7};
  ttd_k_reduce(g_pool, TTD_RED_SUM, NULL, &xs, 1, y);
  ck_assert(y[0] == 0.0f && y[1] == 0.0f && y[2] == 0.0f);
  ttd_k_reduce(g_pool, TTD_RED_MEAN, NULL, &xs, 1, y);
  ck_assert(isnan(y[0]) && isnan(y[1]) && isnan(y[2]));
}
END_TEST

/* The reduce backward matches central differences for every axis subset, sum and mean. */
START_TEST(test_reduce_backward) {
  ttd_kshape shapes[] = {shp(0), shp(1, 7), shp(2, 5, 3), shp(3, 3, 1, 5), shp(4, 2, 3, 1, 4)};
  uint64_t st = 10;
  for (size_t s = 0; s < sizeof(shapes) / sizeof(*shapes); s++) {
    int64_t nx = count(&shapes[s]);
    float *x = random_floats(&st, nx, -3, 3), *dx = fbuf(nx);
    double *in[1] = {to_double(x, nx)};
    for (uint32_t mask = 0; mask < (1u << shapes[s].ndim); mask++) {
      for (int op = TTD_RED_SUM; op <= TTD_RED_MEAN; op++) {
        red_ctx c = make_red((ttd_reduce_op)op, shapes[s], mask);
        int64_t ny = count(&c.ys);
        float *dy = random_floats(&st, ny, -1, 1);
        ttd_k_reduce_backward(g_pool, c.op, dy, &c.xs, mask, dx);
        expect_close("reduce dx", dx, fd_grad(ref_reduce, &c, in, 0, nx, to_double(dy, ny), ny), nx, GRAD_RTOL,
                     GRAD_ATOL);
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
  int64_t idx[TTD_KMAX_DIMS], xi[TTD_KMAX_DIMS];
  for (int64_t o = 0; o < count(&ys); o++) {
    unravel(&ys, o, idx);
    for (int i = 0; i < xs->ndim; i++) xi[perm[i]] = idx[i];
    int64_t off = 0;
    for (int i = 0; i < xs->ndim; i++) off = off * xs->d[i] + xi[i];
    y[o] = x[off];
  }
}

/* Every permutation of small shapes and big (batched, tiled) transposes match the reference exactly. */
START_TEST(test_permute_forward) {
  ttd_kshape shapes[] = {shp(0),           shp(1, 7),          shp(2, 7, 33),
                         shp(3, 3, 1, 5),  shp(4, 2, 3, 4, 5), shp(4, 1, 3, 1, 5),
                         shp(2, 333, 517), shp(3, 5, 67, 129), shp(4, 3, 40, 2, 70)};
  uint64_t st = 11;
  for (size_t s = 0; s < sizeof(shapes) / sizeof(*shapes); s++) {
    int64_t n = count(&shapes[s]);
    float *x = random_floats(&st, n, -1, 1), *y = fbuf(n), *want = fbuf(n);
    int perm[TTD_KMAX_DIMS];
    for (int i = 0; i < shapes[s].ndim; i++) perm[i] = i;
    do {
      ref_permute(x, &shapes[s], perm, want);
      ttd_k_permute(g_pool, x, &shapes[s], perm, y);
      ck_assert_msg(memcmp(y, want, (size_t)n * sizeof(float)) == 0, "shape %zu: a permutation differs", s);
    } while (next_perm(perm, shapes[s].ndim));
  }
}
END_TEST

/* The backward of a permute (the inverse permutation) gives back the input exactly. */
START_TEST(test_permute_inverse_roundtrip) {
  ttd_kshape xs = shp(4, 3, 4, 5, 6);
  uint64_t st = 12;
  float *x = random_floats(&st, 360, -1, 1), *y = fbuf(360), *back = fbuf(360);
  int perm[4] = {0, 1, 2, 3};
  do {
    int inv[4];
    for (int i = 0; i < 4; i++) inv[perm[i]] = i;
    ttd_kshape ys = permuted(&xs, perm);
    ttd_k_permute(g_pool, x, &xs, perm, y);
    ttd_k_permute(g_pool, y, &ys, inv, back);
    ck_assert_int_eq(memcmp(x, back, 360 * sizeof(float)), 0);
  } while (next_perm(perm, 4));
}
END_TEST

/* A perm that is not a permutation (repeat, out of range) writes nothing. */
START_TEST(test_permute_rejects_bad_perm) {
  ttd_kshape xs = shp(3, 2, 3, 4);
  float x[24] = {0}, y[24];
  int repeat[3] = {0, 0, 1}, out_of_range[3] = {0, 1, 3}, negative[3] = {-1, 1, 2};
  for (int i = 0; i < 24; i++) y[i] = 42.0f;
  ttd_k_permute(g_pool, x, &xs, repeat, y);
  ttd_k_permute(g_pool, x, &xs, out_of_range, y);
  ttd_k_permute(g_pool, x, &xs, negative, y);
  for (int i = 0; i < 24; i++) ck_assert(y[i] == 42.0f);
}
END_TEST

/* ======================================================================================
 * softmax
 * ====================================================================================== */

typedef struct sm_ctx {
  int64_t rows, cols;
  int log;
} sm_ctx;

static void ref_softmax(const void *ctx, double *const *in, double *out) {
  const sm_ctx *c = ctx;
  for (int64_t r = 0; r < c->rows; r++) {
    const double *x = in[0] + r * c->cols;
    double *y = out + r * c->cols, m = x[0], s = 0.0;
    for (int64_t j = 1; j < c->cols; j++) m = fmax(m, x[j]);
    for (int64_t j = 0; j < c->cols; j++) s += exp(x[j] - m);
    for (int64_t j = 0; j < c->cols; j++) y[j] = c->log ? x[j] - m - log(s) : exp(x[j] - m) / s;
  }
}

/* softmax and log_softmax match the reference on odd sizes and for logits near +-1000. */
START_TEST(test_softmax_forward) {
  struct {
    int64_t rows, cols;
    double lo, hi;
  } cases[] = {{1, 1, -1, 1},     {3, 7, -3, 3},     {5, 33, -5, 5},     {2, 1023, -8, 8},
               {64, 1000, -4, 4}, {4, 9, 995, 1005}, {4, 9, -1005, -995}};
  uint64_t st = 13;
  for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
    for (int log_ = 0; log_ <= 1; log_++) {
      sm_ctx c = {cases[i].rows, cases[i].cols, log_};
      int64_t n = c.rows * c.cols;
      float *x = random_floats(&st, n, cases[i].lo, cases[i].hi), *y = fbuf(n);
      double *in[1] = {to_double(x, n)}, *want = dbuf(n);
      ref_softmax(&c, in, want);
      if (log_) ttd_k_log_softmax(g_pool, x, c.rows, c.cols, y);
      else ttd_k_softmax(g_pool, x, c.rows, c.cols, y);
      expect_close(log_ ? "log_softmax" : "softmax", y, want, n, 1e-5, log_ ? 2e-6 : 1e-9);
    }
  }
}
END_TEST

/* softmax and log_softmax backwards (from y and dy) match central differences. */
START_TEST(test_softmax_backward) {
  int64_t shapes[][2] = {{1, 1}, {1, 7}, {3, 5}, {2, 33}};
  uint64_t st = 14;
  for (size_t i = 0; i < sizeof(shapes) / sizeof(*shapes); i++) {
    for (int log_ = 0; log_ <= 1; log_++) {
      sm_ctx c = {shapes[i][0], shapes[i][1], log_};
      int64_t n = c.rows * c.cols;
      float *x = random_floats(&st, n, -3, 3), *y = fbuf(n), *dy = random_floats(&st, n, -1, 1), *dx = fbuf(n);
      double *in[1] = {to_double(x, n)};
      if (log_) {
        ttd_k_log_softmax(g_pool, x, c.rows, c.cols, y);
        ttd_k_log_softmax_backward(g_pool, y, dy, c.rows, c.cols, dx);
      } else {
        ttd_k_softmax(g_pool, x, c.rows, c.cols, y);
        ttd_k_softmax_backward(g_pool, y, dy, c.rows, c.cols, dx);
      }
      expect_close(log_ ? "log_softmax dx" : "softmax dx", dx, fd_grad(ref_softmax, &c, in, 0, n, to_double(dy, n), n),
                   n, GRAD_RTOL, GRAD_ATOL);
    }
  }
}
END_TEST

/* ======================================================================================
 * losses
 * ====================================================================================== */

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
  int32_t *l = tmalloc((size_t)n * sizeof(int32_t));
  for (int64_t i = 0; i < n; i++) l[i] = (int32_t)(next_random(st) % (uint64_t)c);
  return l;
}

/* cross_entropy (mean over samples) matches the reference for odd sizes and large logits. */
START_TEST(test_cross_entropy_forward) {
  int64_t shapes[][2] = {{1, 1}, {1, 7}, {7, 3}, {33, 10}, {1023, 5}, {500, 1000}};
  uint64_t st = 15;
  for (size_t i = 0; i < sizeof(shapes) / sizeof(*shapes); i++) {
    for (int big = 0; big <= 1; big++) {
      ce_ctx c = {shapes[i][0], shapes[i][1], random_labels(&st, shapes[i][0], shapes[i][1])};
      float *x = random_floats(&st, c.n * c.c, big ? 90 : -4, big ? 110 : 4);
      float loss = -1.0f;
      int64_t bad = 123;
      double *in[1] = {to_double(x, c.n * c.c)}, want;
      ref_cross_entropy(&c, in, &want);
      ck_assert_int_eq(ttd_k_cross_entropy(g_pool, x, c.labels, c.n, c.c, &loss, &bad), 0);
      expect_close("cross_entropy", &loss, &want, 1, 1e-5, 1e-6);
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
  ck_assert_int_eq(ttd_k_cross_entropy(g_pool, x, neg, 4, 3, &loss, &bad), -1);
  ck_assert_int_eq(bad, 2);
  ck_assert_int_eq(ttd_k_cross_entropy(g_pool, x, high, 4, 3, &loss, &bad), -1);
  ck_assert_int_eq(bad, 1);
  ck_assert_int_eq(ttd_k_cross_entropy(g_pool, x, two_bad, 4, 3, &loss, &bad), -1);
  ck_assert_int_eq(bad, 1);
  ck_assert(loss == 5.0f);
  ck_assert_int_eq(ttd_k_cross_entropy(g_pool, x, ok, 4, 3, &loss, &bad), 0);
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
    float *x = random_floats(&st, n, -3, 3), *dx = fbuf(n);
    double *in[1] = {to_double(x, n)}, dloss = -1.7;
    ttd_k_cross_entropy_backward(g_pool, x, c.labels, c.n, c.c, (float)dloss, dx);
    expect_close("cross_entropy dx", dx, fd_grad(ref_cross_entropy, &c, in, 0, n, &dloss, 1), n, GRAD_RTOL, GRAD_ATOL);
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
  float *b = random_away_from_zero(st, n, gap, 2);
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
      float *a = random_floats(&st, c.n, -3, 3), *b = random_floats(&st, c.n, -3, 3), loss;
      double *in[2] = {to_double(a, c.n), to_double(b, c.n)}, want;
      ref_pair_loss(&c, in, &want);
      if (l1) ttd_k_l1_loss(g_pool, a, b, c.n, &loss);
      else ttd_k_mse_loss(g_pool, a, b, c.n, &loss);
      expect_close(l1 ? "l1" : "mse", &loss, &want, 1, 4e-6, 0);
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
      float *a = random_floats(&st, c.n, -3, 3), *b = offset_from(&st, a, c.n, 0.05);
      float *da = fbuf(c.n), *db = fbuf(c.n), *only = fbuf(c.n);
      double *in[2] = {to_double(a, c.n), to_double(b, c.n)}, dloss = 0.6;
      void (*bw)(ttd_pool *, const float *, const float *, int64_t, float, float *, float *) =
          l1 ? ttd_k_l1_loss_backward : ttd_k_mse_loss_backward;
      bw(g_pool, a, b, c.n, (float)dloss, da, db);
      expect_close("da", da, fd_grad(ref_pair_loss, &c, in, 0, c.n, &dloss, 1), c.n, GRAD_RTOL, GRAD_ATOL);
      expect_close("db", db, fd_grad(ref_pair_loss, &c, in, 1, c.n, &dloss, 1), c.n, GRAD_RTOL, GRAD_ATOL);
      bw(g_pool, a, b, c.n, (float)dloss, only, NULL);
      ck_assert_int_eq(memcmp(only, da, (size_t)c.n * sizeof(float)), 0);
      bw(g_pool, a, b, c.n, (float)dloss, NULL, only);
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

/* ======================================================================================
 * optimizers
 * ====================================================================================== */

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
    float *param = random_floats(&st, OPT_N, -2, 2), *buf = fbuf(OPT_N);
    for (int i = 0; i < OPT_N; i++) buf[i] = cases[k].momentum != 0.0f ? 0.0f : 1234.5f;
    double *rp = to_double(param, OPT_N), *rbuf = dbuf(OPT_N);
    for (int step = 1; step <= OPT_STEPS; step++) {
      float *grad = random_floats(&st, OPT_N, -1, 1);
      ttd_k_sgd_step(g_pool, &cases[k], step, param, grad, buf, OPT_N);
      ref_sgd(&cases[k], step, rp, to_double(grad, OPT_N), rbuf, OPT_N);
      expect_close("sgd param", param, rp, OPT_N, 1e-5, 1e-6);
      if (cases[k].momentum != 0.0f) expect_close("sgd momentum", buf, rbuf, OPT_N, 1e-5, 1e-6);
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
    float *param = random_floats(&st, OPT_N, -2, 2), *m = fbuf(OPT_N), *v = fbuf(OPT_N);
    memset(m, 0, OPT_N * sizeof(float));
    memset(v, 0, OPT_N * sizeof(float));
    double *rp = to_double(param, OPT_N), *rm = dbuf(OPT_N), *rv = dbuf(OPT_N);
    memset(rm, 0, OPT_N * sizeof(double));
    memset(rv, 0, OPT_N * sizeof(double));
    for (int step = 1; step <= OPT_STEPS; step++) {
      float *grad = random_away_from_zero(&st, OPT_N, 0.05, 1);
      ttd_k_adam_step(g_pool, &cases[k], step, param, grad, m, v, OPT_N);
      ref_adam(&cases[k], step, rp, to_double(grad, OPT_N), rm, rv, OPT_N);
      expect_close("adam param", param, rp, OPT_N, 1e-5, 1e-6);
      expect_close("adam m", m, rm, OPT_N, 1e-5, 1e-7);
      expect_close("adam v", v, rv, OPT_N, 1e-5, 1e-9);
    }
  }
}
END_TEST

/* Bias correction makes the first Adam step move each parameter by about lr against its gradient. */
START_TEST(test_adam_first_step_is_lr) {
  ttd_adam_params p = {.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
  float param[3] = {1, 1, 1}, grad[3] = {0.5f, -3.0f, 1e-3f}, m[3] = {0}, v[3] = {0};
  ttd_k_adam_step(NULL, &p, 1, param, grad, m, v, 3);
  ck_assert_float_eq_tol(param[0], 0.99f, 1e-6f);
  ck_assert_float_eq_tol(param[1], 1.01f, 1e-6f);
  ck_assert_float_eq_tol(param[2], 0.99f, 1e-5f);
}
END_TEST

Suite *kernels_core_suite(void) {
  Suite *s = suite_create("kernels_core");
  TCase *tc = tcase_create("thread_pool");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_pool_covers_each_index_once);
  tcase_add_test(tc, test_pool_null_runs_inline);
  tcase_add_test(tc, test_pool_thread_count);
  tcase_add_test(tc, test_pool_concurrent_callers_serialise);
  tcase_add_test(tc, test_pool_nested_call_runs_inline);
  tcase_add_test(tc, test_pool_same_results_any_thread_count);
  suite_add_tcase(s, tc);

  tc = tcase_create("shape");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_numel);
  tcase_add_test(tc, test_broadcast_shape);
  tcase_add_test(tc, test_accumulate);
  suite_add_tcase(s, tc);

  tc = tcase_create("elementwise");
  tcase_add_checked_fixture(tc, setup, teardown);
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
  suite_add_tcase(s, tc);

  tc = tcase_create("reduce_permute");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_reduce_forward);
  tcase_add_test(tc, test_reduce_forward_large);
  tcase_add_test(tc, test_reduce_empty);
  tcase_add_test(tc, test_reduce_backward);
  tcase_add_test(tc, test_permute_forward);
  tcase_add_test(tc, test_permute_inverse_roundtrip);
  tcase_add_test(tc, test_permute_rejects_bad_perm);
  suite_add_tcase(s, tc);

  tc = tcase_create("softmax_loss");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_softmax_forward);
  tcase_add_test(tc, test_softmax_backward);
  tcase_add_test(tc, test_cross_entropy_forward);
  tcase_add_test(tc, test_cross_entropy_bad_label);
  tcase_add_test(tc, test_cross_entropy_backward);
  tcase_add_test(tc, test_mse_l1_forward);
  tcase_add_test(tc, test_mse_l1_backward);
  tcase_add_test(tc, test_l1_subgradient_at_equality);
  suite_add_tcase(s, tc);

  tc = tcase_create("optimizer");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_sgd_steps);
  tcase_add_test(tc, test_adam_steps);
  tcase_add_test(tc, test_adam_first_step_is_lr);
  suite_add_tcase(s, tc);
  return s;
}
