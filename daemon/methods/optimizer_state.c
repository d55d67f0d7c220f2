/* OptimizerState: the optimizer state that OptimizerStep keeps on the device with each
 * parameter (its step count and buffers), read as new tensors of the session, replaced from
 * tensors the client uploaded, or moved from one parameter to another: torch's
 * optimizer.state_dict() and load_state_dict(). Device work, on the executor thread of the
 * first parameter's device, like OptimizerStep. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "device/optimizer_options.h"
#include "graph/ops.h"
#include "methods/methods.h"
#include "methods/parameter_work.h"

#define STATE_BUFFERS 2 /* SGD's momentum_buffer, or Adam's exp_avg and exp_avg_sq */

int ttd_device_of_optimizer_state(ttd_call *call, const ProtobufCMessage *request) {
  const Ttd__V1__OptimizerStateRequest *req = (const Ttd__V1__OptimizerStateRequest *)request;
  int device = ttd_session_device_of(call->session, req->parameters, req->n_parameters);
  for (size_t i = 0; device < 0 && i < req->n_set; i++) {
    device = ttd_session_device_of(call->session, &req->set[i]->parameter, 1);
  }
  return device;
}

/* status with "what (parameter 0x...): " in front of its message; takes status. */
static ttd_status_t name_it(ttd_status_t status, const char *what, size_t index, uint64_t param) {
  if (!status) return TTD_OK;
  ttd_status_t named = ttd_make_status(ttd_status_code(status), "%s %zu (parameter 0x%016" PRIx64 "): %s", what, index,
                                       param, ttd_status_message(status));
  ttd_status_free(status);
  return named;
}

/* A parameter of the session whose state may be read or written (one an optimizer updates). */
static ttd_status_t lookup_param(ttd_call *call, uint64_t handle, ttd_tensor **out_param) {
  TTD_RETURN_IF_ERROR(ttd_session_tensor_lookup(call->session, handle, out_param));
  ttd_dtype dtype = (*out_param)->spec.dtype;
  if (dtype == TTD_DTYPE_FLOAT32 || dtype == TTD_DTYPE_BFLOAT16) return TTD_OK;
  return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                         "tensor 0x%016" PRIx64 " is %s; optimizer state is kept for float32 and bfloat16 parameters",
                         handle, ttd_dtype_name(dtype));
}

/* INVALID_ARGUMENT unless t is float32 (any dtype when any_dtype) shaped like param, on its
 * device and in its memory. what names t in the message. */
static ttd_status_t check_like(const ttd_tensor *t, const ttd_tensor *param, bool any_dtype, const char *what) {
  const ttd_tensor_spec *a = &t->spec, *p = &param->spec;
  if ((any_dtype || a->dtype == TTD_DTYPE_FLOAT32) && a->ndim == p->ndim &&
      memcmp(a->shape, p->shape, sizeof(int64_t) * (size_t)p->ndim) == 0 && a->device == p->device &&
      a->location == p->location) {
    return TTD_OK;
  }
  ttd_kshape want = {.ndim = p->ndim}, got = {.ndim = a->ndim};
  memcpy(want.d, p->shape, sizeof(int64_t) * (size_t)p->ndim);
  memcpy(got.d, a->shape, sizeof(int64_t) * (size_t)a->ndim);
  char b1[128], b2[128];
  return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "%s must be %s %s on tt:%d %s like the parameter, got %s %s on tt:%d %s",
                         what, any_dtype ? "a parameter" : "float32", ttd_kshape_format(&want, b1, sizeof(b1)), p->device,
                         ttd_memloc_name(p->location), ttd_dtype_name(a->dtype), ttd_kshape_format(&got, b2, sizeof(b2)),
                         a->device, ttd_memloc_name(a->location));
}

/* ---- reading: copies of each parameter's buffers as new tensors of the session ---- */

/* Copies param's state into new tensors of the session: handles into out_handles (0 where a
 * buffer is absent), their count, the last present buffer's slot + 1, into *out_n. */
static ttd_status_t read_one(ttd_call *call, ttd_tensor *param, int64_t *out_step, uint64_t *out_handles, size_t *out_n) {
  ttd_backend *backend = call->core->backend;
  ttd_status_t status = TTD_OK;
  *out_n = 0;
  pthread_mutex_lock(&param->train_lock);
  *out_step = param->opt_step;
  for (int k = 0; k < STATE_BUFFERS && !status; k++) {
    const ttd_tensor *state = param->opt_state[k];
    if (!state) continue;
    ttd_tensor *copy = NULL;
    status = ttd_tensor_create(backend, call->session->quota, &state->spec, &copy);
    if (!status) status = backend->vtable->buffer_copy(backend, state->buffer, copy->buffer);
    if (!status) status = ttd_session_tensor_add(call->session, copy, &out_handles[k]);
    ttd_tensor_release(copy);
    if (!status) *out_n = (size_t)k + 1;
  }
  pthread_mutex_unlock(&param->train_lock);
  return status;
}

