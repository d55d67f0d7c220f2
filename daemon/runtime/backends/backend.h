/* Layer runtime/backends: the device interface and its implementations (sim/: the simulated
 * card), chosen by name in registry.c. Calls runtime/graph, runtime/base and kernels/.
 *
 * The device backend interface (IREE HAL style): a struct of function pointers plus the
 * backend's state. The RPC layer, sessions and tensors reach a card only through this,
 * so a tt-metal or GPU backend is one new folder beside sim/ and one line in
 * registry.c.
 *
 * Threading: every entry point may be called from any worker thread concurrently; a
 * backend synchronises its own state. A buffer is used by one call at a time for
 * writes; concurrent reads are allowed. */
#ifndef TTD_BACKEND_H
#define TTD_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "kernels.h"
#include "base/status.h"
#include "graph/tensor_spec.h"

/* "dram" / "l1" / "invalid". */
const char *ttd_memloc_name(ttd_memloc loc);

typedef struct ttd_device_memory {
  ttd_memloc location;
  uint64_t capacity_bytes;
  uint64_t used_bytes;
  /* Host bytes of freed buffers that sends still point into (see ttd_host_pin): not part
   * of used_bytes, back when the peer reads them or its connection closes. */
  uint64_t in_flight_bytes;
} ttd_device_memory;

/* A reference to the host memory behind a view (buffer_host_view) that outlives the
 * buffer: a send still on its way to a slow client keeps the host bytes it points into,
 * while the device's bytes go back when the buffer is freed. release drops it, from any
 * thread. */
typedef struct ttd_host_pin {
  void (*release)(struct ttd_host_pin *pin);
} ttd_host_pin;

typedef struct ttd_device_info {
  char kind[48];   /* "sim-wormhole-n150", ... */
  uint32_t cores;
  ttd_device_memory memory[TTD_MEM_COUNT]; /* [0] dram, [1] l1 */
} ttd_device_info;

/* Construction options; a backend uses what applies to it. */
typedef struct ttd_backend_options {
  int devices;          /* number of cards to expose */
  uint64_t dram_bytes;  /* per card, for simulated cards */
  uint64_t l1_bytes;
  int cores;            /* host threads standing in for a card's cores; 0 = all */
} ttd_backend_options;

typedef struct ttd_backend ttd_backend;
typedef struct ttd_backend_buffer ttd_backend_buffer; /* opaque; defined by each backend */

struct ttd_program_node;
struct ttd_kshape;

/* How a program runs, for the ops that differ between training and evaluation (dropout),
 * and when it must stop. All zero: training, dropout step 0, never stopped. */
typedef struct ttd_run_mode {
  bool eval;             /* torch's eval(): dropout passes its input (and its gradient) through */
  uint64_t dropout_step; /* training: with each dropout node's seed, picks that node's mask */
  /* The caller's cancellation flag (kernels/thread_pool.h), or NULL. A backend polls it at
   * least at chunk boundaries while a node runs, and returns soon after it is set (the
   * node's outputs then hold garbage); the caller checks it after each node. */
  const ttd_cancel *cancel;
  /* Where each node's wall time goes, or NULL: called after every node the run runs, forward
   * (backward false) and backward, with the node's op (a ttd_op) and its nanoseconds. */
  void (*node_timed)(void *ctx, int op, bool backward, int64_t ns);
  void *node_timed_ctx;
} ttd_run_mode;

/* One node of a program, forward, as the backend sees it: the node (op and attributes),
 * its operand buffers and shapes, its output buffer and shape, and scratch buffers the
 * op keeps for its backward (max_pool2d: argmax; layer_norm: mean and rstd). */
