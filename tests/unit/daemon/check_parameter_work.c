/* daemon/methods/parameter_work.c over a sim backend: a step and a zero_grad of the same
 * parameters run as one pass per parameter (the optimizer zeroes each .grad as it reads
 * it), leaving exactly what the two passes leave; where they could differ (state not yet
 * made, a bfloat16 parameter, a .grad that is also a parameter, other lists, an unknown
 * handle) the two passes run. A wrapped backend counts the passes. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "call_fixture.h"
#include "core/core.h"
#include "device/tensor.h"
#include "methods/methods.h"
#include "methods/parameter_work.h"
#include "session/session.h"
#include "suites.h"

static ttd_backend *backend;
static const ttd_backend_vtable *sim_vtable; /* the wrapped backend's own */
static ttd_backend_vtable wrapped;
static int zero_passes, fused_steps, plain_steps;
static ttd_session *session;
static ttd_call call;

static ttd_status_t counting_zero(ttd_backend *b, ttd_backend_buffer *buffer) {
  zero_passes++;
  return sim_vtable->buffer_zero(b, buffer);
}

static ttd_status_t counting_step(ttd_backend *b, int device, const ttd_optimizer_call *oc) {
  if (oc->zero_grad) fused_steps++;
  else plain_steps++;
  return sim_vtable->optimizer_step(b, device, oc);
}

static call_fixture fx;

static void setup(void) {
  cf_setup(&fx);
  backend = fx.backend;
  session = fx.session;
  call = fx.call;
  sim_vtable = backend->vtable;
  wrapped = *sim_vtable;
  wrapped.buffer_zero = counting_zero;
  wrapped.optimizer_step = counting_step;
  backend->vtable = &wrapped;
  zero_passes = fused_steps = plain_steps = 0;
}

static void teardown(void) {
  backend->vtable = sim_vtable;
  cf_teardown(&fx);
}

static ttd_tensor *new_tensor(int64_t n, ttd_dtype dtype, float first) {
  ttd_tensor_spec spec = {.dtype = dtype, .ndim = 1, .shape = {n}, .device = 0, .location = TTD_MEM_DRAM};
  ck_assert_ptr_null(ttd_tensor_spec_finish(&spec));
  ttd_tensor *t = NULL;
  ck_assert_ptr_null(ttd_tensor_create(backend, NULL, &spec, &t));
  if (dtype == TTD_DTYPE_FLOAT32) {
    float *v = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) v[i] = first + 0.25f * (float)(i % 13) - 0.5f * (float)(i % 7);
    ck_assert_ptr_null(backend->vtable->buffer_write(backend, t->buffer, 0, v, (uint64_t)n * sizeof(float)));
    free(v);
  } else {
    ck_assert_ptr_null(backend->vtable->buffer_zero(backend, t->buffer));
  }
  return t;
}

/* A parameter of n elements with a .grad, in the session (which holds it until teardown
 * closes it); its handle. */
static uint64_t new_param(int64_t n, ttd_dtype dtype, ttd_tensor **out_param) {
  ttd_tensor *p = new_tensor(n, dtype, 1.0f);
  p->grad = new_tensor(n, TTD_DTYPE_FLOAT32, 0.5f);
  uint64_t h = 0;
  ck_assert_ptr_null(ttd_session_tensor_add(session, p, &h));
  ttd_tensor_release(p);
  *out_param = p;
  return h;
}

static float *values(ttd_tensor *t) {
  float *v = malloc(t->spec.nbytes);
  ck_assert_ptr_null(backend->vtable->buffer_read(backend, t->buffer, 0, v, t->spec.nbytes));
  return v;
}

static int grad_state(ttd_tensor *param) { return atomic_load(&param->grad->grad_state); }

static void expect_zeros(ttd_tensor *t, const char *what) {
  float *v = values(t);
  for (int64_t i = 0; i < (int64_t)t->spec.numel; i++)
    ck_assert_msg(v[i] == 0.0f, "%s[%lld] is %g, not 0", what, (long long)i, v[i]);
  free(v);
}

