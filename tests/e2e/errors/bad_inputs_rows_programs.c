/* Bad-input rows of the program RPCs: Compile, Execute, Backward, ReleaseRun, ZeroGrad,
 * OptimizerStep and OptimizerState; and the graphs too large to write as literals (10^6 nodes, long cycles,
 * 10^5 outputs), built at run time. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "bad_inputs.h"

static size_t make_million_empty_nodes(unsigned char **out);
static size_t make_million_node_chain(unsigned char **out);
static size_t make_chain_past_limit(unsigned char **out);
static size_t make_long_cycle(unsigned char **out);
static size_t make_chain_into_cycle(unsigned char **out);
static size_t make_many_outputs(unsigned char **out);
static size_t make_repeated_output(unsigned char **out);

const bad_row bad_inputs_program_rows[] = {
    /* Compile: the shapes of bad graphs e2e_programs does not try */
    ROW(WRONG_TYPE, "Compile", AS_ALICE, "an ExecuteRequest: field 1 a fixed64, not a Graph", INVALID_ARGUMENT,
        "not a valid ttd.v1.CompileRequest", .msg = {EXECUTE(.program = 0x1234)}),
    ROW(GRAPHS, "Compile", AS_ALICE, "no graph", INVALID_ARGUMENT, "the graph is missing",
        .msg = {REQ(Ttd__V1__CompileRequest, ttd__v1__compile_request__descriptor, .graph = NULL)}),
    ROW(GRAPHS, "Compile", AS_ALICE, "a 3-cycle beside the output's path", INVALID_ARGUMENT, "is part of a cycle",
        .msg = {COMPILE(INPUTS(VALUE("x", F32, SHAPE(4))), OUTPUTS("y"),
                        NODES(NODE("y", "relu", INS("x")), NODE("a", "relu", INS("c")), NODE("b", "relu", INS("a")),
                              NODE("c", "relu", INS("b"))))}),
    ROW(GRAPHS, "Compile", AS_ALICE, "the output reads itself through both inputs of add", INVALID_ARGUMENT,
        "node 'y' is part of a cycle", .msg = {COMPILE(OUTPUTS("y"), NODES(NODE("y", "add", INS("y", "y"))))}),
    ROW(GRAPHS, "Compile", AS_ALICE, "a node reading itself, no inputs at all", INVALID_ARGUMENT,
        "node 'n' is part of a cycle", .msg = {COMPILE(OUTPUTS("n"), NODES(NODE("n", "tanh", INS("n"))))}),
    ROW(GRAPHS, "Compile", AS_ALICE, "a node named like an input it reads", INVALID_ARGUMENT, "the name 'x' is used twice",
        .msg = {COMPILE(INPUTS(VALUE("x", F32, SHAPE(4))), OUTPUTS("x"), NODES(NODE("x", "relu", INS("x"))))}),
    ROW(GRAPHS, "Compile", AS_ALICE, "an output listed twice", INVALID_ARGUMENT, "output 'y' is listed twice",
        .msg = {COMPILE(INPUTS(VALUE("x", F32, SHAPE(4))), OUTPUTS("y", "y"), NODES(NODE("y", "relu", INS("x"))))}),
    ROW(GRAPHS, "Compile", AS_ALICE, "a node with 4 inputs", INVALID_ARGUMENT, "4 inputs; no op takes more than 3",
        .msg = {COMPILE(INPUTS(VALUE("x", F32, SHAPE(4))), OUTPUTS("y"), NODES(NODE("y", "add", INS("x", "x", "x", "x"))))}),
    ROW(GRAPHS, "Compile", AS_ALICE, "a node with no name", INVALID_ARGUMENT, "node 0 (relu) has no name; name every node",
        .msg = {COMPILE(INPUTS(VALUE("x", F32, SHAPE(4))), OUTPUTS("x"), NODES(NODE("", "relu", INS("x"))))}),
    ROW(GRAPHS, "Compile", AS_ALICE, "an input with no name", INVALID_ARGUMENT, "graph input 0 has no name",
        .msg = {COMPILE(INPUTS(VALUE("", F32, SHAPE(4))), OUTPUTS("y"), NODES(NODE("y", "relu", INS("x"))))}),
    ROW(GRAPHS, "Compile", AS_ALICE, "an attribute given twice", INVALID_ARGUMENT, "attribute 'p' is given twice",
        .msg = {COMPILE(INPUTS(VALUE("x", F32, SHAPE(4))), OUTPUTS("y"),
                        NODES(NODE("y", "dropout", INS("x"), ATTRS(ATTR_F("p", 0.1f), ATTR_F("p", 0.2f)))))}),
    ROW(GRAPHS, "Compile", AS_ALICE, "a dropout probability above 1", INVALID_ARGUMENT, "p must be in [0, 1], got 1.5",
        .msg = {COMPILE(INPUTS(VALUE("x", F32, SHAPE(4))), OUTPUTS("y"),
                        NODES(NODE("y", "dropout", INS("x"), ATTRS(ATTR_F("p", 1.5f)))))}),
    ROW(GRAPHS, "Compile", AS_ALICE, "an integer attribute sent as a float", INVALID_ARGUMENT,
        "attribute 'kernel' must be a list of integers",
        .msg = {COMPILE(INPUTS(VALUE("x", F32, SHAPE(1, 1, 4, 4))), OUTPUTS("y"),
                        NODES(NODE("y", "max_pool2d", INS("x"), ATTRS(ATTR_F("kernel", 2.0f)))))}),
    ROW(DIMS, "Compile", AS_ALICE, "an input of 2^40 x 2^40 elements", INVALID_ARGUMENT,
        "input 'x': shape has more than 2^63 elements",
        .msg = {COMPILE(INPUTS(VALUE("x", F32, SHAPE(1ll << 40, 1ll << 40))), OUTPUTS("y"), NODES(NODE("y", "relu", INS("x"))))}),
    ROW(DIMS, "Compile", AS_ALICE, "a parameter of 9 dims", INVALID_ARGUMENT, "parameter 'w' has more than 8 dims",
        .msg = {COMPILE(PARAMS(VALUE("w", F32, SHAPE(1, 1, 1, 1, 1, 1, 1, 1, 1))), OUTPUTS("w"))}),
    ROW(DIMS, "Compile", AS_ALICE, "matmul [2^32, 1] x [1, 2^32]: the output passes 2^63 elements", INVALID_ARGUMENT,
        "node 'y' (matmul): its output [4294967296, 4294967296]: shape has more than 2^63 elements",
        .msg = {COMPILE(INPUTS(VALUE("a", F32, SHAPE(1ll << 32, 1)), VALUE("b", F32, SHAPE(1, 1ll << 32))), OUTPUTS("y"),
                        NODES(NODE("y", "matmul", INS("a", "b"))))}),
    ROW(DIMS, "Compile", AS_ALICE, "add [2^32, 1] + [1, 2^32]: broadcast past 2^63 elements", INVALID_ARGUMENT,
        "node 'y' (add): its output [4294967296, 4294967296]: shape has more than 2^63 elements",
        .msg = {COMPILE(INPUTS(VALUE("a", F32, SHAPE(1ll << 32, 1)), VALUE("b", F32, SHAPE(1, 1ll << 32))), OUTPUTS("y"),
                        NODES(NODE("y", "add", INS("a", "b"))))}),
    ROW(DIMS, "Compile", AS_ALICE, "embedding of 2^40 indices into 2^40-wide rows", INVALID_ARGUMENT,
        "node 'y' (embedding): its output [1099511627776, 1099511627776]: shape has more than 2^63 elements",
        .msg = {COMPILE(INPUTS(VALUE("i", I32, SHAPE(1ll << 40)), VALUE("t", F32, SHAPE(1, 1ll << 40))), OUTPUTS("y"),
                        NODES(NODE("y", "embedding", INS("i", "t"))))}),
    ROW(DIMS, "Compile", AS_ALICE, "conv2d with padding 2^62", INVALID_ARGUMENT,
        "node 'y' (conv2d): attribute 'padding' is 4611686018427387904; it must lie in [0, 2147483647]",
        .msg = {COMPILE(INPUTS(VALUE("x", F32, SHAPE(1, 1, 4, 4)), VALUE("k", F32, SHAPE(1, 1, 1, 1))), OUTPUTS("y"),
                        NODES(NODE("y", "conv2d", INS("x", "k"), ATTRS(ATTR_I("padding", 1ll << 62)))))}),
    ROW(DIMS, "Compile", AS_ALICE, "conv2d with padding 2^40 on a 1x1 kernel (an output of 2^82 elements)",
        INVALID_ARGUMENT, "node 'y' (conv2d): attribute 'padding' is 1099511627776",
        .msg = {COMPILE(INPUTS(VALUE("x", F32, SHAPE(1, 1, 4, 4)), VALUE("k", F32, SHAPE(1, 1, 1, 1))), OUTPUTS("y"),
                        NODES(NODE("y", "conv2d", INS("x", "k"), ATTRS(ATTR_I("padding", 1ll << 40)))))}),
    ROW(DIMS, "Compile", AS_ALICE, "conv2d with stride -1", INVALID_ARGUMENT, "node 'y' (conv2d): attribute 'stride' is -1",
        .msg = {COMPILE(INPUTS(VALUE("x", F32, SHAPE(1, 1, 4, 4)), VALUE("k", F32, SHAPE(1, 1, 1, 1))), OUTPUTS("y"),
                        NODES(NODE("y", "conv2d", INS("x", "k"), ATTRS(ATTR_I("stride", -1)))))}),
    ROW(DIMS, "Compile", AS_ALICE, "max_pool2d with kernel INT64_MAX and padding 2^62", INVALID_ARGUMENT,
        "node 'y' (max_pool2d): attribute 'kernel' is 9223372036854775807",
        .msg = {COMPILE(INPUTS(VALUE("x", F32, SHAPE(1, 1, 4, 4))), OUTPUTS("y"),
                        NODES(NODE("y", "max_pool2d", INS("x"),
                                   ATTRS(ATTR_I("kernel", INT64_MAX), ATTR_I("padding", 1ll << 62)))))}),
    ROW(DIMS, "Compile", AS_ALICE, "avg_pool2d of a 2048x2048 window over 4096x4096 (10^13 operations)",
        RESOURCE_EXHAUSTED,
        "the program's forward costs about 1.76e+13 operations, more than this ttd runs in one program "
        "(--max-program-cost 1.1e+12): node 'y' (avg_pool2d) alone costs 1.76e+13",
        .msg = {COMPILE(INPUTS(VALUE("x", F32, SHAPE(1, 1, 4096, 4096))), OUTPUTS("y"),
                        NODES(NODE("y", "avg_pool2d", INS("x"), ATTRS(ATTR_I("kernel", 2048), ATTR_I("stride", 1)))))}),
    ROW(DIMS, "Compile", AS_ALICE, "conv2d of a 384x384 window over 768x768, too large for columns (direct path)",
        RESOURCE_EXHAUSTED, "node 'y' (conv2d) alone costs 2.8e+12",
        .msg = {COMPILE(INPUTS(VALUE("x", F32, SHAPE(1, 1, 768, 768)), VALUE("k", F32, SHAPE(1, 1, 384, 384))),
                        OUTPUTS("y"), NODES(NODE("y", "conv2d", INS("x", "k"), ATTRS())))}),
    ROW(DIMS, "Compile", AS_ALICE, "avg_pool2d with stride 0", INVALID_ARGUMENT, "node 'y' (avg_pool2d)",
        .msg = {COMPILE(INPUTS(VALUE("x", F32, SHAPE(1, 1, 4, 4))), OUTPUTS("y"),
                        NODES(NODE("y", "avg_pool2d", INS("x"), ATTRS(ATTR_I("kernel", 2), ATTR_I("stride", 0)))))}),
    ROW(DIMS, "Compile", AS_ALICE, "reshape into [-1, -1]", INVALID_ARGUMENT, "at most one -1",
        .msg = {COMPILE(INPUTS(VALUE("x", F32, SHAPE(4))), OUTPUTS("y"),
                        NODES(NODE("y", "reshape", INS("x"),
                                   ATTRS(NEW(Ttd__V1__Attr, ttd__v1__attr__descriptor, .name = "shape",
                                             .value_case = TTD__V1__ATTR__VALUE_INTS,
                                             .ints = NEW(Ttd__V1__IntList, ttd__v1__int_list__descriptor,
                                                         .n_values = 2, .values = (int64_t[]){-1, -1}))))))}),
    ROW(DTYPES, "Compile", AS_ALICE, "add of float32 and int32", INVALID_ARGUMENT,
        "node 'y' (add): input 1 must be floating point, got int32",
        .msg = {COMPILE(INPUTS(VALUE("a", F32, SHAPE(4)), VALUE("b", I32, SHAPE(4))), OUTPUTS("y"),
                        NODES(NODE("y", "add", INS("a", "b"))))}),
    ROW(DTYPES, "Compile", AS_ALICE, "embedding with float32 indices", INVALID_ARGUMENT,
        "indices (input 0) must be int32, got float32",
        .msg = {COMPILE(INPUTS(VALUE("i", F32, SHAPE(4)), VALUE("t", F32, SHAPE(8, 2))), OUTPUTS("y"),
                        NODES(NODE("y", "embedding", INS("i", "t"))))}),
    ROW(DTYPES, "Compile", AS_ALICE, "an int32 parameter", INVALID_ARGUMENT, "parameter 'w' is int32",
        .msg = {COMPILE(PARAMS(VALUE("w", I32, SHAPE(4))), OUTPUTS("w"))}),
    ROW(DTYPES, "Compile", AS_ALICE, "an input of dtype 7", INVALID_ARGUMENT, "input 'x': dtype 7 is not supported",
        .msg = {COMPILE(INPUTS(VALUE("x", 7, SHAPE(4))), OUTPUTS("x"))}),
    ROW(GRAPHS, "Compile", AS_ALICE, "10^6 nodes (2 MB of empty nodes)", INVALID_ARGUMENT,
        "graph has 1000000 nodes; at most 100000 are supported", .make = make_million_empty_nodes),
    ROW(GRAPHS, "Compile", AS_ALICE, "a chain of 10^6 relu nodes (a 20 MB message)", RESOURCE_EXHAUSTED,
        "larger than max", .make = make_million_node_chain),
    ROW(GRAPHS, "Compile", AS_ALICE, "a chain of 100001 relu nodes, one past the limit", INVALID_ARGUMENT,
        "graph has 100001 nodes; at most 100000", .make = make_chain_past_limit),
    ROW(GRAPHS, "Compile", AS_ALICE, "a 1000-node cycle", INVALID_ARGUMENT, "is part of a cycle", .make = make_long_cycle),
    ROW(GRAPHS, "Compile", AS_ALICE, "a chain of 99990 nodes fed by a 10-node cycle", INVALID_ARGUMENT,
        "is part of a cycle", .make = make_chain_into_cycle),
    ROW(GRAPHS, "Compile", AS_ALICE, "100000 distinct outputs (each a graph input): compiles in time", OK, NULL,
        .make = make_many_outputs),
    ROW(GRAPHS, "Compile", AS_ALICE, "400000 outputs, the last a repeat of the first: refused in time", INVALID_ARGUMENT,
        "output '0' is listed twice", .make = make_repeated_output),

    /* Execute (e2e_programs and e2e_round_trips have counts, swapped int32, shapes, tt:1, inline data) */
    ROW(WRONG_TYPE, "Execute", AS_ALICE, "a CompileRequest: field 1 a Graph, not a fixed64", INVALID_ARGUMENT,
        "not a valid ttd.v1.ExecuteRequest", .msg = {COMPILE(OUTPUTS("y"))}),
    ROW(HANDLE_LISTS, "Execute", AS_ALICE, "no inputs for a program of one", INVALID_ARGUMENT,
        "takes 1 inputs and 0 parameters, got 0 and 0", .msg = {EXECUTE(.program = H(P_RELU))}),
    ROW(HANDLE_LISTS, "Execute", AS_ALICE, "input handle 0 with no inline input", NOT_FOUND,
        "tensor 0x0000000000000000 not found", .msg = {EXECUTE(.program = H(P_RELU), HANDLES(inputs, 0))}),
    ROW(HANDLE_LISTS, "Execute", AS_ALICE, "program 0", NOT_FOUND, "program 0x0000000000000000 not found",
        .msg = {EXECUTE(.program = 0, HANDLES(inputs, H(T_F32)))}),
    ROW(HANDLE_LISTS, "Execute", AS_ALICE, "a tensor handle as the program", NOT_FOUND, "not found in this session",
        .msg = {EXECUTE(.program = H(T_F32), HANDLES(inputs, H(T_F32)))}),
    ROW(DTYPES, "Execute", AS_ALICE, "a bfloat16 tensor for a float32 input", INVALID_ARGUMENT,
        "input 'x' must be float32 [4], got bfloat16 [4]", .msg = {EXECUTE(.program = H(P_RELU), HANDLES(inputs, H(T_BF16)))}),
    ROW(DIMS, "Execute", AS_ALICE, "an empty [0] tensor for a [4] input", INVALID_ARGUMENT,
        "input 'x' must be float32 [4], got float32 [0]", .msg = {EXECUTE(.program = H(P_RELU), HANDLES(inputs, H(T_EMPTY)))}),
    ROW(DIMS, "Execute", AS_ALICE, "an inline input of 2^40 x 2^40", INVALID_ARGUMENT,
        "inline input 0 ('x'): shape has more than 2^63 elements",
        .msg = {EXECUTE(.program = H(P_RELU), .n_inline_inputs = 1,
                        .inline_inputs = (Ttd__V1__InlineTensor *[]){INLINE(16, .dtype = F32, SHAPE(1ll << 40, 1ll << 40))})}),
    ROW(OPTIONS, "Execute", AS_ALICE, "output_mode -1", INVALID_ARGUMENT, "output_mode -1 is unknown",
        .msg = {EXECUTE(.program = H(P_RELU), HANDLES(inputs, H(T_F32)), .output_mode = -1)}),
    ROW(HANDLE_LISTS, "Execute", AS_ALICE, "before: OptimizerStep listing a parameter twice", INVALID_ARGUMENT,
        "OptimizerStep queued before this Execute failed: handle 0x",
        .msg = {EXECUTE(.program = H(P_RELU), HANDLES(inputs, H(T_F32)),
                        .before = WORK(.step = STEP(HANDLES(parameters, H(T_W), H(T_B), H(T_W)), SGD(.lr = 0.1f))))}),
    ROW(HANDLE_LISTS, "Execute", AS_ALICE, "carrying a Backward of run 0", NOT_FOUND,
        "the Backward carried by this Execute failed, so the forward did not run: run 0x0000000000000000 not found",
        .msg = {EXECUTE(.program = H(P_RELU), HANDLES(inputs, H(T_F32)),
                        .backward = CARRIED(.run = 0, HANDLES(output_grads, H(T_DY))))}),
    ROW(DTYPES, "Execute", AS_ALICE, "carrying a Backward with an int32 output gradient", INVALID_ARGUMENT,
        "the Backward carried by this Execute failed, so the forward did not run: ",
        .msg = {EXECUTE(.program = H(P_LIN), HANDLES(inputs, H(T_X)), HANDLES(parameters, H(T_W), H(T_B)),
                        .backward = CARRIED(.run = H(RUN), HANDLES(output_grads, H(T_I32))))}),
    ROW(FOREIGN, "Execute", AS_ALICE, "free: bob's tensor rides along (skipped; his tensor stays)", OK, NULL,
        .msg = {EXECUTE(.program = H(P_RELU), HANDLES(inputs, H(T_F32)), HANDLES(free, H(BOB_T)),
                        .output_mode = TTD__V1__OUTPUT_MODE__OUTPUT_MODE_INLINE)}),

    /* Backward */
    ROW(WRONG_TYPE, "Backward", AS_ALICE, "a ReleaseRunRequest: the run and no gradient", INVALID_ARGUMENT,
        "the program has 1 outputs, got 0 output gradients", .msg = {RELEASE(H(RUN))}),
    ROW(HANDLE_LISTS, "Backward", AS_ALICE, "run 0", NOT_FOUND, "run 0x0000000000000000 not found",
        .msg = {BACKWARD(.run = 0, HANDLES(output_grads, H(T_DY)))}),
    ROW(HANDLE_LISTS, "Backward", AS_ALICE, "a program handle as the run", NOT_FOUND, "not found in this session",
        .msg = {BACKWARD(.run = H(P_LIN), HANDLES(output_grads, H(T_DY)))}),
    ROW(HANDLE_LISTS, "Backward", AS_ALICE, "the same gradient twice for one output", INVALID_ARGUMENT,
        "the program has 1 outputs, got 2 output gradients", .msg = {BACKWARD(.run = H(RUN), HANDLES(output_grads, H(T_DY), H(T_DY)))}),
    ROW(DTYPES, "Backward", AS_ALICE, "an int32 output gradient", INVALID_ARGUMENT, "int32",
        .msg = {BACKWARD(.run = H(RUN), HANDLES(output_grads, H(T_I32)))}),
    ROW(DIMS, "Backward", AS_ALICE, "an empty [0] output gradient for a [2, 4] output", INVALID_ARGUMENT, "[0]",
        .msg = {BACKWARD(.run = H(RUN), HANDLES(output_grads, H(T_EMPTY)))}),
    ROW(HANDLE_LISTS, "Backward", AS_ALICE, "after: OptimizerStep listing a parameter twice", INVALID_ARGUMENT,
        "OptimizerStep after this Backward failed: handle 0x",
        .msg = {BACKWARD(.run = H(RUN), HANDLES(output_grads, H(T_DY)),
                         .after = WORK(.step = STEP(HANDLES(parameters, H(T_B), H(T_B)), SGD(.lr = 0.1f))))}),

    /* ReleaseRun */
    ROW(WRONG_TYPE, "ReleaseRun", AS_ALICE, "the run as a varint (wrong wire type)", INVALID_ARGUMENT,
        "not a valid ttd.v1.ReleaseRunRequest", RAW("\x08\x05")),
    ROW(HANDLE_LISTS, "ReleaseRun", AS_ALICE, "run 0", NOT_FOUND, "run 0x0000000000000000 not found",
        .msg = {RELEASE(0)}),
    ROW(HANDLE_LISTS, "ReleaseRun", AS_ALICE, "a tensor handle as the run", NOT_FOUND, "not found in this session",
        .msg = {RELEASE(H(T_F32))}),

    /* ZeroGrad */
    ROW(WRONG_TYPE, "ZeroGrad", AS_ALICE, "a KillSessionRequest: a fixed64 where a list is", OK, NULL,
        .msg = {KILL(H(T_W))}),
    ROW(HANDLE_LISTS, "ZeroGrad", AS_ALICE, "an empty parameter list: nothing to zero", OK, NULL,
        .msg = {&ZERO_GRAD(.n_parameters = 0)->base}),
    ROW(HANDLE_LISTS, "ZeroGrad", AS_ALICE, "a parameter listed twice", INVALID_ARGUMENT,
        "is listed twice (at 1); list each once", .msg = {&ZERO_GRAD(HANDLES(parameters, H(T_W), H(T_W)))->base}),
    ROW(HANDLE_LISTS, "ZeroGrad", AS_ALICE, "a freed parameter after a good one", NOT_FOUND, "not found in this session",
        .msg = {&ZERO_GRAD(HANDLES(parameters, H(T_W), H(T_FREED)))->base}),

    /* OptimizerStep (e2e_programs has no optimizer; the client refuses bad options when an optimizer is made) */
    ROW(WRONG_TYPE, "OptimizerStep", AS_ALICE, "a ZeroGradRequest: parameters and no optimizer", INVALID_ARGUMENT,
        "OptimizerStep needs an optimizer: set sgd or adam", .msg = {&ZERO_GRAD(HANDLES(parameters, H(T_W)))->base}),
    ROW(HANDLE_LISTS, "OptimizerStep", AS_ALICE, "an empty parameter list: nothing to update", OK, NULL,
        .msg = {&STEP(SGD(.lr = 0.1f))->base}),
    ROW(HANDLE_LISTS, "OptimizerStep", AS_ALICE, "a parameter listed twice (it would step twice)", INVALID_ARGUMENT,
        "is listed twice (at 1); list each once", .msg = {&STEP(HANDLES(parameters, H(T_W), H(T_W)), SGD(.lr = 0.1f))->base}),
    ROW(DTYPES, "OptimizerStep", AS_ALICE, "an int32 tensor as a parameter", INVALID_ARGUMENT,
        "OptimizerStep updates float32 or bfloat16 parameters, got int32",
        .msg = {&STEP(HANDLES(parameters, H(T_I32)), SGD(.lr = 0.1f))->base}),
    ROW(OPTIONS, "OptimizerStep", AS_ALICE, "SGD learning rate NaN", INVALID_ARGUMENT,
        "SGD: lr is nan; it must be a finite number >= 0",
        .msg = {&STEP(HANDLES(parameters, H(T_W)), SGD(.lr = __builtin_nanf("")))->base}),
    ROW(OPTIONS, "OptimizerStep", AS_ALICE, "SGD momentum -0.9", INVALID_ARGUMENT,
        "SGD: momentum is -0.9; it must be a finite number >= 0",
        .msg = {&STEP(HANDLES(parameters, H(T_W)), SGD(.lr = 0.1f, .momentum = -0.9f))->base}),
    ROW(OPTIONS, "OptimizerStep", AS_ALICE, "SGD weight decay -1", INVALID_ARGUMENT,
        "SGD: weight_decay is -1; it must be a finite number >= 0",
        .msg = {&STEP(HANDLES(parameters, H(T_W)), SGD(.lr = 0.1f, .weight_decay = -1.0f))->base}),
    ROW(OPTIONS, "OptimizerStep", AS_ALICE, "Adam beta1 1", INVALID_ARGUMENT,
        "Adam: beta1 is 1; it must be a finite number in [0, 1)",
        .msg = {&STEP(HANDLES(parameters, H(T_W)), ADAM(.lr = 0.1f, .beta1 = 1.0f))->base}),
    ROW(OPTIONS, "OptimizerStep", AS_ALICE, "Adam eps -1e-8", INVALID_ARGUMENT,
        "Adam: eps is -1e-08; it must be a finite number > 0",
        .msg = {&STEP(HANDLES(parameters, H(T_W)), ADAM(.lr = 0.1f, .eps = -1e-8f))->base}),
    ROW(OPTIONS, "OptimizerStep", AS_ALICE, "SGD learning rate +inf", INVALID_ARGUMENT,
        "SGD: lr is inf; it must be a finite number >= 0",
        .msg = {&STEP(HANDLES(parameters, H(T_W)), SGD(.lr = __builtin_inff()))->base}),
    ROW(OPTIONS, "OptimizerStep", AS_ALICE, "Adam eps 0 taken as given (no_defaults)", INVALID_ARGUMENT,
        "Adam: eps is 0; it must be a finite number > 0",
        .msg = {&STEP(HANDLES(parameters, H(T_W)), ADAM(.lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.99f, .no_defaults = 1))->base}),

    /* OptimizerState: reads copy no state for a bad request, writes change nothing */
    ROW(WRONG_TYPE, "OptimizerState", AS_ALICE, "an OptimizerStepRequest: its sgd read as a ParameterState",
        INVALID_ARGUMENT, "not a valid ttd.v1.OptimizerStateRequest",
        .msg = {&STEP(HANDLES(parameters, H(T_W)), SGD(.lr = 0.1f))->base}),
    ROW(HANDLE_LISTS, "OptimizerState", AS_ALICE, "an empty request: nothing to read", OK, NULL,
        .msg = {OPT_STATE(.n_parameters = 0)}),
    ROW(HANDLE_LISTS, "OptimizerState", AS_ALICE, "parameters to read and states to write at once", INVALID_ARGUMENT,
        "reads parameters or writes set, not both",
        .msg = {OPT_STATE(HANDLES(parameters, H(T_W)), SETS(PSTATE(.parameter = H(T_B))))}),
    ROW(HANDLE_LISTS, "OptimizerState", AS_ALICE, "read: a parameter listed twice", INVALID_ARGUMENT,
        "is listed twice (at 1); list each once", .msg = {OPT_STATE(HANDLES(parameters, H(T_W), H(T_W)))}),
    ROW(HANDLE_LISTS, "OptimizerState", AS_ALICE, "read: a freed parameter after a good one", NOT_FOUND,
        "not found in this session", .msg = {OPT_STATE(HANDLES(parameters, H(T_W), H(T_FREED)))}),
    ROW(DTYPES, "OptimizerState", AS_ALICE, "read: an int32 tensor as a parameter", INVALID_ARGUMENT,
        "is int32; optimizer state is kept for float32 and bfloat16 parameters",
        .msg = {OPT_STATE(HANDLES(parameters, H(T_I32)))}),
    ROW(HANDLE_LISTS, "OptimizerState", AS_ALICE, "write: a parameter written twice", INVALID_ARGUMENT,
        "is listed twice (at 1); list each once",
        .msg = {OPT_STATE(SETS(PSTATE(.parameter = H(T_B)), PSTATE(.parameter = H(T_B))))}),
    ROW(HANDLE_LISTS, "OptimizerState", AS_ALICE, "write: a freed parameter", NOT_FOUND, "not found in this session",
        .msg = {OPT_STATE(SETS(PSTATE(.parameter = H(T_FREED), .step = 1)))}),
    ROW(DTYPES, "OptimizerState", AS_ALICE, "write: an int32 parameter", INVALID_ARGUMENT,
        "is int32; optimizer state is kept for float32 and bfloat16 parameters",
        .msg = {OPT_STATE(SETS(PSTATE(.parameter = H(T_I32), .step = 1)))}),
    ROW(HANDLE_LISTS, "OptimizerState", AS_ALICE, "write: a good entry, then a freed buffer (nothing changes)", NOT_FOUND,
        "not found in this session",
        .msg = {OPT_STATE(SETS(PSTATE(.parameter = H(T_B), .step = 1, HANDLES(buffers, H(T_F32))),
                               PSTATE(.parameter = H(T_W), .step = 1, HANDLES(buffers, H(T_FREED)))))}),
    ROW(DIMS, "OptimizerState", AS_ALICE, "write: a [4] buffer for a [4, 3] parameter", INVALID_ARGUMENT,
        "buffer 0 must be float32 [4, 3] on tt:0 dram like the parameter, got float32 [4] on tt:0 dram",
        .msg = {OPT_STATE(SETS(PSTATE(.parameter = H(T_W), .step = 1, HANDLES(buffers, H(T_F32)))))}),
    ROW(DTYPES, "OptimizerState", AS_ALICE, "write: a bfloat16 buffer", INVALID_ARGUMENT,
        "buffer 1 must be float32 [4] on tt:0 dram like the parameter, got bfloat16 [4]",
        .msg = {OPT_STATE(SETS(PSTATE(.parameter = H(T_B), .step = 1, HANDLES(buffers, H(T_F32), H(T_BF16)))))}),
    ROW(OPTIONS, "OptimizerState", AS_ALICE, "write: step -1", INVALID_ARGUMENT, "step is -1; it must be >= 0",
        .msg = {OPT_STATE(SETS(PSTATE(.parameter = H(T_B), .step = -1)))}),
    ROW(HANDLE_LISTS, "OptimizerState", AS_ALICE, "write: 3 buffers", INVALID_ARGUMENT,
        "3 buffers; an optimizer keeps at most 2",
        .msg = {OPT_STATE(SETS(PSTATE(.parameter = H(T_B), .step = 1, HANDLES(buffers, H(T_F32), H(T_F32), H(T_F32)))))}),
    ROW(OPTIONS, "OptimizerState", AS_ALICE, "write: from_parameter with a step", INVALID_ARGUMENT,
        "from_parameter moves a whole state: leave step and buffers unset",
        .msg = {OPT_STATE(SETS(PSTATE(.parameter = H(T_B), .step = 2, .from_parameter = H(T_F32))))}),
    ROW(DIMS, "OptimizerState", AS_ALICE, "write: the state of a [4, 3] parameter moved to a [4] one", INVALID_ARGUMENT,
        "from_parameter must be a parameter [4] on tt:0 dram like the parameter, got float32 [4, 3]",
        .msg = {OPT_STATE(SETS(PSTATE(.parameter = H(T_B), .from_parameter = H(T_W))))}),
    ROW(HANDLE_LISTS, "OptimizerState", AS_ALICE, "write: a parameter's state moved onto itself", INVALID_ARGUMENT,
        "is listed twice (at 1); list each once",
        .msg = {OPT_STATE(SETS(PSTATE(.parameter = H(T_B), .from_parameter = H(T_B))))}),
    ROW(HANDLE_LISTS, "OptimizerState", AS_ALICE, "write: one state moved to two parameters", INVALID_ARGUMENT,
        "is listed twice (at 3); list each once",
        .msg = {OPT_STATE(SETS(PSTATE(.parameter = H(T_B), .from_parameter = H(T_F32)),
                               PSTATE(.parameter = H(T_BF16), .from_parameter = H(T_F32))))}),
    ROW(HANDLE_LISTS, "OptimizerState", AS_ALICE, "write: a freed from_parameter", NOT_FOUND,
        "not found in this session", .msg = {OPT_STATE(SETS(PSTATE(.parameter = H(T_B), .from_parameter = H(T_FREED))))}),
};
const size_t bad_inputs_program_rows_count = sizeof(bad_inputs_program_rows) / sizeof(bad_inputs_program_rows[0]);

