/* Internals of libttclient shared by its files; not installed. */
#ifndef TT_CLIENT_INTERNAL_H
#define TT_CLIENT_INTERNAL_H

#include <grpc/grpc.h>
#include <protobuf-c/protobuf-c.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "base/block_cache.h"
#include "wire/cq_spin.h"
#include "ttclient.h"
#include "ttd/v1/protocol.h"
#include "ttd/v1/ttd.pb-c.h"

_Static_assert(TT_MAX_DIMS == TTD_MAX_DIMS, "ttclient.h and the protocol disagree on the dims of a tensor");

#define TT_CHUNK_BYTES (1u << 20)
#define TT_LOOP_DEVICES 16

/* Methods of ttd.v1.Device this library calls; order matches tt_rpc_paths. */
typedef enum tt_rpc_method {
  TT_RPC_OPEN_SESSION,
  TT_RPC_KEEP_ALIVE,
  TT_RPC_CLOSE_SESSION,
  TT_RPC_LIST_DEVICES,
  TT_RPC_ALLOCATE,
  TT_RPC_UPLOAD,
  TT_RPC_DOWNLOAD,
  TT_RPC_MOVE,
  TT_RPC_FREE,
  TT_RPC_COMPILE,
  TT_RPC_EXECUTE,
  TT_RPC_BACKWARD,
  TT_RPC_RELEASE_RUN,
  TT_RPC_ZERO_GRAD,
  TT_RPC_OPTIMIZER_STEP,
  TT_RPC_LIST_SESSIONS,
  TT_RPC_KILL_SESSION,
  TT_RPC_COUNT
} tt_rpc_method;

/* A shared-memory segment of the same-host fast path (shm_pool.c). */
typedef struct tt_shm_segment {
  uint64_t id; /* the daemon's */
  unsigned char *addr;
  uint64_t size;
  bool in_use;
} tt_shm_segment;

#define TT_SHM_MIN_BYTES (256u << 10) /* smaller host tensors stay in malloc memory */
/* Deferred device tensors from this size travel by shared memory instead of inside the call:
 * the segment is reused step after step, so a copy less and no bytes through gRPC. */
#define TT_SHM_INLINE_MIN_BYTES (32u << 10)

#define TT_CQ_CACHE 4 /* pluck queues kept for reuse: one per thread making calls at once */

struct tt_client {
  atomic_int refs;      /* the user's, plus one per live tensor */
  bool closed;          /* tt_disconnect was called: no more calls to the daemon */
  bool grpc_initialized; /* grpc_init was called for this client: tt_disconnect balances it */
  grpc_channel *channel;
  void *registered[TT_RPC_COUNT];
  char target[256];
  char session_hex[17];  /* "" until a session is open */
  uint64_t session_id;
  char instance_id[40];
  char tenant[64];
  uint64_t quota_bytes;
  char authorization[512]; /* "Bearer TOKEN", or "" */
  uint32_t lease_ms;
  int64_t call_timeout_ms;
  ttd_cq_spin spin;        /* the wait for a light call's answer (disable_spin, TTD_SPIN) */

  pthread_mutex_t error_lock;
  tt_status errcode;
  char errmsg[1024];

  ttd_block_cache blocks; /* large host buffers kept for reuse (without shared memory) */
  int shm_fd;              /* the side socket, or -1: no fast path */
  uint64_t shm_key[2];     /* the session's key on it */
  pthread_mutex_t shm_lock; /* guards the segments */
  tt_shm_segment *segments;
  size_t n_segments, cap_segments;

  /* Pluck queues of finished calls, reused by the next ones (rpc.c): creating, shutting
   * down and destroying one per call was 6 % of a small call's client CPU. */
  pthread_mutex_t cq_lock;
  grpc_completion_queue *cq_free[TT_CQ_CACHE];
  int cq_count;

  pthread_t keepalive_thread;
  bool keepalive_running;
  bool stopping;
  pthread_mutex_t keepalive_lock;
  pthread_cond_t keepalive_cond;

  /* Fewer round trips (inline.c, module.c); all zero until first used. */
  int inline_mode;                             /* 0: not read yet, 1: on, 2: off (TTD_INLINE=0) */
  atomic_int training_loops[TT_LOOP_DEVICES];  /* per device: modules in a training loop there */
  atomic_int deferred_modules;                 /* modules holding a queued tt_step / tt_zero_grad */
};

