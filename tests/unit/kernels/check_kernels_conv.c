/* kernels/conv.c: conv2d and its parameters. Forwards are checked against direct
 * double-precision references on random inputs, backwards against central finite
 * differences of sum(dy * f(x)) taken through the float forward itself, and the pool must
 * not change any result. */

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels.h"
#include "thread_pool.h"
#include "kernel_testing.h"
#include "suites.h"

static void ref_conv(const ttd_conv2d_params *p, const float *x, const float *w, const float *bias, double *y) {
  for (int64_t g = 0; g < p->n; g++)
    for (int64_t co = 0; co < p->c_out; co++)
      for (int64_t oi = 0; oi < p->out_h; oi++)
        for (int64_t oj = 0; oj < p->out_w; oj++) {
          double s = bias ? bias[co] : 0.0;
          for (int64_t c = 0; c < p->c_in; c++)
            for (int64_t ki = 0; ki < p->kh; ki++)
              for (int64_t kj = 0; kj < p->kw; kj++) {
                int64_t ii = oi * p->stride_h - p->pad_h + ki, jj = oj * p->stride_w - p->pad_w + kj;
                if (ii < 0 || ii >= p->h || jj < 0 || jj >= p->w) continue;
                s += (double)x[((g * p->c_in + c) * p->h + ii) * p->w + jj] *
                     w[((co * p->c_in + c) * p->kh + ki) * p->kw + kj];
              }
          y[((g * p->c_out + co) * p->out_h + oi) * p->out_w + oj] = s;
        }
}

static ttd_conv2d_params conv_params(int64_t n, int64_t c_in, int64_t h, int64_t w, int64_t c_out, int64_t kh,
                                     int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
  ttd_conv2d_params p = {.n = n,
                         .c_in = c_in,
                         .h = h,
                         .w = w,
                         .c_out = c_out,
                         .kh = kh,
                         .kw = kw,
                         .stride_h = sh,
                         .stride_w = sw,
                         .pad_h = ph,
                         .pad_w = pw};
  ck_assert_int_eq(ttd_conv2d_params_finish(&p), 0);
  return p;
}

/* Strided, padded, non-square and 1x1 convolutions, with and without bias, match double. */
START_TEST(test_conv_forward) {
  ttd_conv2d_params cases[] = {
      conv_params(2, 3, 7, 6, 4, 3, 2, 2, 2, 1, 1), conv_params(1, 2, 9, 5, 3, 2, 3, 2, 1, 0, 1),
      conv_params(3, 5, 4, 7, 2, 1, 1, 1, 1, 0, 0), conv_params(2, 1, 5, 5, 1, 5, 5, 1, 1, 2, 2),
      conv_params(1, 4, 6, 6, 3, 1, 1, 2, 2, 1, 0),
  };
  uint64_t rng = 8;
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
    for (int with_bias = 0; with_bias < 2; with_bias++) {
      const ttd_conv2d_params *p = &cases[i];
      int64_t nx = p->n * p->c_in * p->h * p->w, nw = p->c_out * p->c_in * p->kh * p->kw;
      int64_t ny = p->n * p->c_out * p->out_h * p->out_w;
      float *x = kt_rand_buf(&rng, nx, -1, 1), *w = kt_rand_buf(&rng, nw, -1, 1),
            *bias = kt_rand_buf(&rng, p->c_out, -1, 1);
      float *y = kt_nan_buf(ny);
      double *want = kt_dzeros(ny);
      ttd_k_conv2d(NULL, p, x, w, with_bias ? bias : NULL, y);
      ref_conv(p, x, w, with_bias ? bias : NULL, want);
      char what[32];
      snprintf(what, sizeof(what), "case %zu y", i);
      kt_expect_close(what, y, want, ny, 1e-5, kt_dot_tol(p->c_in * p->kh * p->kw));
      free(x), free(w), free(bias), free(y), free(want);
    }
}
END_TEST

typedef struct conv_ctx {
  const ttd_conv2d_params *p;
  const float *x, *w, *bias;
} conv_ctx;

static void conv_forward(void *ctx, float *y) {
  conv_ctx *c = ctx;
  ttd_k_conv2d(NULL, c->p, c->x, c->w, c->bias, y);
}

