/* Backward, ReleaseRun, ZeroGrad and OptimizerStep: training on device-resident
 * parameters, which never leave the device. Backward takes output gradients inline too,
 * and runs queued parameter work before and after it (parameter_work.h). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "methods/methods.h"
#include "rpc/inline_tensor.h"
#include "methods/parameter_work.h"
#include "device/program_run.h"
#include "rpc/tensor_proto.h"
#include "ttd/v1/ttd.pb-c.h"

/* The session handle of param's .grad: the one given before if it still names it. */
static ttd_status_t grad_handle(ttd_session *session, ttd_tensor *param, uint64_t *out_handle) {
  pthread_mutex_lock(&param->train_lock);
  uint64_t handle = param->grad_handle;
  ttd_tensor *grad = param->grad;
  pthread_mutex_unlock(&param->train_lock);
  if (handle) {
    ttd_tensor *known = NULL;
    ttd_status_t looked = ttd_session_tensor_lookup(session, handle, &known);
    ttd_tensor_release(known);
    ttd_status_free(looked); /* NOT_FOUND: the user freed that handle, so a new one is issued */
    if (!looked && known == grad) {
      *out_handle = handle;
      return TTD_OK;
    }
  }
  TTD_RETURN_IF_ERROR(ttd_session_tensor_add(session, grad, out_handle));
  pthread_mutex_lock(&param->train_lock);
  param->grad_handle = *out_handle;
  pthread_mutex_unlock(&param->train_lock);
  return TTD_OK;
}

int ttd_device_of_backward(ttd_call *call, const ProtobufCMessage *request) {
  const Ttd__V1__BackwardRequest *req = (const Ttd__V1__BackwardRequest *)request;
  int device = ttd_session_run_device(call->session, req->run);
  return device >= 0 ? device : ttd_session_device_of(call->session, req->output_grads, req->n_output_grads);
}

/* ZeroGrad and OptimizerStep: where the first parameter lives. Their requests share the
 * layout of field 1 (repeated fixed64 parameters). */
int ttd_device_of_parameters(ttd_call *call, const ProtobufCMessage *request) {
  if (request->descriptor == &ttd__v1__zero_grad_request__descriptor) {
    const Ttd__V1__ZeroGradRequest *req = (const Ttd__V1__ZeroGradRequest *)request;
    return ttd_session_device_of(call->session, req->parameters, req->n_parameters);
  }
  const Ttd__V1__OptimizerStepRequest *req = (const Ttd__V1__OptimizerStepRequest *)request;
  return ttd_session_device_of(call->session, req->parameters, req->n_parameters);
}

/* The output gradients of a Backward: by handle (looked up) or inline (checked, then made
 * on the run's device and charged to the session). out_grads has one slot per output. */
static ttd_status_t gather_output_grads(ttd_call *call, const ttd_run *run, const Ttd__V1__BackwardRequest *req,
                                        ttd_tensor **out_grads) {
  const ttd_program *p = run->program;
  size_t n_inline = req->n_inline_output_grads;
  if (n_inline == 0 && req->n_output_grads != (size_t)p->n_outputs) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                           "the program has %d outputs, got %zu output gradients (use handle 0 for none)", p->n_outputs,
                           req->n_output_grads);
  }
  if (n_inline && (n_inline != (size_t)p->n_outputs || (req->n_output_grads && req->n_output_grads != (size_t)p->n_outputs))) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                           "the program has %d outputs, got %zu inline output gradients and %zu handles; give one entry "
                           "per output (an entry without a spec for none) and leave output_grads empty or one per output",
                           p->n_outputs, n_inline, req->n_output_grads);
  }
  ttd_tensor_spec *specs = calloc((size_t)p->n_outputs + 1, sizeof(*specs));
  if (!specs) return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  ttd_status_t status = TTD_OK;
  uint64_t total = 0;
  for (int i = 0; !status && i < p->n_outputs; i++) {
    uint64_t handle = i < (int)req->n_output_grads ? req->output_grads[i] : 0;
    const Ttd__V1__InlineTensor *wire = n_inline ? req->inline_output_grads[i] : NULL;
    const ttd_program_value *out = &p->values[p->outputs[i]];
    if (handle && wire && wire->spec) {
      status = ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                               "output %d ('%.128s') has a gradient by handle and one inline; give one", i, out->name);
    } else if (wire && wire->spec) {
      ttd_value_type want = out->type;
      want.dtype = TTD_DTYPE_FLOAT32; /* gradients are float32 */
      status = ttd_inline_check(call->core, wire, &want, "inline gradient of output", i, out->name, run->device, &specs[i]);
      total += specs[i].nbytes;
    }
  }
  if (!status) {
    status = ttd_inline_check_total(total, "inline output gradients", "upload larger ones and pass their handles");
  }
  for (int i = 0; !status && i < p->n_outputs; i++) {
    uint64_t handle = i < (int)req->n_output_grads ? req->output_grads[i] : 0;
    if (handle) status = ttd_session_tensor_lookup(call->session, handle, &out_grads[i]);
  }
  for (int i = 0; !status && n_inline && i < p->n_outputs; i++) {
    if (req->inline_output_grads[i]->spec) {
      status = ttd_inline_create(call, &specs[i], req->inline_output_grads[i], &out_grads[i]);
    }
  }
  free(specs);
  return status;
}