/* Where a tensor lives. */
typedef struct tt_place {
  int is_host;
  int device;  /* tt:N */
  int l1;      /* 1: L1, 0: DRAM */
} tt_place;

typedef struct tt_autograd_node tt_autograd_node;
typedef struct tt_run_ref tt_run_ref;

struct tt_tensor {
  atomic_int refs;
  tt_client *client;
  tt_dtype dtype;
  int ndim;
  int64_t shape[TT_MAX_DIMS];
  uint64_t numel;
  uint64_t nbytes;
  tt_place place;
  char device_name[24];
  void *data;       /* host tensors */
  uint64_t shm_segment; /* host data in this shared-memory segment (offset 0), or 0 */
  size_t host_block;    /* else: the size of the block cache's block behind data */
  uint64_t handle;  /* device tensors */
  tt_autograd_node *grad_fn; /* host tensors made by tracked ops (autograd.c) */
  float *grad;               /* during tt_backward only */
  tt_run_ref *run;           /* device outputs of a training forward */
  int output_index;
  int borrowed;              /* a view of a daemon-owned tensor (.grad): free does not Free it */
  int param;                 /* a module's parameter: reading it sends queued parameter work first */
  void *host_copy;           /* device tensors: their bytes on the host (inline.c). With handle 0 the
                              * tensor is deferred: it travels inline or is uploaded when needed */
  uint64_t host_copy_segment; /* host_copy lies in this shared-memory segment (offset 0), or 0 */
};

/* A daemon run kept for Backward, shared by the outputs of one training forward. */
struct ttd_run;

struct tt_run_ref {
  atomic_int refs;
  tt_client *client;
  struct tt_module *module;
  uint64_t run;           /* the daemon's run; 0 once backpropagated or released */
  struct ttd_run *local_run; /* a module on "cpu": the in-process run; NULL once used */
  int n_outputs;
  float **output_grads;   /* host accumulators during tt_backward, then until its Backward is sent */
  int backward_waiting;   /* tt_backward left its Backward for the module's next Execute */
};

tt_run_ref *tt_run_ref_retain(tt_run_ref *ref);
void tt_run_ref_release(tt_run_ref *ref); /* the last reference releases the daemon's run */
void tt_autograd_node_free(tt_autograd_node *node);

/* Makes host (downloaded from a device output of a training forward) carry the hook that
 * sends its gradient back to the device run. */
tt_status tt_autograd_track_to_cpu(tt_tensor *host, tt_tensor *device_output);

/* The shape of output i of module: fills shape, returns ndim (module.c). */
int tt_module_output_dims(const struct tt_module *module, int i, int64_t *shape);

/* Reference counting of modules: runs keep theirs alive (module.c). */
struct tt_module *tt_module_retain(struct tt_module *module);

/* A training run of module was backpropagated or released (module.c). */
void tt_module_run_done(struct tt_module *module);

/* Backward of an in-process run (a module on "cpu"): accumulates the parameters' host
 * gradients and frees the run (module.c). */
tt_status tt_module_backward_local(struct tt_module *module, tt_run_ref *ref);

/* Frees an in-process run that was never backpropagated (module.c). */
void tt_module_release_local(struct tt_module *module, tt_run_ref *ref);

/* Records the parameter gradient handles Backward returned (module.c). */
void tt_module_set_grad_handles(struct tt_module *module, const uint64_t *handles, int n);

/* ---- fewer round trips (inline.c, module.c) ---- */

/* Whether inline transfers, deferred uploads and queued parameter work are on for client:
 * yes unless TTD_INLINE=0 (then every call goes out as it did before them). */
int tt_inline_enabled(tt_client *client);

/* Whether a host -> device tt_to of nbytes to place should be deferred: small, DRAM, and a
 * module on that device is in a training loop (a Backward in training mode reached it there). */
int tt_inline_defer_wanted(tt_client *client, const tt_place *place, uint64_t nbytes);

/* A deferred device tensor: src's bytes (converted to dtype) kept on the host, no handle. */
tt_tensor *tt_inline_defer(tt_tensor *src, const tt_place *place, tt_dtype dtype);

/* Gives a deferred tensor its handle (an Upload of its bytes); OK for any other tensor. */
tt_status tt_tensor_materialize(tt_tensor *tensor);

/* A host tensor (dtype) from a device tensor's host copy. */
tt_tensor *tt_inline_to_host(tt_tensor *src, tt_dtype dtype);

