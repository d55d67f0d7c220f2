/* The kernel suites' shared helpers; see kernel_testing.h. */
#include "kernel_testing.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"

/* ---- fixture ---- */

ttd_pool *kt_pool;
static void **g_allocs;
static size_t g_nallocs, g_cap;

void *kt_alloc(size_t bytes) {
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

float *kt_fbuf(int64_t n) { return kt_alloc((size_t)n * sizeof(float)); }
double *kt_dbuf(int64_t n) { return kt_alloc((size_t)n * sizeof(double)); }

void kt_setup(void) {
  kt_pool = ttd_pool_create(4);
  ck_assert_ptr_nonnull(kt_pool);
}

void kt_teardown(void) {
  ttd_pool_destroy(kt_pool);
  kt_pool = NULL;
  for (size_t i = 0; i < g_nallocs; i++) free(g_allocs[i]);
  free(g_allocs);
  g_allocs = NULL;
  g_nallocs = g_cap = 0;
}

/* ---- random data ---- */

uint64_t kt_next_random(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static double uniform(uint64_t *st, double lo, double hi) {
  return lo + (hi - lo) * (double)(kt_next_random(st) >> 11) * 0x1.0p-53;
}

float *kt_random_floats(uint64_t *st, int64_t n, double lo, double hi) {
  float *x = kt_fbuf(n);
  for (int64_t i = 0; i < n; i++) x[i] = (float)uniform(st, lo, hi);
  return x;
}

float *kt_random_away_from_zero(uint64_t *st, int64_t n, double lo, double hi) {
  float *x = kt_random_floats(st, n, lo, hi);
  for (int64_t i = 0; i < n; i++)
    if (kt_next_random(st) & 1) x[i] = -x[i];
  return x;
}

double *kt_to_double(const float *x, int64_t n) {
  double *d = kt_dbuf(n);
  for (int64_t i = 0; i < n; i++) d[i] = (double)x[i];
  return d;
}

/* uniform in [lo, hi) */
static float rand_float(uint64_t *state, float lo, float hi) {
  return lo + (hi - lo) * (float)((double)(kt_next_random(state) >> 11) * 0x1.0p-53);
}

float *kt_rand_buf(uint64_t *state, int64_t n, float lo, float hi) {
  float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
  ck_assert_ptr_nonnull(x);
  for (int64_t i = 0; i < n; i++) x[i] = rand_float(state, lo, hi);
  return x;
}

float *kt_nan_buf(int64_t n) {
  float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
  ck_assert_ptr_nonnull(x);
  for (int64_t i = 0; i < n; i++) x[i] = NAN;
  return x;
}

double *kt_dzeros(int64_t n) {
  double *x = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
  ck_assert_ptr_nonnull(x);
  return x;
}

/* ---- shapes ---- */

ttd_kshape kt_shp(int ndim, ...) {
  ttd_kshape s;
  memset(&s, 0, sizeof(s));
  s.ndim = ndim;
  va_list ap;
  va_start(ap, ndim);
  for (int i = 0; i < ndim; i++) s.d[i] = va_arg(ap, int);
  va_end(ap);
  return s;
}

int64_t kt_count(const ttd_kshape *s) {
  int64_t n = 1;
  for (int i = 0; i < s->ndim; i++) n *= s->d[i];
  return n;
}

void kt_unravel(const ttd_kshape *s, int64_t flat, int64_t *idx) {
  for (int i = s->ndim - 1; i >= 0; i--) {
    idx[i] = flat % s->d[i];
    flat /= s->d[i];
  }
}

int64_t kt_bcast_offset(const ttd_kshape *s, int out_ndim, const int64_t *idx) {
  int64_t off = 0;
  for (int j = 0; j < s->ndim; j++) {
    int64_t v = s->d[j] == 1 ? 0 : idx[j + out_ndim - s->ndim];
    off = off * s->d[j] + v;
  }
  return off;
}

/* ---- comparison ---- */

void kt_expect_close(const char *what, const float *got, const double *want, int64_t n, double rtol, double atol) {
  for (int64_t i = 0; i < n; i++) {
    double err = fabs((double)got[i] - want[i]);
    KT_CHECK_EACH(err <= atol + rtol * fabs(want[i]), "%s[%lld]: got %.9g, want %.9g (err %.3g)", what, (long long)i,
                  (double)got[i], want[i], err);
  }
}

double kt_dot_tol(int64_t k) { return 1e-6 * (double)(k + 1); }

/* ---- central differences of a double reference ---- */

#define FD_STEP 1e-4

static double dot(const double *a, const double *b, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
  return s;
}

double *kt_fd_grad(kt_ref_fn f, const void *ctx, double **in, int which, int64_t nin, const double *dy, int64_t nout) {
  double *out = kt_dbuf(nout), *g = kt_dbuf(nin);
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

/* ---- central differences through the float forward ---- */

/* sum(dy * f(x)) in double. */
static double objective(void *ctx, kt_forward_fn f, float *y, const float *dy, int64_t ny) {
  f(ctx, y);
  double s = 0.0;
  for (int64_t i = 0; i < ny; i++) s += (double)dy[i] * (double)y[i];
  return s;
}

void kt_check_grad(const char *what, void *ctx, kt_forward_fn f, int64_t ny, const float *dy, float *param, int64_t np,
                   const float *grad, float h) {
  float *y = kt_nan_buf(ny);
  for (int64_t i = 0; i < np; i++) {
    float orig = param[i], up = orig + h, down = orig - h;
    param[i] = up;
    double fp = objective(ctx, f, y, dy, ny);
    param[i] = down;
    double fm = objective(ctx, f, y, dy, ny);
    param[i] = orig;
    double fd = (fp - fm) / ((double)up - (double)down);
    KT_CHECK_EACH(fabs(fd - grad[i]) <= 1e-3 + 1e-2 * fabs(fd), "%s[%lld]: analytic %.7g, finite difference %.7g", what,
                  (long long)i, (double)grad[i], fd);
  }
  free(y);
}

struct kt_flipper {
  pthread_t thread;
  volatile int32_t *values;
  int64_t n;
  int32_t good, bad;
  atomic_int stop;
};

static void *flip(void *arg) {
  kt_flipper *f = arg;
  for (uint64_t round = 0; !atomic_load_explicit(&f->stop, memory_order_relaxed); round++) {
    int32_t v = (round & 1) ? f->bad : f->good;
    for (int64_t i = 0; i < f->n; i++) f->values[i] = v;
  }
  return NULL;
}

kt_flipper *kt_flipper_start(int32_t *values, int64_t n, int32_t good, int32_t bad) {
  kt_flipper *f = malloc(sizeof(*f));
  ck_assert_ptr_nonnull(f);
  f->values = values;
  f->n = n;
  f->good = good;
  f->bad = bad;
  atomic_init(&f->stop, 0);
  ck_assert_int_eq(pthread_create(&f->thread, NULL, flip, f), 0);
  return f;
}

void kt_flipper_stop(kt_flipper *f) {
  atomic_store(&f->stop, 1);
  pthread_join(f->thread, NULL);
  free(f);
}

/* ---- matmul references ---- */

void kt_ref_matmul(const float *a, const float *b, double *c, int64_t m, int64_t n, int64_t k, int ta, int tb) {
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double s = 0.0;
      for (int64_t p = 0; p < k; p++) {
        double av = ta ? a[p * m + i] : a[i * k + p];
        double bv = tb ? b[j * k + p] : b[p * n + j];
        s += av * bv;
      }
      c[i * n + j] = s;
    }
}

uint16_t *kt_bf16_rand_buf(uint64_t *rng, int64_t n, float **out_f) {
  float *f = kt_rand_buf(rng, n, -1, 1);
  uint16_t *h = malloc((size_t)(n ? n : 1) * sizeof(uint16_t));
  ck_assert_ptr_nonnull(h);
  for (int64_t i = 0; i < n; i++) {
    h[i] = ttd_bf16_from_f32(f[i]);
    f[i] = ttd_f32_from_bf16(h[i]);
  }
  *out_f = f;
  return h;
}

void kt_check_matmul_pool_identical(int threads, int64_t m, int64_t n, int64_t k, uint64_t rng, bool bf16) {
  ttd_pool *pool = ttd_pool_create(threads);
  ck_assert_ptr_nonnull(pool);
  for (int t = 0; t < 4; t++) {
    int ta = t & 1, tb = t >> 1;
    float *c1 = kt_nan_buf(m * n), *c2 = kt_nan_buf(m * n), *af = NULL, *bf = NULL;
    void *a, *b;
    if (bf16) {
      a = kt_bf16_rand_buf(&rng, m * k, &af), b = kt_bf16_rand_buf(&rng, k * n, &bf);
      ttd_k_matmul_bf16(NULL, a, b, NULL, c1, 1, m, n, k, ta, tb, 0, 0);
      ttd_k_matmul_bf16(pool, a, b, NULL, c2, 1, m, n, k, ta, tb, 0, 0);
    } else {
      a = kt_rand_buf(&rng, m * k, -1, 1), b = kt_rand_buf(&rng, k * n, -1, 1);
      ttd_k_matmul(NULL, a, b, c1, 1, m, n, k, ta, tb, 0, 0);
      ttd_k_matmul(pool, a, b, c2, 1, m, n, k, ta, tb, 0, 0);
    }
    ck_assert(memcmp(c1, c2, (size_t)(m * n) * sizeof(float)) == 0);
    for (int64_t i = 0; i < m * n; i += 997) ck_assert(!isnan(c2[i]));
    ck_assert(!isnan(c2[m * n - 1]));
    free(a), free(b), free(af), free(bf), free(c1), free(c2);
  }
  ttd_pool_destroy(pool);
}