typedef struct ttd_node_call {
  const struct ttd_program_node *node;
  ttd_backend_buffer *inputs[3];
  const struct ttd_kshape *input_shapes[3];
  /* Each input's element type: float32 (int32 where the op takes indices), or bfloat16 where
   * takes_bf16 said the node reads it so. */
  ttd_dtype input_dtypes[3];
  ttd_backend_buffer *output;
  const struct ttd_kshape *output_shape;
  ttd_backend_buffer *saved[2];
  /* Backward only: the gradient of the output, and where to write each input's gradient
   * (NULL: not needed). Written, except input k's when bit k of input_grads_add is set: that
   * one is added to (only where backward_adds says the backend can). */
  ttd_backend_buffer *output_grad;
  ttd_backend_buffer *input_grads[3];
  unsigned input_grads_add;
  /* Forward only: the node's output is relu'd in place as it is written (the node's
   * relu_next, where fuses_relu says the backend can). */
  bool relu_epilogue;
  /* Backward only: the output of the relu before this node, or NULL: input 0's gradient is
   * zeroed where it is <= 0 as it is written, the relu's backward done here (the relu's
   * grad_next, where masks_relu_grad says the backend can). */
  ttd_backend_buffer *relu_grad_mask;
  ttd_run_mode mode; /* the run's, the same for its forward and backward */
} ttd_node_call;

typedef enum ttd_optimizer_kind { TTD_OPTIMIZER_SGD, TTD_OPTIMIZER_ADAM } ttd_optimizer_kind;

/* One parameter's optimizer update, in place (kernels.h defines the parameters). */
typedef struct ttd_optimizer_call {
  ttd_optimizer_kind kind;  /* TTD_OPTIMIZER_ADAM: Adam or AdamW (adam_params.decoupled) */
  ttd_sgd_params sgd;
  ttd_adam_params adam_params;
  int64_t step;             /* counts from 1 */
  ttd_backend_buffer *param, *grad, *state[2]; /* state: momentum, or Adam's m and v */
  ttd_dtype param_dtype;    /* float32, or bfloat16: updated in float32 and rounded back to
                             * nearest even; grad and state are float32 */
  int64_t n;                /* elements of each */
  bool zero_grad;           /* grad is also set to zeros, in the pass that reads it (a step that
                             * fails may leave it zeroed or not) */
  bool fresh_state;         /* state was made for this step: SGD's momentum buffer starts as the
                             * gradient, as torch's does when it has none (whatever step counts) */
} ttd_optimizer_call;

