/* The simulated card's node executor: each op's forward kernel from kernels/ on the host
 * memory standing for device memory, split over the simulated cores. */
#include <inttypes.h>
#include <string.h>

#include "graph/program.h"
#include "sim_internal.h"

/* The binary and unary ops map onto the kernels' enums by their offset from the first of
 * each (node->op - TTD_OP_ADD, node->op - TTD_OP_RELU). */
_Static_assert(TTD_OP_ADD - TTD_OP_ADD == TTD_BIN_ADD && TTD_OP_SUB - TTD_OP_ADD == TTD_BIN_SUB &&
                   TTD_OP_MUL - TTD_OP_ADD == TTD_BIN_MUL && TTD_OP_DIV - TTD_OP_ADD == TTD_BIN_DIV,
               "ttd_op's add..div must follow ttd_binary_op's order");
_Static_assert(TTD_OP_RELU - TTD_OP_RELU == TTD_UN_RELU && TTD_OP_GELU - TTD_OP_RELU == TTD_UN_GELU &&
                   TTD_OP_SIGMOID - TTD_OP_RELU == TTD_UN_SIGMOID && TTD_OP_TANH - TTD_OP_RELU == TTD_UN_TANH &&
                   TTD_OP_EXP - TTD_OP_RELU == TTD_UN_EXP && TTD_OP_LOG - TTD_OP_RELU == TTD_UN_LOG,
               "ttd_op's relu..log must follow ttd_unary_op's order");

/* The 0-d shape of a binary op's scalar operand (the node's `scalar` attribute). */
static const ttd_kshape scalar_shape = {0};

#define F(i) ((float *)call->inputs[i]->data)
/* An input that takes_bf16 may let through as bfloat16: its data and its element type. */
#define RAW(i) ((const void *)call->inputs[i]->data)
#define DT(i) (call->input_dtypes[i] == TTD_DTYPE_BFLOAT16 ? TTD_DTYPE_BFLOAT16 : TTD_DTYPE_FLOAT32)
#define I32(i) ((const int32_t *)call->inputs[i]->data)
#define OUT ((float *)call->output->data)

static ttd_status_t bad_index(const ttd_program_node *node, const char *what, int64_t at, int64_t value, int64_t limit) {
  return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "%s %s at position %" PRId64 " is %" PRId64 "; it must lie in [0, %" PRId64 ")",
                         ttd_op_name(node->op), what, at, value, limit);
}

/* The shapes of a matmul node: m, n, k, batch count and per-operand batch strides. */
typedef struct matmul_dims {
  int64_t m, n, k, batch, a_stride, b_stride;
} matmul_dims;

static matmul_dims matmul_dims_of(const ttd_node_call *call) {
  const ttd_kshape *s0 = call->input_shapes[0], *s1 = call->input_shapes[1], *os = call->output_shape;
  matmul_dims d;
  d.m = os->d[os->ndim - 2];
  d.n = os->d[os->ndim - 1];
  d.k = s0->d[s0->ndim - (call->node->attrs.transpose_a ? 2 : 1)];
  d.batch = 1; /* the output's leading dims: also where m or n is 0, whose gradients are zeros to write */
  for (int i = 0; i < os->ndim - 2; i++) d.batch *= os->d[i];
  d.a_stride = s0->ndim > 2 ? d.m * d.k : 0;
  d.b_stride = s1->ndim > 2 ? d.k * d.n : 0;
  return d;
}

static ttd_conv2d_params conv_params_of(const ttd_node_call *call) {
  const ttd_kshape *s0 = call->input_shapes[0], *s1 = call->input_shapes[1];
  const ttd_op_attrs *a = &call->node->attrs;
  ttd_conv2d_params p = {.n = s0->d[0], .c_in = s0->d[1], .h = s0->d[2], .w = s0->d[3], .c_out = s1->d[0],
                         .kh = s1->d[2], .kw = s1->d[3], .stride_h = a->stride[0], .stride_w = a->stride[1],
                         .pad_h = a->padding[0], .pad_w = a->padding[1]};
  ttd_conv2d_params_finish(&p);
  return p;
}

