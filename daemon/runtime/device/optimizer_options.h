/* The options of an optimizer step as the wire gives them (ttd.v1.OptimizerStepRequest's
 * sgd or adam), checked and turned into the backend's ttd_optimizer_call. Pure: shared by
 * the daemon's OptimizerStep (and the ParameterWork riding on Execute and Backward) and by
 * libttclient, which checks a tt_step it queues with the same code. */
#ifndef TTD_OPTIMIZER_OPTIONS_H
#define TTD_OPTIMIZER_OPTIONS_H

#include "dtype.h"
#include "backends/backend.h"
#include "ttd/v1/ttd.pb-c.h"

/* Fills out (cleared first) with the optimizer, its parameters and torch's defaults for zero
 * Adam betas and eps. INVALID_ARGUMENT when no optimizer is set, for Nesterov without
 * momentum or with dampening, for Adam betas outside [0, 1) and for a negative or NaN
 * learning rate; the message says what to fix. */
ttd_status_t ttd_optimizer_options_from_proto(const Ttd__V1__OptimizerStepRequest *req, ttd_optimizer_call *out);

/* INVALID_ARGUMENT unless dtype is one an optimizer updates (float32 or bfloat16). */
ttd_status_t ttd_optimizer_check_dtype(ttd_dtype dtype);

#endif