static ttd_status_t read_states(ttd_call *call, const Ttd__V1__OptimizerStateRequest *req,
                                Ttd__V1__OptimizerStateResponse *resp) {
  size_t n = req->n_parameters;
  TTD_RETURN_IF_ERROR(ttd_handles_check_distinct(req->parameters, n));
  resp->states = ttd_call_alloc(call, sizeof(*resp->states) * (n + 1));
  uint64_t *made = calloc(n * STATE_BUFFERS + 1, sizeof(uint64_t)); /* handles issued, for an undo */
  ttd_status_t status = resp->states && made ? TTD_OK : ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  for (size_t i = 0; i < n && !status; i++) {
    Ttd__V1__ParameterState *ps = ttd_call_alloc(call, sizeof(*ps));
    uint64_t *handles = ttd_call_alloc(call, sizeof(uint64_t) * STATE_BUFFERS);
    if (!ps || !handles) {
      status = ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
      break;
    }
    ttd__v1__parameter_state__init(ps);
    memset(handles, 0, sizeof(uint64_t) * STATE_BUFFERS);
    ps->parameter = req->parameters[i];
    ps->buffers = handles;
    ttd_tensor *param = NULL;
    status = lookup_param(call, req->parameters[i], &param);
    if (!status) status = read_one(call, param, &ps->step, handles, &ps->n_buffers);
    ttd_tensor_release(param);
    memcpy(&made[i * STATE_BUFFERS], handles, sizeof(uint64_t) * STATE_BUFFERS);
    resp->states[resp->n_states++] = ps;
  }
  if (status) { /* all or nothing: the copies made so far go */
    for (size_t i = 0; made && i < n * STATE_BUFFERS; i++) {
      uint64_t tensors, bytes;
      if (made[i]) ttd_status_free(ttd_session_tensors_free(call->session, &made[i], 1, &tensors, &bytes));
    }
    resp->n_states = 0;
  }
  free(made);
  return status;
}

/* ---- writing: each entry checked, memory taken, then every state replaced ---- */

typedef struct state_write {
  ttd_tensor *param;
  ttd_tensor *from;                    /* from_parameter: its state moves here */
  ttd_tensor *source[STATE_BUFFERS];   /* buffers whose bytes are copied (NULL: none) */
  ttd_tensor *fresh[STATE_BUFFERS];    /* made for slots the parameter has no buffer in */
  int64_t step;
} state_write;

static ttd_status_t check_entry(ttd_call *call, const Ttd__V1__ParameterState *e, state_write *w) {
  TTD_RETURN_IF_ERROR(lookup_param(call, e->parameter, &w->param));
  if (e->from_parameter) {
    if (e->step || e->n_buffers) {
      return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                             "from_parameter moves a whole state: leave step and buffers unset");
    }
    TTD_RETURN_IF_ERROR(lookup_param(call, e->from_parameter, &w->from));
    return check_like(w->from, w->param, true, "from_parameter");
  }
  if (e->step < 0) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "step is %" PRId64 "; it must be >= 0", e->step);
  }
  if (e->n_buffers > STATE_BUFFERS) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                           "%zu buffers; an optimizer keeps at most %d (SGD's momentum_buffer, or Adam's exp_avg and "
                           "exp_avg_sq)", e->n_buffers, STATE_BUFFERS);
  }
  w->step = e->step;
  for (size_t k = 0; k < e->n_buffers; k++) {
    if (!e->buffers[k]) continue;
    TTD_RETURN_IF_ERROR(ttd_session_tensor_lookup(call->session, e->buffers[k], &w->source[k]));
    char what[32];
    snprintf(what, sizeof(what), "buffer %zu", k);
    TTD_RETURN_IF_ERROR(check_like(w->source[k], w->param, false, what));
  }
  return TTD_OK;
}