static ttd_pool2d_params pool_params_of(const ttd_node_call *call) {
  const ttd_kshape *s0 = call->input_shapes[0];
  const ttd_op_attrs *a = &call->node->attrs;
  ttd_pool2d_params p = {.n = s0->d[0], .c = s0->d[1], .h = s0->d[2], .w = s0->d[3], .kh = a->kernel[0],
                         .kw = a->kernel[1], .stride_h = a->stride[0], .stride_w = a->stride[1],
                         .pad_h = a->padding[0], .pad_w = a->padding[1]};
  ttd_pool2d_params_finish(&p);
  return p;
}

/* Rows of a last-axis op on s: the product of the leading dims (not numel / last dim, which
 * says 0 rows when the last dim is 0). */
static int64_t leading_rows(const ttd_kshape *s) {
  int64_t rows = 1;
  for (int i = 0; i + 1 < s->ndim; i++) rows *= s->d[i];
  return rows;
}

/* Rows and columns of a last-axis op (softmax, layer_norm). */
static void rows_cols(const ttd_node_call *call, int64_t *rows, int64_t *cols) {
  const ttd_kshape *s0 = call->input_shapes[0];
  *cols = s0->d[s0->ndim - 1];
  *rows = leading_rows(s0);
}

typedef ttd_status_t (*node_fn)(ttd_backend *backend, const ttd_node_call *call);
static ttd_status_t node_forward(ttd_backend *backend, const ttd_node_call *call);
static ttd_status_t node_backward(ttd_backend *backend, const ttd_node_call *call);

/* The kernels of one node run with the call's cancellation flag as their thread's. */
static ttd_status_t run_with_cancel(node_fn fn, ttd_backend *backend, const ttd_node_call *call) {
  const ttd_cancel *before = ttd_pool_cancel_enter(call->mode.cancel);
  ttd_status_t status = fn(backend, call);
  ttd_pool_cancel_enter(before);
  return status;
}

ttd_status_t ttd_sim_run_node(ttd_backend *backend, int device, const ttd_node_call *call) {
  (void)device;
  return run_with_cancel(node_forward, backend, call);
}

_Static_assert(TTD_KGRAD_ADD_A == 1 << 0 && TTD_KGRAD_ADD_B == 1 << 1 && TTD_KGRAD_ADD_BIAS == 1 << 2,
               "input_grads_add's bit k is input k's TTD_KGRAD_ADD_* flag for matmul and linear");

bool ttd_sim_backward_adds(ttd_backend *backend, const ttd_program_node *node, int input) {
  (void)backend;
  return (node->op == TTD_OP_LINEAR && input < 3) || (node->op == TTD_OP_MATMUL && input < 2);
}

bool ttd_sim_fuses_relu(ttd_backend *backend, const ttd_program_node *node) {
  (void)backend;
  return node->op == TTD_OP_LINEAR;
}

bool ttd_sim_masks_relu_grad(ttd_backend *backend, const ttd_program_node *node) {
  (void)backend;
  return node->op == TTD_OP_LINEAR;
}

bool ttd_sim_takes_bf16(ttd_backend *backend, const ttd_program_node *node, int input) {
  (void)backend;
  return (node->op == TTD_OP_LINEAR || node->op == TTD_OP_MATMUL) && input < 2;
}

ttd_status_t ttd_sim_run_node_backward(ttd_backend *backend, int device, const ttd_node_call *call) {
  (void)device;
  return run_with_cancel(node_backward, backend, call);
}

