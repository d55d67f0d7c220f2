#include "program_run.h"

#include <stdlib.h>
#include <string.h>

static ttd_status_t check_operand(const ttd_program_value *want, const ttd_tensor *got, const char *what, int device) {
  char b1[128], b2[128];
  ttd_kshape have = {.ndim = got->spec.ndim};
  memcpy(have.d, got->spec.shape, sizeof(int64_t) * (size_t)got->spec.ndim);
  if (got->spec.dtype != want->type.dtype || have.ndim != want->type.shape.ndim ||
      memcmp(have.d, want->type.shape.d, sizeof(int64_t) * (size_t)have.ndim) != 0) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "%s '%.128s' must be %s %s, got %s %s", what, want->name,
                           ttd_dtype_name(want->type.dtype), ttd_kshape_format(&want->type.shape, b1, sizeof(b1)),
                           ttd_dtype_name(got->spec.dtype), ttd_kshape_format(&have, b2, sizeof(b2)));
  }
  if (got->spec.device != device) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "%s '%.128s' is on tt:%d but the program runs on tt:%d; move it first",
                           what, want->name, got->spec.device, device);
  }
  return TTD_OK;
}

static ttd_status_t make_tensor(ttd_backend *backend, int device, ttd_dtype dtype, const ttd_kshape *shape,
                                ttd_tensor **out) {
  ttd_tensor_spec spec = {.dtype = dtype, .ndim = shape->ndim, .device = device, .location = TTD_MEM_DRAM};
  memcpy(spec.shape, shape->d, sizeof(int64_t) * (size_t)shape->ndim);
  TTD_RETURN_IF_ERROR(ttd_tensor_spec_finish(&spec));
  return ttd_tensor_create(backend, &spec, out);
}

/* What an op keeps for its backward: max_pool2d the argmax of each output element,
 * layer_norm the mean and rstd of each row. */
static ttd_status_t make_saved(ttd_backend *backend, int device, const ttd_program_node *node, const ttd_kshape *out_shape,
                               ttd_tensor **saved) {
  if (node->op == TTD_OP_MAX_POOL2D) return make_tensor(backend, device, TTD_DTYPE_INT32, out_shape, &saved[0]);
  if (node->op == TTD_OP_LAYER_NORM) {
    ttd_kshape rows = {.ndim = 1, .d = {ttd_kshape_numel(out_shape) / (out_shape->d[out_shape->ndim - 1] ? out_shape->d[out_shape->ndim - 1] : 1)}};
    TTD_RETURN_IF_ERROR(make_tensor(backend, device, TTD_DTYPE_FLOAT32, &rows, &saved[0]));
    return make_tensor(backend, device, TTD_DTYPE_FLOAT32, &rows, &saved[1]);
  }
  return TTD_OK;
}

void ttd_run_free(ttd_run *run) {
  if (!run) return;
  for (int i = 0; run->values && i < run->program->n_values; i++) ttd_tensor_release(run->values[i]);
  for (int i = 0; run->saved && i < 2 * run->program->n_nodes; i++) ttd_tensor_release(run->saved[i]);
  free(run->values);
  free(run->saved);
  ttd_program_release(run->program);
  free(run);
}

ttd_status_t ttd_run_forward(ttd_backend *backend, ttd_program *program, ttd_tensor *const *inputs, int n_inputs,
                             ttd_tensor *const *params, int n_params, ttd_run **out_run) {
  *out_run = NULL;
  if (n_inputs != program->n_inputs || n_params != program->n_params) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                           "the program takes %d inputs and %d parameters, got %d and %d", program->n_inputs,
                           program->n_params, n_inputs, n_params);
  }
  int device = n_params ? params[0]->spec.device : (n_inputs ? inputs[0]->spec.device : 0);
  for (int i = 0; i < n_inputs; i++) TTD_RETURN_IF_ERROR(check_operand(&program->values[i], inputs[i], "input", device));
  for (int i = 0; i < n_params; i++) {
    TTD_RETURN_IF_ERROR(check_operand(&program->values[ttd_program_param_value(program, i)], params[i], "parameter", device));
  }
  ttd_run *run = calloc(1, sizeof(*run));
  if (!run) return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  run->program = ttd_program_retain(program);
  run->device = device;
  run->values = calloc((size_t)program->n_values, sizeof(*run->values));
  run->saved = calloc((size_t)(2 * program->n_nodes + 1), sizeof(*run->saved));
  if (!run->values || !run->saved) {
    ttd_run_free(run);
    return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  }
  for (int i = 0; i < n_inputs; i++) run->values[i] = ttd_tensor_retain(inputs[i]);
  for (int i = 0; i < n_params; i++) run->values[program->n_inputs + i] = ttd_tensor_retain(params[i]);
  ttd_status_t status = TTD_OK;
  for (int i = 0; i < program->n_nodes && !status; i++) {
    const ttd_program_node *node = &program->nodes[i];
    const ttd_kshape *out_shape = &program->values[node->value].type.shape;
    status = make_tensor(backend, device, program->values[node->value].type.dtype, out_shape, &run->values[node->value]);
    if (!status) status = make_saved(backend, device, node, out_shape, &run->saved[2 * i]);
    if (status) break;
    ttd_node_call call = {.node = node, .output = run->values[node->value]->buffer, .output_shape = out_shape};
    for (int k = 0; k < node->n_inputs; k++) {
      call.inputs[k] = run->values[node->inputs[k]]->buffer;
      call.input_shapes[k] = &program->values[node->inputs[k]].type.shape;
    }
    for (int k = 0; k < 2; k++) call.saved[k] = run->saved[2 * i + k] ? run->saved[2 * i + k]->buffer : NULL;
    status = backend->vtable->run_node(backend, device, &call);
  }
  if (status) {
    ttd_run_free(run);
    return status;
  }
  *out_run = run;
  return TTD_OK;
}