/* A ParameterWork of an SGD step over step_handles and a zero_grad over zero_handles. */
typedef struct work_msg {
  Ttd__V1__ParameterWork work;
  Ttd__V1__OptimizerStepRequest step;
  Ttd__V1__SgdOptions sgd;
  Ttd__V1__ZeroGradRequest zero;
} work_msg;

static void make_work(work_msg *w, float lr, float momentum, uint64_t *step_handles, size_t n_step,
                      uint64_t *zero_handles, size_t n_zero) {
  ttd__v1__parameter_work__init(&w->work);
  ttd__v1__optimizer_step_request__init(&w->step);
  ttd__v1__sgd_options__init(&w->sgd);
  ttd__v1__zero_grad_request__init(&w->zero);
  w->sgd.lr = lr;
  w->sgd.momentum = momentum;
  w->step.optimizer_case = TTD__V1__OPTIMIZER_STEP_REQUEST__OPTIMIZER_SGD;
  w->step.sgd = &w->sgd;
  w->step.parameters = step_handles;
  w->step.n_parameters = n_step;
  w->zero.parameters = zero_handles;
  w->zero.n_parameters = n_zero;
  w->work.step = &w->step;
  w->work.zero_grad = &w->zero;
}

/* p - lr * g, element by element in float, as the kernel computes it. */
static void expect_sgd(ttd_tensor *p, const float *p0, const float *g0, float lr) {
  float *v = values(p);
  for (int64_t i = 0; i < (int64_t)p->spec.numel; i++) {
    float want = p0[i] - lr * g0[i];
    ck_assert_msg(v[i] == want, "param[%lld] is %.9g, want %.9g", (long long)i, v[i], want);
  }
  free(v);
}

/* The same handles: one fused pass each, no zeroing pass; parameters as p - lr g, every
 * .grad zeros and known zeros (the next Backward writes it in place); likewise for the
 * parameters a Backward reached (empty lists). */
START_TEST(test_step_and_zero_fused) {
  ttd_tensor *a, *b;
  uint64_t h[2] = {new_param(5, TTD_DTYPE_FLOAT32, &a), new_param(70001, TTD_DTYPE_FLOAT32, &b)};
  for (int by_reach = 0; by_reach < 2; by_reach++) {
    float *a0 = values(a), *ag = values(a->grad), *b0 = values(b), *bg = values(b->grad);
    work_msg w;
    make_work(&w, 0.1f, 0.0f, by_reach ? NULL : h, by_reach ? 0 : 2, by_reach ? NULL : h, by_reach ? 0 : 2);
    ttd_tensor *reached[2] = {a, b};
    zero_passes = fused_steps = plain_steps = 0;
    ttd_status_t s = ttd_parameter_work_run(&call, &w.work, "before this Execute", by_reach ? reached : NULL, 2, NULL);
    ck_assert_msg(s == NULL, "%s", ttd_status_message(s));
    ck_assert_int_eq(fused_steps, 2);
    ck_assert_int_eq(plain_steps, 0);
    ck_assert_int_eq(zero_passes, 0);
    expect_sgd(a, a0, ag, 0.1f);
    expect_sgd(b, b0, bg, 0.1f);
    expect_zeros(a->grad, "a.grad");
    expect_zeros(b->grad, "b.grad");
    ck_assert_int_eq(grad_state(a), TTD_GRAD_ZEROS);
    ck_assert_int_eq(grad_state(b), TTD_GRAD_ZEROS);
    /* New gradients for the next round. */
    float *g = malloc(b->spec.nbytes);
    for (int64_t i = 0; i < (int64_t)b->spec.numel; i++) g[i] = 0.01f * (float)(i % 17) - 0.05f;
    backend->vtable->buffer_write(backend, a->grad->buffer, 0, g, a->spec.nbytes);
    backend->vtable->buffer_write(backend, b->grad->buffer, 0, g, b->spec.nbytes);
    atomic_store(&a->grad->grad_state, TTD_GRAD_UNKNOWN);
    atomic_store(&b->grad->grad_state, TTD_GRAD_UNKNOWN);
    free(g), free(a0), free(ag), free(b0), free(bg);
  }
}
END_TEST