static ttd_status_t node_forward(ttd_backend *backend, const ttd_node_call *call) {
  ttd_pool *pool = ((sim_backend *)backend)->pool;
  const ttd_program_node *node = call->node;
  const ttd_op_attrs *a = &node->attrs;
  const ttd_kshape *s0 = call->input_shapes[0], *s1 = call->input_shapes[1], *os = call->output_shape;
  int64_t n_out = ttd_kshape_numel(os);
  switch (node->op) {
    case TTD_OP_MATMUL: {
      matmul_dims d = matmul_dims_of(call);
      if (d.batch == 0) return TTD_OK;
      ttd_k_matmul_dt(pool, RAW(0), DT(0), RAW(1), DT(1), NULL, OUT, d.batch, d.m, d.n, d.k, a->transpose_a, a->transpose_b,
                      d.a_stride, d.b_stride);
      return TTD_OK;
    }
    case TTD_OP_LINEAR: {
      int64_t in = s0->d[s0->ndim - 1], out = os->d[os->ndim - 1];
      ttd_k_linear_act_dt(pool, RAW(0), DT(0), RAW(1), DT(1), call->inputs[2] ? F(2) : NULL, call->relu_epilogue,
                          leading_rows(s0), in, out, OUT);
      return TTD_OK;
    }
    case TTD_OP_ADD: case TTD_OP_SUB: case TTD_OP_MUL: case TTD_OP_DIV: {
      ttd_binary_op op = (ttd_binary_op)(node->op - TTD_OP_ADD);
      if (!a->scalar_operand) ttd_k_binary(pool, op, F(0), s0, F(1), s1, OUT, os);
      else if (a->reverse) ttd_k_binary(pool, op, &a->scalar, &scalar_shape, F(0), s0, OUT, os);
      else ttd_k_binary(pool, op, F(0), s0, &a->scalar, &scalar_shape, OUT, os);
      return TTD_OK;
    }
    case TTD_OP_RELU: case TTD_OP_GELU: case TTD_OP_SIGMOID: case TTD_OP_TANH: case TTD_OP_EXP: case TTD_OP_LOG:
      ttd_k_unary(pool, (ttd_unary_op)(node->op - TTD_OP_RELU), F(0), OUT, n_out);
      return TTD_OK;
    case TTD_OP_SUM: case TTD_OP_MEAN:
      ttd_k_reduce(pool, node->op == TTD_OP_SUM ? TTD_RED_SUM : TTD_RED_MEAN, F(0), s0, a->axes_mask, OUT);
      return TTD_OK;
    case TTD_OP_RESHAPE: case TTD_OP_FLATTEN:
      memcpy(OUT, call->inputs[0]->data, call->output->bytes);
      return TTD_OK;
    case TTD_OP_TRANSPOSE: case TTD_OP_PERMUTE:
      ttd_k_permute(pool, F(0), s0, a->perm, OUT);
      return TTD_OK;
    case TTD_OP_SOFTMAX: case TTD_OP_LOG_SOFTMAX: {
      int64_t rows, cols;
      rows_cols(call, &rows, &cols);
      if (node->op == TTD_OP_SOFTMAX) ttd_k_softmax(pool, F(0), rows, cols, OUT);
      else ttd_k_log_softmax(pool, F(0), rows, cols, OUT);
      return TTD_OK;
    }
    case TTD_OP_CROSS_ENTROPY: {
      int64_t bad = 0;
      if (ttd_k_cross_entropy(pool, F(0), I32(1), s0->d[0], s0->d[1], OUT, &bad) != 0) {
        return bad_index(node, "label", bad, I32(1)[bad], s0->d[1]);
      }
      return TTD_OK;
    }
    case TTD_OP_MSE_LOSS:
      ttd_k_mse_loss(pool, F(0), F(1), ttd_kshape_numel(s0), OUT);
      return TTD_OK;
    case TTD_OP_L1_LOSS:
      ttd_k_l1_loss(pool, F(0), F(1), ttd_kshape_numel(s0), OUT);
      return TTD_OK;
    case TTD_OP_CONV2D: {
      ttd_conv2d_params p = conv_params_of(call);
      ttd_k_conv2d(pool, &p, F(0), F(1), call->inputs[2] ? F(2) : NULL, OUT);
      return TTD_OK;
    }
    case TTD_OP_MAX_POOL2D: case TTD_OP_AVG_POOL2D: {
      ttd_pool2d_params p = pool_params_of(call);
      if (node->op == TTD_OP_MAX_POOL2D) ttd_k_max_pool2d(pool, &p, F(0), OUT, (int32_t *)call->saved[0]->data);
      else ttd_k_avg_pool2d(pool, &p, F(0), OUT);
      return TTD_OK;
    }
    case TTD_OP_LAYER_NORM: {
      int64_t rows, cols;
      rows_cols(call, &rows, &cols);
      ttd_k_layer_norm(pool, F(0), call->inputs[1] ? F(1) : NULL, call->inputs[2] ? F(2) : NULL, rows, cols, a->eps, OUT,
                       (float *)call->saved[0]->data, (float *)call->saved[1]->data);
      return TTD_OK;
    }
    case TTD_OP_EMBEDDING: {
      int64_t bad = 0, n = ttd_kshape_numel(s0);
      if (ttd_k_embedding(pool, F(1), I32(0), n, s1->d[0], s1->d[1], OUT, &bad) != 0) {
        return bad_index(node, "index", bad, I32(0)[bad], s1->d[0]);
      }
      return TTD_OK;
    }
    case TTD_OP_DROPOUT:
      if (call->mode.eval) memcpy(OUT, call->inputs[0]->data, call->output->bytes);
      else ttd_k_dropout(pool, F(0), n_out, a->p, a->seed, call->mode.dropout_step, OUT);
      return TTD_OK;
    case TTD_OP_COUNT:
      break;
  }
  return ttd_make_status(GRPC_STATUS_INTERNAL, "sim backend: op %d has no kernel", (int)node->op);
}

