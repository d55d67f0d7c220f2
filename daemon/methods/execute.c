/* Execute: a program forward on this session's tensors, in training or eval mode (eval,
 * dropout_step); outputs become new tensors. Small inputs may travel inline and outputs
 * come back inline when asked (inline_tensor.h); queued parameter work runs first and frees
 * ride along (parameter_work.h). */
#include <inttypes.h>
#include <stdlib.h>

#include "methods/methods.h"
#include "rpc/inline_tensor.h"
#include "methods/parameter_work.h"
#include "device/program_run.h"
#include "rpc/tensor_proto.h"
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
  if (device < 0) device = ttd_session_device_of(call->session, req->inputs, req->n_inputs);
  if (device < 0 && req->n_inline_inputs && req->inline_inputs[0]->spec) {
    ttd_status_free(ttd_core_parse_device(call->core, req->inline_inputs[0]->spec->device, &device));
  }
  return device;
}

/* The program's inputs in order: handles looked up, inline ones checked (not yet made: the
 * k-th 0 of req->inputs takes inline input k; specs[i] set where inputs[i] stays NULL). */
static ttd_status_t gather_inputs(ttd_call *call, const ttd_program *p, const Ttd__V1__ExecuteRequest *req,
                                  int *device, ttd_tensor **inputs, ttd_tensor_spec *specs) {
  size_t n_inline = req->n_inline_inputs;
  if (n_inline == 0) {
    for (size_t i = 0; i < req->n_inputs; i++) {
      TTD_RETURN_IF_ERROR(ttd_session_tensor_lookup(call->session, req->inputs[i], &inputs[i]));
    }
    return TTD_OK;
  }
  size_t zeros = 0;
  for (size_t i = 0; i < req->n_inputs; i++) zeros += req->inputs[i] == 0;
  if (req->n_inputs != 0 && req->n_inputs != (size_t)p->n_inputs) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                           "the program takes %d inputs, got %zu in inputs; list one handle per input (0 where it travels "
                           "inline) or leave inputs empty when all travel inline",
                           p->n_inputs, req->n_inputs);
  }
  if (req->n_inputs == 0 ? n_inline != (size_t)p->n_inputs : n_inline != zeros) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                           "%zu inline inputs given for %zu inputs marked inline (a 0 in inputs, or all %d inputs when "
                           "inputs is empty); give one inline input per 0",
                           n_inline, req->n_inputs == 0 ? (size_t)p->n_inputs : zeros, p->n_inputs);
  }
  for (size_t i = 0; i < req->n_inputs; i++) {
    if (req->inputs[i]) TTD_RETURN_IF_ERROR(ttd_session_tensor_lookup(call->session, req->inputs[i], &inputs[i]));
  }
  if (*device < 0) {
    for (int i = 0; i < p->n_inputs && *device < 0; i++) {
      if (inputs[i]) *device = inputs[i]->spec.device;
    }
  }
  if (*device < 0 && req->inline_inputs[0]->spec) {
    TTD_RETURN_IF_ERROR(ttd_core_parse_device(call->core, req->inline_inputs[0]->spec->device, device));
  }
  if (*device < 0) *device = 0;
  uint64_t total = 0;
  for (size_t i = 0, k = 0; i < (size_t)p->n_inputs; i++) {
    if (inputs[i]) continue;
    const ttd_program_value *want = &p->values[i];
    TTD_RETURN_IF_ERROR(ttd_inline_check(call->core, req->inline_inputs[k], &want->type, "inline input", (int)i,
                                         want->name, *device, &specs[i]));
    total += specs[i].nbytes;
    k++;
  }
  return ttd_inline_check_total(total, "inline inputs", "upload larger tensors and pass their handles");
}