/* A tensor the Backward reached twice (bound to two of the program's parameters: a tied
 * weight) is stepped once by a step over the parameters reached, fused or in two passes
 * (momentum without its buffer yet), as OptimizerStep and torch step it. */
START_TEST(test_tied_parameter_reached_twice_stepped_once) {
  ttd_tensor *a;
  new_param(9, TTD_DTYPE_FLOAT32, &a);
  for (int momentum = 0; momentum < 2; momentum++) {
    float *a0 = values(a), *ag = values(a->grad);
    work_msg w;
    make_work(&w, 0.5f, momentum ? 0.9f : 0.0f, NULL, 0, NULL, 0);
    ttd_tensor *reached[3] = {a, NULL, a};
    zero_passes = fused_steps = plain_steps = 0;
    ttd_status_t s = ttd_parameter_work_run(&call, &w.work, "after this Backward", reached, 3, NULL);
    ck_assert_msg(s == NULL, "%s", ttd_status_message(s));
    ck_assert_int_eq(fused_steps + plain_steps, 1);
    expect_sgd(a, a0, ag, 0.5f); /* the first momentum step: the buffer starts as the gradient */
    expect_zeros(a->grad, "a.grad");
    float g[9];
    for (int i = 0; i < 9; i++) g[i] = 0.25f * (float)(i - 4);
    backend->vtable->buffer_write(backend, a->grad->buffer, 0, g, sizeof(g));
    atomic_store(&a->grad->grad_state, TTD_GRAD_UNKNOWN);
    free(a0), free(ag);
  }
}
END_TEST

/* A step over parameters one of which an Upload is writing (or a Download reading: its
 * mark taken) steps none of them and says to send it after that call, by handles and over
 * the parameters reached, fused (step and zero_grad) or alone; with the mark given back it
 * steps each once, two handles of one tensor once. */
START_TEST(test_step_waits_for_an_upload_of_a_parameter) {
  ttd_tensor *a, *b;
  uint64_t h[3] = {new_param(5, TTD_DTYPE_FLOAT32, &a), new_param(7, TTD_DTYPE_FLOAT32, &b), 0};
  ttd_tensor *reached[2] = {a, b};
  ck_assert_ptr_null(ttd_session_tensor_add(session, a, &h[2])); /* a second handle of a */
  float *a0 = values(a), *ag = values(a->grad), *b0 = values(b);
  for (int way = 0; way < 4; way++) { /* handles, reached; each alone and with zero_grad */
    bool by_reach = way & 1, with_zero = way & 2;
    work_msg w;
    make_work(&w, 0.5f, 0.0f, by_reach ? NULL : h, by_reach ? 0 : 2, by_reach ? NULL : h, by_reach ? 0 : 2);
    if (!with_zero) w.work.zero_grad = NULL;
    ck_assert(ttd_tensor_write_begin(b));
    ttd_status_t s = ttd_parameter_work_run(&call, &w.work, "before this Execute", by_reach ? reached : NULL, 2, NULL);
    ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_FAILED_PRECONDITION);
    ck_assert_msg(strstr(ttd_status_message(s), "being written by an Upload") &&
                      strstr(ttd_status_message(s), "no parameter was stepped"),
                  "%s", ttd_status_message(s));
    ttd_status_free(s);
    ttd_tensor_write_end(b);
    ck_assert_int_eq(fused_steps + plain_steps, 0);
    float *a1 = values(a), *b1 = values(b);
    ck_assert_mem_eq(a1, a0, a->spec.nbytes);
    ck_assert_mem_eq(b1, b0, b->spec.nbytes);
    free(a1), free(b1);
  }
  Ttd__V1__OptimizerStepRequest step = TTD__V1__OPTIMIZER_STEP_REQUEST__INIT;
  Ttd__V1__SgdOptions sgd = TTD__V1__SGD_OPTIONS__INIT;
  sgd.lr = 0.5f;
  step.optimizer_case = TTD__V1__OPTIMIZER_STEP_REQUEST__OPTIMIZER_SGD;
  step.sgd = &sgd;
  uint64_t twice[2] = {h[0], h[2]}, updated = 0;
  step.parameters = twice;
  step.n_parameters = 2;
  ck_assert_ptr_null(ttd_optimizer_step_handles(&call, &step, &updated));
  ck_assert_int_eq(updated, 1);
  expect_sgd(a, a0, ag, 0.5f);
  free(a0), free(ag), free(b0);
}
END_TEST