#define DIN(i) (call->input_grads[i] ? (float *)call->input_grads[i]->data : NULL)
#define DY ((const float *)call->output_grad->data)
#define Y ((const float *)call->output->data)

static ttd_status_t node_backward(ttd_backend *backend, const ttd_node_call *call) {
  ttd_pool *pool = ((sim_backend *)backend)->pool;
  const ttd_program_node *node = call->node;
  const ttd_op_attrs *a = &node->attrs;
  const ttd_kshape *s0 = call->input_shapes[0], *s1 = call->input_shapes[1], *os = call->output_shape;
  int64_t n_out = ttd_kshape_numel(os);
  switch (node->op) {
    case TTD_OP_MATMUL: { /* input_grads_add bits 0 and 1 are TTD_KGRAD_ADD_A and _B */
      matmul_dims d = matmul_dims_of(call);
      ttd_k_matmul_backward_dt(pool, RAW(0), DT(0), RAW(1), DT(1), DY, d.batch, d.m, d.n, d.k, a->transpose_a,
                               a->transpose_b, d.a_stride, d.b_stride, DIN(0), DIN(1), call->input_grads_add);
      return TTD_OK;
    }
    case TTD_OP_LINEAR: { /* bits 0, 1, 2: x, weight, bias as TTD_KGRAD_ADD_A, _B, _BIAS */
      int64_t in = s0->d[s0->ndim - 1], out = os->d[os->ndim - 1];
      ttd_k_linear_backward_mask_dt(pool, RAW(0), DT(0), RAW(1), DT(1), DY, leading_rows(s0), in, out, DIN(0), DIN(1),
                                    DIN(2), call->input_grads_add,
                                    call->relu_grad_mask ? (const float *)call->relu_grad_mask->data : NULL);
      return TTD_OK;
    }
    case TTD_OP_ADD: case TTD_OP_SUB: case TTD_OP_MUL: case TTD_OP_DIV: {
      ttd_binary_op op = (ttd_binary_op)(node->op - TTD_OP_ADD);
      if (!a->scalar_operand) ttd_k_binary_backward(pool, op, F(0), s0, F(1), s1, DY, os, DIN(0), DIN(1));
      else if (a->reverse) ttd_k_binary_backward(pool, op, &a->scalar, &scalar_shape, F(0), s0, DY, os, NULL, DIN(0));
      else ttd_k_binary_backward(pool, op, F(0), s0, &a->scalar, &scalar_shape, DY, os, DIN(0), NULL);
      return TTD_OK;
    }
    case TTD_OP_RELU: case TTD_OP_GELU: case TTD_OP_SIGMOID: case TTD_OP_TANH: case TTD_OP_EXP: case TTD_OP_LOG:
      ttd_k_unary_backward(pool, (ttd_unary_op)(node->op - TTD_OP_RELU), F(0), Y, DY, DIN(0), n_out);
      return TTD_OK;
    case TTD_OP_SUM: case TTD_OP_MEAN:
      ttd_k_reduce_backward(pool, node->op == TTD_OP_SUM ? TTD_RED_SUM : TTD_RED_MEAN, DY, s0, a->axes_mask, DIN(0));
      return TTD_OK;
    case TTD_OP_RESHAPE: case TTD_OP_FLATTEN:
    {
      float *dx = DIN(0);
      if (dx) memcpy(dx, DY, call->output_grad->bytes);
      return TTD_OK;
    }
    case TTD_OP_TRANSPOSE: case TTD_OP_PERMUTE: {
      int inverse[TTD_MAX_DIMS];
      for (int i = 0; i < os->ndim; i++) inverse[a->perm[i]] = i;
      ttd_k_permute(pool, DY, os, inverse, DIN(0));
      return TTD_OK;
    }
    case TTD_OP_SOFTMAX: case TTD_OP_LOG_SOFTMAX: {
      int64_t rows, cols;
      rows_cols(call, &rows, &cols);
      if (node->op == TTD_OP_SOFTMAX) ttd_k_softmax_backward(pool, Y, DY, rows, cols, DIN(0));
      else ttd_k_log_softmax_backward(pool, Y, DY, rows, cols, DIN(0));
      return TTD_OK;
    }
    case TTD_OP_CROSS_ENTROPY:
      ttd_k_cross_entropy_backward(pool, F(0), I32(1), s0->d[0], s0->d[1], DY[0], DIN(0));
      return TTD_OK;
    case TTD_OP_MSE_LOSS:
      ttd_k_mse_loss_backward(pool, F(0), F(1), ttd_kshape_numel(s0), DY[0], DIN(0), DIN(1));
      return TTD_OK;
    case TTD_OP_L1_LOSS:
      ttd_k_l1_loss_backward(pool, F(0), F(1), ttd_kshape_numel(s0), DY[0], DIN(0), DIN(1));
      return TTD_OK;
    case TTD_OP_CONV2D: {
      ttd_conv2d_params p = conv_params_of(call);
      ttd_k_conv2d_backward(pool, &p, F(0), F(1), DY, DIN(0), DIN(1), DIN(2));
      return TTD_OK;
    }
    case TTD_OP_MAX_POOL2D: case TTD_OP_AVG_POOL2D: {
      ttd_pool2d_params p = pool_params_of(call);
      if (node->op == TTD_OP_MAX_POOL2D) {
        ttd_k_max_pool2d_backward(pool, &p, (const int32_t *)call->saved[0]->data, DY, DIN(0));
      } else {
        ttd_k_avg_pool2d_backward(pool, &p, DY, DIN(0));
      }
      return TTD_OK;
    }
    case TTD_OP_LAYER_NORM: {
      int64_t rows, cols;
      rows_cols(call, &rows, &cols);
      ttd_k_layer_norm_backward(pool, F(0), call->inputs[1] ? F(1) : NULL, (const float *)call->saved[0]->data,
                                (const float *)call->saved[1]->data, DY, rows, cols, DIN(0), DIN(1), DIN(2));
      return TTD_OK;
    }
    case TTD_OP_EMBEDDING:
      if (DIN(1)) ttd_k_embedding_backward(pool, I32(0), DY, ttd_kshape_numel(s0), s1->d[0], s1->d[1], DIN(1));
      return TTD_OK;
    case TTD_OP_DROPOUT: {
      float *dx = DIN(0);
      if (dx && call->mode.eval) memcpy(dx, DY, call->output_grad->bytes);
      else if (dx) ttd_k_dropout_backward(pool, DY, n_out, a->p, a->seed, call->mode.dropout_step, dx);
      return TTD_OK;
    }
    case TTD_OP_COUNT:
      break;
  }
  return ttd_make_status(GRPC_STATUS_INTERNAL, "sim backend: op %d has no backward kernel", (int)node->op);
}

