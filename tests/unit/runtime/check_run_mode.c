/* A run's mode (device/program_run.h) on the simulated card, with y = dropout(x): in eval mode
 * dropout is the identity forward and backward; in training each dropout step draws a new
 * mask, the same (seed, step) the same mask (the kernel's, whatever runs it), about p of the
 * elements dropped, and a run's backward uses its own forward's mask. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "device/program_run.h"
#include "graph_builder.h"
#include "suites.h"

enum { ROWS = 64, COLS = 1000, N = ROWS * COLS };
#define SEED 20240607u
#define P 0.3f

static ttd_backend *backend;
static ttd_program *program;
static ttd_tensor *x;
static float *host_x;

static ttd_tensor *new_tensor(const float *data) {
  ttd_tensor_spec spec = {.dtype = TTD_DTYPE_FLOAT32, .ndim = 2, .shape = {ROWS, COLS}, .location = TTD_MEM_DRAM};
  ck_assert_ptr_null(ttd_tensor_spec_finish(&spec));
  ttd_tensor *t = NULL;
  ck_assert_ptr_null(ttd_tensor_create(backend, NULL, &spec, &t));
  ck_assert_ptr_null(backend->vtable->buffer_write(backend, t->buffer, 0, data, spec.nbytes));
  return t;
}

static void read_all(const ttd_tensor *t, float *out) {
  ck_assert_ptr_null(backend->vtable->buffer_read(backend, t->buffer, 0, out, t->spec.nbytes));
}

/* Values in [0.5, 1.5) with signs mixed, and the special values eval must keep bit for bit. */
static void fill_x(float *v) {
  uint32_t s = 99;
  for (int i = 0; i < N; i++) {
    s = s * 1664525u + 1013904223u;
    v[i] = (0.5f + (float)(s >> 8) * 0x1.0p-24f) * (i % 2 ? -1.0f : 1.0f);
  }
  v[0] = NAN, v[1] = -0.0f, v[2] = INFINITY, v[3] = -INFINITY;
}

static void setup(void) {
  ttd_backend_options o = {.devices = 1, .dram_bytes = 1ull << 30, .l1_bytes = 1 << 20, .cores = 2};
  ck_assert_ptr_null(ttd_backend_create("sim", &o, &backend));
  graph_builder b;
  gb_init(&b);
  gb_value(&b, 0, "x", TTD__V1__DTYPE__DTYPE_FLOAT32, 2, ROWS, COLS, 0, 0);
  Ttd__V1__Node *d = gb_node(&b, "y", "dropout", "x", NULL, NULL);
  gb_int(&b, d, "seed", SEED);
  gb_int(&b, d, "p", 0);
  d->attrs[1]->value_case = TTD__V1__ATTR__VALUE_F; /* p is a float attribute */
  d->attrs[1]->f = P;
  gb_output(&b, "y");
  ttd_status_t s = ttd_program_compile(&b.graph, &program);
  ck_assert_msg(s == NULL, "compile: %s", ttd_status_message(s));
  host_x = malloc(N * sizeof(float));
  ck_assert_ptr_nonnull(host_x);
  fill_x(host_x);
  x = new_tensor(host_x);
}

static void teardown(void) {
  ttd_tensor_release(x);
  free(host_x);
  ttd_program_release(program);
  ttd_device_info info;
  backend->vtable->device_info(backend, 0, &info);
  ck_assert_uint_eq(info.memory[0].used_bytes, 0); /* every value and gradient freed */
  ttd_backend_destroy(backend);
}

/* The forward in mode (NULL: ttd_run_forward) into y; the caller frees the run. */
static ttd_run *forward(const ttd_run_mode *mode, float *y) {
  ttd_run *run = NULL;
  ttd_status_t s = mode ? ttd_run_forward_mode(backend, NULL, program, &x, 1, NULL, 0, mode, &run)
                        : ttd_run_forward(backend, NULL, program, &x, 1, NULL, 0, &run);
  ck_assert_msg(s == NULL, "forward: %s", ttd_status_message(s));
  read_all(run->values[program->outputs[0]], y);
  return run;
}

/* dx of run for the output gradient dy (host floats); frees the run. */
static void backward(ttd_run *run, const float *dy, float *dx) {
  ttd_tensor *g = new_tensor(dy), *input_grads[1] = {NULL};
  ttd_status_t s = ttd_run_backward(run, backend, &g, NULL, input_grads);
  ck_assert_msg(s == NULL, "backward: %s", ttd_status_message(s));
  ck_assert_ptr_nonnull(input_grads[0]);
  read_all(input_grads[0], dx);
  ttd_tensor_release(input_grads[0]);
  ttd_tensor_release(g);
  ttd_run_free(run);
}

static float *buf(void) {
  float *v = malloc(N * sizeof(float));
  ck_assert_ptr_nonnull(v);
  return v;
}

