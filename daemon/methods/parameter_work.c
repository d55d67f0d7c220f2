#include "methods/parameter_work.h"

#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "device/optimizer_options.h"

/* Whether g's zeros can go to the Backward of defer, which then holds g's lock. */
static bool defer_zeros(ttd_zero_defer *defer, ttd_tensor *g) {
  for (size_t i = 0; i < defer->n_reads; i++) {
    if (defer->reads[i] == g) return false;
  }
  if (defer->n == defer->cap) {
    size_t cap = defer->cap ? 2 * defer->cap : 8;
    ttd_tensor **grown = realloc(defer->grads, cap * sizeof(*grown));
    if (!grown) return false;
    defer->grads = grown;
    defer->cap = cap;
  }
  if (!ttd_tensor_zero_grad_begin(g)) return false; /* an Upload, a read or another ZeroGrad has it */
  atomic_store(&g->grad_state, TTD_GRAD_PENDING_ZEROS);
  defer->grads[defer->n++] = ttd_tensor_retain(g);
  return true;
}

ttd_status_t ttd_zero_defer_end(ttd_backend *backend, ttd_zero_defer *defer) {
  ttd_status_t status = TTD_OK;
  for (size_t i = 0; i < defer->n; i++) {
    ttd_tensor *g = defer->grads[i];
    int pending = TTD_GRAD_PENDING_ZEROS;
    if (atomic_compare_exchange_strong(&g->grad_state, &pending, TTD_GRAD_UNKNOWN)) { /* not written: zeros */
      ttd_status_t s = backend->vtable->buffer_zero(backend, g->buffer);
      ttd_tensor_zero_grad_end(g, true, !s);
      if (!status) status = s;
      else ttd_status_free(s);
    } else {
      ttd_tensor_write_end(g);
    }
    ttd_tensor_release(g);
  }
  free(defer->grads);
  defer->grads = NULL;
  defer->n = defer->cap = 0;
  return status;
}

static ttd_status_t zero_one(ttd_backend *backend, ttd_tensor *param, uint64_t *zeroed, ttd_zero_defer *defer) {
  ttd_status_t status = TTD_OK;
  pthread_mutex_lock(&param->train_lock);
  if (param->grad) {
    if (!defer || !defer_zeros(defer, param->grad)) status = ttd_tensor_zero_grad(backend, param->grad);
    (*zeroed)++;
  }
  pthread_mutex_unlock(&param->train_lock);
  return status;
}

ttd_status_t ttd_optimizer_state_create(ttd_backend *backend, const ttd_tensor *param, ttd_tensor **out_state) {
  *out_state = NULL;
  ttd_tensor_spec spec = param->spec;
  spec.dtype = TTD_DTYPE_FLOAT32; /* optimizer state is float32 for any parameter */
  TTD_RETURN_IF_ERROR(ttd_tensor_spec_finish(&spec));
  return ttd_tensor_create_zeroed(backend, param->quota, &spec, out_state); /* charged like the parameter */
}

/* A zeroed float32 tensor shaped like t into *out, unless there is one already. */
static ttd_status_t zeroed_like(ttd_backend *backend, const ttd_tensor *t, ttd_tensor **out) {
  return *out ? TTD_OK : ttd_optimizer_state_create(backend, t, out);
}

/* The state buffers a parameter's step needs (opt_state[0..n)): Adam's m and v, SGD's
 * momentum buffer, or none. */
static int state_buffers(const ttd_optimizer_call *oc) {
  return oc->kind == TTD_OPTIMIZER_ADAM ? 2 : (oc->sgd.momentum != 0.0f ? 1 : 0);
}

/* One parameter's step, its train_lock held: its state is made on first use and lives with
 * the parameter. With zero_grad the step also zeroes the .grad as it reads it, as ZeroGrad
 * would after it. */
