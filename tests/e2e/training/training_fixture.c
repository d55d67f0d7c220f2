#include "training_fixture.h"

#include <check.h>
#include <string.h>

tt_graph *tf_mlp(tt_client *client) {
  tt_graph *g = tt_graph_create(client, 42);
  int64_t xs[2] = {TF_N, TF_IN};
  tt_value x = tt_graph_input(g, "x", TT_FLOAT32, xs, 2);
  tt_value h = tt_relu(g, tt_nn_linear(g, x, TF_H, 1));
  tt_value y = tt_nn_linear(g, h, TF_OUT, 1);
  ck_assert_int_ge(y, 0);
  ck_assert_int_eq(tt_graph_output(g, y), 0);
  return g;
}

void tf_grad_of(tt_client *client, tt_module *m, const char *name, float *out, size_t n) {
  tt_tensor *g = tt_param_grad(m, name);
  ck_assert_msg(g != NULL, "%s", tt_last_error(client));
  tt_tensor *h = tt_to(g, "cpu");
  memcpy(out, tt_tensor_data(h), n * sizeof(float));
  tt_tensor_free(h);
  tt_tensor_free(g);
}
