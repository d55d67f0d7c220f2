#include "device/program_run.h"

#include <stdlib.h>
#include <string.h>

#include "base/clock.h"

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

/* Whether operand value v, held as bfloat16, needs no float32 copy: it is no output of the
 * program, and every node input that reads it the backend takes as bfloat16. */
static bool read_as_bf16(ttd_backend *backend, const ttd_program *program, int v) {
  if (!backend->vtable->takes_bf16) return false;
  for (int o = 0; o < program->n_outputs; o++) {
    if (program->outputs[o] == v) return false;
  }
  for (int i = 0; i < program->n_nodes; i++) {
    const ttd_program_node *node = &program->nodes[i];
    for (int k = 0; k < node->n_inputs; k++) {
      if (node->inputs[k] == v && !backend->vtable->takes_bf16(backend, node, k)) return false;
    }
  }
  return true;
}

/* The tensor node input k reads: a bfloat16 input or parameter as it is where the backend
 * takes it so (also when other readers have it widened: the node's products are bfloat16
 * ones either way), else the run's value. */
static const ttd_tensor *input_of(ttd_backend *backend, const ttd_run *run, const ttd_program_node *node, int k) {
  int v = node->inputs[k];
  if (v < run->program->n_inputs + run->program->n_params) {
    const ttd_tensor *op = run->operands[v];
    if (op->spec.dtype == TTD_DTYPE_BFLOAT16 && backend->vtable->takes_bf16 && backend->vtable->takes_bf16(backend, node, k)) {
      return op;
    }
  }
  return run->values[v];
}

/* A tensor of the run: on its device, charged to its quota. */
static ttd_status_t make_tensor(ttd_backend *backend, const ttd_run *run, ttd_dtype dtype, const ttd_kshape *shape,
                                ttd_tensor **out) {
  ttd_tensor_spec spec = {.dtype = dtype, .ndim = shape->ndim, .device = run->device, .location = TTD_MEM_DRAM};
  memcpy(spec.shape, shape->d, sizeof(int64_t) * (size_t)shape->ndim);
  TTD_RETURN_IF_ERROR(ttd_tensor_spec_finish(&spec));
  return ttd_tensor_create(backend, run->quota, &spec, out);
}

/* What an op keeps for its backward: max_pool2d the argmax of each output element,
 * layer_norm the mean and rstd of each row. */
static ttd_status_t make_saved(ttd_backend *backend, const ttd_run *run, const ttd_program_node *node, const ttd_kshape *out_shape,
                               ttd_tensor **saved) {
  if (node->op == TTD_OP_MAX_POOL2D) return make_tensor(backend, run, TTD_DTYPE_INT32, out_shape, &saved[0]);
  if (node->op == TTD_OP_LAYER_NORM) {
    ttd_kshape rows = {.ndim = 1, .d = {ttd_kshape_numel(out_shape) / (out_shape->d[out_shape->ndim - 1] ? out_shape->d[out_shape->ndim - 1] : 1)}};
    TTD_RETURN_IF_ERROR(make_tensor(backend, run, TTD_DTYPE_FLOAT32, &rows, &saved[0]));
    return make_tensor(backend, run, TTD_DTYPE_FLOAT32, &rows, &saved[1]);
  }
  return TTD_OK;
}

/* Whether node's forward writes the relu of its value, for the next node to pass on. */
static bool relu_fused(ttd_backend *backend, const ttd_program_node *node) {
  return node->relu_next && backend->vtable->fuses_relu && backend->vtable->fuses_relu(backend, node);
}

/* Whether the backward of relu node i is done by node i + 1's, as it writes the gradient of
 * its x (the relu's output) masked by the relu's output. */
static bool relu_grad_fused(ttd_backend *backend, const ttd_program *program, int i) {
  const ttd_program_node *node = &program->nodes[i];
  return node->grad_next && i + 1 < program->n_nodes && backend->vtable->masks_relu_grad &&
         backend->vtable->masks_relu_grad(backend, &program->nodes[i + 1]);
}