/* ---- requests built at run time ---- */

/* A CompileRequest of g, packed into *out (malloc'd). */
static size_t pack_graph(Ttd__V1__Graph *g, unsigned char **out) {
  Ttd__V1__CompileRequest req = TTD__V1__COMPILE_REQUEST__INIT;
  req.graph = g;
  size_t len = ttd__v1__compile_request__get_packed_size(&req);
  *out = malloc(len);
  ttd__v1__compile_request__pack(&req, *out);
  return len;
}

/* A CompileRequest of n relu nodes chained from input "x" [4]: node i reads node i - 1 (or,
 * with cycle_len, the first cycle_len nodes form a cycle that feeds the chain); with empty,
 * nodes left empty instead. The output is the last node. */
static size_t make_graph(unsigned char **out, size_t n, size_t cycle_len, int empty) {
  struct { Ttd__V1__Node node; char *input; char name[12]; } *at = calloc(n, sizeof(*at));
  Ttd__V1__Node **ptrs = calloc(n, sizeof(*ptrs));
  ck_assert(at && ptrs);
  for (size_t i = 0; i < n; i++) {
    ttd__v1__node__init(&at[i].node);
    ptrs[i] = &at[i].node;
    snprintf(at[i].name, sizeof(at[i].name), "%x", (unsigned)i);
    if (empty) continue;
    at[i].node.name = at[i].name;
    at[i].node.op = "relu";
    at[i].node.n_inputs = 1;
    at[i].node.inputs = &at[i].input;
  }
  for (size_t i = 0; i < n && !empty; i++) {
    if (cycle_len && i < cycle_len) at[i].input = at[(i + cycle_len - 1) % cycle_len].name;
    else at[i].input = i ? at[i - 1].name : "x";
  }
  char *output = at[n - 1].name;
  Ttd__V1__ValueSpec x = TTD__V1__VALUE_SPEC__INIT, *xs = &x;
  int64_t four = 4;
  x.name = "x";
  x.dtype = F32;
  x.n_shape = 1;
  x.shape = &four;
  Ttd__V1__Graph g = TTD__V1__GRAPH__INIT;
  g.n_inputs = 1;
  g.inputs = &xs;
  g.n_nodes = n;
  g.nodes = ptrs;
  g.n_outputs = 1;
  g.outputs = &output;
  size_t len = pack_graph(&g, out);
  free(at);
  free(ptrs);
  return len;
}

