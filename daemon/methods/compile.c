/* Compile: a graph into a program handle of this session, with inferred specs. */
#include <inttypes.h>

#include "methods/methods.h"
#include "telemetry/log.h"
#include "work/program_cache.h"
#include "ttd/v1/ttd.pb-c.h"

static Ttd__V1__ValueSpec **specs_to_proto(ttd_call *call, const ttd_program *p, const int *values, int n) {
  Ttd__V1__ValueSpec **list = ttd_call_alloc(call, sizeof(*list) * (size_t)(n ? n : 1));
  if (!list) return NULL;
  for (int i = 0; i < n; i++) {
    const ttd_program_value *v = &p->values[values ? values[i] : i];
    Ttd__V1__ValueSpec *spec = ttd_call_alloc(call, sizeof(*spec));
    int64_t *shape = ttd_call_alloc(call, sizeof(int64_t) * TTD_MAX_DIMS);
    if (!spec || !shape) return NULL;
    ttd__v1__value_spec__init(spec);
    spec->name = v->name;
    spec->dtype = (Ttd__V1__DType)v->type.dtype;
    spec->n_shape = (size_t)v->type.shape.ndim;
    for (int d = 0; d < v->type.shape.ndim; d++) shape[d] = v->type.shape.d[d];
    spec->shape = shape;
    list[i] = spec;
  }
  return list;
}

/* A program whose forward would cost more than max operations holds the card for longer
 * than any deadline or kill can cut short: refused, naming its costliest node. */
static ttd_status_t check_cost(const ttd_program *p, double max) {
  if (p->cost <= max) return TTD_OK;
  const ttd_program_node *n = &p->nodes[p->costliest];
  return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED,
                         "the program's forward costs about %.3g operations, more than this ttd runs in one program "
                         "(--max-program-cost %.3g): node '%.128s' (%s) alone costs %.3g; split the work into "
                         "smaller programs, or ask the operator to raise the bound",
                         p->cost, max, p->values[n->value].name, ttd_op_name(n->op), p->costliest_cost);
}

ttd_status_t ttd_method_compile(ttd_call *call, const ProtobufCMessage *request, ProtobufCMessage **out_response) {
  const Ttd__V1__CompileRequest *req = (const Ttd__V1__CompileRequest *)request;
  Ttd__V1__CompileResponse *resp = ttd_call_alloc(call, sizeof(*resp));
  TTD_CHECK_ALLOC(resp);
  ttd__v1__compile_response__init(resp);
  ttd_program *program = NULL;
  bool cached = false;
  TTD_RETURN_IF_ERROR(ttd_program_cache_get(&call->core->programs, call->principal.tenant, req->graph, &program, &cached));
  uint64_t handle = 0;
  ttd_status_t status = check_cost(program, (double)call->core->config->max_program_cost);
  if (!status) status = ttd_session_program_add(call->session, program, &handle);
  if (!status) {
    resp->program = handle;
    resp->cached = cached;
    resp->n_inputs = (size_t)program->n_inputs;
    resp->inputs = specs_to_proto(call, program, NULL, program->n_inputs);
    int *params = ttd_call_alloc(call, sizeof(int) * (size_t)(program->n_params ? program->n_params : 1));
    if (params) {
      for (int i = 0; i < program->n_params; i++) params[i] = ttd_program_param_value(program, i);
    }
    resp->n_parameters = (size_t)program->n_params;
    resp->parameters = params ? specs_to_proto(call, program, params, program->n_params) : NULL;
    resp->n_outputs = (size_t)program->n_outputs;
    resp->outputs = specs_to_proto(call, program, program->outputs, program->n_outputs);
    if (!resp->inputs || !resp->parameters || !resp->outputs) {
      status = ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
    }
  }
  if (!status) {
    TTD_LOG(TTD_LOG_DEBUG, "session=%016" PRIx64 " event=compile nodes=%d cached=%d program=%016" PRIx64,
            call->session->id, program->n_nodes, cached, handle);
  }
  ttd_program_release(program);
  if (!status) *out_response = &resp->base;
  return status;
}
