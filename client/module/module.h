/* Layer client/module: graphs, modules (a compiled graph and its parameters, on "cpu" or a
 * card), their forward and backward runs, queued parameter work, and host autograd. Calls
 * only client/move, client/data, client/tensor, client/conn and the shared runtime. */
#ifndef TT_CLIENT_MODULE_H
#define TT_CLIENT_MODULE_H

#include <stdbool.h>

#include "device/program_run.h"
#include "graph/program.h"
#include "move/move.h"

/* ---- a graph under construction (graph.c); lifecycle.c turns it into a module ---- */

typedef enum tt_graph_value_kind {
  TT_GRAPH_INPUT,
  TT_GRAPH_PARAM,
  TT_GRAPH_NODE,
} tt_graph_value_kind;

typedef struct tt_graph_value {
  char *name;
  tt_graph_value_kind kind;
  tt_dtype dtype;
  int ndim;
  int64_t shape[TT_MAX_DIMS];
  tt_tensor *init; /* parameters: the initial host data */
} tt_graph_value;

struct tt_graph {
  tt_client *client;
  tt_graph_value *values;
  int n_values, cap_values;
  Ttd__V1__Node **nodes; /* owned; node i produces the value named like it */
  int n_nodes, cap_nodes;
  int *outputs;
  int n_outputs, cap_outputs;
  int layer_count[8]; /* per layer kind (graph.c), for parameter names */
  uint64_t rng;
};

/* ---- the module ---- */

typedef enum tt_optim_kind { TT_OPTIM_SGD, TT_OPTIM_ADAM } tt_optim_kind;

/* What tt_step / tt_zero_grad queued on a module on a card: the step first, then the zeroing. */
typedef struct tt_queued_work {
  bool step, zero;
  tt_optim_kind optim; /* the step's */
  Ttd__V1__SgdOptions sgd;
  Ttd__V1__AdamOptions adam;
} tt_queued_work;

typedef struct tt_run_ref tt_run_ref;

/* Programs of other input dims a module keeps (shapes.c), the least recently used evicted. */
#define TT_MODULE_SHAPES 8

/* The module's graph compiled for one set of input dims. */
typedef struct tt_module_program {
  ttd_program *local; /* compiled in process: output shapes, and the CPU path */
  uint64_t handle;    /* the daemon's program handle; 0 until compiled there */
  int64_t *dims;      /* the inputs' dims one after another (NULL: the graph's declared ones) */
  uint64_t used;      /* the module's forward count when a forward last chose it */
} tt_module_program;

struct tt_module {
  atomic_int refs;       /* the user's, plus one per pending run's outputs */
  uint64_t key;          /* this module among the process's: its parameters' and .grads' owner */
  tt_client *client;
  Ttd__V1__Graph *graph; /* owned copy (protobuf-c allocated) */
  ttd_program *local;    /* the graph compiled in process: names, counts, declared shapes */
  tt_module_program declared;                 /* local (not another reference) and its handle */
  tt_module_program shapes[TT_MODULE_SHAPES]; /* other input dims; n_shapes of them in use */
  int n_shapes;
  uint64_t forwards;     /* forwards begun: the clock of shapes[].used */
  uint64_t dropout_step; /* training forwards run, on a card and on "cpu": each draws its own
                          * dropout masks (ExecuteRequest.dropout_step) */
  int n_params;
  tt_tensor **params;    /* where the module is */
  uint64_t param_generation; /* bumped each time tt_module_to replaces params: optimizer state
                              * on a card stays with the tensors it was made beside */
  uint64_t param_version; /* bumped by each tt_step and tt_module_load: a run whose forward came
                           * before one is not backpropagated, as torch refuses it */
  tt_place place;
  char device_name[24];
  bool training;         /* forward keeps activations for backward (torch's train()) */
  uint64_t *grad_handles; /* per parameter: its .grad on the daemon (0: none yet) */
  int pending_runs;      /* training forwards not yet backpropagated or released */
  tt_tensor **host_grads; /* on "cpu": each parameter's .grad (NULL: none yet) */
  /* Guarded by param_work.c's lock: */
  tt_queued_work queued;        /* queued since the waiting Backward, if any */
  tt_run_ref *waiting_backward; /* tt_backward left this run's Backward for the next Execute
                                 * (one reference), with backward_before queued before it */
  tt_queued_work backward_before;
  bool listed;                  /* in the list of modules holding queued things */
  struct tt_module *next_listed;
  int loop_device; /* trained on this card (a Backward reached it since tt_module_to): counted in
                    * client->training_loops[]; -1 otherwise */
};

