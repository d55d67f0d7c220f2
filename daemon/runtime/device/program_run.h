/* Running a compiled program forward on device tensors: every node's output becomes a
 * device tensor (accounted like any other), nodes run in order through the backend's
 * run_node. A run holds its values until it is released, and its mode (training or eval,
 * dropout step) for its backward. */
#ifndef TTD_PROGRAM_RUN_H
#define TTD_PROGRAM_RUN_H

#include "graph/program.h"
#include "device/tensor.h"

typedef struct ttd_run {
  ttd_program *program;  /* one reference */
  int device;
  ttd_quota *quota;      /* one reference: every tensor the run makes is charged here */
  ttd_tensor **values;   /* per program value, one reference each (NULL where not made);
                          * a bfloat16 input or parameter appears as itself where every node
                          * reading it takes it so (takes_bf16) and it is no output, else as a
                          * float32 copy (nodes that take it read the operand all the same) */
  ttd_tensor **operands; /* the caller's inputs then parameters, one reference each */
  ttd_tensor **saved;    /* per node, 2 slots: what the op keeps for its backward */
  ttd_run_mode mode;     /* the forward's; its backward runs in the same mode. mode.cancel is
                          * NULL once the forward returns: a caller sets it for the backward */
} ttd_run;

/* Checks inputs and parameters against the program (count, dtype, shape, one device) and
 * runs it. Values, saved activations and (in backward) gradients are charged to quota
 * (NULL: unaccounted). INVALID_ARGUMENT names the operand and what was expected. The caller owns
 * *out_run (ttd_run_free). */
ttd_status_t ttd_run_forward(ttd_backend *backend, ttd_quota *quota, ttd_program *program, ttd_tensor *const *inputs, int n_inputs,
                             ttd_tensor *const *params, int n_params, ttd_run **out_run);

/* The same in a mode (NULL: all zero, training at dropout step 0, as ttd_run_forward): in
 * eval mode dropout is the identity; in training, each dropout node's mask is drawn from its
 * seed and mode->dropout_step, so a caller that counts its training forwards gets a new mask
 * at each, reproducible from (seed, step) on any backend and thread count.
 * With mode->cancel, the run stops between nodes, and inside one at the backend's next
 * check, once the flag is set: it fails with the flag's code, a message naming the node it
 * stopped at, and leaves nothing behind (no run; everything it made is released). */
ttd_status_t ttd_run_forward_mode(ttd_backend *backend, ttd_quota *quota, ttd_program *program,
                                  ttd_tensor *const *inputs, int n_inputs, ttd_tensor *const *params, int n_params,
                                  const ttd_run_mode *mode, ttd_run **out_run);

void ttd_run_free(ttd_run *run); /* accepts NULL */

/* Reverse-mode differentiation of a run, in the forward's mode (the same dropout masks).
 * With run->mode.cancel set by the caller, it stops as the forward does, before any
 * gradient reaches a parameter's .grad (the run itself is kept for the caller to free).
 * output_grads has one entry per program output
 * (NULL: that output gets no gradient); each must match its output's dtype, shape and
 * device. Every parameter's gradient is accumulated into its .grad (as torch does) and
 * out_param_grads[i] gets a reference to that .grad (NULL when the parameter was not
 * reached). With out_input_grads, float inputs get their gradients too. */
ttd_status_t ttd_run_backward(ttd_run *run, ttd_backend *backend, ttd_tensor *const *output_grads,
                              ttd_tensor **out_param_grads, ttd_tensor **out_input_grads);

#endif