/* The status of a run stopped by its flag, at node i of its `pass`; OK while the flag is clear. */
static ttd_status_t stopped(const ttd_run *run, int i, const char *pass) {
  const ttd_cancel *cancel = run->mode.cancel;
  int code = cancel ? atomic_load_explicit(&((ttd_cancel *)cancel)->code, memory_order_relaxed) : 0;
  if (!code) return TTD_OK;
  const ttd_program *p = run->program;
  if (i >= p->n_nodes) {
    return ttd_make_status((grpc_status_code)code, "stopped at the end of the %s (after all %d nodes)", pass, p->n_nodes);
  }
  return ttd_make_status((grpc_status_code)code, "stopped in the %s at node '%.128s' (%s, %d of %d)", pass,
                         p->values[p->nodes[i].value].name, ttd_op_name(p->nodes[i].op), i + 1, p->n_nodes);
}

/* A node's status, unless the flag stopped the run meanwhile (the node's outputs are then
 * garbage, and what it said of them means nothing). Takes status. */
static ttd_status_t node_status(const ttd_run *run, int i, const char *pass, ttd_status_t status) {
  ttd_status_t stop = stopped(run, i, pass);
  if (!stop) return status;
  ttd_status_free(status);
  return stop;
}

void ttd_run_free(ttd_run *run) {
  if (!run) return;
  for (int i = 0; run->values && i < run->program->n_values; i++) ttd_tensor_release(run->values[i]);
  for (int i = 0; run->saved && i < 2 * run->program->n_nodes; i++) ttd_tensor_release(run->saved[i]);
  for (int i = 0; run->operands && i < run->program->n_inputs + run->program->n_params; i++) {
    ttd_tensor_release(run->operands[i]);
  }
  free(run->operands);
  free(run->values);
  free(run->saved);
  ttd_program_release(run->program);
  ttd_quota_release(run->quota);
  free(run);
}

ttd_status_t ttd_run_forward(ttd_backend *backend, ttd_quota *quota, ttd_program *program, ttd_tensor *const *inputs, int n_inputs,
                             ttd_tensor *const *params, int n_params, ttd_run **out_run) {
  return ttd_run_forward_mode(backend, quota, program, inputs, n_inputs, params, n_params, NULL, out_run);
}

ttd_status_t ttd_run_forward_mode(ttd_backend *backend, ttd_quota *quota, ttd_program *program,
                                  ttd_tensor *const *inputs, int n_inputs, ttd_tensor *const *params, int n_params,
                                  const ttd_run_mode *mode, ttd_run **out_run) {
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
  run->quota = ttd_quota_retain(quota);
  if (mode) run->mode = *mode;
  run->values = calloc((size_t)program->n_values, sizeof(*run->values));
  run->saved = calloc((size_t)(2 * program->n_nodes + 1), sizeof(*run->saved));
  run->operands = calloc((size_t)(n_inputs + n_params + 1), sizeof(*run->operands));
  if (!run->values || !run->saved || !run->operands) {
    ttd_run_free(run);
    return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  }
  for (int i = 0; i < n_inputs; i++) run->operands[i] = ttd_tensor_retain(inputs[i]);
  for (int i = 0; i < n_params; i++) run->operands[n_inputs + i] = ttd_tensor_retain(params[i]);
  ttd_status_t status = TTD_OK;
  /* A bfloat16 operand is read as it is by the nodes that take it so (input_of); a float32
   * copy is made for the others, and for an output, once per run. */
  for (int i = 0; i < n_inputs + n_params && !status; i++) {
    ttd_tensor *op = run->operands[i];
    if (op->spec.dtype != TTD_DTYPE_BFLOAT16 || read_as_bf16(backend, program, i)) {
      run->values[i] = ttd_tensor_retain(op);
      continue;
    }
    status = make_tensor(backend, run, TTD_DTYPE_FLOAT32, &program->values[i].type.shape, &run->values[i]);
    if (!status) {
      status = backend->vtable->buffer_convert(backend, op->buffer, TTD_DTYPE_BFLOAT16, run->values[i]->buffer,
                                               TTD_DTYPE_FLOAT32, op->spec.numel);
    }
  }
  for (int i = 0; i < program->n_nodes && !status; i++) {
    const ttd_program_node *node = &program->nodes[i];
    const ttd_kshape *out_shape = &program->values[node->value].type.shape;
    if ((status = stopped(run, i, "forward"))) break;
    if (i > 0 && relu_fused(backend, &program->nodes[i - 1])) {
      /* This relu's input already holds its values (the linear's epilogue): passed on, the
       * same tensor; its backward's mask reads the same signs (relu(x) > 0 iff x > 0). */
      run->values[node->value] = ttd_tensor_retain(run->values[program->nodes[i - 1].value]);
      continue;
    }
    status = make_tensor(backend, run, program->values[node->value].type.dtype, out_shape, &run->values[node->value]);
    if (!status) status = make_saved(backend, run, node, out_shape, &run->saved[2 * i]);
    if (status) break;
    ttd_node_call call = {.node = node,
                          .output = run->values[node->value]->buffer,
                          .output_shape = out_shape,
                          .relu_epilogue = relu_fused(backend, node),
                          .mode = run->mode};
    for (int k = 0; k < node->n_inputs; k++) {
      const ttd_tensor *in = input_of(backend, run, node, k);
      call.inputs[k] = in->buffer;
      call.input_shapes[k] = &program->values[node->inputs[k]].type.shape;
      call.input_dtypes[k] = in->spec.dtype;
    }
    for (int k = 0; k < 2; k++) call.saved[k] = run->saved[2 * i + k] ? run->saved[2 * i + k]->buffer : NULL;
    int64_t began = run->mode.node_timed ? ttd_now_ns() : 0;
    status = node_status(run, i, "forward", backend->vtable->run_node(backend, device, &call));
    if (run->mode.node_timed) run->mode.node_timed(run->mode.node_timed_ctx, (int)node->op, false, ttd_now_ns() - began);
  }
  if (!status) status = stopped(run, program->n_nodes, "forward");
  run->mode.cancel = NULL; /* the caller's flag is for this call only */
  if (status) {
    ttd_run_free(run);
    return status;
  }
  *out_run = run;
  return TTD_OK;
}

