/* Execute: a program forward on this session's tensors; outputs become new tensors. */
#include <stdlib.h>

#include "handlers.h"
#include "program_run.h"
#include "tensor_proto.h"
#include "ttd/v1/ttd.pb-c.h"

/* References to the tensors under handles, or NOT_FOUND; *out is calloc'd. */
static ttd_status_t lookup_all(ttd_session *session, const uint64_t *handles, size_t n, ttd_tensor ***out) {
  *out = calloc(n ? n : 1, sizeof(**out));
  if (!*out) return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  for (size_t i = 0; i < n; i++) TTD_RETURN_IF_ERROR(ttd_session_tensor_lookup(session, handles[i], &(*out)[i]));
  return TTD_OK;
}

static void release_all(ttd_tensor **tensors, size_t n) {
  for (size_t i = 0; tensors && i < n; i++) ttd_tensor_release(tensors[i]);
  free(tensors);
}

int ttd_device_of_execute(ttd_call *call, const ProtobufCMessage *request) {
  const Ttd__V1__ExecuteRequest *req = (const Ttd__V1__ExecuteRequest *)request;
  int device = ttd_session_device_of(call->session, req->parameters, req->n_parameters);
  return device >= 0 ? device : ttd_session_device_of(call->session, req->inputs, req->n_inputs);
}

ttd_status_t ttd_handle_execute(ttd_call *call, const ProtobufCMessage *request, ProtobufCMessage **out_response) {
  const Ttd__V1__ExecuteRequest *req = (const Ttd__V1__ExecuteRequest *)request;
  Ttd__V1__ExecuteResponse *resp = ttd_call_alloc(call, sizeof(*resp));
  TTD_CHECK_ALLOC(resp);
  ttd__v1__execute_response__init(resp);
  ttd_program *program = NULL;
  TTD_RETURN_IF_ERROR(ttd_session_program_lookup(call->session, req->program, &program));
  ttd_tensor **inputs = NULL, **params = NULL;
  ttd_run *run = NULL;
  ttd_status_t status = lookup_all(call->session, req->inputs, req->n_inputs, &inputs);
  if (!status) status = lookup_all(call->session, req->parameters, req->n_parameters, &params);
  if (!status) {
    status = ttd_run_forward(call->core->backend, call->session->quota, program, inputs, (int)req->n_inputs, params, (int)req->n_parameters, &run);
  }
  if (!status) {
    resp->n_outputs = (size_t)program->n_outputs;
    resp->outputs = ttd_call_alloc(call, sizeof(*resp->outputs) * (size_t)program->n_outputs);
    if (!resp->outputs) status = ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  }
  uint64_t *added = calloc((size_t)program->n_outputs + 1, sizeof(uint64_t));
  int n_added = 0;
  if (!added && !status) status = ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  for (int i = 0; !status && i < program->n_outputs; i++) {
    ttd_tensor *t = run->values[program->outputs[i]];
    uint64_t handle = 0;
    status = ttd_session_tensor_add(call->session, t, &handle);
    if (status) break;
    added[n_added++] = handle;
    resp->outputs[i] = ttd_tensor_info_to_proto(call, handle, &t->spec);
    if (!resp->outputs[i]) status = ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  }
  if (!status && req->keep_for_backward) {
    status = ttd_session_run_add(call->session, run, &resp->run); /* the session owns it now, even on error */
    run = NULL;
  }
  if (status && n_added) { /* a failed Execute leaves no outputs behind */
    uint64_t n, bytes;
    ttd_status_free(ttd_session_tensors_free(call->session, added, (size_t)n_added, &n, &bytes));
  }
  free(added);
  ttd_run_free(run);
  release_all(inputs, req->n_inputs);
  release_all(params, req->n_parameters);
  ttd_program_release(program);
  if (!status) *out_response = &resp->base;
  return status;
}