/* dx, dW, dbias match finite differences (strided padded non-square, and 1x1); NULL outputs skipped. */
START_TEST(test_conv_backward_fd) {
  ttd_conv2d_params cases[] = {conv_params(2, 2, 5, 4, 3, 3, 2, 2, 1, 1, 1),
                               conv_params(2, 3, 3, 2, 2, 1, 1, 1, 1, 0, 0)};
  uint64_t rng = 9;
  for (size_t i = 0; i < 2; i++) {
    const ttd_conv2d_params *p = &cases[i];
    int64_t nx = p->n * p->c_in * p->h * p->w, nw = p->c_out * p->c_in * p->kh * p->kw;
    int64_t ny = p->n * p->c_out * p->out_h * p->out_w;
    float *x = kt_rand_buf(&rng, nx, -1, 1), *w = kt_rand_buf(&rng, nw, -1, 1),
          *bias = kt_rand_buf(&rng, p->c_out, -1, 1);
    float *dy = kt_rand_buf(&rng, ny, -1, 1);
    float *dx = kt_nan_buf(nx), *dw = kt_nan_buf(nw), *db = kt_nan_buf(p->c_out);
    conv_ctx c = {.p = p, .x = x, .w = w, .bias = bias};
    ttd_k_conv2d_backward(NULL, p, x, w, dy, dx, dw, db);
    kt_check_grad("dx", &c, conv_forward, ny, dy, x, nx, dx, 1e-2f);
    kt_check_grad("dW", &c, conv_forward, ny, dy, w, nw, dw, 1e-2f);
    kt_check_grad("dbias", &c, conv_forward, ny, dy, bias, p->c_out, db, 1e-2f);
    float *dx2 = kt_nan_buf(nx), *dw2 = kt_nan_buf(nw);
    ttd_k_conv2d_backward(NULL, p, x, w, dy, dx2, NULL, NULL);
    ttd_k_conv2d_backward(NULL, p, x, w, dy, NULL, dw2, NULL);
    ck_assert(memcmp(dx, dx2, (size_t)nx * sizeof(float)) == 0);
    ck_assert(memcmp(dw, dw2, (size_t)nw * sizeof(float)) == 0);
    free(x), free(w), free(bias), free(dy), free(dx), free(dw), free(db), free(dx2), free(dw2);
  }
}
END_TEST

/* A batch over one column buffer (several groups): y, dx, dW, dbias match double; 4 threads identical. */
START_TEST(test_conv_many_images) {
  ttd_conv2d_params p = conv_params(40, 3, 64, 64, 8, 3, 3, 1, 1, 1, 1);
  int64_t nx = p.n * p.c_in * p.h * p.w, nw = p.c_out * p.c_in * p.kh * p.kw, P = p.out_h * p.out_w;
  int64_t ny = p.n * p.c_out * P;
  uint64_t rng = 10;
  float *x = kt_rand_buf(&rng, nx, -1, 1), *w = kt_rand_buf(&rng, nw, -1, 1), *bias = kt_rand_buf(&rng, p.c_out, -1, 1);
  float *dy = kt_rand_buf(&rng, ny, -1, 1);
  float *y = kt_nan_buf(ny), *dx = kt_nan_buf(nx), *dw = kt_nan_buf(nw), *db = kt_nan_buf(p.c_out);
  ttd_k_conv2d(NULL, &p, x, w, bias, y);
  ttd_k_conv2d_backward(NULL, &p, x, w, dy, dx, dw, db);

  double *want_y = kt_dzeros(ny), *want_dx = kt_dzeros(nx), *want_dw = kt_dzeros(nw), *want_db = kt_dzeros(p.c_out);
  ref_conv(&p, x, w, bias, want_y);
  for (int64_t g = 0; g < p.n; g++)
    for (int64_t co = 0; co < p.c_out; co++)
      for (int64_t oi = 0; oi < p.out_h; oi++)
        for (int64_t oj = 0; oj < p.out_w; oj++) {
          double d = dy[((g * p.c_out + co) * p.out_h + oi) * p.out_w + oj];
          want_db[co] += d;
          for (int64_t c = 0; c < p.c_in; c++)
            for (int64_t ki = 0; ki < p.kh; ki++)
              for (int64_t kj = 0; kj < p.kw; kj++) {
                int64_t ii = oi - p.pad_h + ki, jj = oj - p.pad_w + kj;
                if (ii < 0 || ii >= p.h || jj < 0 || jj >= p.w) continue;
                int64_t xi = ((g * p.c_in + c) * p.h + ii) * p.w + jj, wi = ((co * p.c_in + c) * p.kh + ki) * p.kw + kj;
                want_dx[xi] += d * w[wi];
                want_dw[wi] += d * x[xi];
              }
        }
  kt_expect_close("y", y, want_y, ny, 1e-5, kt_dot_tol(27));
  kt_expect_close("dx", dx, want_dx, nx, 1e-5, kt_dot_tol(72));
  kt_expect_close("dW", dw, want_dw, nw, 1e-4, 1e-2);
  kt_expect_close("dbias", db, want_db, p.c_out, 1e-5, 1e-3);

  ttd_pool *pool = ttd_pool_create(4);
  ck_assert_ptr_nonnull(pool);
  float *y4 = kt_nan_buf(ny), *dx4 = kt_nan_buf(nx), *dw4 = kt_nan_buf(nw), *db4 = kt_nan_buf(p.c_out);
  ttd_k_conv2d(pool, &p, x, w, bias, y4);
  ttd_k_conv2d_backward(pool, &p, x, w, dy, dx4, dw4, db4);
  ck_assert(memcmp(y, y4, (size_t)ny * sizeof(float)) == 0);
  ck_assert(memcmp(dx, dx4, (size_t)nx * sizeof(float)) == 0);
  ck_assert(memcmp(dw, dw4, (size_t)nw * sizeof(float)) == 0);
  ck_assert(memcmp(db, db4, (size_t)p.c_out * sizeof(float)) == 0);
  ttd_pool_destroy(pool);
  free(x), free(w), free(bias), free(dy), free(y), free(dx), free(dw), free(db);
  free(want_y), free(want_dx), free(want_dw), free(want_db), free(y4), free(dx4), free(dw4), free(db4);
}
END_TEST

