/* Layer kernels/ (the bottom): the device kernels, forward and backward, and the thread pool
 * they run on. Calls nothing of ttd but proto/ttd/v1/protocol.h's limits.
 *
 * Device kernels, forward and backward: plain C functions over contiguous row-major
 * float32 buffers (int32 for labels and indices). The simulated card runs them on host
 * threads; the client's in-process CPU path runs the same functions.
 *
 * Conventions
 * - Outputs are overwritten, never accumulated: gradient accumulation is the caller's
 *   job (ttd_k_accumulate). Output buffers never alias inputs unless a function says so.
 * - A `pool` may be NULL (run on the calling thread); otherwise work is split across it.
 * - Shapes use ttd_kshape; a 0-d tensor has ndim 0 and one element.
 * - Functions that can meet bad data (labels or indices out of range) return 0 or a
 *   negative value and write the offending position to *out_bad_index; all others are void.
 * - Backward functions take the forward's inputs (and output where useful) and dy, and
 *   write the gradient of each input whose pointer is non-NULL.
 * - Hot loops are written to vectorize (restrict, contiguous inner loops); wider SIMD is
 *   picked at run time with target_clones where it pays, so the build runs on any x86-64. */
#ifndef TTD_KERNELS_H
#define TTD_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "thread_pool.h"
#include "ttd/v1/protocol.h"

typedef struct ttd_kshape {
  int ndim;
  int64_t d[TTD_MAX_DIMS];
} ttd_kshape;

/* Number of elements (1 for 0-d). */
int64_t ttd_kshape_numel(const ttd_kshape *s);

/* dst[i] += src[i]. */
void ttd_k_accumulate(ttd_pool *pool, float *restrict dst, const float *restrict src, int64_t n);

/* ---- elementwise binary with numpy broadcasting ---- */
typedef enum ttd_binary_op { TTD_BIN_ADD, TTD_BIN_SUB, TTD_BIN_MUL, TTD_BIN_DIV } ttd_binary_op;

/* Numpy broadcast of a and b into *out. Returns 0, or -1 if the shapes do not broadcast. */
int ttd_broadcast_shape(const ttd_kshape *a, const ttd_kshape *b, ttd_kshape *out);

/* out (shape os = broadcast of as and bs) = a op b. */
void ttd_k_binary(ttd_pool *pool, ttd_binary_op op, const float *a, const ttd_kshape *as, const float *b,
                  const ttd_kshape *bs, float *out, const ttd_kshape *os);
/* da (shape as) and db (shape bs), summing over broadcast dims. Either may be NULL. */
void ttd_k_binary_backward(ttd_pool *pool, ttd_binary_op op, const float *a, const ttd_kshape *as, const float *b,
                           const ttd_kshape *bs, const float *dy, const ttd_kshape *os, float *da, float *db);

/* ---- elementwise unary ---- */
typedef enum ttd_unary_op {
  TTD_UN_RELU,
  TTD_UN_GELU,    /* exact: x * Phi(x), with erf, as torch's default */
  TTD_UN_SIGMOID,
  TTD_UN_TANH,
  TTD_UN_EXP,
  TTD_UN_LOG,
} ttd_unary_op;

void ttd_k_unary(ttd_pool *pool, ttd_unary_op op, const float *x, float *y, int64_t n);
/* dx from x, y (the forward output) and dy. relu passes dy where x is not <= 0 (torch's
 * threshold_backward): relu'(0) = 0, and at a NaN input the gradient goes through. */
void ttd_k_unary_backward(ttd_pool *pool, ttd_unary_op op, const float *x, const float *y, const float *dy, float *dx,
                          int64_t n);

/* ---- reductions ---- */
typedef enum ttd_reduce_op { TTD_RED_SUM, TTD_RED_MEAN } ttd_reduce_op;

/* Reduces x over the dims whose bit is set in axes_mask (bit i = dim i). y has the shape
 * of x with those dims set to 1 (keepdim layout; the caller may drop them). */