/* grads[v] += contribution, adopting it when there is none yet. Takes the reference. */
static ttd_status_t add_grad(ttd_backend *backend, ttd_tensor **grads, int v, ttd_tensor *contribution) {
  if (!grads[v]) {
    grads[v] = contribution;
    return TTD_OK;
  }
  ttd_status_t status = backend->vtable->buffer_accumulate(backend, grads[v]->buffer, contribution->buffer);
  ttd_tensor_release(contribution);
  return status;
}

/* Whether the backward computes v's gradient: with input gradients wanted, every float value
 * reached from a parameter or a float input; without, only those reached from a parameter. */
static bool grad_needed(const ttd_program_value *v, bool input_grads) {
  return input_grads ? v->requires_grad : v->param_grad;
}

/* How a Backward treats each parameter's .grad: summed at the end from the gradient
 * buffers (the general way), or summed in place by the nodes themselves, which is one pass
 * less over it and no buffer. In place only where the backend can add that operand's
 * gradient and the .grad is known to be all zeros when the Backward first reaches it: the
 * first node then writes it, later ones add to it, and a Backward that stops puts it back
 * exactly (zeroes it again). The .grad's state (ttd_grad_state) is TTD_GRAD_SUMMING
 * meanwhile, so a ZeroGrad or an Upload from another thread cannot mark it zeros.
 * in_place[p]: parameter p's .grad is summed in place by this Backward. */

/* Whether input k of node i sums its gradient into its parameter's .grad (p: the
 * parameter's index, or -1); *first when the .grad still holds its zeros (written, not
 * added to). */
static bool grad_in_place(ttd_backend *backend, const ttd_run *run, int i, int k, int p, bool *in_place, bool *first) {
  const ttd_program *program = run->program;
  const ttd_program_node *node = &program->nodes[i];
  *first = false;
  if (p < 0 || !backend->vtable->backward_adds || !backend->vtable->backward_adds(backend, node, k)) return false;
  for (int j = 0; j < node->n_inputs; j++) {
    if (j != k && node->inputs[j] == node->inputs[k]) return false; /* x @ x: its gradients are summed at the end */
  }
  if (in_place[p]) return true;
  ttd_tensor *param = run->operands[program->n_inputs + p];
  pthread_mutex_lock(&param->train_lock);
  ttd_tensor *g = param->grad;
  bool ok = g && g->spec.dtype == TTD_DTYPE_FLOAT32 && g->spec.numel == param->spec.numel;
  for (int o = 0; ok && o < program->n_inputs + program->n_params; o++) {
    ok = run->operands[o] != g; /* a .grad the run also reads keeps its values until the end */
  }
  /* Claimed from TTD_GRAD_ZEROS (or zeros a ZeroGrad left to this Backward): a parameter
   * bound twice (one tensor for two of the program's parameters) is summed in place once,
   * and at the end for the other. */
  int zeros = TTD_GRAD_ZEROS, pending = TTD_GRAD_PENDING_ZEROS;
  ok = ok && (atomic_compare_exchange_strong(&g->grad_state, &zeros, TTD_GRAD_SUMMING) ||
              atomic_compare_exchange_strong(&g->grad_state, &pending, TTD_GRAD_SUMMING));
  pthread_mutex_unlock(&param->train_lock);
  in_place[p] = ok;
  *first = ok;
  return ok;
}

