/* Backward, ReleaseRun, ZeroGrad and OptimizerStep: training on device-resident
 * parameters, which never leave the device. */
#include <inttypes.h>
#include <stdlib.h>

#include "handlers.h"
#include "program_run.h"
#include "tensor_proto.h"
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

static ttd_status_t lookup_grads(ttd_session *session, const uint64_t *handles, size_t n, ttd_tensor **out) {
  for (size_t i = 0; i < n; i++) {
    if (handles[i] == 0) continue;
    TTD_RETURN_IF_ERROR(ttd_session_tensor_lookup(session, handles[i], &out[i]));
  }
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

ttd_status_t ttd_handle_backward(ttd_call *call, const ProtobufCMessage *request, ProtobufCMessage **out_response) {
  const Ttd__V1__BackwardRequest *req = (const Ttd__V1__BackwardRequest *)request;
  Ttd__V1__BackwardResponse *resp = ttd_call_alloc(call, sizeof(*resp));
  TTD_CHECK_ALLOC(resp);
  ttd__v1__backward_response__init(resp);
  ttd_run *run = NULL;
  TTD_RETURN_IF_ERROR(ttd_session_run_take(call->session, req->run, &run));
  const ttd_program *p = run->program;
  ttd_status_t status = TTD_OK;
  if (req->n_output_grads != (size_t)p->n_outputs) {
    status = ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                             "the program has %d outputs, got %zu output gradients (use handle 0 for none)", p->n_outputs,
                             req->n_output_grads);
  }
  ttd_tensor **out_grads = calloc((size_t)p->n_outputs + 1, sizeof(*out_grads));
  ttd_tensor **param_grads = calloc((size_t)p->n_params + 1, sizeof(*param_grads));
  ttd_tensor **input_grads = calloc((size_t)p->n_inputs + 1, sizeof(*input_grads));
  if (!status && (!out_grads || !param_grads || !input_grads)) {
    status = ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  }
  if (!status) status = lookup_grads(call->session, req->output_grads, req->n_output_grads, out_grads);
  if (!status) status = ttd_run_backward(run, call->core->backend, out_grads, param_grads, req->input_grads ? input_grads : NULL);
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
    if (param_grads[i]) status = grad_handle(call->session, param, &handle);
    resp->parameter_grads[i] = ttd_tensor_info_to_proto(call, handle, &spec);
    if (!resp->parameter_grads[i]) status = ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  }
  if (!status && req->input_grads) {
    resp->n_input_grads = (size_t)p->n_inputs;
    resp->input_grads = ttd_call_alloc(call, sizeof(void *) * (size_t)(p->n_inputs + 1));
    if (!resp->input_grads) status = ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
    for (int i = 0; !status && i < p->n_inputs; i++) {
      uint64_t handle = 0;
      ttd_tensor_spec spec = run->values[i]->spec; /* float32, as the gradient */
      if (input_grads[i]) status = ttd_session_tensor_add(call->session, input_grads[i], &handle);
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
  if (req->keep_run) {
    ttd_status_t put = ttd_session_run_put_back(call->session, req->run, run);
    if (!status) status = put;
    else ttd_status_free(put);
  } else {
    ttd_run_free(run); /* activations go now, as torch frees the graph after backward */
  }
  if (!status) *out_response = &resp->base;
  return status;
}

ttd_status_t ttd_handle_release_run(ttd_call *call, const ProtobufCMessage *request, ProtobufCMessage **out_response) {
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

ttd_status_t ttd_handle_zero_grad(ttd_call *call, const ProtobufCMessage *request, ProtobufCMessage **out_response) {
  const Ttd__V1__ZeroGradRequest *req = (const Ttd__V1__ZeroGradRequest *)request;
  Ttd__V1__ZeroGradResponse *resp = ttd_call_alloc(call, sizeof(*resp));
  TTD_CHECK_ALLOC(resp);
  ttd__v1__zero_grad_response__init(resp);
  ttd_backend *backend = call->core->backend;
  for (size_t i = 0; i < req->n_parameters; i++) {
    ttd_tensor *param = NULL;
    TTD_RETURN_IF_ERROR(ttd_session_tensor_lookup(call->session, req->parameters[i], &param));
    ttd_status_t status = TTD_OK;
    pthread_mutex_lock(&param->train_lock);
    if (param->grad) {
      status = backend->vtable->buffer_zero(backend, param->grad->buffer);
      resp->zeroed++;
    }
    pthread_mutex_unlock(&param->train_lock);
    ttd_tensor_release(param);
    TTD_RETURN_IF_ERROR(status);
  }
  *out_response = &resp->base;
  return TTD_OK;
}

/* A zeroed float32 tensor shaped like t (optimizer state is float32 for any parameter). */
static ttd_status_t zeroed_like(ttd_backend *backend, const ttd_tensor *t, ttd_tensor **out) {
  if (*out) return TTD_OK;
  ttd_tensor_spec spec = t->spec;
  spec.dtype = TTD_DTYPE_FLOAT32;
  TTD_RETURN_IF_ERROR(ttd_tensor_spec_finish(&spec));
  return ttd_tensor_create_zeroed(backend, t->quota, &spec, out); /* charged like the parameter */
}

/* One parameter's step: its state is made on first use and lives with the parameter. */
static ttd_status_t step_param(ttd_backend *backend, ttd_tensor *param, ttd_optimizer_call *oc, int *out_updated) {
  *out_updated = 0;
  if (param->spec.dtype != TTD_DTYPE_FLOAT32 && param->spec.dtype != TTD_DTYPE_BFLOAT16) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "OptimizerStep updates float32 or bfloat16 parameters, got %s",
                           ttd_dtype_name(param->spec.dtype));
  }
  ttd_status_t status = TTD_OK;
  ttd_tensor *wide = NULL; /* a bfloat16 parameter is updated in float32, then rounded back */
  pthread_mutex_lock(&param->train_lock);
  if (param->grad) {
    int need_state = oc->adam ? 2 : (oc->sgd.momentum != 0.0f ? 1 : 0);
    for (int k = 0; k < need_state && !status; k++) status = zeroed_like(backend, param, &param->opt_state[k]);
    if (!status && param->spec.dtype == TTD_DTYPE_BFLOAT16) {
      status = zeroed_like(backend, param, &wide);
      if (!status) {
        status = backend->vtable->buffer_convert(backend, param->buffer, TTD_DTYPE_BFLOAT16, wide->buffer,
                                                 TTD_DTYPE_FLOAT32, param->spec.numel);
      }
    }
    if (!status) {
      oc->step = ++param->opt_step;
      oc->param = wide ? wide->buffer : param->buffer;
      oc->grad = param->grad->buffer;
      oc->state[0] = param->opt_state[0] ? param->opt_state[0]->buffer : NULL;
      oc->state[1] = param->opt_state[1] ? param->opt_state[1]->buffer : NULL;
      oc->n = (int64_t)param->spec.numel;
      status = backend->vtable->optimizer_step(backend, param->spec.device, oc);
      if (!status && wide) {
        status = backend->vtable->buffer_convert(backend, wide->buffer, TTD_DTYPE_FLOAT32, param->buffer,
                                                 TTD_DTYPE_BFLOAT16, param->spec.numel);
      }
      *out_updated = 1;
    }
  }
  pthread_mutex_unlock(&param->train_lock);
  ttd_tensor_release(wide);
  return status;
}

