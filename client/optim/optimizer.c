/* Optimizers of modules: on the device (tt_step and tt_zero_grad are queued on the module
 * and ride on its next Execute or Backward, or are sent as OptimizerStep and ZeroGrad calls
 * with TTD_INLINE=0), or on the host (the CPU optimizer, the same kernels as the card).
 * Their arguments are checked when they are made, as torch.optim checks them. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "optim/optim.h"

const char *tt_optimizer_kind_name(const tt_optimizer *o) {
  if (o->kind == TT_OPTIM_SGD) return "SGD";
  return o->adam_options.decoupled ? "AdamW" : "Adam";
}

int tt_optimizer_buffer_count(const tt_optimizer *o) {
  return o->kind == TT_OPTIM_ADAM ? 2 : o->sgd.momentum != 0.0f ? 1 : 0;
}

tt_status tt_optimizer_call(const tt_optimizer *o, const char *who, ttd_optimizer_call *out_call) {
  Ttd__V1__OptimizerStepRequest req = TTD__V1__OPTIMIZER_STEP_REQUEST__INIT;
  tt_module_step_options(&req, o->kind, (Ttd__V1__SgdOptions *)&o->sgd, (Ttd__V1__AdamOptions *)&o->adam_options);
  ttd_status_t s = ttd_optimizer_options_convert(&req, out_call);
  if (!s) s = ttd_optimizer_check(out_call, who);
  return s ? tt_client_fail_status(o->module->client, s) : TT_OK;
}

tt_status tt_optimizer_on_cpu(tt_optimizer *o, int on_cpu) {
  o->on_cpu = on_cpu != 0;
  return TT_OK;
}

float tt_optimizer_lr(const tt_optimizer *o) {
  if (!o) return NAN;
  return o->kind == TT_OPTIM_ADAM ? o->adam_options.lr : o->sgd.lr;
}

tt_status tt_optimizer_set_lr(tt_optimizer *o, float lr) {
  if (!o) return TT_INVALID_ARGUMENT;
  ttd_status_t s = ttd_optimizer_check_lr(lr, "tt_optimizer_set_lr");
  if (s) return tt_client_fail_status(o->module->client, s);
  if (o->kind == TT_OPTIM_ADAM) o->adam_options.lr = lr;
  else o->sgd.lr = lr;
  return TT_OK;
}

/* One parameter's update on the host, torch's rules (the same kernels the card runs). */
static tt_status host_update(tt_optimizer *o, const ttd_optimizer_call *oc, int i, float *param, float *grad,
                             int64_t n) {
  bool fresh = tt_optimizer_buffer_count(o) > 0 && !o->state[0][i]; /* SGD's buffer starts as the gradient */
  for (int k = 0; k < tt_optimizer_buffer_count(o); k++) {
    if (!o->state[k][i] && !(o->state[k][i] = calloc((size_t)(n ? n : 1), sizeof(float)))) {
      return tt_client_fail(o->module->client, TT_RESOURCE_EXHAUSTED, "out of host memory");
    }
  }
  int64_t step = ++o->steps[i];
  if (o->kind == TT_OPTIM_ADAM) {
    ttd_k_adam_step(NULL, &oc->adam_params, step, param, grad, o->state[0][i], o->state[1][i], n, false);
  } else {
    ttd_k_sgd_step(NULL, &oc->sgd, fresh ? 1 : step, param, grad, o->state[0][i], n, false);
  }
  return TT_OK;
}

/* The CPU optimizer: for a module on "cpu" in place; for one on a card, each parameter and
 * its .grad come down, are updated, and the parameter goes back into the same handle. */
static tt_status host_step(tt_optimizer *o) {
  tt_module *m = o->module;
  ttd_optimizer_call oc;
  TT_RETURN_IF_FAILED(tt_optimizer_call(o, "tt_step", &oc));
  if (!m->place.is_host) TT_RETURN_IF_FAILED(tt_module_flush(m));
  for (int i = 0; i < m->n_params; i++) {
    tt_tensor *param = m->params[i];
    if (param->dtype != TT_FLOAT32) {
      return tt_client_fail(m->client, TT_INVALID_ARGUMENT, "the CPU optimizer updates float32 parameters");
    }
    if (m->place.is_host) {
      if (m->host_grads[i]) {
        TT_RETURN_IF_FAILED(host_update(o, &oc, i, param->data, m->host_grads[i]->data, (int64_t)param->numel));
      }
      continue;
    }
    if (!m->grad_handles[i]) continue; /* no .grad: skipped, as torch skips it */
    tt_tensor *gd = tt_param_grad(m, tt_module_param_name(m, i));
    tt_tensor *gh = gd ? tt_to(gd, "cpu") : NULL, *ph = gh ? tt_to(param, "cpu") : NULL;
    tt_status st = ph ? host_update(o, &oc, i, ph->data, gh->data, (int64_t)param->numel) : tt_errcode(m->client);
    if (st == TT_OK) {
      Ttd__V1__UploadHeader header = TTD__V1__UPLOAD_HEADER__INIT;
      header.target_case = TTD__V1__UPLOAD_HEADER__TARGET_HANDLE;
      header.handle = param->handle;
      Ttd__V1__UploadResponse *resp = NULL;
      st = tt_rpc_upload(m->client, &header, ph->data, ph->nbytes, &resp);
      if (resp) protobuf_c_message_free_unpacked(&resp->base, NULL);
    }
    tt_tensor_free(ph);
    tt_tensor_free(gh);
    tt_tensor_free(gd);
    TT_RETURN_IF_FAILED(st);
  }
  return TT_OK;
}