static int64_t count_dropped(const float *y) {
  int64_t dropped = 0;
  for (int i = 0; i < N; i++) dropped += y[i] == 0.0f;
  return dropped;
}

/* Eval mode: y is x bit for bit (NaN, -0 and infinities too) at any step, and dx is dy. */
START_TEST(test_eval_is_identity) {
  float *y = buf(), *dy = buf(), *dx = buf();
  for (int i = 0; i < N; i++) dy[i] = host_x[(i * 7) % N] * 3.0f;
  const uint64_t steps[] = {0, 1, 77};
  for (size_t k = 0; k < 3; k++) {
    ttd_run_mode eval = {.eval = true, .dropout_step = steps[k]};
    ttd_run *run = forward(&eval, y);
    ck_assert(run->mode.eval);
    ck_assert_int_eq(memcmp(y, host_x, N * sizeof(float)), 0);
    backward(run, dy, dx);
    ck_assert_int_eq(memcmp(dx, dy, N * sizeof(float)), 0);
  }
  free(y), free(dy), free(dx);
}
END_TEST

/* Training: the mask is the kernel's for (seed, step): ttd_run_forward is step 0, and step
 * k's output equals ttd_k_dropout(seed, k), also run again. Each step drops about p of the
 * elements (3 sigma), and two steps' masks are independent (they disagree on about
 * 2 p (1 - p) of the elements). */
START_TEST(test_training_mask_per_step) {
  float *y0 = buf(), *y = buf(), *again = buf(), *want = buf();
  ttd_run_free(forward(NULL, y0));
  ttd_k_dropout(NULL, host_x, N, P, SEED, 0, want);
  ck_assert_int_eq(memcmp(y0, want, N * sizeof(float)), 0);
  double sigma = sqrt((double)N * P * (1.0 - P)), q = 2.0 * P * (1.0 - P);
  for (uint64_t step = 1; step <= 4; step++) {
    ttd_run_mode mode = {.dropout_step = step};
    ttd_run_free(forward(&mode, y));
    ttd_run_free(forward(&mode, again));
    ck_assert_int_eq(memcmp(y, again, N * sizeof(float)), 0);
    ttd_k_dropout(NULL, host_x, N, P, SEED, step, want);
    ck_assert_int_eq(memcmp(y, want, N * sizeof(float)), 0);
    int64_t dropped = count_dropped(y), differ = 0;
    ck_assert_msg(fabs((double)dropped - N * P) <= 3.0 * sigma, "step %llu dropped %lld of %d, p = %g",
                  (unsigned long long)step, (long long)dropped, N, (double)P);
    for (int i = 0; i < N; i++) differ += (y[i] == 0.0f) != (y0[i] == 0.0f);
    double expect = N * q, sd = sqrt(N * q * (1.0 - q));
    ck_assert_msg(fabs((double)differ - expect) <= 3.0 * sd, "steps 0 and %llu disagree at %lld, expected %.0f",
                  (unsigned long long)step, (long long)differ, expect);
    for (int i = 0; i < N; i++) {
      if (y[i] != 0.0f && !(y[i] == host_x[i] * (1.0f / (1.0f - P)) || (isnan(y[i]) && isnan(host_x[i])))) {
        ck_abort_msg("y[%d] = %g for x = %g, p = %g", i, (double)y[i], (double)host_x[i], (double)P);
      }
    }
  }
  free(y0), free(y), free(again), free(want);
}
END_TEST

/* A run's backward uses its own forward's mask, also with a later step's run in between and
 * still held: dx = dy / (1 - p) where y kept x, 0 where it dropped it. */
START_TEST(test_backward_uses_forward_mask) {
  float *y = buf(), *y_next = buf(), *dy = buf(), *dx = buf();
  for (int i = 0; i < N; i++) dy[i] = 1.0f + (float)(i % 13);
  ttd_run_mode step5 = {.dropout_step = 5}, step6 = {.dropout_step = 6};
  ttd_run *run = forward(&step5, y);
  ttd_run *next = forward(&step6, y_next);
  ck_assert_int_ne(memcmp(y, y_next, N * sizeof(float)), 0);
  backward(next, dy, dx); /* the later run's backward first */
  backward(run, dy, dx);
  for (int i = 4; i < N; i++) { /* past the special values: x is never 0 there */
    float want = y[i] == 0.0f ? 0.0f : dy[i] * (1.0f / (1.0f - P));
    if (dx[i] != want) ck_abort_msg("dx[%d] = %g, want %g (y = %g)", i, (double)dx[i], (double)want, (double)y[i]);
  }
  free(y), free(y_next), free(dy), free(dx);
}
END_TEST

Suite *run_mode_suite(void) {
  Suite *s = suite_create("run_mode");
  TCase *tc = tcase_create("dropout");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_eval_is_identity);
  tcase_add_test(tc, test_training_mask_per_step);
  tcase_add_test(tc, test_backward_uses_forward_mask);
  suite_add_tcase(s, tc);
  return s;
}
