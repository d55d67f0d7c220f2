/* The ops a graph may use: for each, its name, its arity, the attributes it accepts and
 * its shape and dtype inference. Used by the graph compiler; the executor dispatches on
 * ttd_op. */
#ifndef TTD_OPS_H
#define TTD_OPS_H

#include <stdbool.h>
#include <stdint.h>

#include "dtype.h"
#include "kernels.h"
#include "base/status.h"
#include "ttd/v1/ttd.pb-c.h"

typedef enum ttd_op {
  TTD_OP_MATMUL, TTD_OP_LINEAR, TTD_OP_ADD, TTD_OP_SUB, TTD_OP_MUL, TTD_OP_DIV,
  TTD_OP_RELU, TTD_OP_GELU, TTD_OP_SIGMOID, TTD_OP_TANH, TTD_OP_EXP, TTD_OP_LOG,
  TTD_OP_SUM, TTD_OP_MEAN, TTD_OP_RESHAPE, TTD_OP_TRANSPOSE, TTD_OP_PERMUTE, TTD_OP_FLATTEN,
  TTD_OP_SOFTMAX, TTD_OP_LOG_SOFTMAX, TTD_OP_CROSS_ENTROPY, TTD_OP_MSE_LOSS, TTD_OP_L1_LOSS,
  TTD_OP_CONV2D, TTD_OP_MAX_POOL2D, TTD_OP_AVG_POOL2D, TTD_OP_LAYER_NORM, TTD_OP_EMBEDDING,
  TTD_OP_DROPOUT,
  TTD_OP_COUNT
} ttd_op;

/* Parsed attributes; each op reads the fields it declares. */
typedef struct ttd_op_attrs {
  int transpose_a, transpose_b;       /* matmul */
  bool scalar_operand;                /* add, sub, mul, div of one input and `scalar`: */
  bool reverse;                       /* x op scalar, or with reverse scalar op x */
  float scalar;
  uint32_t axes_mask;                 /* sum, mean */
  int keepdim;
  int perm[TTD_MAX_DIMS];            /* permute, transpose */
  int64_t kernel[2], stride[2], padding[2]; /* conv2d, pools */
  float eps;                          /* layer_norm */
  float p;                            /* dropout */
  uint64_t seed;
  int start_dim;                      /* flatten */
} ttd_op_attrs;

/* A value as the compiler sees it. */
typedef struct ttd_value_type {
  ttd_dtype dtype;
  ttd_kshape shape;
} ttd_value_type;

/* Looks an op up by name; -1 if unknown. */
int ttd_op_lookup(const char *name);
const char *ttd_op_name(ttd_op op);

/* Checks arity and attributes of a node and infers its output type. Errors are
 * INVALID_ARGUMENT naming the node, its op and the reason. */
ttd_status_t ttd_op_infer(ttd_op op, const Ttd__V1__Node *node, const ttd_value_type *const *inputs, int n_inputs,
                          ttd_op_attrs *out_attrs, ttd_value_type *out_type);

/* An estimate of the arithmetic one forward of the node costs, in operations (a
 * multiply-add counts two): the output's elements times the work behind each (the inner
 * dimension of a product, a convolution's receptive field, a pool's window), and at least
 * the elements read or written. An order of magnitude, for refusing programs too big to run
 * in bounded time; inputs and out as ttd_op_infer saw and made them. */
double ttd_op_cost(ttd_op op, const ttd_op_attrs *attrs, const ttd_value_type *const *inputs, int n_inputs,
                   const ttd_value_type *out);

/* "[2, 3, 4]" into buf. */
const char *ttd_kshape_format(const ttd_kshape *s, char *buf, size_t len);

#endif
