/* The bad-input table (check_e2e_bad_inputs.c), shared by its files: the macros that write
 * requests as file-scope compound literals, the placeholders that stand for handles made at
 * run time, who calls, the categories, and the row types of every table with the tables
 * themselves (bad_inputs_rows_*.c). */
#ifndef TTD_TESTS_BAD_INPUTS_H
#define TTD_TESTS_BAD_INPUTS_H

#include <grpc/status.h>
#include <stddef.h>
#include <stdint.h>

#include "raw_rpc.h"
#include "ttd/v1/ttd.pb-c.h"

/* ---- requests as file-scope compound literals ---- */

#define C(code) GRPC_STATUS_##code
#define N(type, ...) (sizeof((type[]){__VA_ARGS__}) / sizeof(type))
#define NEW(type, desc, ...) (&(type){PROTOBUF_C_MESSAGE_INIT(&desc), __VA_ARGS__})
#define REQ(type, desc, ...) (&NEW(type, desc, __VA_ARGS__)->base)
#define SHAPE(...) .n_shape = N(int64_t, __VA_ARGS__), .shape = (int64_t[]){__VA_ARGS__}
#define HANDLES(field, ...) .n_##field = N(uint64_t, __VA_ARGS__), .field = (uint64_t[]){__VA_ARGS__}
#define SPEC(...) NEW(Ttd__V1__TensorSpec, ttd__v1__tensor_spec__descriptor, __VA_ARGS__)
#define F32 TTD__V1__DTYPE__DTYPE_FLOAT32
#define BF16 TTD__V1__DTYPE__DTYPE_BFLOAT16
#define I32 TTD__V1__DTYPE__DTYPE_INT32
#define RAW(s) .bytes = s, .len = sizeof(s) - 1

#define ALLOCATE(...) REQ(Ttd__V1__AllocateRequest, ttd__v1__allocate_request__descriptor, .spec = SPEC(__VA_ARGS__))
#define DOWNLOAD(...) REQ(Ttd__V1__DownloadRequest, ttd__v1__download_request__descriptor, __VA_ARGS__)
#define MOVE(...) REQ(Ttd__V1__MoveRequest, ttd__v1__move_request__descriptor, __VA_ARGS__)
#define FREE(...) REQ(Ttd__V1__FreeRequest, ttd__v1__free_request__descriptor, HANDLES(handles, __VA_ARGS__))
#define EXECUTE(...) REQ(Ttd__V1__ExecuteRequest, ttd__v1__execute_request__descriptor, __VA_ARGS__)
#define BACKWARD(...) REQ(Ttd__V1__BackwardRequest, ttd__v1__backward_request__descriptor, __VA_ARGS__)
#define CARRIED(...) NEW(Ttd__V1__BackwardRequest, ttd__v1__backward_request__descriptor, __VA_ARGS__) /* in an Execute */
#define RELEASE(h) REQ(Ttd__V1__ReleaseRunRequest, ttd__v1__release_run_request__descriptor, .run = h)
#define ZERO_GRAD(...) NEW(Ttd__V1__ZeroGradRequest, ttd__v1__zero_grad_request__descriptor, __VA_ARGS__)
#define STEP(...) NEW(Ttd__V1__OptimizerStepRequest, ttd__v1__optimizer_step_request__descriptor, __VA_ARGS__)
#define SGD(...)                                                                                     \
  .optimizer_case = TTD__V1__OPTIMIZER_STEP_REQUEST__OPTIMIZER_SGD,                                  \
  .sgd = NEW(Ttd__V1__SgdOptions, ttd__v1__sgd_options__descriptor, __VA_ARGS__)
#define ADAM(...)                                                                                    \
  .optimizer_case = TTD__V1__OPTIMIZER_STEP_REQUEST__OPTIMIZER_ADAM,                                 \
  .adam = NEW(Ttd__V1__AdamOptions, ttd__v1__adam_options__descriptor, __VA_ARGS__)
#define WORK(...) NEW(Ttd__V1__ParameterWork, ttd__v1__parameter_work__descriptor, __VA_ARGS__)
#define OPT_STATE(...) REQ(Ttd__V1__OptimizerStateRequest, ttd__v1__optimizer_state_request__descriptor, __VA_ARGS__)
#define PSTATE(...) NEW(Ttd__V1__ParameterState, ttd__v1__parameter_state__descriptor, __VA_ARGS__)
#define SETS(...) .n_set = N(Ttd__V1__ParameterState *, __VA_ARGS__), .set = (Ttd__V1__ParameterState *[]){__VA_ARGS__}
#define KILL(s) REQ(Ttd__V1__KillSessionRequest, ttd__v1__kill_session_request__descriptor, .session_id = s)
#define OPEN(...) REQ(Ttd__V1__OpenSessionRequest, ttd__v1__open_session_request__descriptor, __VA_ARGS__)
#define INLINE(len_, ...)                                                                            \
  NEW(Ttd__V1__InlineTensor, ttd__v1__inline_tensor__descriptor, .spec = SPEC(__VA_ARGS__),          \
      .data = {.len = len_, .data = bad_inputs_zeros})