/* The index of the parameter whose value v is, or -1. */
static int param_index(const ttd_program *program, int v) {
  return v >= program->n_inputs && v < program->n_inputs + program->n_params ? v - program->n_inputs : -1;
}

static ttd_status_t node_backward(ttd_backend *backend, ttd_run *run, int i, ttd_tensor **grads, bool input_grads,
                                  bool *in_place) {
  const ttd_program *program = run->program;
  const ttd_program_node *node = &program->nodes[i];
  ttd_node_call call = {.node = node,
                        .output = run->values[node->value]->buffer,
                        .output_shape = &program->values[node->value].type.shape,
                        .output_grad = grads[node->value]->buffer,
                        .mode = run->mode};
  if (i > 0 && relu_grad_fused(backend, program, i - 1)) {
    call.relu_grad_mask = run->values[program->nodes[i - 1].value]->buffer; /* x's gradient, a node value's: written */
  }
  ttd_tensor *contrib[TTD_MAX_NODE_INPUTS] = {0};
  ttd_status_t status = TTD_OK;
  for (int k = 0; k < node->n_inputs && !status; k++) {
    const ttd_program_value *in = &program->values[node->inputs[k]];
    const ttd_tensor *held = input_of(backend, run, node, k);
    call.inputs[k] = held->buffer;
    call.input_shapes[k] = &in->type.shape;
    call.input_dtypes[k] = held->spec.dtype;
    if (!grad_needed(in, input_grads)) continue;
    int p = param_index(program, node->inputs[k]);
    bool first;
    if (grad_in_place(backend, run, i, k, p, in_place, &first)) {
      call.input_grads[k] = run->operands[program->n_inputs + p]->grad->buffer;
      if (!first) call.input_grads_add |= 1u << k;
      continue;
    }
    status = make_tensor(backend, run, TTD_DTYPE_FLOAT32, &in->type.shape, &contrib[k]);
    if (!status) call.input_grads[k] = contrib[k]->buffer;
  }
  for (int k = 0; k < 2; k++) call.saved[k] = run->saved[2 * i + k] ? run->saved[2 * i + k]->buffer : NULL;
  if (!status) {
    int64_t began = run->mode.node_timed ? ttd_now_ns() : 0;
    status = node_status(run, i, "backward", backend->vtable->run_node_backward(backend, run->device, &call));
    if (run->mode.node_timed) run->mode.node_timed(run->mode.node_timed_ctx, (int)node->op, true, ttd_now_ns() - began);
  }
  for (int k = 0; k < node->n_inputs; k++) {
    if (!contrib[k]) continue;
    if (status) ttd_tensor_release(contrib[k]);
    else status = add_grad(backend, grads, node->inputs[k], contrib[k]);
  }
  return status;
}

/* Accumulates g into the parameter's .grad, creating it on first use (zeroing it first where
 * a ZeroGrad left its zeros to this Backward). */
static ttd_status_t accumulate_param_grad(ttd_backend *backend, ttd_tensor *param, ttd_tensor *g) {
  ttd_status_t status = TTD_OK;
  pthread_mutex_lock(&param->train_lock);
  int pending = TTD_GRAD_PENDING_ZEROS;
  if (!param->grad) {
    param->grad = ttd_tensor_retain(g);
  } else {
    if (atomic_compare_exchange_strong(&param->grad->grad_state, &pending, TTD_GRAD_UNKNOWN)) {
      status = backend->vtable->buffer_zero(backend, param->grad->buffer);
    }
    if (!status) status = backend->vtable->buffer_accumulate(backend, param->grad->buffer, g->buffer);
  }
  int zeros = TTD_GRAD_ZEROS; /* a tensor summed in place meanwhile keeps TTD_GRAD_SUMMING */
  atomic_compare_exchange_strong(&param->grad->grad_state, &zeros, TTD_GRAD_UNKNOWN);
  pthread_mutex_unlock(&param->train_lock);
  return status;
}

