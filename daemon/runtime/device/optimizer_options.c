#include "device/optimizer_options.h"

#include <string.h>

ttd_status_t ttd_optimizer_options_from_proto(const Ttd__V1__OptimizerStepRequest *req, ttd_optimizer_call *out) {
  memset(out, 0, sizeof(*out));
  if (req->optimizer_case == TTD__V1__OPTIMIZER_STEP_REQUEST__OPTIMIZER_SGD && req->sgd) {
    const Ttd__V1__SgdOptions *o = req->sgd;
    out->kind = TTD_OPTIMIZER_SGD;
    out->sgd = (ttd_sgd_params){o->lr, o->momentum, o->dampening, o->weight_decay, o->nesterov};
    if (o->nesterov && (o->momentum <= 0.0f || o->dampening != 0.0f)) {
      return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "Nesterov momentum needs momentum > 0 and dampening 0");
    }
  } else if (req->optimizer_case == TTD__V1__OPTIMIZER_STEP_REQUEST__OPTIMIZER_ADAM && req->adam) {
    const Ttd__V1__AdamOptions *o = req->adam;
    out->kind = TTD_OPTIMIZER_ADAM;
    out->adam_params = (ttd_adam_params){o->lr, o->beta1 ? o->beta1 : 0.9f, o->beta2 ? o->beta2 : 0.999f,
                                         o->eps ? o->eps : 1e-8f, o->weight_decay, o->decoupled};
    if (out->adam_params.beta1 >= 1.0f || out->adam_params.beta2 >= 1.0f || out->adam_params.beta1 < 0.0f ||
        out->adam_params.beta2 < 0.0f) {
      return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "Adam betas must lie in [0, 1)");
    }
  } else {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "OptimizerStep needs an optimizer: set sgd or adam");
  }
  /* torch.optim refuses the same: each of these >= 0 (NaN too). */
  bool adam = out->kind == TTD_OPTIMIZER_ADAM;
  const struct { const char *name; float value; } checks[] = {
      {"learning rate", adam ? out->adam_params.lr : out->sgd.lr},
      {"momentum", adam ? 0.0f : out->sgd.momentum},
      {"weight decay", adam ? out->adam_params.weight_decay : out->sgd.weight_decay},
      {"Adam eps", adam ? out->adam_params.eps : 0.0f},
  };
  for (size_t i = 0; i < sizeof(checks) / sizeof(checks[0]); i++) {
    if (!(checks[i].value >= 0.0f)) {
      return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "%s must be >= 0, got %g", checks[i].name,
                             (double)checks[i].value);
    }
  }
  return TTD_OK;
}

ttd_status_t ttd_optimizer_check_dtype(ttd_dtype dtype) {
  if (dtype == TTD_DTYPE_FLOAT32 || dtype == TTD_DTYPE_BFLOAT16) return TTD_OK;
  return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "OptimizerStep updates float32 or bfloat16 parameters, got %s",
                         ttd_dtype_name(dtype));
}