void ttd_k_reduce(ttd_pool *pool, ttd_reduce_op op, const float *x, const ttd_kshape *xs, uint32_t axes_mask, float *y);
/* dx (shape xs) from dy (keepdim shape). */
void ttd_k_reduce_backward(ttd_pool *pool, ttd_reduce_op op, const float *dy, const ttd_kshape *xs, uint32_t axes_mask,
                           float *dx);

/* ---- layout ---- */
/* y = x with dims permuted: y.shape[i] = xs.d[perm[i]]. Backward is the inverse permutation. */
void ttd_k_permute(ttd_pool *pool, const float *x, const ttd_kshape *xs, const int *perm, float *y);

/* ---- softmax family, over the last axis: x is [rows, cols] ---- */
void ttd_k_softmax(ttd_pool *pool, const float *x, int64_t rows, int64_t cols, float *y);
void ttd_k_softmax_backward(ttd_pool *pool, const float *y, const float *dy, int64_t rows, int64_t cols, float *dx);
void ttd_k_log_softmax(ttd_pool *pool, const float *x, int64_t rows, int64_t cols, float *y);
void ttd_k_log_softmax_backward(ttd_pool *pool, const float *y, const float *dy, int64_t rows, int64_t cols, float *dx);

/* ---- losses (mean reduction, scalar output) ---- */
/* logits [n, c], labels int32 [n] in [0, c). Returns 0, or -1 with *out_bad_index = the
 * first sample whose label is out of range. Each label is read once, into a local, and
 * checked where it is used: a label another thread makes out of range during the call is
 * refused the same way, never followed. */
int ttd_k_cross_entropy(ttd_pool *pool, const float *logits, const int32_t *labels, int64_t n, int64_t c, float *loss,
                        int64_t *out_bad_index);
/* dlogits = dloss * (softmax - onehot) / n. */
void ttd_k_cross_entropy_backward(ttd_pool *pool, const float *logits, const int32_t *labels, int64_t n, int64_t c,
                                  float dloss, float *dlogits);
/* mean((a - b)^2) over n elements; backward gives da and/or db (NULL to skip). */
void ttd_k_mse_loss(ttd_pool *pool, const float *a, const float *b, int64_t n, float *loss);
void ttd_k_mse_loss_backward(ttd_pool *pool, const float *a, const float *b, int64_t n, float dloss, float *da, float *db);
/* mean(|a - b|); the subgradient at a == b is 0. */
void ttd_k_l1_loss(ttd_pool *pool, const float *a, const float *b, int64_t n, float *loss);
void ttd_k_l1_loss_backward(ttd_pool *pool, const float *a, const float *b, int64_t n, float dloss, float *da, float *db);

/* ---- matmul ---- */
/* For each of `batch` problems: C[m,n] = op(A) op(B), op(A) = A^T when trans_a (A stored
 * [k,m]), else A stored [m,k]; likewise B stored [k,n] or, with trans_b, [n,k].
 * a_batch_stride / b_batch_stride are element strides between problems; 0 broadcasts one
 * matrix to every problem. C is dense [batch, m, n]. */
void ttd_k_matmul(ttd_pool *pool, const float *a, const float *b, float *c, int64_t batch, int64_t m, int64_t n,
                  int64_t k, int trans_a, int trans_b, int64_t a_batch_stride, int64_t b_batch_stride);
/* The same, then bias[n] (or NULL) added to every row of C: a fused epilogue, the same bits
 * as adding it after the product. */
void ttd_k_matmul_bias(ttd_pool *pool, const float *a, const float *b, const float *bias, float *c, int64_t batch,
                       int64_t m, int64_t n, int64_t k, int trans_a, int trans_b, int64_t a_batch_stride,
                       int64_t b_batch_stride);