/* The output mode, checked: inline outputs must fit the inline limit. */
static ttd_status_t check_output_mode(const ttd_program *p, Ttd__V1__OutputMode mode) {
  if (mode != TTD__V1__OUTPUT_MODE__OUTPUT_MODE_HANDLES && mode != TTD__V1__OUTPUT_MODE__OUTPUT_MODE_INLINE &&
      mode != TTD__V1__OUTPUT_MODE__OUTPUT_MODE_HANDLES_AND_INLINE) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                           "output_mode %d is unknown; use OUTPUT_MODE_HANDLES, OUTPUT_MODE_INLINE or "
                           "OUTPUT_MODE_HANDLES_AND_INLINE",
                           (int)mode);
  }
  if (mode == TTD__V1__OUTPUT_MODE__OUTPUT_MODE_HANDLES) return TTD_OK;
  uint64_t total = 0;
  for (int i = 0; i < p->n_outputs; i++) total += ttd_value_type_nbytes(&p->values[p->outputs[i]].type);
  return ttd_inline_check_total(total, "the program's outputs", "ask for OUTPUT_MODE_HANDLES and download them");
}

/* The Backward an Execute carries (the previous step's), run first and answered in the
 * Execute's response; it must be on the device the Execute was scheduled on. */
static ttd_status_t chained_backward(ttd_call *call, const ProtobufCMessage *request, Ttd__V1__ExecuteResponse *resp) {
  const Ttd__V1__ExecuteRequest *req = (const Ttd__V1__ExecuteRequest *)request;
  int run_device = ttd_session_run_device(call->session, req->backward->run);
  int device = ttd_device_of_execute(call, request);
  if (run_device >= 0 && device >= 0 && run_device != device) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                           "the Backward carried by this Execute is for a run on tt:%d but the Execute runs on tt:%d; "
                           "send that Backward on its own",
                           run_device, device);
  }
  ProtobufCMessage *answer = NULL;
  ttd_status_t status = ttd_method_backward(call, &req->backward->base, &answer);
  if (status) {
    ttd_status_t wrapped = ttd_make_status(ttd_status_code(status),
                                           "the Backward carried by this Execute failed, so the forward did not run: %s",
                                           ttd_status_message(status));
    ttd_status_free(status);
    return wrapped;
  }
  resp->backward = (Ttd__V1__BackwardResponse *)answer;
  return TTD_OK;
}