/* params_finish computes out sizes; refuses stride < 1, padding < 0, too big a window, no channels. */
START_TEST(test_conv_params) {
  ttd_conv2d_params p = {.n = 1,
                         .c_in = 2,
                         .h = 7,
                         .w = 6,
                         .c_out = 3,
                         .kh = 3,
                         .kw = 2,
                         .stride_h = 2,
                         .stride_w = 3,
                         .pad_h = 1,
                         .pad_w = 0};
  ck_assert_int_eq(ttd_conv2d_params_finish(&p), 0);
  ck_assert_int_eq(p.out_h, 4);
  ck_assert_int_eq(p.out_w, 2);
  ttd_conv2d_params bad = p;
  bad.stride_h = 0;
  ck_assert_int_eq(ttd_conv2d_params_finish(&bad), -1);
  bad = p;
  bad.pad_w = -1;
  ck_assert_int_eq(ttd_conv2d_params_finish(&bad), -1);
  bad = p;
  bad.kh = 10;
  ck_assert_int_eq(ttd_conv2d_params_finish(&bad), -1);
  bad = p;
  bad.kw = 7; /* 6 + 0 < 7 */
  ck_assert_int_eq(ttd_conv2d_params_finish(&bad), -1);
  bad = p;
  bad.c_in = 0;
  ck_assert_int_eq(ttd_conv2d_params_finish(&bad), -1);
}
END_TEST

/* Sets a cancellation flag after 100 ms. */
static void *cancel_later(void *arg) {
  usleep(100 * 1000);
  atomic_store(&((ttd_cancel *)arg)->code, 4);
  return NULL;
}

static double since_ms(const struct timespec *t0) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)(t.tv_sec - t0->tv_sec) * 1e3 + (double)(t.tv_nsec - t0->tv_nsec) / 1e6;
}

/* A window too large for a column buffer (a 768 x 768 image under a 384 x 384 kernel would
 * take 87 GB of columns) runs the direct path, about half a minute of work forward and as
 * much backward; a cancellation flag set 100 ms in stops each within a second. Columns up to
 * TTD_CONV2D_COLUMNS_MAX go through the buffer. */
START_TEST(test_conv_huge_window_stops) {
  ttd_conv2d_params p = conv_params(1, 1, 768, 768, 1, 384, 384, 1, 1, 0, 0);
  ck_assert_int_eq(ttd_conv2d_direct(&p), 1);
  ttd_conv2d_params lenet = conv_params(256, 1, 28, 28, 6, 5, 5, 1, 1, 2, 2);
  ttd_conv2d_params strided = conv_params(1, 1, 8192, 8192, 1, 1, 1, 2, 2, 0, 0); /* 16 Mi floats of columns */
  ck_assert_int_eq(ttd_conv2d_direct(&lenet), 0);
  ck_assert_int_eq(ttd_conv2d_direct(&strided), 0);
  int64_t nx = 768 * 768, nw = 384 * 384, ny = p.out_h * p.out_w;
  float *x = calloc((size_t)nx, sizeof(float)), *w = calloc((size_t)nw, sizeof(float));
  float *y = calloc((size_t)ny, sizeof(float)), *dx = calloc((size_t)nx, sizeof(float));
  float *dw = calloc((size_t)nw, sizeof(float));
  ck_assert(x && w && y && dx && dw);
  ttd_cancel cancel = {0};
  ck_assert_ptr_null(ttd_pool_cancel_enter(&cancel));
  for (int backward = 0; backward < 2; backward++) {
    atomic_store(&cancel.code, 0);
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, cancel_later, &cancel), 0);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (backward) ttd_k_conv2d_backward(NULL, &p, x, w, y, dx, dw, NULL);
    else ttd_k_conv2d(NULL, &p, x, w, NULL, y);
    double ms = since_ms(&t0);
    pthread_join(t, NULL);
    ck_assert_msg(ms < 1000, "%s ran %.0f ms after a flag set at 100 ms", backward ? "the backward" : "the forward", ms);
  }
  ck_assert_ptr_eq(ttd_pool_cancel_enter(NULL), &cancel);
  free(x), free(w), free(y), free(dx), free(dw);
}
END_TEST

Suite *kernels_conv_suite(void) {
  Suite *s = suite_create("kernels_conv");
  TCase *tc = tcase_create("conv2d");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_conv_forward);
  tcase_add_test(tc, test_conv_backward_fd);
  tcase_add_test(tc, test_conv_many_images);
  tcase_add_test(tc, test_conv_params);
  tcase_add_test(tc, test_conv_huge_window_stops);
  suite_add_tcase(s, tc);
  return s;
}