static ttd_status_t step_locked(ttd_core *core, ttd_tensor *param, ttd_optimizer_call *oc, uint64_t *updated,
                                bool zero_grad) {
  TTD_RETURN_IF_ERROR(ttd_optimizer_check_dtype(param->spec.dtype));
  ttd_backend *backend = core->backend;
  ttd_status_t status = TTD_OK;
  if (param->grad) {
    oc->fresh_state = state_buffers(oc) > 0 && !param->opt_state[0];
    for (int k = 0; k < state_buffers(oc) && !status; k++) status = zeroed_like(backend, param, &param->opt_state[k]);
    if (!status) {
      oc->step = ++param->opt_step;
      oc->param = param->buffer;
      oc->param_dtype = param->spec.dtype; /* a bfloat16 one is updated in float32 and rounded back */
      oc->grad = param->grad->buffer;
      oc->state[0] = param->opt_state[0] ? param->opt_state[0]->buffer : NULL;
      oc->state[1] = param->opt_state[1] ? param->opt_state[1]->buffer : NULL;
      oc->n = (int64_t)param->spec.numel;
      oc->zero_grad = zero_grad;
      bool marked = zero_grad && ttd_tensor_zero_grad_begin(param->grad);
      int64_t began = ttd_now_ns();
      status = backend->vtable->optimizer_step(backend, param->spec.device, oc);
      ttd_metrics_record_optimizer(&core->metrics, ttd_now_ns() - began);
      if (zero_grad) ttd_tensor_zero_grad_end(param->grad, marked, !status);
      (*updated)++;
    }
  }
  return status;
}

static ttd_status_t step_one(ttd_core *core, ttd_tensor *param, ttd_optimizer_call *oc, uint64_t *updated) {
  pthread_mutex_lock(&param->train_lock);
  ttd_status_t status = step_locked(core, param, oc, updated, false);
  pthread_mutex_unlock(&param->train_lock);
  return status;
}

static ttd_status_t zero_handles(ttd_call *call, const Ttd__V1__ZeroGradRequest *req, uint64_t *out_zeroed,
                                 ttd_zero_defer *defer) {
  *out_zeroed = 0;
  TTD_RETURN_IF_ERROR(ttd_handles_check_distinct(req->parameters, req->n_parameters));
  for (size_t i = 0; i < req->n_parameters; i++) {
    ttd_tensor *param = NULL;
    TTD_RETURN_IF_ERROR(ttd_session_tensor_lookup(call->session, req->parameters[i], &param));
    ttd_status_t status = zero_one(call->core->backend, param, out_zeroed, defer);
    ttd_tensor_release(param);
    TTD_RETURN_IF_ERROR(status);
  }
  return TTD_OK;
}

ttd_status_t ttd_zero_grad_handles(ttd_call *call, const Ttd__V1__ZeroGradRequest *req, uint64_t *out_zeroed) {
  return zero_handles(call, req, out_zeroed, NULL);
}

static size_t distinct_sorted(ttd_tensor *const *params, size_t n, ttd_tensor **out);

/* Marks the distinct parameters of params (n, NULL entries skipped) written for a step, all or
 * none (the backend's one writer of a buffer at a time): FAILED_PRECONDITION while an Upload
 * writes one or a Download reads it. *out_marked (n + 1 entries) gets them, for
 * step_marks_end. */
static ttd_status_t step_marks_begin(ttd_tensor *const *params, size_t n, ttd_tensor ***out_marked, size_t *out_n) {
  *out_n = 0;
  ttd_tensor **marked = *out_marked = calloc(n + 1, sizeof(*marked));
  if (!marked) return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  size_t d = distinct_sorted(params, n, marked);
  for (size_t i = 0; i < d; i++) {
    if (ttd_tensor_write_begin(marked[i])) continue;
    for (size_t k = 0; k < i; k++) ttd_tensor_write_end(marked[k]);
    return ttd_make_status(GRPC_STATUS_FAILED_PRECONDITION,
                           "a parameter of this step is being written by an Upload of this session, or read by a "
                           "Download: send the step after that call answers (no parameter was stepped)");
  }
  *out_n = d;
  return TTD_OK;
}