/* Fills wire and spec (and device, 16 bytes) to send tensor's host copy inline. */
/* One inline tensor of a request, with the storage its message points into. */
typedef struct tt_inline_wire {
  Ttd__V1__InlineTensor wire;
  Ttd__V1__TensorSpec spec;
  Ttd__V1__ShmRange range;
  char device[16];
} tt_inline_wire;
void tt_inline_fill(tt_inline_wire *w, const tt_tensor *tensor);

/* Frees a device tensor's host copy (malloc or shared memory). */
void tt_inline_host_copy_free(tt_tensor *tensor);

/* Uploads bytes of dtype and shape to place as a new tensor; *out_handle its handle. With a
 * segment, data is that shared-memory segment's start and the daemon reads it there. */
tt_status tt_inline_upload(tt_client *client, const tt_place *place, tt_dtype dtype, const int64_t *shape, int ndim,
                           const void *data, uint64_t nbytes, uint64_t segment, uint64_t *out_handle);

/* tt_step and tt_zero_grad of a module on a card are queued on the module and ride on its
 * next Execute or Backward (ParameterWork before). This moves them into work (which owns the
 * storage; release it with tt_param_work_clear) and sets *out_work to its message, or NULL
 * when nothing is queued. */
typedef struct tt_param_work {
  Ttd__V1__ParameterWork work;
  Ttd__V1__OptimizerStepRequest step;
  Ttd__V1__ZeroGradRequest zero;
  Ttd__V1__SgdOptions sgd;
  Ttd__V1__AdamOptions adam;
  uint64_t *handles;
} tt_param_work;
tt_status tt_module_take_work(struct tt_module *module, tt_param_work *work, Ttd__V1__ParameterWork **out_work);
void tt_param_work_clear(tt_param_work *work);

/* Sends queued parameter work of client's modules as OptimizerStep / ZeroGrad calls before
 * tensor (a parameter or a .grad) is read or moved; OK at once for other tensors. */
tt_status tt_deferred_flush_for(const tt_tensor *tensor);

/* ---- a Backward riding on the module's next Execute (autograd.c, module.c) ---- */

/* One Backward request for a run: the message, the storage of its gradients, and the
 * parameter work that runs before it (req.before points into it when set). */
typedef struct tt_backward_call {
  Ttd__V1__BackwardRequest req;
  struct backward_grads *grads;
  tt_param_work before;
} tt_backward_call;

/* Makes ref's Backward request from the output gradients accumulated in ref: inline when
 * they fit, else uploaded (freed by the Backward). bc->before is left to the caller. */
tt_status tt_backward_call_begin(tt_run_ref *ref, tt_backward_call *bc);

/* After the call that carried bc (a Backward, or an Execute when carried): with st OK,
 * records resp's gradient handles; in any case the run counts as backpropagated (an Execute
 * that failed also releases it, in case its Backward never ran), and bc and ref's
 * gradients are freed. */
void tt_backward_call_end(tt_run_ref *ref, tt_backward_call *bc, tt_status st, const Ttd__V1__BackwardResponse *resp,
                          int carried);

/* Sends bc as a Backward call when st is OK (begin and the caller's work made it), then
 * ends it as tt_backward_call_end does; returns the call's status, or st. */
tt_status tt_backward_call_send(tt_run_ref *ref, tt_backward_call *bc, tt_status st);

/* Whether tt_backward may leave ref's Backward for its module's next Execute: on a card,
 * inline on, the gradients inline (autograd.c). */
int tt_backward_can_wait(const tt_run_ref *ref);

/* Leaves ref's Backward (ref retained) for the module's next Execute, with the work queued
 * so far running before it; a Backward already waiting is sent first (module.c). */
tt_status tt_module_defer_backward(struct tt_module *module, tt_run_ref *ref);

/* Sends the Backward waiting on the module, if any, on its own (module.c). */
tt_status tt_module_flush_backward(struct tt_module *module);

/* Drops one internal reference of a module (runs hold one); tt_module_free is the user's. */
void tt_module_unref(struct tt_module *module);

/* A backward of module on a card succeeded: in training mode it is in a training loop now. */
void tt_module_loop_enter(struct tt_module *module);

#define TT_RETURN_IF_FAILED(expr)      \
  do {                                 \
    tt_status tt_status_tmp_ = (expr); \
    if (tt_status_tmp_ != TT_OK) return tt_status_tmp_; \
  } while (0)

/* Tensors keep their client (struct) alive after tt_disconnect. */
tt_client *tt_client_retain(tt_client *client);
void tt_client_release(tt_client *client);