/* A Download holds its tensor's read mark for its whole stream: an optimizer step of that
 * parameter meanwhile steps nothing (FAILED_PRECONDITION), nor can an Upload take the write
 * mark; with the stream done the step goes through. A Download of a tensor being written is
 * refused the same way and leaves the mark as it was. */
START_TEST(test_download_holds_the_read_mark) {
  ttd_tensor *a;
  uint64_t h = new_param(5, TTD_DTYPE_FLOAT32, &a);
  float *a0 = values(a), *ag = values(a->grad);
  Ttd__V1__DownloadRequest dl = TTD__V1__DOWNLOAD_REQUEST__INIT;
  dl.handle = h;
  ttd_call stream = call; /* a second call of the session */
  stream.stream = NULL;
  stream.arena = NULL;
  ck_assert_ptr_null(ttd_download_begin(&stream, &dl.base));
  ck_assert(!ttd_tensor_write_begin(a));
  Ttd__V1__OptimizerStepRequest step = TTD__V1__OPTIMIZER_STEP_REQUEST__INIT;
  Ttd__V1__SgdOptions sgd = TTD__V1__SGD_OPTIONS__INIT;
  sgd.lr = 0.5f;
  step.optimizer_case = TTD__V1__OPTIMIZER_STEP_REQUEST__OPTIMIZER_SGD;
  step.sgd = &sgd;
  step.parameters = &h;
  step.n_parameters = 1;
  uint64_t updated = 0;
  ttd_status_t s = ttd_optimizer_step_handles(&call, &step, &updated);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_FAILED_PRECONDITION);
  ck_assert_msg(strstr(ttd_status_message(s), "read by a Download") && strstr(ttd_status_message(s), "no parameter"),
                "%s", ttd_status_message(s));
  ttd_status_free(s);
  float *a1 = values(a);
  ck_assert_mem_eq(a1, a0, a->spec.nbytes);
  free(a1);
  ttd_download_done(&stream);
  ck_assert_ptr_null(ttd_optimizer_step_handles(&call, &step, &updated));
  ck_assert_int_eq(updated, 1);
  expect_sgd(a, a0, ag, 0.5f);

  ck_assert(ttd_tensor_write_begin(a)); /* an Upload writing it */
  stream.stream = NULL;
  s = ttd_download_begin(&stream, &dl.base);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_FAILED_PRECONDITION);
  ck_assert_msg(strstr(ttd_status_message(s), "being written by an Upload"), "%s", ttd_status_message(s));
  ttd_status_free(s);
  ttd_download_done(&stream);
  ck_assert(!ttd_tensor_read_begin(a)); /* still the Upload's */
  ttd_tensor_write_end(a);
  ck_assert(ttd_tensor_read_begin(a));
  ttd_tensor_read_end(a);
  ttd_call_arena_free(&stream);
  free(a0), free(ag);
}
END_TEST