ttd_status_t ttd_handle_optimizer_step(ttd_call *call, const ProtobufCMessage *request, ProtobufCMessage **out_response) {
  const Ttd__V1__OptimizerStepRequest *req = (const Ttd__V1__OptimizerStepRequest *)request;
  Ttd__V1__OptimizerStepResponse *resp = ttd_call_alloc(call, sizeof(*resp));
  TTD_CHECK_ALLOC(resp);
  ttd__v1__optimizer_step_response__init(resp);
  ttd_optimizer_call oc = {0};
  if (req->optimizer_case == TTD__V1__OPTIMIZER_STEP_REQUEST__OPTIMIZER_SGD) {
    const Ttd__V1__SgdOptions *o = req->sgd;
    oc.sgd = (ttd_sgd_params){o->lr, o->momentum, o->dampening, o->weight_decay, o->nesterov};
    if (o->nesterov && (o->momentum <= 0.0f || o->dampening != 0.0f)) {
      return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "Nesterov momentum needs momentum > 0 and dampening 0");
    }
  } else if (req->optimizer_case == TTD__V1__OPTIMIZER_STEP_REQUEST__OPTIMIZER_ADAM) {
    const Ttd__V1__AdamOptions *o = req->adam;
    oc.adam = 1;
    oc.adam_params = (ttd_adam_params){o->lr, o->beta1 ? o->beta1 : 0.9f, o->beta2 ? o->beta2 : 0.999f,
                                       o->eps ? o->eps : 1e-8f, o->weight_decay, o->decoupled};
    if (oc.adam_params.beta1 >= 1.0f || oc.adam_params.beta2 >= 1.0f || oc.adam_params.beta1 < 0.0f ||
        oc.adam_params.beta2 < 0.0f) {
      return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "Adam betas must lie in [0, 1)");
    }
  } else {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "OptimizerStep needs an optimizer: set sgd or adam");
  }
  float lr = oc.adam ? oc.adam_params.lr : oc.sgd.lr;
  if (!(lr >= 0.0f)) return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "learning rate must be >= 0, got %g", (double)lr);
  for (size_t i = 0; i < req->n_parameters; i++) {
    ttd_tensor *param = NULL;
    TTD_RETURN_IF_ERROR(ttd_session_tensor_lookup(call->session, req->parameters[i], &param));
    int updated = 0;
    ttd_status_t status = step_param(call->core->backend, param, &oc, &updated);
    ttd_tensor_release(param);
    TTD_RETURN_IF_ERROR(status);
    resp->updated += (uint64_t)updated;
  }
  *out_response = &resp->base;
  return TTD_OK;
}