/* Records an error on the client and returns its code. */
tt_status tt_client_fail(tt_client *client, tt_status code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* One unary call: packs request, sends it with the session metadata, unpacks the
 * response (free it with protobuf_c_message_free_unpacked). Records errors. */
tt_status tt_rpc_unary(tt_client *client, tt_rpc_method method, const ProtobufCMessage *request,
                       const ProtobufCMessageDescriptor *response_type, ProtobufCMessage **out_response);

/* The same, reporting the error into err instead of the client's last error. */
tt_status tt_rpc_unary_quiet(tt_client *client, tt_rpc_method method, const ProtobufCMessage *request,
                             const ProtobufCMessageDescriptor *response_type, ProtobufCMessage **out_response,
                             char *err, size_t err_len);

/* Destroys the pluck queues kept for reuse; calls ending later destroy their own. For
 * tt_disconnect, after `closed` is set and before grpc_shutdown. */
void tt_rpc_cq_cache_clear(tt_client *client);

/* Streams bytes (in header's source dtype) into the tensor the header names. */
tt_status tt_rpc_upload(tt_client *client, const Ttd__V1__UploadHeader *header, const void *data, uint64_t bytes,
                        Ttd__V1__UploadResponse **out_response);

/* Streams a device tensor into dst, which holds exactly bytes bytes of target dtype. */
tt_status tt_rpc_download(tt_client *client, uint64_t handle, tt_dtype target, void *dst, uint64_t bytes,
                          uint64_t shm_segment);

/* Raises glibc's malloc thresholds for big buffers, once per process, unless the program
 * keeps its own (malloc_tuning.c). */
void tt_malloc_tune(const tt_connect_options *options);

/* The same-host fast path (shm_pool.c). connect: after OpenSession, when the daemon named
 * a side socket and the target is local (silently none otherwise). alloc: bytes in a
 * registered segment, or NULL (use malloc) below min_bytes or without the fast path. */
void tt_shm_connect(tt_client *client, const char *path, const tt_connect_options *options);
void *tt_shm_alloc(tt_client *client, uint64_t bytes, uint64_t min_bytes, uint64_t *out_segment);
void tt_shm_free(tt_client *client, void *addr);
void tt_shm_destroy(tt_client *client);

/* Host data for a tensor of bytes (shared memory when large and available); NULL if out
 * of memory. Freed with tt_host_free. */
void *tt_host_alloc(tt_client *client, uint64_t bytes, uint64_t *out_segment, size_t *out_block);
void tt_host_free(tt_client *client, void *data, uint64_t segment, size_t block);

/* A host tensor whose bytes are not initialised (they are about to be overwritten). */
tt_tensor *tt_tensor_host_uninit(tt_client *client, tt_dtype dtype, const int64_t *shape, int ndim);

/* Parses "cpu", "tt", "tt:N", "tt:N/dram", "tt:N/l1", "tt/l1". Returns 0 or -1. */
int tt_place_parse(const char *text, tt_place *out_place);

/* "cpu", "tt:N", "tt:N/l1". */
void tt_place_format(const tt_place *place, char *buf, size_t len);

/* Checks dtype and shape and fills a tensor's dtype, shape, numel and nbytes. */
tt_status tt_tensor_describe(tt_client *client, tt_tensor *tensor, tt_dtype dtype, const int64_t *shape, int ndim);

/* A new tensor struct for client with one reference and no storage. */
tt_tensor *tt_tensor_alloc(tt_client *client);

/* A new tensor struct of src's client and shape with dtype, placed at place, with no
 * storage or handle yet; NULL (the client's last error says why) on failure. */
tt_tensor *tt_tensor_like(const tt_tensor *src, const tt_place *place, tt_dtype dtype);

/* A graph under construction (graph.c); module.c turns it into a module. */
typedef struct tt_graph_value {
  char *name;
  int kind;          /* 0 input, 1 parameter, 2 node */
  tt_dtype dtype;
  int ndim;
  int64_t shape[TT_MAX_DIMS];
  tt_tensor *init;   /* parameters: the initial host data */
} tt_graph_value;

struct tt_graph {
  tt_client *client;
  tt_graph_value *values;
  int n_values, cap_values;
  Ttd__V1__Node **nodes; /* owned; node i produces the value named like it */
  int n_nodes, cap_nodes;
  int *outputs;
  int n_outputs, cap_outputs;
  int layer_count[8];    /* per layer kind, for parameter names */
  uint64_t rng;
};

#endif