/* Momentum turned on after steps without it (dampening 0.5): the buffer, made now, starts as
 * the gradient as torch's does when it has none, not as (1 - dampening) g. */
START_TEST(test_momentum_buffer_made_late_starts_as_the_gradient) {
  ttd_tensor *a;
  uint64_t h = new_param(6, TTD_DTYPE_FLOAT32, &a);
  work_msg w;
  for (int i = 0; i < 2; i++) {
    make_work(&w, 0.5f, 0.0f, &h, 1, NULL, 0);
    w.work.zero_grad = NULL;
    ck_assert_ptr_null(ttd_parameter_work_run(&call, &w.work, "before this Execute", NULL, 0, NULL));
  }
  float *a0 = values(a), *ag = values(a->grad);
  make_work(&w, 0.5f, 0.9f, &h, 1, NULL, 0);
  w.work.zero_grad = NULL;
  w.sgd.dampening = 0.5f;
  ck_assert_ptr_null(ttd_parameter_work_run(&call, &w.work, "before this Execute", NULL, 0, NULL));
  expect_sgd(a, a0, ag, 0.5f);
  free(a0), free(ag);
}
END_TEST

/* A .grad held by an Upload (its write mark taken) is zeroed all the same, as ZeroGrad
 * zeroes it, but not known zeros: the Upload may have written part of it. */
START_TEST(test_fused_beside_an_upload) {
  ttd_tensor *a;
  uint64_t h = new_param(9, TTD_DTYPE_FLOAT32, &a);
  ck_assert(ttd_tensor_write_begin(a->grad));
  work_msg w;
  make_work(&w, 0.5f, 0.0f, &h, 1, &h, 1);
  ck_assert_ptr_null(ttd_parameter_work_run(&call, &w.work, "before this Execute", NULL, 0, NULL));
  ck_assert_int_eq(fused_steps, 1);
  expect_zeros(a->grad, "a.grad");
  ck_assert_int_eq(grad_state(a), TTD_GRAD_UNKNOWN);
  ttd_tensor_write_end(a->grad);
}
END_TEST

/* Where one pass each could leave something else, the step and then the zeroing run: a
 * zero_grad of other parameters; momentum before its buffer exists (made by the first step;
 * the second is fused); a .grad that is also a listed parameter (the two passes zero it
 * after its own step, which one pass each would not). A bfloat16 parameter, stepped in place
 * with no float32 copy, is fused. */