/* The tensors a Backward reads besides its gradients' zeros: the run's operands, then (one
 * reference each) the output gradients given by handle. */
static ttd_status_t call_reads(ttd_call *call, const ttd_run *run, const Ttd__V1__BackwardRequest *req,
                               ttd_tensor ***out_reads, size_t *out_n) {
  size_t n_operands = (size_t)(run->program->n_inputs + run->program->n_params);
  ttd_tensor **reads = calloc(n_operands + req->n_output_grads + 1, sizeof(*reads));
  if (!reads) return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  memcpy(reads, run->operands, n_operands * sizeof(*reads));
  size_t n = n_operands;
  for (size_t i = 0; i < req->n_output_grads; i++) {
    ttd_status_t missing = req->output_grads[i] ? ttd_session_tensor_lookup(call->session, req->output_grads[i], &reads[n])
                                                : NULL;
    if (req->output_grads[i] && !missing) n++;
    ttd_status_free(missing); /* gather_output_grads names it */
  }
  *out_reads = reads;
  *out_n = n;
  return TTD_OK;
}

static ttd_status_t backward(ttd_call *call, const ProtobufCMessage *request, ProtobufCMessage *response) {
  const Ttd__V1__BackwardRequest *req = (const Ttd__V1__BackwardRequest *)request;
  Ttd__V1__BackwardResponse *resp = (Ttd__V1__BackwardResponse *)response;
  ttd_run *run = NULL;
  TTD_RETURN_IF_ERROR(ttd_session_run_take(call->session, req->run, &run));
  const ttd_program *p = run->program;
  /* Queued work first, the chained work checked before any gradient accumulates; if either
   * fails the run goes as with any failed Backward. A queued zero_grad leaves its zeros to
   * this Backward where it writes those .grads whole (ttd_zero_defer). */
  ttd_status_t status = ttd_parameter_work_check(req->after, "after this Backward");
  ttd_zero_defer defer = {0};
  ttd_tensor **reads = NULL;
  size_t n_reads = 0;
  if (!status) status = call_reads(call, run, req, &reads, &n_reads);
  defer.reads = reads;
  defer.n_reads = n_reads;
  if (!status) status = ttd_parameter_work_run(call, req->before, "queued before this Backward", NULL, 0, &defer);
  ttd_tensor **out_grads = calloc((size_t)p->n_outputs + 1, sizeof(*out_grads));
  ttd_tensor **param_grads = calloc((size_t)p->n_params + 1, sizeof(*param_grads));
  ttd_tensor **input_grads = calloc((size_t)p->n_inputs + 1, sizeof(*input_grads));
  ttd_tensor **reached = calloc((size_t)p->n_params + 1, sizeof(*reached));
  if (!status && (!out_grads || !param_grads || !input_grads || !reached)) {
    status = ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  }
  if (!status) status = gather_output_grads(call, run, req, out_grads);
  int n_operands = p->n_inputs + p->n_params;
  /* No Upload rewrites an operand or an output gradient while the backward reads it. */
  if (!status && !(status = ttd_tensors_read_begin(run->operands, n_operands, "operand"))) {
    status = ttd_tensors_read_begin(out_grads, p->n_outputs, "output gradient");
    if (status) ttd_tensors_read_end(run->operands, n_operands);
  }
  if (!status) {
    run->mode.cancel = call->job.cancel; /* this call's deadline and session stop the backward */
    status = ttd_run_backward(run, call->core->backend, out_grads, param_grads, req->input_grads ? input_grads : NULL);
    run->mode.cancel = NULL;
    ttd_tensors_read_end(run->operands, n_operands);
    ttd_tensors_read_end(out_grads, p->n_outputs);
  }
  ttd_status_t zeroed = ttd_zero_defer_end(call->core->backend, &defer); /* before any step reads them */
  if (!status) status = zeroed;
  else ttd_status_free(zeroed);
  for (size_t i = (size_t)n_operands; i < n_reads; i++) ttd_tensor_release(reads[i]);
  free(reads);
  if (!status) {
    resp->n_parameter_grads = (size_t)p->n_params;
    resp->parameter_grads = ttd_call_alloc(call, sizeof(void *) * (size_t)(p->n_params + 1));
    if (!resp->parameter_grads) status = ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  }
  for (int i = 0; !status && i < p->n_params; i++) {
    uint64_t handle = 0;
    ttd_tensor *param = run->operands[p->n_inputs + i];
    ttd_tensor_spec spec = param->spec;
    spec.dtype = TTD_DTYPE_FLOAT32; /* gradients are float32, also of bfloat16 parameters */
    ttd_tensor_spec_finish(&spec);
    if (param_grads[i]) {
      status = grad_handle(call->session, param, &handle);
      reached[i] = param;
    }
    resp->parameter_grads[i] = ttd_tensor_info_to_proto(call, handle, &spec);
    if (!resp->parameter_grads[i]) status = ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  }
  /* The chained step before input gradients get handles: if it fails, none is left behind. */
  if (!status) status = ttd_parameter_work_run(call, req->after, "after this Backward", reached, (size_t)p->n_params, NULL);
  if (!status && req->input_grads) {
    resp->n_input_grads = (size_t)p->n_inputs;
    resp->input_grads = ttd_call_alloc(call, sizeof(void *) * (size_t)(p->n_inputs + 1));
    if (!resp->input_grads) status = ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
    for (int i = 0; !status && i < p->n_inputs; i++) {
      uint64_t handle = 0;
      ttd_tensor_spec spec = run->values[i]->spec;
      spec.dtype = TTD_DTYPE_FLOAT32; /* the gradient's, whatever the input's */
      status = ttd_tensor_spec_finish(&spec);
      if (!status && input_grads[i]) status = ttd_session_tensor_add(call->session, input_grads[i], &handle);
      resp->input_grads[i] = ttd_tensor_info_to_proto(call, handle, &spec);
      if (!resp->input_grads[i]) status = ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
    }
  }
  for (int i = 0; out_grads && i < p->n_outputs; i++) ttd_tensor_release(out_grads[i]);
  for (int i = 0; param_grads && i < p->n_params; i++) ttd_tensor_release(param_grads[i]);
  for (int i = 0; input_grads && i < p->n_inputs; i++) ttd_tensor_release(input_grads[i]);
  free(out_grads);
  free(param_grads);
  free(input_grads);
  free(reached);
  if (req->keep_run) {
    ttd_status_t put = ttd_session_run_put_back(call->session, req->run, run);
    if (!status) status = put;
    else ttd_status_free(put);
  } else {
    ttd_run_free(run); /* activations go now, as torch frees the graph after backward */
  }
  return status;
}