/* Upload stream messages: a header (new tensor from spec, or into handle) and data bytes. */
#define UP_SPEC(data_len, src, ...)                                                                  \
  REQ(Ttd__V1__UploadRequest, ttd__v1__upload_request__descriptor,                                   \
      .header = NEW(Ttd__V1__UploadHeader, ttd__v1__upload_header__descriptor,                       \
                    .target_case = TTD__V1__UPLOAD_HEADER__TARGET_SPEC, .spec = SPEC(__VA_ARGS__),   \
                    .source_dtype = src),                                                            \
      .data = {.len = data_len, .data = bad_inputs_zeros})
#define UP_INTO(h, data_len, src)                                                                    \
  REQ(Ttd__V1__UploadRequest, ttd__v1__upload_request__descriptor,                                   \
      .header = NEW(Ttd__V1__UploadHeader, ttd__v1__upload_header__descriptor,                       \
                    .target_case = TTD__V1__UPLOAD_HEADER__TARGET_HANDLE, .handle = h,               \
                    .source_dtype = src),                                                            \
      .data = {.len = data_len, .data = bad_inputs_zeros})
#define UP_DATA(data_len) \
  REQ(Ttd__V1__UploadRequest, ttd__v1__upload_request__descriptor, .data = {.len = data_len, .data = bad_inputs_zeros})

/* Graphs. */
#define VALUE(nm, dt, ...) NEW(Ttd__V1__ValueSpec, ttd__v1__value_spec__descriptor, .name = nm, .dtype = dt, __VA_ARGS__)
#define INPUTS(...) .n_inputs = N(Ttd__V1__ValueSpec *, __VA_ARGS__), .inputs = (Ttd__V1__ValueSpec *[]){__VA_ARGS__}
#define PARAMS(...) \
  .n_parameters = N(Ttd__V1__ValueSpec *, __VA_ARGS__), .parameters = (Ttd__V1__ValueSpec *[]){__VA_ARGS__}
#define NODES(...) .n_nodes = N(Ttd__V1__Node *, __VA_ARGS__), .nodes = (Ttd__V1__Node *[]){__VA_ARGS__}
#define OUTPUTS(...) .n_outputs = N(char *, __VA_ARGS__), .outputs = (char *[]){__VA_ARGS__}
#define INS(...) .n_inputs = N(char *, __VA_ARGS__), .inputs = (char *[]){__VA_ARGS__}
#define ATTRS(...) .n_attrs = N(Ttd__V1__Attr *, __VA_ARGS__), .attrs = (Ttd__V1__Attr *[]){__VA_ARGS__}
#define NODE(nm, o, ...) NEW(Ttd__V1__Node, ttd__v1__node__descriptor, .name = nm, .op = o, __VA_ARGS__)
#define ATTR_I(nm, v) \
  NEW(Ttd__V1__Attr, ttd__v1__attr__descriptor, .name = nm, .value_case = TTD__V1__ATTR__VALUE_I, .i = v)
#define ATTR_F(nm, v) \
  NEW(Ttd__V1__Attr, ttd__v1__attr__descriptor, .name = nm, .value_case = TTD__V1__ATTR__VALUE_F, .f = v)
#define COMPILE(...)                                                                                 \
  REQ(Ttd__V1__CompileRequest, ttd__v1__compile_request__descriptor,                                 \
      .graph = NEW(Ttd__V1__Graph, ttd__v1__graph__descriptor, __VA_ARGS__))

/* Zeros for the data of the requests (defined in check_e2e_bad_inputs.c). */
extern uint8_t bad_inputs_zeros[1 << 16];

/* ---- placeholders: fixed64 values in the table that stand for handles made at run time ---- */

enum slot {
  T_F32 = 1,   /* alice's float32 [4] on tt:0 */
  T_I32,       /* int32 [4] */
  T_BF16,      /* bfloat16 [4] */
  T_EMPTY,     /* float32 [0]: no bytes */
  T_X,         /* float32 [2, 3]: P_LIN's input */
  T_W, T_B,    /* float32 [4, 3] and [4]: P_LIN's parameters */
  T_DY,        /* float32 [2, 4]: a gradient of P_LIN's output */
  T_FREED,     /* a tensor alice freed */
  P_RELU,      /* y = relu(x), x float32 [4] */
  P_LIN,       /* y = linear(x, w, b), [2, 3] -> [2, 4] */
  RUN,         /* a fresh run of P_LIN kept for backward, made for the row and released after it */
  SIB_T, SIB_P, SIB_RUN, SIB_S,   /* alice's other session: a tensor, a program, a run, its id */
  BOB_T, BOB_P, BOB_RUN, BOB_S,   /* tenant bob's session */
  DB_T, DB_P, DB_S,               /* daemon B, another instance: a tensor, a program, a session */
  T_BIG,       /* float32 [1M] (4 MiB): a download cut short */
  FX_T, FX_P, FX_RUN, /* in bad_inputs_foreign_rows: another owner's tensor, program and run (foreign_owners) */
  N_SLOTS
};
#define H(slot) (0x7ad0000000000000ull | (uint64_t)(slot))