/* A new optimizer with args' module and arguments, checked (errors named after who); NULL on
 * error, or for a NULL module. */
static tt_optimizer *optimizer_new(const tt_optimizer *args, const char *who) {
  tt_module *m = args->module;
  ttd_optimizer_call oc;
  if (!m || tt_optimizer_call(args, who, &oc) != TT_OK) return NULL;
  tt_optimizer *o = calloc(1, sizeof(*o));
  if (!o) {
    tt_client_fail(m->client, TT_RESOURCE_EXHAUSTED, "out of host memory");
    return NULL;
  }
  *o = *args;
  for (int k = 0; k < TT_OPTIM_BUFFERS; k++) o->state[k] = calloc((size_t)m->n_params + 1, sizeof(float *));
  o->steps = calloc((size_t)m->n_params + 1, sizeof(int64_t));
  if (!o->state[0] || !o->state[1] || !o->steps) {
    tt_client_fail(m->client, TT_RESOURCE_EXHAUSTED, "out of host memory");
    tt_optimizer_free(o);
    return NULL;
  }
  return o;
}

/* The arguments of an optimizer of kind, as the wire takes them, to fill in. */
static tt_optimizer args_of(tt_module *m, tt_optim_kind kind) {
  tt_optimizer o = {.module = m, .kind = kind};
  ttd__v1__sgd_options__init(&o.sgd);
  ttd__v1__adam_options__init(&o.adam_options);
  o.adam_options.no_defaults = 1; /* a beta of 0 is 0 */
  return o;
}

static tt_optimizer *sgd_new(tt_module *m, const tt_sgd_options *a, const char *who) {
  tt_optimizer o = args_of(m, TT_OPTIM_SGD);
  o.sgd.lr = a->lr, o.sgd.momentum = a->momentum, o.sgd.dampening = a->dampening;
  o.sgd.weight_decay = a->weight_decay, o.sgd.nesterov = a->nesterov != 0;
  return optimizer_new(&o, who);
}

static tt_optimizer *adam_new(tt_module *m, const tt_adam_options *a, const char *who) {
  tt_optimizer o = args_of(m, TT_OPTIM_ADAM);
  o.adam_options.lr = a->lr, o.adam_options.beta1 = a->beta1, o.adam_options.beta2 = a->beta2;
  o.adam_options.eps = a->eps, o.adam_options.weight_decay = a->weight_decay, o.adam_options.decoupled = a->decoupled != 0;
  return optimizer_new(&o, who);
}

void tt_sgd_options_init(tt_sgd_options *options) { *options = (tt_sgd_options){.lr = 1e-3f}; }

