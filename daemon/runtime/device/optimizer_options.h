/* The options of an optimizer step as the wire gives them (ttd.v1.OptimizerStepRequest's
 * sgd or adam), checked and turned into the backend's ttd_optimizer_call. Pure: shared by
 * the daemon's OptimizerStep (and the ParameterWork riding on Execute and Backward) and by
 * libttclient, whose optimizer constructors and tt_optimizer_set_lr check with the same code. */
#ifndef TTD_OPTIMIZER_OPTIONS_H
#define TTD_OPTIMIZER_OPTIONS_H

#include "dtype.h"
#include "backends/backend.h"
#include "ttd/v1/ttd.pb-c.h"

/* Fills out (cleared first) with the optimizer and its parameters; zero Adam betas and eps
 * take torch's defaults unless AdamOptions.no_defaults is set. INVALID_ARGUMENT when no
 * optimizer is set; the values are not checked. */
ttd_status_t ttd_optimizer_options_convert(const Ttd__V1__OptimizerStepRequest *req, ttd_optimizer_call *out);

/* The same, then checked as ttd_optimizer_check does, naming the optimizer ("SGD", "Adam",
 * "AdamW"). */
ttd_status_t ttd_optimizer_options_from_proto(const Ttd__V1__OptimizerStepRequest *req, ttd_optimizer_call *out);

/* torch.optim's constructor checks, each value also finite: lr, momentum and weight_decay
 * >= 0, dampening any finite number, Nesterov only with momentum > 0 and dampening 0; Adam's
 * beta1 and beta2 in [0, 1) and eps > 0. INVALID_ARGUMENT for the first bad one, in torch's
 * order: "WHO: lr is -1; it must be a finite number >= 0". */
ttd_status_t ttd_optimizer_check(const ttd_optimizer_call *call, const char *who);

/* The learning rate's part of that check, for a change between steps. */
ttd_status_t ttd_optimizer_check_lr(float lr, const char *who);

/* INVALID_ARGUMENT unless dtype is one an optimizer updates (float32 or bfloat16). */
ttd_status_t ttd_optimizer_check_dtype(ttd_dtype dtype);

#endif