/* Who calls. */
typedef enum caller {
  AS_ALICE,            /* alice's token, her session and instance: a well-formed caller */
  AS_ALICE_BARE,       /* alice's token, no session metadata */
  AS_ADMIN,            /* ops, an admin tenant, no session */
  AS_CAROL_BARE,       /* carol's token (a tenant with a 1 MiB quota), no session */
  AS_NOBODY,           /* no metadata at all */
  AS_FORGED_TOKEN,     /* alice's session with a token the tokens file does not list */
  AS_BOB_ON_ALICE,     /* bob's token with alice's session id */
  AS_OTHER_INSTANCE,   /* alice's token and session with daemon B's instance id */
  AS_DAEMON_B_SESSION, /* alice's token with daemon B's session id */
  AS_GIVEN,            /* the row's own md */
} caller;

enum category { WRONG_TYPE, DIMS, DTYPES, HANDLE_LISTS, FOREIGN, METADATA, STREAMS, GRAPHS, OPTIONS, SOCKETS, N_CATEGORIES };

typedef struct bad_row {
  int category;
  const char *method;               /* "Allocate": /ttd.v1.Device/Allocate */
  caller as;
  const char *what;                 /* what is wrong, one line */
  int code;                         /* the gRPC code it must get */
  const char *needle;               /* a part of the message it must get */
  const ProtobufCMessage *msg[4];   /* the request; Upload: the stream's messages */
  const char *bytes;                /* or these raw bytes as the only message */
  size_t len;
  size_t (*make)(unsigned char **out); /* or a message built at run time (malloc'd) */
  raw_md md;                        /* AS_GIVEN: the metadata sent */
} bad_row;

#define ROW(cat, m, who, w, c, n, ...) \
  {.category = cat, .method = m, .as = who, .what = w, .code = C(c), .needle = n, __VA_ARGS__}

/* Streams cut short: the client is gone before the stream's end, and the daemon must undo
 * what the call began. */
typedef enum cut_how {
  CUT_KILL, /* a forked client sends whole messages, then SIGKILLs itself (raw_stream) */
  CUT_H2,   /* HTTP/2 by hand: the connection closes inside the last message (raw_h2_cut) */
} cut_how;

typedef struct cut_row {
  const char *what;
  const char *method;
  cut_how how;
  const ProtobufCMessage *msg[3];
  size_t keep; /* CUT_H2: bytes of the last message sent; 0: all of it */
  int seen;    /* the call reaches the daemon (its headers suffice), which must end it */
} cut_row;

/* Bytes that are not gRPC, on the daemon's sockets. */
typedef struct socket_row {
  const char *what;
  const char *bytes;
  size_t len;
  size_t random; /* then this many random bytes */
  int side;      /* on the shared-memory side socket (PATH.shm), else the main one */
  int keep_open; /* left open through the rest of the table */
} socket_row;

/* Zero dims through every op: a graph whose inputs all travel inline, compiled, executed and
 * (with backward) differentiated. Zero-size tensors are legal; only shapes an op cannot take
 * are refused, at Compile. */
typedef struct zero_row {
  const char *what;
  const ProtobufCMessage *compile;
  int backward; /* also a Backward with inline gradients of the outputs */
  int code;     /* Compile's answer; when OK, Execute's and Backward's are OK */
  const char *needle;
} zero_row;

/* ---- the tables, each with its length ---- */

/* The hand-written rows, RPC by RPC, run in this order: the session RPCs (OpenSession,
 * KeepAlive, ListDevices, CloseSession), the tensor RPCs (Allocate .. Free), the program RPCs
 * (Compile .. OptimizerStep, OptimizerState), the admin RPCs (ListSessions, KillSession). Handles of others
 * (bad_inputs_foreign_rows) and the metadata rows of every method (run_metadata) are
 * generated. */
extern const bad_row bad_inputs_session_rows[], bad_inputs_tensor_rows[], bad_inputs_program_rows[],
    bad_inputs_admin_rows[];
extern const size_t bad_inputs_session_rows_count, bad_inputs_tensor_rows_count, bad_inputs_program_rows_count,
    bad_inputs_admin_rows_count;

/* Templates run once per owner of foreign handles, FX_* standing for that owner's. */
extern const bad_row bad_inputs_foreign_rows[];
extern const size_t bad_inputs_foreign_rows_count;

/* Below the RPCs: streams cut short, and garbage on the sockets. */
extern const cut_row bad_inputs_cut_rows[];
extern const size_t bad_inputs_cut_rows_count;
extern const socket_row bad_inputs_socket_rows[];
extern const size_t bad_inputs_socket_rows_count;

/* Zero dims through every op. */
extern const zero_row bad_inputs_zero_rows[];
extern const size_t bad_inputs_zero_rows_count;

#endif