/* The path ttd_k_matmul and ttd_k_matmul_bias take now for a problem of these m and K and
 * these transposes, whatever n: "dot" (dot products of A's rows and B's columns, nothing
 * packed: A [m,k] against a transposed B, K up to 1024, on AVX2, as a linear's forward),
 * "rows" (the same layout on AVX-512 up to 192 rows of A: the product turned round, B's
 * rows read where they lie; the bits of "packed") or "packed" (the blocked GEMM). Never
 * NULL, static. */
const char *ttd_k_matmul_path(int64_t m, int64_t k, int trans_a, int trans_b);
/* The same with A and B in bfloat16 (bits as uint16_t, as the project stores them; the
 * strides count elements), C in float32, each product exact and summed in float32 (so C
 * matches the float32 matmul of the widened operands to float32 rounding). bias may be NULL.
 * On a CPU whose AVX-512 BF16 does more FLOPs than its float32 FMAs (ttd_k_bf16_dot_gain),
 * or with TTD_KERNEL_ISA=avx512bf16 on one that has it, it runs on vdpbf16ps (subnormal
 * operands and products count as zero there); elsewhere, or with TTD_KERNEL_ISA set to
 * "avx512", "avx2" or "generic", it widens the operands as it packs them and runs that ISA's
 * float32 micro-kernel; with TTD_KERNEL_ISA=generic-pairs, vdpbf16ps's arithmetic in
 * portable C. Thread-safe as
 * ttd_k_matmul; no allocation failure is reported (a tile falls back to a direct loop). */
void ttd_k_matmul_bf16(ttd_pool *pool, const uint16_t *a, const uint16_t *b, const float *bias, float *c,
                       int64_t batch, int64_t m, int64_t n, int64_t k, int trans_a, int trans_b,
                       int64_t a_batch_stride, int64_t b_batch_stride);
/* The path bfloat16 products take now: "avx512bf16", "generic-pairs" (the same arithmetic in
 * portable C, TTD_KERNEL_ISA=generic-pairs) or "float32" (widened). Never NULL, static. */
const char *ttd_k_matmul_bf16_path(void);
/* vdpbf16ps's FLOP rate over float32 FMAs' on this CPU, measured once (about 0.3 ms); 0
 * without AVX-512 BF16. bfloat16 products take it where this is at least 1.25. */
double ttd_k_bf16_dot_gain(void);
/* ttd_k_matmul_bias with each operand held as float32 or as bfloat16 bits (a_dtype, b_dtype:
 * TTD_DTYPE_FLOAT32 or TTD_DTYPE_BFLOAT16). Both float32: ttd_k_matmul_bias. Either
 * bfloat16: a bfloat16 product, as a card computes one: a float32 operand is rounded to
 * bfloat16 (nearest even) as it is read, and then as ttd_k_matmul_bf16. */
void ttd_k_matmul_dt(ttd_pool *pool, const void *a, ttd_dtype a_dtype, const void *b, ttd_dtype b_dtype,
                     const float *bias, float *c, int64_t batch, int64_t m, int64_t n, int64_t k, int trans_a,
                     int trans_b, int64_t a_batch_stride, int64_t b_batch_stride);
/* The same, then C = relu(C) where relu is non-zero: in each tile's epilogue, after the bias,
 * the bits of ttd_k_unary(TTD_UN_RELU) run after it (NaN and -0.0 kept). */
void ttd_k_matmul_act_dt(ttd_pool *pool, const void *a, ttd_dtype a_dtype, const void *b, ttd_dtype b_dtype,
                         const float *bias, int relu, float *c, int64_t batch, int64_t m, int64_t n, int64_t k,
                         int trans_a, int trans_b, int64_t a_batch_stride, int64_t b_batch_stride);
/* da and/or db for the same problem from dc [batch, m, n]; with a zero batch stride the
 * gradient is summed over the batch. */
void ttd_k_matmul_backward(ttd_pool *pool, const float *a, const float *b, const float *dc, int64_t batch, int64_t m,
                           int64_t n, int64_t k, int trans_a, int trans_b, int64_t a_batch_stride,
                           int64_t b_batch_stride, float *da, float *db);