ttd_status_t ttd_sim_buffer_accumulate(ttd_backend *backend, ttd_backend_buffer *dst, ttd_backend_buffer *src) {
  ttd_k_accumulate(((sim_backend *)backend)->pool, (float *)dst->data, (const float *)src->data,
                   (int64_t)(dst->bytes / sizeof(float)));
  return TTD_OK;
}

/* Never cancelled: the step is one short pass over its tensors, and a parameter half
 * updated would be worse than a late answer. */
ttd_status_t ttd_sim_optimizer_step(ttd_backend *backend, int device, const ttd_optimizer_call *call) {
  (void)device;
  ttd_pool *pool = ((sim_backend *)backend)->pool;
  void *param = call->param->data;
  float *grad = (float *)call->grad->data;
  ttd_dtype dtype = call->param_dtype == TTD_DTYPE_BFLOAT16 ? TTD_DTYPE_BFLOAT16 : TTD_DTYPE_FLOAT32;
  if (call->kind == TTD_OPTIMIZER_ADAM) {
    ttd_k_adam_step_dt(pool, &call->adam_params, call->step, param, dtype, grad, (float *)call->state[0]->data,
                       (float *)call->state[1]->data, call->n, call->zero_grad);
  } else {
    ttd_k_sgd_step_dt(pool, &call->sgd, call->fresh_state ? 1 : call->step, param, dtype, grad,
                      call->state[0] ? (float *)call->state[0]->data : NULL, call->n, call->zero_grad);
  }
  return TTD_OK;
}