START_TEST(test_two_passes_where_fusing_differs) {
  ttd_tensor *a, *b;
  uint64_t h[2] = {new_param(6, TTD_DTYPE_FLOAT32, &a), new_param(6, TTD_DTYPE_FLOAT32, &b)};
  work_msg w;

  make_work(&w, 0.1f, 0.0f, h, 2, h, 1); /* zero_grad of a only */
  ck_assert_ptr_null(ttd_parameter_work_run(&call, &w.work, "before this Execute", NULL, 0, NULL));
  ck_assert_int_eq(plain_steps, 2);
  ck_assert_int_eq(fused_steps, 0);
  ck_assert_int_eq(zero_passes, 1);

  zero_passes = fused_steps = plain_steps = 0;
  make_work(&w, 0.1f, 0.9f, h, 2, h, 2); /* momentum: no buffer yet */
  ck_assert_ptr_null(ttd_parameter_work_run(&call, &w.work, "before this Execute", NULL, 0, NULL));
  ck_assert_int_eq(plain_steps, 2);
  ck_assert_int_eq(zero_passes, 4); /* two momentum buffers made zeroed, then the two .grads */
  ck_assert_ptr_nonnull(a->opt_state[0]);
  zero_passes = fused_steps = plain_steps = 0;
  ck_assert_ptr_null(ttd_parameter_work_run(&call, &w.work, "before this Execute", NULL, 0, NULL));
  ck_assert_int_eq(fused_steps, 2); /* the buffers exist now */
  ck_assert_int_eq(zero_passes, 0);

  ttd_tensor *c;
  uint64_t hc = new_param(4, TTD_DTYPE_BFLOAT16, &c);
  zero_passes = fused_steps = plain_steps = 0;
  float *cg = values(c->grad);
  make_work(&w, 0.1f, 0.0f, &hc, 1, &hc, 1);
  ck_assert_ptr_null(ttd_parameter_work_run(&call, &w.work, "before this Execute", NULL, 0, NULL));
  ck_assert_int_eq(fused_steps, 1);
  ck_assert_int_eq(plain_steps, 0);
  ck_assert_int_eq(zero_passes, 0);
  expect_zeros(c->grad, "c.grad");
  uint16_t *c16 = (uint16_t *)values(c); /* 0 - lr g, rounded to bfloat16 */
  for (int i = 0; i < 4; i++) ck_assert_uint_eq(c16[i], ttd_bf16_from_f32(0.0f - 0.1f * cg[i]));
  free(cg);
  free(c16);

  /* d's .grad is e, itself a parameter with a .grad. Two passes: d -= lr e, e -= lr e.grad,
   * then both .grads (e and e.grad) zeroed, so e ends all zeros. */
  ttd_tensor *d, *e;
  uint64_t hd[2] = {new_param(3, TTD_DTYPE_FLOAT32, &d), new_param(3, TTD_DTYPE_FLOAT32, &e)};
  ttd_tensor_release(d->grad);
  d->grad = ttd_tensor_retain(e);
  float *d0 = values(d), *e0 = values(e);
  zero_passes = fused_steps = plain_steps = 0;
  make_work(&w, 0.25f, 0.0f, hd, 2, hd, 2);
  ck_assert_ptr_null(ttd_parameter_work_run(&call, &w.work, "before this Execute", NULL, 0, NULL));
  ck_assert_int_eq(fused_steps, 0);
  ck_assert_int_eq(zero_passes, 2);
  expect_sgd(d, d0, e0, 0.25f);
  expect_zeros(e, "e");
  expect_zeros(e->grad, "e.grad");
  free(d0), free(e0);
}
END_TEST

/* A listed parameter that never got a .grad is skipped by the step, as torch skips it, and
 * keeps the others fused: with momentum it has no buffer, and needs none. */
START_TEST(test_param_without_grad_still_fused) {
  ttd_tensor *a, *b;
  uint64_t h[2] = {new_param(6, TTD_DTYPE_FLOAT32, &a), new_param(6, TTD_DTYPE_FLOAT32, &b)};
  ttd_tensor_release(b->grad);
  b->grad = NULL;
  float *b0 = values(b);
  work_msg w;
  make_work(&w, 0.1f, 0.9f, h, 2, h, 2);
  ck_assert_ptr_null(ttd_parameter_work_run(&call, &w.work, "before this Execute", NULL, 0, NULL)); /* a's buffer made */
  ck_assert_ptr_null(b->opt_state[0]);
  zero_passes = fused_steps = plain_steps = 0;
  ck_assert_ptr_null(ttd_parameter_work_run(&call, &w.work, "before this Execute", NULL, 0, NULL));
  ck_assert_int_eq(fused_steps, 1);
  ck_assert_int_eq(plain_steps, 0);
  ck_assert_int_eq(zero_passes, 0);
  float *b1 = values(b);
  ck_assert_int_eq(memcmp(b0, b1, b->spec.nbytes), 0);
  free(b0), free(b1);
}
END_TEST

/* The one difference from two passes, as documented: a step the backend fails leaves the
 * .grads of the parameters stepped before it zeroed (two passes would not have zeroed any),
 * its own and the later ones as they were. */
static int steps_before_failure;

static ttd_status_t failing_step(ttd_backend *b, int device, const ttd_optimizer_call *oc) {
  if (steps_before_failure-- == 0) return ttd_make_status(GRPC_STATUS_INTERNAL, "the card failed the step");
  return counting_step(b, device, oc);
}