/* Gradients a backward adds to instead of writing (a parameter's .grad, summed in place
 * with no separate pass): bits of the `add` argument of the *_backward_add kernels. */
enum { TTD_KGRAD_ADD_A = 1, TTD_KGRAD_ADD_B = 2, TTD_KGRAD_ADD_BIAS = 4 };
/* ttd_k_matmul_backward with da (TTD_KGRAD_ADD_A) and/or db (TTD_KGRAD_ADD_B) summed into:
 * each element becomes its old value plus the sum over K blocks in order. */
void ttd_k_matmul_backward_add(ttd_pool *pool, const float *a, const float *b, const float *dc, int64_t batch,
                               int64_t m, int64_t n, int64_t k, int trans_a, int trans_b, int64_t a_batch_stride,
                               int64_t b_batch_stride, float *da, float *db, unsigned add);
/* ttd_k_matmul_backward_add of ttd_k_matmul_dt's product: with either operand bfloat16, both
 * gradients are bfloat16 products too (dc rounded to bfloat16 as it is read), written or
 * added in float32. */
void ttd_k_matmul_backward_dt(ttd_pool *pool, const void *a, ttd_dtype a_dtype, const void *b, ttd_dtype b_dtype,
                              const float *dc, int64_t batch, int64_t m, int64_t n, int64_t k, int trans_a,
                              int trans_b, int64_t a_batch_stride, int64_t b_batch_stride, float *da, float *db,
                              unsigned add);
/* The same, then da's final values (after TTD_KGRAD_ADD_A's sum, where set) zeroed where
 * da_mask (or NULL), laid out as da is stored, is <= 0: the backward of a relu whose output
 * is da_mask and whose input is op(A), in the epilogue of each tile of da, the bits of
 * ttd_k_unary_backward's (a NaN passes its gradient). */
void ttd_k_matmul_backward_mask_dt(ttd_pool *pool, const void *a, ttd_dtype a_dtype, const void *b, ttd_dtype b_dtype,
                                   const float *dc, int64_t batch, int64_t m, int64_t n, int64_t k, int trans_a,
                                   int trans_b, int64_t a_batch_stride, int64_t b_batch_stride, float *da, float *db,
                                   unsigned add, const float *da_mask);

/* ---- linear: y[n,out] = x[n,in] W[out,in]^T + bias[out] (bias may be NULL) ---- */
void ttd_k_linear(ttd_pool *pool, const float *x, const float *w, const float *bias, int64_t n, int64_t in, int64_t out,
                  float *y);
void ttd_k_linear_backward(ttd_pool *pool, const float *x, const float *w, const float *dy, int64_t n, int64_t in,
                           int64_t out, float *dx, float *dw, float *dbias);
/* The same with dx (TTD_KGRAD_ADD_A), dw (TTD_KGRAD_ADD_B) and/or dbias (TTD_KGRAD_ADD_BIAS)
 * added to rather than written. */
void ttd_k_linear_backward_add(ttd_pool *pool, const float *x, const float *w, const float *dy, int64_t n, int64_t in,
                               int64_t out, float *dx, float *dw, float *dbias, unsigned add);
/* The same with x and w each held as float32 or bfloat16 (their products as ttd_k_matmul_dt
 * and ttd_k_matmul_backward_dt compute them); bias, dy and the gradients are float32. */
void ttd_k_linear_dt(ttd_pool *pool, const void *x, ttd_dtype x_dtype, const void *w, ttd_dtype w_dtype,
                     const float *bias, int64_t n, int64_t in, int64_t out, float *y);
/* ttd_k_linear_dt, then y = relu(y) where relu is non-zero (ttd_k_matmul_act_dt's epilogue):
 * a linear and the relu after it in one pass over y. */