static ttd_status_t execute(ttd_call *call, const ProtobufCMessage *request, ProtobufCMessage *response) {
  const Ttd__V1__ExecuteRequest *req = (const Ttd__V1__ExecuteRequest *)request;
  Ttd__V1__ExecuteResponse *resp = (Ttd__V1__ExecuteResponse *)response;
  if (req->backward) TTD_RETURN_IF_ERROR(chained_backward(call, request, resp));
  TTD_RETURN_IF_ERROR(ttd_parameter_work_run(call, req->before, "queued before this Execute", NULL, 0, NULL));
  ttd_program *program = NULL;
  TTD_RETURN_IF_ERROR(ttd_session_program_lookup(call->session, req->program, &program));
  int n_in = program->n_inputs > (int)req->n_inputs ? program->n_inputs : (int)req->n_inputs;
  ttd_tensor **inputs = calloc((size_t)n_in + 1, sizeof(*inputs)), **params = NULL;
  ttd_tensor_spec *specs = calloc((size_t)n_in + 1, sizeof(*specs));
  ttd_run *run = NULL;
  Ttd__V1__OutputMode mode = req->output_mode;
  ttd_status_t status = inputs && specs ? TTD_OK : ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  int device = ttd_session_device_of(call->session, req->parameters, req->n_parameters);
  if (!status) status = gather_inputs(call, program, req, &device, inputs, specs);
  if (!status) status = lookup_all(call->session, req->parameters, req->n_parameters, &params);
  if (!status) status = check_output_mode(program, mode);
  for (size_t i = 0, k = 0; !status && req->n_inline_inputs && i < (size_t)program->n_inputs; i++) {
    if (inputs[i]) continue;
    status = ttd_inline_create(call, &specs[i], req->inline_inputs[k++], &inputs[i]);
  }
  int n_inputs = req->n_inline_inputs ? program->n_inputs : (int)req->n_inputs;
  /* The call's flag (set when its deadline passes or its session closes) stops the run. */
  ttd_run_mode run_mode = {.eval = req->eval,
                           .dropout_step = req->dropout_step,
                           .cancel = call->job.cancel,
                           .node_timed = ttd_metrics_record_node, /* its backward's nodes too: the run keeps it */
                           .node_timed_ctx = &call->core->metrics};
  /* No Upload rewrites an operand while the forward reads it, nor starts meanwhile. */
  if (!status && !(status = ttd_tensors_read_begin(inputs, n_inputs, "input"))) {
    status = ttd_tensors_read_begin(params, (int)req->n_parameters, "parameter");
    if (status) ttd_tensors_read_end(inputs, n_inputs);
  }
  if (!status) {
    status = ttd_run_forward_mode(call->core->backend, call->session->quota, program, inputs, n_inputs, params,
                                  (int)req->n_parameters, &run_mode, &run);
    ttd_tensors_read_end(inputs, n_inputs);
    ttd_tensors_read_end(params, (int)req->n_parameters);
  }
  if (!status) {
    resp->mode_applied = true;
    resp->n_outputs = (size_t)program->n_outputs;
    resp->outputs = ttd_call_alloc(call, sizeof(*resp->outputs) * (size_t)program->n_outputs);
    if (mode != TTD__V1__OUTPUT_MODE__OUTPUT_MODE_HANDLES) {
      resp->n_output_data = (size_t)program->n_outputs;
      resp->output_data = ttd_call_alloc(call, sizeof(*resp->output_data) * (size_t)(program->n_outputs + 1));
      if (!resp->output_data) status = ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
    }
    if (!resp->outputs) status = ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  }
  uint64_t *added = calloc((size_t)program->n_outputs + 1, sizeof(uint64_t));
  int n_added = 0;
  if (!added && !status) status = ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  for (int i = 0; !status && i < program->n_outputs; i++) {
    ttd_tensor *t = run->values[program->outputs[i]];
    uint64_t handle = 0;
    if (mode != TTD__V1__OUTPUT_MODE__OUTPUT_MODE_INLINE) {
      status = ttd_session_tensor_add(call->session, t, &handle);
      if (status) break;
      added[n_added++] = handle;
    }
    if (mode != TTD__V1__OUTPUT_MODE__OUTPUT_MODE_HANDLES) status = ttd_inline_read(call, t, &resp->output_data[i]);
    resp->outputs[i] = ttd_tensor_info_to_proto(call, handle, &t->spec);
    if (!status && !resp->outputs[i]) status = ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
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
  ttd_run_free(run); /* and with it the tensors made of inline inputs, unless the run is kept */
  release_all(inputs, (size_t)n_in);
  release_all(params, req->n_parameters);
  free(specs);
  ttd_program_release(program);
  return status;
}

/* execute, and when it fails after the Backward it carried ran: that Backward's answer is lost
 * with the call's, so the input gradients it added to the session (which no one could name)
 * are freed, and the message says the Backward took effect (its .grads summed, its work after
 * done, its run gone), so that no client sends it again. */
static ttd_status_t execute_answering(ttd_call *call, const ProtobufCMessage *request, ProtobufCMessage *response) {
  Ttd__V1__ExecuteResponse *resp = (Ttd__V1__ExecuteResponse *)response;
  ttd_status_t status = execute(call, request, response);
  const Ttd__V1__BackwardResponse *ran = resp->backward;
  if (!status || !ran) return status;
  for (size_t i = 0; i < ran->n_input_grads; i++) {
    uint64_t handle = ran->input_grads[i] ? ran->input_grads[i]->handle : 0, n, bytes;
    if (handle) ttd_status_free(ttd_session_tensors_free(call->session, &handle, 1, &n, &bytes));
  }
  ttd_status_t told = ttd_make_status(ttd_status_code(status),
                                      "%s (the Backward this Execute carried did run before: its gradients are summed "
                                      "into the .grads and its queued work is done; its input gradients are freed)",
                                      ttd_status_message(status));
  ttd_status_free(status);
  return told;
}

ttd_status_t ttd_method_execute(ttd_call *call, const ProtobufCMessage *request, ProtobufCMessage **out_response) {
  const Ttd__V1__ExecuteRequest *req = (const Ttd__V1__ExecuteRequest *)request;
  return ttd_serve_freeing(call, request, &ttd__v1__execute_response__descriptor, execute_answering, req->free,
                           req->n_free, out_response);
}
