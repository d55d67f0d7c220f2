/* Parameter work on a session's tensors on the device: torch's optimizer.step() and
 * zero_grad(). Serves the OptimizerStep and ZeroGrad calls and the ttd.v1.ParameterWork that
 * rides on Execute and Backward (before the call's own work, or after a backward). Runs on the
 * device executor thread of the call, like every device work. */
#ifndef TTD_PARAMETER_WORK_H
#define TTD_PARAMETER_WORK_H

#include <stddef.h>
#include <stdint.h>

#include "rpc/call.h"
#include "ttd/v1/ttd.pb-c.h"

/* The zeros of a ZeroGrad queued before a Backward, left to that Backward: a .grad it writes
 * whole in place needs none, which spares a pass over it (torch's zero_grad(), backward(),
 * step()). Each .grad left so is TTD_GRAD_PENDING_ZEROS (device/tensor.h), its Upload lock
 * held; a .grad whose tensor the call reads (in `reads`: the run's operands, its output
 * gradients) is zeroed at once, as is one whose lock another call holds. */
typedef struct ttd_zero_defer {
  ttd_tensor *const *reads;
  size_t n_reads;
  ttd_tensor **grads; /* left to the Backward, one reference each */
  size_t n, cap;
} ttd_zero_defer;

/* After the Backward (whatever it returned): zeroes each .grad left to it that it did not
 * write, lets go of their locks and references. Returns the first failure to zero. */
ttd_status_t ttd_zero_defer_end(ttd_backend *backend, ttd_zero_defer *defer);

/* ZeroGrad of req's parameters: each .grad (where there is one) set to zero, counted in
 * *out_zeroed. NOT_FOUND for an unknown handle (the ones before it are zeroed). */
ttd_status_t ttd_zero_grad_handles(ttd_call *call, const Ttd__V1__ZeroGradRequest *req, uint64_t *out_zeroed);

/* OptimizerStep of req's parameters (options checked first), counted in *out_updated:
 * each tensor once (two handles of one tensor too), or none when a handle is unknown
 * (NOT_FOUND) or an Upload writes one or a Download reads one (FAILED_PRECONDITION).
 * Parameters without a .grad are skipped, as torch skips them. */
ttd_status_t ttd_optimizer_step_handles(ttd_call *call, const Ttd__V1__OptimizerStepRequest *req, uint64_t *out_updated);

/* A zeroed float32 tensor shaped like param, on its device and in its memory: one buffer of
 * its optimizer state (made on first use by a step, or by OptimizerState), charged to the
 * parameter's quota. One reference for the caller. */
ttd_status_t ttd_optimizer_state_create(ttd_backend *backend, const ttd_tensor *param, ttd_tensor **out_state);

/* What can be told of work (NULL: nothing) before it runs: its optimizer options and that
 * no parameter is listed twice. Backward checks its after-work so, before the backward
 * accumulates any gradient. */
ttd_status_t ttd_parameter_work_check(const Ttd__V1__ParameterWork *work, const char *where);

/* Runs work (NULL: nothing): its step, then its zero_grad. where names the moment for
 * messages ("before this Execute"); a failure keeps its code and says which part failed.
 * reached (n_reached tensors, may be NULL) stands for an empty parameter list: Backward's
 * after-work applies to the parameters the backward reached, each once (a tensor bound to
 * two of the program's parameters is listed twice). defer (NULL: none) takes the
 * zero_grad's zeros, for the Backward that follows (ttd_zero_defer). */
ttd_status_t ttd_parameter_work_run(ttd_call *call, const Ttd__V1__ParameterWork *work, const char *where,
                                    ttd_tensor *const *reached, size_t n_reached, ttd_zero_defer *defer);

/* The work of a call whose request carries a `free` field (Execute, Backward): fills response. */
typedef ttd_status_t (*ttd_freeing_work_fn)(ttd_call *call, const ProtobufCMessage *request,
                                            ProtobufCMessage *response);

/* Serves such a call: allocates a response of response_type from the call arena, runs work,
 * then frees the n handles of the request's `free` field (skipping those already gone)
 * whatever work returned. *out_response is set only when the call succeeds. */
ttd_status_t ttd_serve_freeing(ttd_call *call, const ProtobufCMessage *request,
                               const ProtobufCMessageDescriptor *response_type, ttd_freeing_work_fn work,
                               const uint64_t *handles, size_t n, ProtobufCMessage **out_response);

#endif
