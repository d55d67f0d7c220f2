#include "device/optimizer_options.h"

#include <math.h>
#include <string.h>

/* "WHO: NAME is VALUE; it must be a finite number RANGE". */
static ttd_status_t out_of_range(const char *who, const char *name, float value, const char *range) {
  return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "%s: %s is %g; it must be a finite number%s", who, name,
                         (double)value, range);
}

static bool finite_at_least(float value, float low) { return isfinite(value) && value >= low; }

ttd_status_t ttd_optimizer_check_lr(float lr, const char *who) {
  return finite_at_least(lr, 0.0f) ? TTD_OK : out_of_range(who, "lr", lr, " >= 0");
}

ttd_status_t ttd_optimizer_check(const ttd_optimizer_call *oc, const char *who) {
  if (oc->kind == TTD_OPTIMIZER_ADAM) {
    const ttd_adam_params *p = &oc->adam_params;
    TTD_RETURN_IF_ERROR(ttd_optimizer_check_lr(p->lr, who));
    if (!(isfinite(p->eps) && p->eps > 0.0f)) return out_of_range(who, "eps", p->eps, " > 0");
    if (!(finite_at_least(p->beta1, 0.0f) && p->beta1 < 1.0f)) return out_of_range(who, "beta1", p->beta1, " in [0, 1)");
    if (!(finite_at_least(p->beta2, 0.0f) && p->beta2 < 1.0f)) return out_of_range(who, "beta2", p->beta2, " in [0, 1)");
    if (!finite_at_least(p->weight_decay, 0.0f)) return out_of_range(who, "weight_decay", p->weight_decay, " >= 0");
    return TTD_OK;
  }
  const ttd_sgd_params *p = &oc->sgd;
  TTD_RETURN_IF_ERROR(ttd_optimizer_check_lr(p->lr, who));
  if (!finite_at_least(p->momentum, 0.0f)) return out_of_range(who, "momentum", p->momentum, " >= 0");
  if (!isfinite(p->dampening)) return out_of_range(who, "dampening", p->dampening, "");
  if (!finite_at_least(p->weight_decay, 0.0f)) return out_of_range(who, "weight_decay", p->weight_decay, " >= 0");
  if (p->nesterov && (p->momentum <= 0.0f || p->dampening != 0.0f)) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                           "%s: nesterov needs momentum > 0 and dampening 0; momentum is %g and dampening %g", who,
                           (double)p->momentum, (double)p->dampening);
  }
  return TTD_OK;
}

ttd_status_t ttd_optimizer_options_convert(const Ttd__V1__OptimizerStepRequest *req, ttd_optimizer_call *out) {
  memset(out, 0, sizeof(*out));
  if (req->optimizer_case == TTD__V1__OPTIMIZER_STEP_REQUEST__OPTIMIZER_SGD && req->sgd) {
    const Ttd__V1__SgdOptions *o = req->sgd;
    out->kind = TTD_OPTIMIZER_SGD;
    out->sgd = (ttd_sgd_params){o->lr, o->momentum, o->dampening, o->weight_decay, o->nesterov};
    return TTD_OK;
  }
  if (req->optimizer_case == TTD__V1__OPTIMIZER_STEP_REQUEST__OPTIMIZER_ADAM && req->adam) {
    const Ttd__V1__AdamOptions *o = req->adam;
    bool defaults = !o->no_defaults; /* an older client's zeros: torch's defaults */
    out->kind = TTD_OPTIMIZER_ADAM;
    out->adam_params = (ttd_adam_params){o->lr,
                                         defaults && o->beta1 == 0.0f ? 0.9f : o->beta1,
                                         defaults && o->beta2 == 0.0f ? 0.999f : o->beta2,
                                         defaults && o->eps == 0.0f ? 1e-8f : o->eps,
                                         o->weight_decay,
                                         o->decoupled};
    return TTD_OK;
  }
  return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "OptimizerStep needs an optimizer: set sgd or adam");
}

ttd_status_t ttd_optimizer_options_from_proto(const Ttd__V1__OptimizerStepRequest *req, ttd_optimizer_call *out) {
  TTD_RETURN_IF_ERROR(ttd_optimizer_options_convert(req, out));
  const char *who = out->kind == TTD_OPTIMIZER_SGD ? "SGD" : out->adam_params.decoupled ? "AdamW" : "Adam";
  return ttd_optimizer_check(out, who);
}

ttd_status_t ttd_optimizer_check_dtype(ttd_dtype dtype) {
  if (dtype == TTD_DTYPE_FLOAT32 || dtype == TTD_DTYPE_BFLOAT16) return TTD_OK;
  return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "OptimizerStep updates float32 or bfloat16 parameters, got %s",
                         ttd_dtype_name(dtype));
}