static inline tt_module *tt_module_retain(tt_module *m) {
  atomic_fetch_add(&m->refs, 1);
  return m;
}

/* ---- the queued parameter work (param_work.c) ---- */

/* A ParameterWork message with the storage it points into; release with tt_param_work_clear. */
typedef struct tt_param_work {
  Ttd__V1__ParameterWork work;
  Ttd__V1__OptimizerStepRequest step;
  Ttd__V1__ZeroGradRequest zero;
  Ttd__V1__SgdOptions sgd;
  Ttd__V1__AdamOptions adam;
  uint64_t *handles;
} tt_param_work;

/* Which work tt_module_queue_work queues. */
typedef enum tt_param_op { TT_PARAM_ZERO_GRAD, TT_PARAM_STEP } tt_param_op;

/* Points req at the optimizer's options: Adam's or SGD's. */
void tt_module_step_options(Ttd__V1__OptimizerStepRequest *req, tt_optim_kind optim, Ttd__V1__SgdOptions *sgd,
                            Ttd__V1__AdamOptions *adam);

/* Builds the ParameterWork message of queued into work for m's parameters; *out_work is NULL
 * when nothing is queued. */
tt_status tt_param_work_build(tt_module *m, tt_queued_work queued, tt_param_work *work,
                              Ttd__V1__ParameterWork **out_work);
void tt_param_work_clear(tt_param_work *work);

/* Moves the work queued on m into work (as tt_param_work_build). */
tt_status tt_module_take_work(tt_module *m, tt_param_work *work, Ttd__V1__ParameterWork **out_work);
/* Forgets the work queued on m since its waiting Backward (tt_module_free). */
void tt_module_drop_work(tt_module *m);

/* Queues op (a step with its optimizer's options) on m; false when it cannot follow what is
 * queued (a second step, a step after a zeroing): send that first. */
bool tt_module_try_queue_work(tt_module *m, tt_param_op op, tt_optim_kind optim, const Ttd__V1__SgdOptions *sgd,
                              const Ttd__V1__AdamOptions *adam);

/* Leaves ref's Backward (one more reference) on m, with the work queued so far before it;
 * false when a Backward is already waiting there: send that first. */
bool tt_module_try_park_backward(tt_module *m, tt_run_ref *ref);

/* Takes the Backward waiting on m (NULL: none; the caller gets its reference) and the work
 * queued before it. */
tt_run_ref *tt_module_take_waiting_backward(tt_module *m, tt_queued_work *before);

/* Up to max modules of client holding queued things, one reference each (tt_module_unref);
 * a module whose last reference is going is left out. */
int tt_module_list_queued(tt_client *client, tt_module **out_modules, int max);
/* The module of client with that key if it holds queued things, one reference; else NULL. */
tt_module *tt_module_find_queued(tt_client *client, uint64_t key);

/* Takes m out of that list: queued work dies with the parameters. */
void tt_module_unlist(tt_module *m);

/* ---- references and what goes with the last (refs.c) ---- */

/* Drops one internal reference of a module (runs hold one); tt_module_free is the user's. */
void tt_module_unref(tt_module *m);

/* Frees the daemon's handles of the parameters' .grad (they go with the parameters). */
void tt_module_release_grads(tt_module *m);