void tt_adam_options_init(tt_adam_options *options) {
  *options = (tt_adam_options){.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
}

tt_optimizer *tt_sgd_opts(tt_module *m, const tt_sgd_options *options) {
  tt_sgd_options defaults;
  tt_sgd_options_init(&defaults);
  return sgd_new(m, options ? options : &defaults, "tt_sgd_opts");
}

tt_optimizer *tt_adam_opts(tt_module *m, const tt_adam_options *options) {
  tt_adam_options defaults;
  tt_adam_options_init(&defaults);
  return adam_new(m, options ? options : &defaults, "tt_adam_opts");
}

tt_optimizer *tt_sgd(tt_module *m, float lr, float momentum, float weight_decay, int nesterov) {
  tt_sgd_options o = {.lr = lr, .momentum = momentum, .weight_decay = weight_decay, .nesterov = nesterov};
  return sgd_new(m, &o, "tt_sgd");
}

tt_optimizer *tt_adam(tt_module *m, float lr, float weight_decay, int decoupled) {
  tt_adam_options o;
  tt_adam_options_init(&o);
  o.lr = lr, o.weight_decay = weight_decay, o.decoupled = decoupled;
  return adam_new(m, &o, "tt_adam");
}

void tt_optimizer_free(tt_optimizer *o) {
  if (!o) return;
  for (int k = 0; k < TT_OPTIM_BUFFERS; k++) {
    for (int i = 0; o->state[k] && i < o->module->n_params; i++) free(o->state[k][i]);
    free(o->state[k]);
  }
  free(o->steps);
  free(o);
}

/* Queues a tt_step or tt_zero_grad of a module on a card; it rides on the module's next
 * Execute or Backward. What the daemon would refuse about a step (a parameter's dtype) is
 * refused now. Work that cannot follow what is queued (a second step, a step after a zeroing)
 * sends what is queued first. */
static tt_status defer(tt_optimizer *o, tt_param_op op) {
  tt_module *m = o->module;
  if (op == TT_PARAM_STEP) {
    ttd_optimizer_call oc;
    TT_RETURN_IF_FAILED(tt_optimizer_call(o, "tt_step", &oc));
    ttd_status_t s = TTD_OK;
    for (int i = 0; !s && i < m->n_params; i++) s = ttd_optimizer_check_dtype((ttd_dtype)m->params[i]->dtype);
    if (s) return tt_client_fail_status(m->client, s);
  }
  return tt_module_defer_work(m, op, o->kind, &o->sgd, &o->adam_options);
}

void tt_optimizer_note_state(tt_optimizer *o) {
  o->has_state = tt_optimizer_buffer_count(o) > 0;
  o->state_on_host = tt_optimizer_on_host(o);
  o->state_generation = o->module->param_generation;
}

/* A step where the optimizer's state is not (the module moved, or tt_optimizer_on_cpu
 * switched, after it stepped) would silently start from fresh moments: refused instead. */
static tt_status check_state_home(tt_optimizer *o) {
  if (!o->has_state) return TT_OK;
  bool host = tt_optimizer_on_host(o);
  if (host == o->state_on_host && (host || o->state_generation == o->module->param_generation)) return TT_OK;
  return tt_client_fail(o->module->client, TT_FAILED_PRECONDITION,
                        "tt_step: this %s optimizer's state (%s) is %s, but the module's parameters were moved "
                        "(tt_module_to) or the optimizer switched sides (tt_optimizer_on_cpu) since; save the state "
                        "with tt_optimizer_save before the move and load it with tt_optimizer_load after, or make a "
                        "new optimizer to start afresh",
                        tt_optimizer_kind_name(o), o->kind == TT_OPTIM_ADAM ? "exp_avg, exp_avg_sq" : "momentum_buffer",
                        o->state_on_host ? "on the host" : "beside the parameters on the card they were on");
}

/* A step or a zeroing, on the host or on the card. */
static tt_status param_rpc(tt_optimizer *o, tt_param_op op) {
  tt_module *m = o->module;
  bool step = op == TT_PARAM_STEP;
  if (step && tt_optimizer_on_host(o)) return host_step(o);
  if (m->place.is_host) { /* zero_grad on the host */
    for (int i = 0; i < m->n_params; i++) {
      if (m->host_grads[i]) memset(m->host_grads[i]->data, 0, m->host_grads[i]->nbytes);
    }
    return TT_OK;
  }
  if (tt_inline_enabled(m->client)) return defer(o, op);
  uint64_t *handles = calloc((size_t)m->n_params + 1, sizeof(uint64_t));
  if (!handles) return tt_client_fail(m->client, TT_RESOURCE_EXHAUSTED, "out of host memory");
  for (int i = 0; i < m->n_params; i++) handles[i] = m->params[i]->handle;
  ProtobufCMessage *out = NULL;
  tt_status st;
  if (step) {
    Ttd__V1__OptimizerStepRequest req = TTD__V1__OPTIMIZER_STEP_REQUEST__INIT;
    req.parameters = handles;
    req.n_parameters = (size_t)m->n_params;
    tt_module_step_options(&req, o->kind, &o->sgd, &o->adam_options);
    st = tt_rpc_unary(m->client, TT_RPC_OPTIMIZER_STEP, &req.base, &ttd__v1__optimizer_step_response__descriptor, &out);
  } else {
    Ttd__V1__ZeroGradRequest req = TTD__V1__ZERO_GRAD_REQUEST__INIT;
    req.parameters = handles;
    req.n_parameters = (size_t)m->n_params;
    st = tt_rpc_unary(m->client, TT_RPC_ZERO_GRAD, &req.base, &ttd__v1__zero_grad_response__descriptor, &out);
  }
  if (st == TT_OK) protobuf_c_message_free_unpacked(out, NULL);
  free(handles);
  return st;
}

tt_status tt_step(tt_optimizer *o) {
  TT_RETURN_IF_FAILED(check_state_home(o));
  tt_status st = param_rpc(o, TT_PARAM_STEP);
  if (st == TT_OK) tt_optimizer_note_state(o);
  if (st == TT_OK) o->module->param_version++;
  return st;
}
tt_status tt_zero_grad(tt_optimizer *o) { return param_rpc(o, TT_PARAM_ZERO_GRAD); }