void ttd_k_linear_act_dt(ttd_pool *pool, const void *x, ttd_dtype x_dtype, const void *w, ttd_dtype w_dtype,
                         const float *bias, int relu, int64_t n, int64_t in, int64_t out, float *y);
void ttd_k_linear_backward_dt(ttd_pool *pool, const void *x, ttd_dtype x_dtype, const void *w, ttd_dtype w_dtype,
                              const float *dy, int64_t n, int64_t in, int64_t out, float *dx, float *dw, float *dbias,
                              unsigned add);
/* The same with dx masked by dx_mask [n, in] (or NULL) as ttd_k_matmul_backward_mask_dt
 * masks da: x is the output of a relu, dx_mask that output, and dx then the gradient of the
 * relu's input, with no pass of its own. */
void ttd_k_linear_backward_mask_dt(ttd_pool *pool, const void *x, ttd_dtype x_dtype, const void *w, ttd_dtype w_dtype,
                                   const float *dy, int64_t n, int64_t in, int64_t out, float *dx, float *dw,
                                   float *dbias, unsigned add, const float *dx_mask);

/* ---- convolution and pooling, NCHW ---- */
typedef struct ttd_conv2d_params {
  int64_t n, c_in, h, w;    /* input */
  int64_t c_out, kh, kw;    /* weight [c_out, c_in, kh, kw] */
  int64_t stride_h, stride_w, pad_h, pad_w;
  int64_t out_h, out_w;     /* (h + 2 pad - k) / stride + 1; filled by ttd_conv2d_params_finish */
} ttd_conv2d_params;

/* Fills out_h/out_w. Returns 0, or -1 if the window does not fit (output size < 1) or a
 * stride is < 1 or a padding < 0. */
int ttd_conv2d_params_finish(ttd_conv2d_params *p);

/* Floats of one image's columns (c_in kh kw by out_h out_w) past which a convolution runs its
 * direct path, with no column buffer: 256 MiB, so the buffer is bounded whatever the window. */
#define TTD_CONV2D_COLUMNS_MAX ((int64_t)1 << 26)
/* How many times the direct path's multiply-adds count in a program's cost: they run at
 * about 1 GFLOP/s on the Zen 3 guest, against the GEMM path's 80-120. */
#define TTD_CONV2D_DIRECT_COST 64

/* Whether p's convolution runs the direct path: its columns pass TTD_CONV2D_COLUMNS_MAX (a
 * 1x1 kernel with stride 1 and no padding needs none). */
int ttd_conv2d_direct(const ttd_conv2d_params *p);

void ttd_k_conv2d(ttd_pool *pool, const ttd_conv2d_params *p, const float *x, const float *w, const float *bias,
                  float *y);
void ttd_k_conv2d_backward(ttd_pool *pool, const ttd_conv2d_params *p, const float *x, const float *w, const float *dy,
                           float *dx, float *dw, float *dbias);

typedef struct ttd_pool2d_params {
  int64_t n, c, h, w;
  int64_t kh, kw, stride_h, stride_w, pad_h, pad_w;
  int64_t out_h, out_w; /* filled by ttd_pool2d_params_finish */
} ttd_pool2d_params;

int ttd_pool2d_params_finish(ttd_pool2d_params *p);

/* max: argmax (int32, index into the input plane h*w, per output element) is written for
 * the backward. Padding cells never win. */
void ttd_k_max_pool2d(ttd_pool *pool, const ttd_pool2d_params *p, const float *x, float *y, int32_t *argmax);
void ttd_k_max_pool2d_backward(ttd_pool *pool, const ttd_pool2d_params *p, const int32_t *argmax, const float *dy,
                               float *dx);
/* avg: padding cells count in the divisor (torch's count_include_pad=True). */
void ttd_k_avg_pool2d(ttd_pool *pool, const ttd_pool2d_params *p, const float *x, float *y);
void ttd_k_avg_pool2d_backward(ttd_pool *pool, const ttd_pool2d_params *p, const float *dy, float *dx);

