/* Bad-input rows that use handles of others: another session's, tenant bob's, daemon B's and
 * never-issued ones, in every RPC that takes a handle. */
#include "bad_inputs.h"

/* Handles of others: each template runs once per owner in foreign_owners, FX_* standing for
 * that owner's tensor, program and run. Every owner's handle gets the same answer, word for
 * word but the handle, as a handle never issued (the last owner). */
const bad_row bad_inputs_foreign_rows[] = {
    ROW(FOREIGN, "Download", AS_ALICE, "Download %s tensor", NOT_FOUND, "not found in this session",
        .msg = {DOWNLOAD(.handle = H(FX_T))}),
    ROW(FOREIGN, "Move", AS_ALICE, "Move %s tensor to tt:1, freeing the source", NOT_FOUND, "not found in this session",
        .msg = {MOVE(.handle = H(FX_T), .device = "tt:1", .free_source = 1)}),
    ROW(FOREIGN, "Free", AS_ALICE, "Free alice's tensor and %s (nothing is freed)", NOT_FOUND,
        "not found in this session", .msg = {FREE(H(T_F32), H(FX_T))}),
    ROW(FOREIGN, "Upload", AS_ALICE, "Upload into %s tensor", NOT_FOUND, "not found in this session",
        .msg = {UP_INTO(H(FX_T), 16, 0)}),
    ROW(FOREIGN, "Execute", AS_ALICE, "Execute %s program", NOT_FOUND, "not found in this session",
        .msg = {EXECUTE(.program = H(FX_P), HANDLES(inputs, H(T_F32)))}),
    ROW(FOREIGN, "Execute", AS_ALICE, "Execute with %s tensor as the input", NOT_FOUND, "not found in this session",
        .msg = {EXECUTE(.program = H(P_RELU), HANDLES(inputs, H(FX_T)))}),
    ROW(FOREIGN, "Execute", AS_ALICE, "Execute with %s tensor as a parameter", NOT_FOUND, "not found in this session",
        .msg = {EXECUTE(.program = H(P_LIN), HANDLES(inputs, H(T_X)), HANDLES(parameters, H(T_W), H(FX_T)))}),
    ROW(FOREIGN, "Execute", AS_ALICE, "Execute after a ZeroGrad of %s tensor", NOT_FOUND,
        "ZeroGrad queued before this Execute failed",
        .msg = {EXECUTE(.program = H(P_RELU), HANDLES(inputs, H(T_F32)),
                        .before = WORK(.zero_grad = ZERO_GRAD(HANDLES(parameters, H(FX_T)))))}),
    ROW(FOREIGN, "Execute", AS_ALICE, "Execute carrying a Backward through %s run", NOT_FOUND,
        "the Backward carried by this Execute failed, so the forward did not run: run 0x",
        .msg = {EXECUTE(.program = H(P_RELU), HANDLES(inputs, H(T_F32)),
                        .backward = CARRIED(.run = H(FX_RUN), HANDLES(output_grads, H(T_DY))))}),
    ROW(FOREIGN, "Backward", AS_ALICE, "Backward through %s run", NOT_FOUND, "not found in this session",
        .msg = {BACKWARD(.run = H(FX_RUN), HANDLES(output_grads, H(T_DY)))}),
    ROW(FOREIGN, "Backward", AS_ALICE, "Backward with %s tensor as the output gradient", NOT_FOUND,
        "not found in this session", .msg = {BACKWARD(.run = H(RUN), HANDLES(output_grads, H(FX_T)))}),
    ROW(FOREIGN, "ReleaseRun", AS_ALICE, "ReleaseRun of %s run", NOT_FOUND, "not found in this session",
        .msg = {RELEASE(H(FX_RUN))}),
    ROW(FOREIGN, "ZeroGrad", AS_ALICE, "ZeroGrad of %s tensor", NOT_FOUND, "not found in this session",
        .msg = {&ZERO_GRAD(HANDLES(parameters, H(FX_T)))->base}),
    ROW(FOREIGN, "OptimizerStep", AS_ALICE, "OptimizerStep of alice's weight and %s tensor", NOT_FOUND,
        "not found in this session", .msg = {&STEP(HANDLES(parameters, H(T_W), H(FX_T)), ADAM(.lr = 0.1f))->base}),
    ROW(FOREIGN, "OptimizerState", AS_ALICE, "OptimizerState reading %s tensor's state", NOT_FOUND,
        "not found in this session", .msg = {OPT_STATE(HANDLES(parameters, H(T_W), H(FX_T)))}),
    ROW(FOREIGN, "OptimizerState", AS_ALICE, "OptimizerState writing alice's bias from %s tensor", NOT_FOUND,
        "not found in this session",
        .msg = {OPT_STATE(SETS(PSTATE(.parameter = H(T_B), .step = 1, HANDLES(buffers, H(FX_T)))))}),
    ROW(FOREIGN, "OptimizerState", AS_ALICE, "OptimizerState moving %s tensor's state to alice's bias", NOT_FOUND,
        "not found in this session", .msg = {OPT_STATE(SETS(PSTATE(.parameter = H(T_B), .from_parameter = H(FX_T))))}),
};
const size_t bad_inputs_foreign_rows_count = sizeof(bad_inputs_foreign_rows) / sizeof(bad_inputs_foreign_rows[0]);