START_TEST(test_backend_failure_mid_list) {
  ttd_tensor *a, *b, *c;
  uint64_t h[3] = {new_param(5, TTD_DTYPE_FLOAT32, &a), new_param(5, TTD_DTYPE_FLOAT32, &b),
                   new_param(5, TTD_DTYPE_FLOAT32, &c)};
  float *bg = values(b->grad), *cg = values(c->grad);
  wrapped.optimizer_step = failing_step;
  steps_before_failure = 1;
  work_msg w;
  make_work(&w, 0.1f, 0.0f, h, 3, h, 3);
  ttd_status_t s = ttd_parameter_work_run(&call, &w.work, "before this Execute", NULL, 0, NULL);
  ck_assert_ptr_nonnull(s);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_INTERNAL);
  ck_assert_str_eq(ttd_status_message(s), "OptimizerStep before this Execute failed: the card failed the step");
  ttd_status_free(s);
  expect_zeros(a->grad, "a.grad");
  float *bg1 = values(b->grad), *cg1 = values(c->grad);
  ck_assert_int_eq(memcmp(bg, bg1, b->spec.nbytes), 0);
  ck_assert_int_eq(memcmp(cg, cg1, c->spec.nbytes), 0);
  ck_assert_int_eq(grad_state(a), TTD_GRAD_ZEROS);
  ck_assert_int_eq(grad_state(b), TTD_GRAD_UNKNOWN);
  free(bg), free(cg), free(bg1), free(cg1);
}
END_TEST

/* An unknown handle: NOT_FOUND from the step as without fusing, no parameter stepped (the
 * step looks every handle up first), and no .grad zeroed (the zero_grad never ran). */
START_TEST(test_unknown_handle_as_two_passes) {
  ttd_tensor *a;
  uint64_t h[2] = {new_param(4, TTD_DTYPE_FLOAT32, &a), 0x1234567812345678ull};
  float *a0 = values(a), *ag = values(a->grad);
  work_msg w;
  make_work(&w, 0.1f, 0.0f, h, 2, h, 2);
  ttd_status_t s = ttd_parameter_work_run(&call, &w.work, "before this Execute", NULL, 0, NULL);
  ck_assert_ptr_nonnull(s);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_NOT_FOUND);
  ck_assert_msg(strncmp(ttd_status_message(s), "OptimizerStep before this Execute failed: ", 42) == 0, "%s",
                ttd_status_message(s));
  ttd_status_free(s);
  ck_assert_int_eq(fused_steps + plain_steps, 0);
  ck_assert_int_eq(zero_passes, 0);
  float *a1 = values(a), *g = values(a->grad);
  ck_assert_mem_eq(a1, a0, a->spec.nbytes);
  free(a1);
  ck_assert_int_eq(memcmp(g, ag, a->spec.nbytes), 0);
  free(g), free(a0), free(ag);
}
END_TEST

Suite *parameter_work_suite(void) {
  Suite *s = suite_create("parameter_work");
  TCase *tc = tcase_create("parameter_work");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_step_and_zero_fused);
  tcase_add_test(tc, test_tied_parameter_reached_twice_stepped_once);
  tcase_add_test(tc, test_step_waits_for_an_upload_of_a_parameter);
  tcase_add_test(tc, test_download_holds_the_read_mark);
  tcase_add_test(tc, test_momentum_buffer_made_late_starts_as_the_gradient);
  tcase_add_test(tc, test_fused_beside_an_upload);
  tcase_add_test(tc, test_two_passes_where_fusing_differs);
  tcase_add_test(tc, test_unknown_handle_as_two_passes);
  tcase_add_test(tc, test_param_without_grad_still_fused);
  tcase_add_test(tc, test_backend_failure_mid_list);
  suite_add_tcase(s, tc);
  return s;
}