static void step_marks_end(ttd_tensor **marked, size_t n) {
  for (size_t i = 0; i < n; i++) ttd_tensor_write_end(marked[i]);
  free(marked);
}

/* Steps params (n, NULL entries skipped, each tensor once), their write marks taken first. */
static ttd_status_t step_tensors_counted(ttd_call *call, ttd_optimizer_call *oc, ttd_tensor *const *params, size_t n,
                                        uint64_t *updated) {
  ttd_tensor **marked = NULL;
  size_t n_marked = 0;
  ttd_status_t status = step_marks_begin(params, n, &marked, &n_marked);
  for (size_t i = 0; i < n_marked && !status; i++) status = step_one(call->core, marked[i], oc, updated); /* each once */
  if (marked) step_marks_end(marked, n_marked);
  return status;
}

ttd_status_t ttd_optimizer_step_handles(ttd_call *call, const Ttd__V1__OptimizerStepRequest *req, uint64_t *out_updated) {
  *out_updated = 0;
  ttd_optimizer_call oc;
  TTD_RETURN_IF_ERROR(ttd_optimizer_options_from_proto(req, &oc));
  TTD_RETURN_IF_ERROR(ttd_handles_check_distinct(req->parameters, req->n_parameters)); /* one step each */
  ttd_tensor **params = calloc(req->n_parameters + 1, sizeof(*params));
  if (!params) return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  ttd_status_t status = TTD_OK;
  for (size_t i = 0; i < req->n_parameters && !status; i++) {
    status = ttd_session_tensor_lookup(call->session, req->parameters[i], &params[i]);
  }
  if (!status) status = step_tensors_counted(call, &oc, params, req->n_parameters, out_updated);
  for (size_t i = 0; i < req->n_parameters; i++) ttd_tensor_release(params[i]);
  free(params);
  return status;
}

/* The same on tensors the call already holds. */
static ttd_status_t step_tensors(ttd_call *call, const Ttd__V1__OptimizerStepRequest *req, ttd_tensor *const *params,
                                 size_t n) {
  ttd_optimizer_call oc;
  uint64_t updated = 0;
  TTD_RETURN_IF_ERROR(ttd_optimizer_options_from_proto(req, &oc));
  return step_tensors_counted(call, &oc, params, n, &updated);
}

static ttd_status_t zero_tensors(ttd_call *call, ttd_tensor *const *params, size_t n) {
  uint64_t zeroed = 0;
  for (size_t i = 0; i < n; i++) {
    if (params[i]) TTD_RETURN_IF_ERROR(zero_one(call->core->backend, params[i], &zeroed, NULL));
  }
  return TTD_OK;
}

/* status with "what, where, failed: " in front of its message; takes status. */
static ttd_status_t explain(ttd_status_t status, const char *what, const char *where) {
  if (!status) return TTD_OK;
  ttd_status_t wrapped =
      ttd_make_status(ttd_status_code(status), "%s %s failed: %s", what, where, ttd_status_message(status));
  ttd_status_free(status);
  return wrapped;
}

ttd_status_t ttd_parameter_work_check(const Ttd__V1__ParameterWork *work, const char *where) {
  if (!work) return TTD_OK;
  if (work->step) {
    ttd_optimizer_call oc;
    ttd_status_t status = ttd_optimizer_options_from_proto(work->step, &oc);
    if (!status) status = ttd_handles_check_distinct(work->step->parameters, work->step->n_parameters);
    TTD_RETURN_IF_ERROR(explain(status, "OptimizerStep", where));
  }
  if (work->zero_grad) {
    const Ttd__V1__ZeroGradRequest *z = work->zero_grad;
    TTD_RETURN_IF_ERROR(explain(ttd_handles_check_distinct(z->parameters, z->n_parameters), "ZeroGrad", where));
  }
  return TTD_OK;
}

static int compare_pointers(const void *a, const void *b) {
  uintptr_t x = (uintptr_t) * (void *const *)a, y = (uintptr_t) * (void *const *)b;
  return x < y ? -1 : x > y;
}

