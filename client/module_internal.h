/* Internals of a module shared by module.c and optimizer.c; not installed. */
#ifndef TT_MODULE_INTERNAL_H
#define TT_MODULE_INTERNAL_H

#include "graph/program.h"
#include "client_internal.h"

/* What tt_step / tt_zero_grad queued: the step first, then the zeroing. */
typedef struct deferred_work {
  int step, zero;
  int adam;
  Ttd__V1__SgdOptions sgd;
  Ttd__V1__AdamOptions adam_options;
} deferred_work;

struct tt_module {
  atomic_int refs;          /* the user's, plus one per pending run's outputs */
  tt_client *client;
  Ttd__V1__Graph *graph;    /* owned copy (protobuf-c allocated) */
  ttd_program *local;       /* the graph compiled in process: shapes, and the CPU path */
  int n_params;
  tt_tensor **params;       /* where the module is */
  tt_place place;
  char device_name[24];
  uint64_t program;         /* the daemon's program handle; 0 until compiled there */
  int training;             /* forward keeps activations for backward (torch's train()) */
  uint64_t *grad_handles;   /* per parameter: its .grad on the daemon (0: none yet) */
  int pending_runs;         /* training forwards not yet backpropagated or released */
  tt_tensor **host_grads;   /* on "cpu": each parameter's .grad (NULL: none yet) */
  deferred_work deferred;   /* guarded by deferred_lock */
  tt_run_ref *waiting_backward; /* tt_backward left this run's Backward for the next Execute
                                 * (one reference), with backward_before queued before it;
                                 * guarded by deferred_lock */
  deferred_work backward_before;
  int queued;               /* in deferred_list (guarded by deferred_lock) */
  struct tt_module *next_queued;
  int loop_device;          /* trained on this card (a Backward reached it since tt_module_to): counted in
                             * client->training_loops[]; -1 otherwise */
};

/* Sends what is queued on the module (a step, a zeroing) now. */
tt_status tt_module_flush(tt_module *m);

/* Fills the options of an OptimizerStep request from an optimizer's settings. */
void tt_module_step_options(Ttd__V1__OptimizerStepRequest *req, int adam, Ttd__V1__SgdOptions *sgd,
                            Ttd__V1__AdamOptions *adam_options);

/* Queues a step (step 1, with its options) or a zeroing (step 0) on a module on a card. */
tt_status tt_module_defer_work(tt_module *m, int step, int adam, const Ttd__V1__SgdOptions *sgd,
                               const Ttd__V1__AdamOptions *adam_options);

#endif