ttd_status_t ttd_method_backward(ttd_call *call, const ProtobufCMessage *request, ProtobufCMessage **out_response) {
  const Ttd__V1__BackwardRequest *req = (const Ttd__V1__BackwardRequest *)request;
  return ttd_serve_freeing(call, request, &ttd__v1__backward_response__descriptor, backward, req->free, req->n_free,
                           out_response);
}

ttd_status_t ttd_method_release_run(ttd_call *call, const ProtobufCMessage *request, ProtobufCMessage **out_response) {
  const Ttd__V1__ReleaseRunRequest *req = (const Ttd__V1__ReleaseRunRequest *)request;
  Ttd__V1__ReleaseRunResponse *resp = ttd_call_alloc(call, sizeof(*resp));
  TTD_CHECK_ALLOC(resp);
  ttd__v1__release_run_response__init(resp);
  ttd_run *run = NULL;
  TTD_RETURN_IF_ERROR(ttd_session_run_take(call->session, req->run, &run));
  ttd_run_free(run);
  *out_response = &resp->base;
  return TTD_OK;
}

ttd_status_t ttd_method_zero_grad(ttd_call *call, const ProtobufCMessage *request, ProtobufCMessage **out_response) {
  const Ttd__V1__ZeroGradRequest *req = (const Ttd__V1__ZeroGradRequest *)request;
  Ttd__V1__ZeroGradResponse *resp = ttd_call_alloc(call, sizeof(*resp));
  TTD_CHECK_ALLOC(resp);
  ttd__v1__zero_grad_response__init(resp);
  TTD_RETURN_IF_ERROR(ttd_zero_grad_handles(call, req, &resp->zeroed));
  *out_response = &resp->base;
  return TTD_OK;
}

ttd_status_t ttd_method_optimizer_step(ttd_call *call, const ProtobufCMessage *request, ProtobufCMessage **out_response) {
  const Ttd__V1__OptimizerStepRequest *req = (const Ttd__V1__OptimizerStepRequest *)request;
  Ttd__V1__OptimizerStepResponse *resp = ttd_call_alloc(call, sizeof(*resp));
  TTD_CHECK_ALLOC(resp);
  ttd__v1__optimizer_step_response__init(resp);
  TTD_RETURN_IF_ERROR(ttd_optimizer_step_handles(call, req, &resp->updated));
  *out_response = &resp->base;
  return TTD_OK;
}