/* Whether a step then a zero_grad over params (n, NULL entries skipped; their train_locks
 * held, so no .grad appears meanwhile) may run as one pass per parameter and leave what the
 * two passes leave: each parameter float32 or bfloat16 (stepped in place, with no float32
 * copy to make) and with the optimizer state its step needs already
 * made (so no check or allocation fails half way through the list), and no tensor both a
 * parameter and a .grad, nor a .grad shared (a step must not read a .grad another step has
 * zeroed). One difference stays: should the backend's optimizer_step itself fail (the sim
 * card's does not), the .grads of the parameters stepped before it are zeros, where the two
 * passes would have kept them. */
static bool fusable(ttd_tensor *const *params, size_t n, const ttd_optimizer_call *oc) {
  void **seen = malloc((2 * n + 1) * sizeof(*seen));
  if (!seen) return false;
  size_t k = 0;
  bool ok = true;
  int need_state = state_buffers(oc);
  for (size_t i = 0; i < n && ok; i++) {
    ttd_tensor *p = params[i];
    if (!p) continue;
    ok = p->spec.dtype == TTD_DTYPE_FLOAT32 || p->spec.dtype == TTD_DTYPE_BFLOAT16;
    for (int s = 0; s < need_state && ok && p->grad; s++) ok = p->opt_state[s] != NULL; /* no .grad: no step */
    seen[k++] = p;
    if (p->grad) seen[k++] = p->grad;
  }
  if (ok) {
    qsort(seen, k, sizeof(*seen), compare_pointers);
    for (size_t i = 1; i < k && ok; i++) ok = seen[i] != seen[i - 1];
  }
  free(seen);
  return ok;
}

/* The distinct tensors of params (n, NULL entries skipped), sorted by address into *out (the
 * order every caller locks them in); their count. */
static size_t distinct_sorted(ttd_tensor *const *params, size_t n, ttd_tensor **out) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (params[i]) out[k++] = params[i];
  qsort(out, k, sizeof(*out), compare_pointers);
  size_t d = 0;
  for (size_t i = 0; i < k; i++)
    if (d == 0 || out[i] != out[d - 1]) out[d++] = out[i];
  return d;
}

/* torch's step() then zero_grad() over the same parameters (the handles of step and
 * zero_grad equal, or both empty: the tensors reached), fused where fusable() allows: the
 * optimizer zeroes each gradient in the pass that reads it, sparing a pass over every .grad.
 * false when it does not apply, and nothing ran. */
static bool step_and_zero(ttd_call *call, const Ttd__V1__ParameterWork *work, ttd_tensor *const *reached,
                          size_t n_reached, ttd_status_t *out_status) {
  const Ttd__V1__OptimizerStepRequest *step = work->step;
  const Ttd__V1__ZeroGradRequest *zero = work->zero_grad;
  bool by_reach = step->n_parameters == 0 && zero->n_parameters == 0 && reached;
  if (!by_reach && (step->n_parameters == 0 || step->n_parameters != zero->n_parameters ||
                    memcmp(step->parameters, zero->parameters, step->n_parameters * sizeof(*step->parameters)) != 0))
    return false;
  size_t n = by_reach ? n_reached : step->n_parameters;
  ttd_tensor **params = calloc(2 * n + 1, sizeof(*params)), **locked = params + n;
  if (!params) return false;
  bool found = true;
  for (size_t i = 0; i < n && found; i++) {
    if (by_reach) params[i] = reached[i] ? ttd_tensor_retain(reached[i]) : NULL;
    else {
      ttd_status_t missing = ttd_session_tensor_lookup(call->session, step->parameters[i], &params[i]);
      found = !missing;
      ttd_status_free(missing);
    }
  }
  ttd_optimizer_call oc;
  ttd_status_t status = found ? ttd_optimizer_options_from_proto(step, &oc) : TTD_OK;
  size_t n_locked = found && !status ? distinct_sorted(params, n, locked) : 0;
  for (size_t i = 0; i < n_locked; i++) pthread_mutex_lock(&locked[i]->train_lock);
  bool fused = found && !status && fusable(params, n, &oc); /* else the two passes tell any error */
  uint64_t updated = 0;
  ttd_tensor **marked = NULL;
  size_t n_marked = 0;
  if (fused) status = step_marks_begin(params, n, &marked, &n_marked);
  for (size_t i = 0; i < n && fused && !status; i++) {
    if (params[i]) status = step_locked(call->core, params[i], &oc, &updated, true);
  }
  if (marked) step_marks_end(marked, n_marked);
  for (size_t i = n_locked; i-- > 0;) pthread_mutex_unlock(&locked[i]->train_lock);
  for (size_t i = 0; i < n; i++) ttd_tensor_release(params[i]);
  free(params);
  if (!fused) {
    ttd_status_free(status);
    return false;
  }
  *out_status = status;
  return true;
}