/* A backward of m on a card succeeded: in training mode it is in a training loop now. */
void tt_module_loop_enter(tt_module *m);

/* m moved or goes: it is in no training loop. */
void tt_module_loop_leave(tt_module *m);

/* ---- runs of a training forward and their Backward calls (run.c) ---- */

/* A daemon run kept for Backward, shared by the outputs of one training forward. */
struct tt_run_ref {
  tt_tensor_tie tie; /* the outputs' hold on it (tensor->run); first */
  atomic_int refs;
  tt_client *client;
  tt_module *module;
  ttd_program *program; /* its forward's (one reference): the outputs' shapes; NULL for a run
                         * only released */
  uint64_t run;        /* the daemon's run; 0 once backpropagated or released */
  ttd_run *local_run;  /* a module on "cpu": the in-process run; NULL once used */
  int n_outputs;
  uint64_t param_version; /* the module's when the forward ran */
  float **output_grads; /* host accumulators during tt_backward, then until its Backward is sent */
  bool backward_waiting; /* tt_backward left its Backward for the module's next Execute */
  bool keep;             /* retain_graph: the next Backward keeps the run for another */
  tt_tensor **grad_inputs; /* per input: the input (one reference) whose gradient the Backward
                            * returns (tt_tensor_set_requires_grad), or NULL; NULL if none does */
  int n_inputs;
};

static inline tt_run_ref *tt_run_ref_retain(tt_run_ref *ref) {
  atomic_fetch_add(&ref->refs, 1);
  return ref;
}

/* The run an output of a training forward holds (NULL for other tensors). */
static inline tt_run_ref *tt_tensor_run(const tt_tensor *t) { return (tt_run_ref *)t->run; }

/* A run shared by a training forward's outputs (run, or local_run on "cpu") of program (the
 * forward's, retained; NULL for a run only to release); one reference for the caller, one on
 * m. NULL (recorded) when out of memory. */
tt_run_ref *tt_run_ref_create(tt_module *m, ttd_program *program, int n_outputs, uint64_t run, ttd_run *local_run);

/* The last reference releases the daemon's run, or frees the in-process one. */
void tt_run_ref_release(tt_run_ref *ref);

/* Frees ref's in-process run: backpropagated, or never to be. */
void tt_run_ref_free_local(tt_run_ref *ref);

/* One Backward request for a run: the message, the storage of its gradients, and the
 * parameter work that runs before it (req.before points into it when set). */
typedef struct tt_backward_call {
  Ttd__V1__BackwardRequest req;
  struct backward_grads *grads;
  tt_param_work before;
} tt_backward_call;

/* Makes ref's Backward request from the output gradients accumulated in ref: inline when
 * they fit, else uploaded (freed by the Backward). bc->before is left to the caller. */
tt_status tt_backward_call_begin(tt_run_ref *ref, tt_backward_call *bc);

/* After the call that carried bc (a Backward, or an Execute when carried): with st OK,
 * records resp's gradient handles and accumulates its input gradients into ref's watched
 * inputs; the run counts as backpropagated unless the Backward kept it (keep_run) and
 * succeeded (a failed one is released, in case its Backward never ran or kept it), and bc
 * and ref's gradients are freed. Returns st, or why the input gradients were not taken. */
tt_status tt_backward_call_end(tt_run_ref *ref, tt_backward_call *bc, tt_status st, const Ttd__V1__BackwardResponse *resp,
                               bool carried);

/* Sends bc as a Backward call when st is OK (begin and the caller's work made it), then
 * ends it as tt_backward_call_end does; returns the call's status, or st. */
tt_status tt_backward_call_send(tt_run_ref *ref, tt_backward_call *bc, tt_status st);

/* Whether tt_backward may leave ref's Backward for its module's next Execute: on a card,
 * inline on, the gradients inline, and no input gradient asked for (they are wanted now). */
bool tt_backward_can_wait(const tt_run_ref *ref);

/* ---- gradients of a forward's inputs (input_grad.c) ---- */

