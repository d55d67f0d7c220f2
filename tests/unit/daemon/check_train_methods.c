/* daemon/methods/train.c and execute.c through their handlers over a sim backend, in one
 * session: a Backward waits for an Upload of an output gradient it would read, and an
 * Execute whose forward fails after the Backward it carried ran leaves none of that
 * Backward's input gradients behind and says the Backward took effect. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "call_fixture.h"
#include "device/tensor.h"
#include "graph/program.h"
#include "graph_builder.h"
#include "methods/methods.h"
#include "session/session.h"
#include "suites.h"

#define F32 TTD__V1__DTYPE__DTYPE_FLOAT32

/* A float32 tensor of shape d0 x d1 holding 0.25 * (i % 7) - 0.5, in the session; its handle. */
static uint64_t put(int64_t d0, int64_t d1, ttd_tensor **out) {
  ttd_tensor_spec spec = {.dtype = TTD_DTYPE_FLOAT32, .ndim = 2, .shape = {d0, d1}, .device = 0,
                          .location = TTD_MEM_DRAM};
  ck_assert_ptr_null(ttd_tensor_spec_finish(&spec));
  ttd_tensor *t = NULL;
  ck_assert_ptr_null(ttd_tensor_create(cf.backend, cf.session->quota, &spec, &t));
  float *v = malloc(spec.nbytes);
  for (uint64_t i = 0; i < spec.numel; i++) v[i] = 0.25f * (float)(i % 7) - 0.5f;
  ck_assert_ptr_null(cf.backend->vtable->buffer_write(cf.backend, t->buffer, 0, v, spec.nbytes));
  free(v);
  uint64_t h = 0;
  ck_assert_ptr_null(ttd_session_tensor_add(cf.session, t, &h));
  if (out) *out = t;
  ttd_tensor_release(t);
  return h;
}

/* y = x @ w, x [3, 4] an input, w [4, 2] a parameter: compiled into the session; its handle. */
static uint64_t matmul_program(void) {
  graph_builder b;
  gb_init(&b);
  gb_value(&b, 0, "x", F32, 2, 3, 4, 0, 0);
  gb_value(&b, 1, "w", F32, 2, 4, 2, 0, 0);
  gb_node(&b, "y", "matmul", "x", "w", NULL);
  gb_output(&b, "y");
  ttd_program *p = NULL;
  ttd_status_t s = ttd_program_compile(&b.graph, &p);
  ck_assert_msg(s == NULL, "%s", ttd_status_message(s));
  uint64_t h = 0;
  ck_assert_ptr_null(ttd_session_program_add(cf.session, p, &h));
  ttd_program_release(p);
  return h;
}

/* Execute of program with input x and parameter w, its run kept; the run's handle and the
 * output's in *out_y. */
static uint64_t run_forward(uint64_t program, uint64_t x, uint64_t w, uint64_t *out_y) {
  Ttd__V1__ExecuteRequest req = TTD__V1__EXECUTE_REQUEST__INIT;
  req.program = program;
  req.inputs = &x, req.n_inputs = 1;
  req.parameters = &w, req.n_parameters = 1;
  req.keep_for_backward = true;
  ProtobufCMessage *resp = NULL;
  ttd_status_t s = ttd_method_execute(&cf.call, &req.base, &resp);
  ck_assert_msg(s == NULL, "%s", ttd_status_message(s));
  Ttd__V1__ExecuteResponse *r = (Ttd__V1__ExecuteResponse *)resp;
  *out_y = r->outputs[0]->handle;
  return r->run;
}

/* A Backward whose output gradient, given by handle, an Upload is writing is refused with
 * FAILED_PRECONDITION naming it, and sums nothing; once the Upload is done it runs. */
START_TEST(test_backward_waits_for_an_upload_of_its_gradient) {
  ttd_tensor *w = NULL, *dy = NULL;
  uint64_t program = matmul_program(), x = put(3, 4, NULL), wh = put(4, 2, &w), y;
  uint64_t dyh = put(3, 2, &dy);
  for (int upload = 1; upload >= 0; upload--) {
    uint64_t run = run_forward(program, x, wh, &y);
    Ttd__V1__BackwardRequest req = TTD__V1__BACKWARD_REQUEST__INIT;
    req.run = run;
    req.output_grads = &dyh, req.n_output_grads = 1;
    if (upload) ck_assert(ttd_tensor_write_begin(dy));
    ProtobufCMessage *resp = NULL;
    ttd_status_t s = ttd_method_backward(&cf.call, &req.base, &resp);
    if (upload) {
      ttd_tensor_write_end(dy);
      ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_FAILED_PRECONDITION);
      ck_assert_msg(strstr(ttd_status_message(s), "output gradient 0 is being written by an Upload"), "%s",
                    ttd_status_message(s));
      ttd_status_free(s);
      ck_assert_ptr_null(w->grad); /* nothing summed */
    } else {
      ck_assert_msg(s == NULL, "%s", ttd_status_message(s));
      ck_assert_ptr_nonnull(w->grad);
    }
  }
}
END_TEST

/* An Execute carrying a Backward that asks for input gradients, whose own forward then fails
 * (an unknown input handle): NOT_FOUND saying the Backward ran; the session holds what it
 * held plus w's .grad (which later Backward answers name), not the input gradient. */
START_TEST(test_failed_execute_frees_its_backwards_input_grads) {
  ttd_tensor *w = NULL;
  uint64_t program = matmul_program(), x = put(3, 4, NULL), wh = put(4, 2, &w), y;
  uint64_t run = run_forward(program, x, wh, &y);
  uint64_t dyh = put(3, 2, NULL);
  size_t tensors_before = cf.session->tensors.count;
  Ttd__V1__BackwardRequest back = TTD__V1__BACKWARD_REQUEST__INIT;
  back.run = run;
  back.output_grads = &dyh, back.n_output_grads = 1;
  back.input_grads = true;
  Ttd__V1__ExecuteRequest req = TTD__V1__EXECUTE_REQUEST__INIT;
  uint64_t unknown = 0x1234567812345678ull;
  req.program = program;
  req.inputs = &unknown, req.n_inputs = 1;
  req.parameters = &wh, req.n_parameters = 1;
  req.backward = &back;
  ProtobufCMessage *resp = NULL;
  ttd_status_t s = ttd_method_execute(&cf.call, &req.base, &resp);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_NOT_FOUND);
  ck_assert_msg(strstr(ttd_status_message(s), "the Backward this Execute carried did run before") &&
                    strstr(ttd_status_message(s), "its input gradients are freed"),
                "%s", ttd_status_message(s));
  ttd_status_free(s);
  ck_assert_ptr_nonnull(w->grad);
  ck_assert_uint_eq(cf.session->tensors.count, tensors_before + 1); /* w's .grad, by its stable handle */
}
END_TEST

Suite *train_methods_suite(void) {
  Suite *s = suite_create("train_methods");
  TCase *tc = cf_tcase("train_methods");
  tcase_add_test(tc, test_backward_waits_for_an_upload_of_its_gradient);
  tcase_add_test(tc, test_failed_execute_frees_its_backwards_input_grads);
  suite_add_tcase(s, tc);
  return s;
}