static ttd_status_t work_run(ttd_call *call, const Ttd__V1__ParameterWork *work, const char *where,
                             ttd_tensor *const *reached, size_t n_reached, ttd_zero_defer *defer);

ttd_status_t ttd_parameter_work_run(ttd_call *call, const Ttd__V1__ParameterWork *work, const char *where,
                                    ttd_tensor *const *reached, size_t n_reached, ttd_zero_defer *defer) {
  if (!work || !reached) return work_run(call, work, where, reached, n_reached, defer);
  /* Each tensor once: one bound to two of the program's parameters (a tied weight) is listed
   * twice, and is stepped once, as OptimizerStep and torch step it. */
  ttd_tensor **once = calloc(n_reached + 1, sizeof(*once));
  if (!once) return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  ttd_status_t status = work_run(call, work, where, once, distinct_sorted(reached, n_reached, once), defer);
  free(once);
  return status;
}

static ttd_status_t work_run(ttd_call *call, const Ttd__V1__ParameterWork *work, const char *where,
                             ttd_tensor *const *reached, size_t n_reached, ttd_zero_defer *defer) {
  if (!work) return TTD_OK;
  ttd_status_t fused_status;
  if (work->step && work->zero_grad && step_and_zero(call, work, reached, n_reached, &fused_status)) {
    return explain(fused_status, "OptimizerStep", where);
  }
  if (work->step) {
    ttd_status_t status;
    uint64_t updated = 0;
    if (work->step->n_parameters == 0 && reached) status = step_tensors(call, work->step, reached, n_reached);
    else status = ttd_optimizer_step_handles(call, work->step, &updated);
    TTD_RETURN_IF_ERROR(explain(status, "OptimizerStep", where));
  }
  if (work->zero_grad) {
    ttd_status_t status;
    uint64_t zeroed = 0;
    if (work->zero_grad->n_parameters == 0 && reached) status = zero_tensors(call, reached, n_reached);
    else status = zero_handles(call, work->zero_grad, &zeroed, defer);
    TTD_RETURN_IF_ERROR(explain(status, "ZeroGrad", where));
  }
  return TTD_OK;
}

ttd_status_t ttd_serve_freeing(ttd_call *call, const ProtobufCMessage *request,
                               const ProtobufCMessageDescriptor *response_type, ttd_freeing_work_fn work,
                               const uint64_t *handles, size_t n, ProtobufCMessage **out_response) {
  ProtobufCMessage *resp = ttd_call_alloc(call, response_type->sizeof_message);
  ttd_status_t status = resp ? TTD_OK : ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  if (resp) protobuf_c_message_init(response_type, resp);
  if (!status) status = work(call, request, resp);
  for (size_t i = 0; i < n; i++) { /* the frees riding along, whatever the work did */
    uint64_t tensors, bytes;
    ttd_status_free(ttd_session_tensors_free(call->session, &handles[i], 1, &tensors, &bytes));
  }
  if (!status) *out_response = resp;
  return status;
}