static size_t make_million_empty_nodes(unsigned char **out) { return make_graph(out, 1000000, 0, 1); }
static size_t make_million_node_chain(unsigned char **out) { return make_graph(out, 1000000, 0, 0); }
static size_t make_chain_past_limit(unsigned char **out) { return make_graph(out, 100001, 0, 0); }
static size_t make_long_cycle(unsigned char **out) { return make_graph(out, 1000, 1000, 0); }
static size_t make_chain_into_cycle(unsigned char **out) { return make_graph(out, 100000, 10, 0); }

/* n float32 scalar inputs, each also an output; with repeat, one more output repeats the first. */
static size_t make_outputs(unsigned char **out, size_t n, int repeat) {
  struct { Ttd__V1__ValueSpec spec; char name[12]; } *at = calloc(n, sizeof(*at));
  Ttd__V1__ValueSpec **ptrs = calloc(n, sizeof(*ptrs));
  char **outputs = calloc(n + 1, sizeof(*outputs));
  ck_assert(at && ptrs && outputs);
  for (size_t i = 0; i < n; i++) {
    ttd__v1__value_spec__init(&at[i].spec);
    snprintf(at[i].name, sizeof(at[i].name), "%x", (unsigned)i);
    at[i].spec.name = outputs[i] = at[i].name;
    at[i].spec.dtype = F32;
    ptrs[i] = &at[i].spec;
  }
  outputs[n] = at[0].name;
  Ttd__V1__Graph g = TTD__V1__GRAPH__INIT;
  g.n_inputs = n;
  g.inputs = ptrs;
  g.n_outputs = n + (repeat ? 1 : 0);
  g.outputs = outputs;
  size_t len = pack_graph(&g, out);
  free(at);
  free(ptrs);
  free(outputs);
  return len;
}

static size_t make_many_outputs(unsigned char **out) { return make_outputs(out, 100000, 0); }
static size_t make_repeated_output(unsigned char **out) { return make_outputs(out, 400000, 1); }