/* Makes ref keep (one reference each) the inputs that require grad, for its Backward to
 * return their gradients; nothing when none does. */
tt_status tt_run_ref_watch_inputs(tt_run_ref *ref, tt_tensor *const *inputs, int n_inputs);

/* Drops ref's watched inputs. */
void tt_run_ref_unwatch_inputs(tt_run_ref *ref);

/* Accumulates g (taken; float32 of target's shape, at target's place) into target's .grad. */
tt_status tt_input_grad_add(tt_tensor *target, tt_tensor *g);

/* Accumulates the input gradients of a Backward answer into ref's watched inputs (handles of
 * inputs not watched are freed). */
tt_status tt_run_ref_take_input_grads(tt_run_ref *ref, const Ttd__V1__BackwardResponse *resp);

/* ---- sending what is deferred on a module (deferred.c) ---- */

/* Leaves ref's Backward (ref retained) for the module's next Execute, with the work queued
 * so far running before it; a Backward already waiting is sent first. */
tt_status tt_module_defer_backward(tt_module *m, tt_run_ref *ref);

/* Sends the Backward waiting on the module, if any, on its own. */
tt_status tt_module_flush_backward(tt_module *m);

/* Drops the Backward waiting on the module, if any, releasing its run on the card. */
void tt_module_cancel_backward(tt_module *m);

/* Sends m's waiting Backward, then its queued work as OptimizerStep and ZeroGrad calls. */
tt_status tt_module_flush(tt_module *m);

/* Queues op on a module on a card; work that cannot follow what is queued sends that first. */
tt_status tt_module_defer_work(tt_module *m, tt_param_op op, tt_optim_kind optim, const Ttd__V1__SgdOptions *sgd,
                               const Ttd__V1__AdamOptions *adam);

/* tt_to's hook (tt_to_set_pending_flush): sends queued work of tensor's client's modules
 * before tensor (a parameter or a .grad) is read or moved; OK at once for other tensors. */
tt_status tt_module_flush_pending(const tt_tensor *tensor);

/* ---- programs per input shape (shapes.c) ---- */

/* The program a forward of m on inputs (their count and place checked) runs: the declared
 * one for the declared dims, and for a dtype or rank other than declared (the run refuses
 * those with its usual message); else the one of the inputs' dims, from m's cache or
 * compiled now (on a card by the daemon's Compile, whose error names the node) and cached,
 * the least recently used of TT_MODULE_SHAPES evicted. NULL (recorded) on error. */
tt_module_program *tt_module_program_for(tt_module *m, tt_tensor *const *inputs, int n_inputs);

/* Compiles p on the daemon, unless it has its handle already. */
tt_status tt_module_program_on_card(tt_module *m, tt_module_program *p);

/* Lets go of m's programs of other dims (the declared one stays). */
void tt_module_programs_clear(tt_module *m);

/* ---- modules on "cpu": the in-process card (local.c) ---- */

/* Forward of program p on the in-process card, in the module's mode; a training forward's
 * outputs share its run. */
tt_status tt_module_forward_local(tt_module *m, const tt_module_program *p, tt_tensor *const *inputs, int n_inputs,
                                  tt_tensor **outputs);

/* Backward of an in-process run: accumulates the parameters' host gradients and frees the run. */
tt_status tt_module_backward_local(tt_module *m, tt_run_ref *ref);

/* ---- making, moving and reading a module (lifecycle.c) ---- */

/* The mode of m's next forward, the same on a card and on "cpu": eval when m is not
 * training; else training at m's next dropout step (counted). */
ttd_run_mode tt_module_next_mode(tt_module *m);

/* A tensor becoming one of m's parameters: on a card it needs its handle now (a deferred
 * tt_to is uploaded) and no host copy (optimizers write parameters in place). Takes t;
 * NULL (recorded) on failure. */
tt_tensor *tt_module_place_param(const tt_module *m, tt_tensor *t);

#endif