/* ---- layer_norm over the last dim: x [rows, cols], weight/bias [cols] (may be NULL) ----
 * mean and rstd [rows] are written for the backward. */
void ttd_k_layer_norm(ttd_pool *pool, const float *x, const float *weight, const float *bias, int64_t rows,
                      int64_t cols, float eps, float *y, float *mean, float *rstd);
void ttd_k_layer_norm_backward(ttd_pool *pool, const float *x, const float *weight, const float *mean,
                               const float *rstd, const float *dy, int64_t rows, int64_t cols, float *dx,
                               float *dweight, float *dbias);

/* ---- embedding: table [vocab, dim], indices int32 [n] -> y [n, dim] ----
 * Returns 0, or -1 with *out_bad_index = a position whose index is outside [0, vocab). Each
 * index is read once, into a local, and checked where it addresses the table (forward and
 * backward): one another thread changes during the call is refused (its row of y zeroed),
 * never followed. */
int ttd_k_embedding(ttd_pool *pool, const float *table, const int32_t *indices, int64_t n, int64_t vocab, int64_t dim,
                    float *y, int64_t *out_bad_index);
/* dtable (overwritten, zeros where no index points) from dy. */
void ttd_k_embedding_backward(ttd_pool *pool, const int32_t *indices, const float *dy, int64_t n, int64_t vocab,
                              int64_t dim, float *dtable);

/* ---- dropout: y = x * keep / (1 - p), keep drawn from (seed, step, element index) by a
 * counter-based hash: each step (one training forward) draws a new mask, and the backward
 * given the forward's seed and step regenerates it. p in [0, 1). ---- */
void ttd_k_dropout(ttd_pool *pool, const float *x, int64_t n, float p, uint64_t seed, uint64_t step, float *y);
void ttd_k_dropout_backward(ttd_pool *pool, const float *dy, int64_t n, float p, uint64_t seed, uint64_t step,
                            float *dx);

/* ---- optimizers, in place on parameters (state buffers start zeroed) ---- */
typedef struct ttd_sgd_params {
  float lr, momentum, dampening, weight_decay;
  bool nesterov;
} ttd_sgd_params;
/* torch.optim.SGD semantics; `step` counts from 1 (momentum buffer starts as the grad).
 * zero_grad: grad is also set to zeros, in the same pass (step() then zero_grad()). */
void ttd_k_sgd_step(ttd_pool *pool, const ttd_sgd_params *p, int64_t step, float *param, float *grad,
                    float *momentum_buf, int64_t n, bool zero_grad);
/* The same with param held as float32 or bfloat16 (param_dtype): a bfloat16 parameter is
 * widened, updated in float32 and rounded back to nearest even, in one pass over it (the bits
 * of widening it whole, ttd_k_sgd_step, and narrowing it back). */
void ttd_k_sgd_step_dt(ttd_pool *pool, const ttd_sgd_params *p, int64_t step, void *param, ttd_dtype param_dtype,
                       float *grad, float *momentum_buf, int64_t n, bool zero_grad);

typedef struct ttd_adam_params {
  float lr, beta1, beta2, eps, weight_decay;
  bool decoupled; /* AdamW (decoupled weight decay); false: Adam (L2 added to the grad) */
} ttd_adam_params;
/* torch.optim.Adam / AdamW semantics with bias correction; `step` counts from 1;
 * zero_grad as for SGD. */
void ttd_k_adam_step(ttd_pool *pool, const ttd_adam_params *p, int64_t step, float *param, float *grad, float *m,
                     float *v, int64_t n, bool zero_grad);
/* The same with param float32 or bfloat16, as ttd_k_sgd_step_dt. */
void ttd_k_adam_step_dt(ttd_pool *pool, const ttd_adam_params *p, int64_t step, void *param, ttd_dtype param_dtype,
                        float *grad, float *m, float *v, int64_t n, bool zero_grad);

#endif