/* The end of a Backward for the .grads it summed in place: their values when it went
 * through; zeros again when it stopped or failed. */
static ttd_status_t grads_in_place_end(ttd_backend *backend, const ttd_run *run, const bool *in_place, bool done) {
  ttd_status_t status = TTD_OK;
  for (int p = 0; p < run->program->n_params; p++) {
    if (!in_place[p]) continue;
    ttd_tensor *g = run->operands[run->program->n_inputs + p]->grad;
    atomic_store(&g->grad_state, TTD_GRAD_UNKNOWN);
    if (done) continue;
    ttd_status_t s = ttd_tensor_zero_grad(backend, g); /* zeros, as before the Backward */
    if (!status) status = s;
    else ttd_status_free(s);
  }
  return status;
}

ttd_status_t ttd_run_backward(ttd_run *run, ttd_backend *backend, ttd_tensor *const *output_grads,
                              ttd_tensor **out_param_grads, ttd_tensor **out_input_grads) {
  const ttd_program *program = run->program;
  for (int i = 0; i < program->n_outputs; i++) {
    if (!output_grads[i]) continue;
    const ttd_program_value *out = &program->values[program->outputs[i]];
    if (!out->requires_grad) {
      return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "output '%.128s' does not depend on any parameter or float input",
                             out->name);
    }
    ttd_program_value want = *out;
    want.type.dtype = TTD_DTYPE_FLOAT32;
    TTD_RETURN_IF_ERROR(check_operand(&want, output_grads[i], "gradient of output", run->device));
  }
  ttd_tensor **grads = calloc((size_t)program->n_values, sizeof(*grads));
  bool *in_place = calloc((size_t)program->n_params + 1, sizeof(bool));
  if (!grads || !in_place) {
    free(grads);
    free(in_place);
    return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  }
  ttd_status_t status = TTD_OK;
  for (int i = 0; i < program->n_outputs && !status; i++) {
    if (!output_grads[i]) continue;
    ttd_tensor *copy = NULL; /* never accumulate into the caller's tensor */
    status = make_tensor(backend, run, TTD_DTYPE_FLOAT32, &program->values[program->outputs[i]].type.shape, &copy);
    if (!status) status = backend->vtable->buffer_copy(backend, output_grads[i]->buffer, copy->buffer);
    if (!status) status = add_grad(backend, grads, program->outputs[i], copy);
    else ttd_tensor_release(copy);
  }
  for (int i = program->n_nodes - 1; i >= 0 && !status; i--) {
    int v = program->nodes[i].value;
    if ((status = stopped(run, i, "backward"))) break;
    if (!grads[v] || !grad_needed(&program->values[v], out_input_grads != NULL)) continue;
    if (relu_grad_fused(backend, program, i)) {
      /* The next node's backward wrote this relu's output's gradient masked: its input's. */
      int x = program->nodes[i].inputs[0];
      if (grad_needed(&program->values[x], out_input_grads != NULL)) {
        status = add_grad(backend, grads, x, ttd_tensor_retain(grads[v]));
      }
      continue;
    }
    status = node_backward(backend, run, i, grads, out_input_grads != NULL, in_place);
  }
  for (int i = 0; i < program->n_params && !status; i++) {
    ttd_tensor *g = grads[ttd_program_param_value(program, i)];
    ttd_tensor *param = run->operands[program->n_inputs + i]; /* the caller's, not a widened copy */
    out_param_grads[i] = NULL;
    if (g) status = accumulate_param_grad(backend, param, g);
    if (!status && (g || in_place[i])) out_param_grads[i] = ttd_tensor_retain(param->grad);
  }
  ttd_status_t ended = grads_in_place_end(backend, run, in_place, !status);
  if (!status) status = ended;
  else ttd_status_free(ended);
  for (int i = 0; out_input_grads && i < program->n_inputs; i++) {
    out_input_grads[i] = !status && grads[i] ? ttd_tensor_retain(grads[i]) : NULL;
  }
  for (int i = 0; i < program->n_values; i++) ttd_tensor_release(grads[i]);
  free(grads);
  free(in_place);
  return status;
}