/* The buffers w will need and the parameter lacks, made now: a write fails here or not at all. */
static ttd_status_t reserve(ttd_backend *backend, state_write *w) {
  for (int k = 0; k < STATE_BUFFERS; k++) {
    if (!w->source[k]) continue;
    pthread_mutex_lock(&w->param->train_lock);
    bool have = w->param->opt_state[k] != NULL;
    pthread_mutex_unlock(&w->param->train_lock);
    if (!have) TTD_RETURN_IF_ERROR(ttd_optimizer_state_create(backend, w->param, &w->fresh[k]));
  }
  return TTD_OK;
}

/* Replaces w->param's state; what it drops goes into dropped. */
static ttd_status_t apply(ttd_backend *backend, state_write *w, ttd_tensor **dropped) {
  ttd_status_t status = TTD_OK;
  ttd_tensor *moved[STATE_BUFFERS] = {NULL, NULL};
  int64_t step = w->step;
  if (w->from) {
    pthread_mutex_lock(&w->from->train_lock);
    for (int k = 0; k < STATE_BUFFERS; k++) {
      moved[k] = w->from->opt_state[k];
      w->from->opt_state[k] = NULL;
    }
    step = w->from->opt_step;
    w->from->opt_step = 0;
    pthread_mutex_unlock(&w->from->train_lock);
  }
  ttd_tensor *p = w->param;
  pthread_mutex_lock(&p->train_lock);
  for (int k = 0; k < STATE_BUFFERS; k++) {
    ttd_tensor *keep = NULL;
    if (w->from) {
      keep = moved[k];
    } else if (w->source[k]) {
      keep = p->opt_state[k] ? p->opt_state[k] : w->fresh[k];
      if (keep == w->fresh[k]) w->fresh[k] = NULL;
      if (!status) status = backend->vtable->buffer_copy(backend, w->source[k]->buffer, keep->buffer);
    }
    if (p->opt_state[k] != keep) dropped[k] = p->opt_state[k];
    p->opt_state[k] = keep;
  }
  p->opt_step = step;
  pthread_mutex_unlock(&p->train_lock);
  return status;
}

static ttd_status_t write_states(ttd_call *call, const Ttd__V1__OptimizerStateRequest *req) {
  size_t n = req->n_set;
  state_write *w = calloc(n + 1, sizeof(*w));
  uint64_t *named = calloc(2 * n + 1, sizeof(uint64_t)); /* every parameter and from_parameter, once */
  if (!w || !named) {
    free(w);
    free(named);
    return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  }
  ttd_status_t status = TTD_OK;
  size_t n_named = 0;
  for (size_t i = 0; i < n; i++) {
    named[n_named++] = req->set[i]->parameter;
    if (req->set[i]->from_parameter) named[n_named++] = req->set[i]->from_parameter;
  }
  for (size_t i = 0; i < n && !status; i++) status = name_it(check_entry(call, req->set[i], &w[i]), "set", i, req->set[i]->parameter);
  if (!status) status = ttd_handles_check_distinct(named, n_named); /* a state moved or written twice */
  for (size_t i = 0; i < n && !status; i++) status = reserve(call->core->backend, &w[i]);
  ttd_tensor **dropped = calloc(n * STATE_BUFFERS + 1, sizeof(*dropped));
  if (!status && !dropped) status = ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory");
  for (size_t i = 0; i < n && !status; i++) {
    status = name_it(apply(call->core->backend, &w[i], &dropped[i * STATE_BUFFERS]), "set", i, req->set[i]->parameter);
  }
  for (size_t i = 0; i < n; i++) {
    ttd_tensor_release(w[i].param);
    ttd_tensor_release(w[i].from);
    for (int k = 0; k < STATE_BUFFERS; k++) {
      ttd_tensor_release(w[i].source[k]);
      ttd_tensor_release(w[i].fresh[k]);
      if (dropped) ttd_tensor_release(dropped[i * STATE_BUFFERS + k]);
    }
  }
  free(dropped);
  free(named);
  free(w);
  return status;
}

ttd_status_t ttd_method_optimizer_state(ttd_call *call, const ProtobufCMessage *request, ProtobufCMessage **out_response) {
  const Ttd__V1__OptimizerStateRequest *req = (const Ttd__V1__OptimizerStateRequest *)request;
  Ttd__V1__OptimizerStateResponse *resp = ttd_call_alloc(call, sizeof(*resp));
  TTD_CHECK_ALLOC(resp);
  ttd__v1__optimizer_state_response__init(resp);
  if (req->n_parameters && req->n_set) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                           "OptimizerState reads parameters or writes set, not both: send two calls");
  }
  TTD_RETURN_IF_ERROR(req->n_set ? write_states(call, req) : read_states(call, req, resp));
  *out_response = &resp->base;
  return TTD_OK;
}