typedef struct ttd_backend_vtable {
  void (*destroy)(ttd_backend *backend);
  int (*device_count)(ttd_backend *backend);
  void (*device_info)(ttd_backend *backend, int device, ttd_device_info *out_info);
  /* Reserves `bytes` of `loc` on `device` and backs them. RESOURCE_EXHAUSTED when they
   * do not fit, naming device, location, bytes requested and bytes free. */
  ttd_status_t (*buffer_alloc)(ttd_backend *backend, int device, ttd_memloc loc, uint64_t bytes,
                               ttd_backend_buffer **out_buffer);
  void (*buffer_free)(ttd_backend *backend, ttd_backend_buffer *buffer);
  /* Host -> device and device -> host byte copies at an offset; the range must lie
   * inside the buffer (callers check). */
  ttd_status_t (*buffer_write)(ttd_backend *backend, ttd_backend_buffer *dst, uint64_t offset,
                               const void *src, uint64_t bytes);
  ttd_status_t (*buffer_read)(ttd_backend *backend, ttd_backend_buffer *src, uint64_t offset,
                              void *dst, uint64_t bytes);
  /* Optional (NULL entry allowed): the host address of bytes [offset, offset + bytes) when
   * the card's memory is mapped into the host (the simulated card), else NULL, and then
   * callers use buffer_read. Lets Download send tensor memory without a copy: the view
   * stays valid until *out_pin is released, even after buffer_free, which gives the
   * device's bytes back at once (a send stuck on a client that does not read cannot hold
   * the card; gRPC keeps a write's bytes until the peer drains its socket). */
  const void *(*buffer_host_view)(ttd_backend *backend, ttd_backend_buffer *buffer, uint64_t offset, uint64_t bytes,
                                  ttd_host_pin **out_pin);
  /* Optional (NULL entry allowed): the host address of the buffer's bytes [offset, offset +
   * bytes) for writing, when the card's memory is mapped into the host (the simulated card),
   * else NULL (callers use buffer_write). For filling a buffer no other call uses yet, such
   * as one read back from saved state straight from its file. */
  void *(*buffer_host_map)(ttd_backend *backend, ttd_backend_buffer *buffer, uint64_t offset, uint64_t bytes);
  /* Sets every byte of the buffer to zero on the device (fresh allocations must not show
   * another session's old data). */
  ttd_status_t (*buffer_zero)(ttd_backend *backend, ttd_backend_buffer *buffer);
  /* Device -> device copy of a whole buffer into one of the same size, across devices
   * and locations of this backend, with no host trip on a real card. */
  ttd_status_t (*buffer_copy)(ttd_backend *backend, ttd_backend_buffer *src,
                              ttd_backend_buffer *dst);
  /* Runs one program node on `device`; every buffer lives on that device. Data errors
   * (a label or index out of range) are INVALID_ARGUMENT naming the position. */
  ttd_status_t (*run_node)(ttd_backend *backend, int device, const ttd_node_call *call);
  /* The node's backward: input gradients from the output gradient and the forward's
   * operands, output and saved buffers. */
  ttd_status_t (*run_node_backward)(ttd_backend *backend, int device, const ttd_node_call *call);
  /* Optional (NULL: never): whether run_node_backward can add input `input`'s gradient to
   * its buffer rather than write it (ttd_node_call.input_grads_add), so that a parameter's
   * .grad is summed in place, with no gradient buffer and no buffer_accumulate pass. */
  bool (*backward_adds)(ttd_backend *backend, const struct ttd_program_node *node, int input);
  /* Optional (NULL: never): whether the node reads input `input` as bfloat16 when it is held
   * so, forward and backward (its products then bfloat16 ones: the other operand rounded,
   * sums in float32). A bfloat16 operand that every node reading it takes so is read as it
   * is; any other is widened to float32 once per run. */
  bool (*takes_bf16)(ttd_backend *backend, const struct ttd_program_node *node, int input);
  /* Optional (NULL: never): whether run_node applies a relu to the node's output as it
   * writes it (ttd_node_call.relu_epilogue), for a node whose relu_next is set. */
  bool (*fuses_relu)(ttd_backend *backend, const struct ttd_program_node *node);
  /* Optional (NULL: never): whether run_node_backward applies a relu's backward to input 0's
   * gradient as it writes it (ttd_node_call.relu_grad_mask), for a node after a relu whose
   * grad_next is set. */
  bool (*masks_relu_grad)(ttd_backend *backend, const struct ttd_program_node *node);
  /* dst += src, float32 elements, same size, same device. */
  ttd_status_t (*buffer_accumulate)(ttd_backend *backend, ttd_backend_buffer *dst, ttd_backend_buffer *src);
  ttd_status_t (*optimizer_step)(ttd_backend *backend, int device, const ttd_optimizer_call *call);
  /* dst = src converted element by element (float32 <-> bfloat16, round to nearest even),
   * n elements, on the device. */
  ttd_status_t (*buffer_convert)(ttd_backend *backend, ttd_backend_buffer *src, ttd_dtype src_dtype,
                                 ttd_backend_buffer *dst, ttd_dtype dst_dtype, uint64_t n);
  /* A call's turn on `device` has come and its work follows at once: the backend may wake
   * the device's cores now rather than at the first kernel. May be NULL. */
  void (*device_wake)(ttd_backend *backend, int device);
  /* How many programs of different sessions `device` runs at once, each on a share of its
   * cores (<= 1 or NULL: one at a time, on all of them). */
  int (*programs_at_once)(ttd_backend *backend, int device);
  /* Calls run(arg, i) for every i < n (n <= programs_at_once), together, each with the
   * device's parallel work inside it kept on its own share of the cores; returns when all
   * have returned. Needed where programs_at_once says more than one. */
  void (*run_together)(ttd_backend *backend, int device, size_t n, void (*run)(void *arg, size_t i), void *arg);
} ttd_backend_vtable;

/* Every backend's state struct starts with this. */
struct ttd_backend {
  const ttd_backend_vtable *vtable;
  const char *name;
};

/* Creates the backend registered under `name` ("sim"). INVALID_ARGUMENT for an unknown
 * name, listing the known ones. The caller owns *out_backend. */
ttd_status_t ttd_backend_create(const char *name, const ttd_backend_options *options,
                                ttd_backend **out_backend);

/* Accepts NULL. All buffers must have been freed. */
void ttd_backend_destroy(ttd_backend *backend);

/* Names of registered backends, comma-separated, for messages and --help. */
const char *ttd_backend_names(void);

#endif
