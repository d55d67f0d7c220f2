/* libttclient: the C client of ttd.
 *
 * A program connects to the daemon, makes host tensors and moves them with tt_to(), the
 * way torch's .to() moves tensors between "cpu" and an accelerator:
 *
 *   tt_client *c;
 *   if (tt_connect(NULL, NULL, &c) != TT_OK) { fprintf(stderr, "%s\n", tt_last_error(c)); ... }
 *   int64_t shape[] = {2, 3};
 *   tt_tensor *x = tt_tensor_from_host(c, data, TT_FLOAT32, shape, 2);
 *   tt_tensor *d = tt_to(x, "tt");        // onto tt:0 DRAM
 *   tt_tensor *y = tt_to(d, "cpu");       // and back
 *   tt_tensor_free(y); tt_tensor_free(d); tt_tensor_free(x);
 *   tt_disconnect(c);
 *
 * Errors, SQLite style: functions return a tt_status (or NULL for functions returning a
 * tensor) and tt_last_error(client) says what went wrong and what to fix. The codes are
 * gRPC's canonical codes, so a daemon's status arrives unchanged.
 *
 * Threads: a client may be used from several threads; each call is independent (a module,
 * with what it queues, is one thread's at a time). The last error is per thread
 * (tt_last_error).
 * Ownership: every tt_tensor returned is owned by the caller and released with
 * tt_tensor_free; free functions accept NULL. Tensors may outlive tt_disconnect: host data
 * stays readable, and anything that needs the daemon fails with TT_FAILED_PRECONDITION. */
#ifndef TTCLIENT_H
#define TTCLIENT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tt_status {
  TT_OK = 0,
  TT_CANCELLED = 1,
  TT_UNKNOWN = 2,
  TT_INVALID_ARGUMENT = 3,
  TT_DEADLINE_EXCEEDED = 4,
  TT_NOT_FOUND = 5,
  TT_ALREADY_EXISTS = 6,
  TT_PERMISSION_DENIED = 7,
  TT_RESOURCE_EXHAUSTED = 8,
  TT_FAILED_PRECONDITION = 9,
  TT_ABORTED = 10,
  TT_OUT_OF_RANGE = 11,
  TT_UNIMPLEMENTED = 12,
  TT_INTERNAL = 13,
  TT_UNAVAILABLE = 14,
  TT_DATA_LOSS = 15,
  TT_UNAUTHENTICATED = 16,
} tt_status;

/* Element types; values equal ttd.v1.DType. */
typedef enum tt_dtype {
  TT_FLOAT32 = 1,
  TT_BFLOAT16 = 2, /* stored as raw 16-bit patterns on the host */
  TT_INT32 = 3,
} tt_dtype;

#define TT_MAX_DIMS 8

typedef struct tt_client tt_client;
typedef struct tt_tensor tt_tensor;

/* ---- connection ---- */

typedef struct tt_connect_options {
  const char *client_name;  /* shown to operators; default: the program's name */
  int disable_keepalive;    /* 1: no background KeepAlive (the session expires after its lease) */
  /* Deadline of unary calls; 0: 60 s. Past it a call ends with TT_DEADLINE_EXCEEDED. Device
   * work (forward, backward, steps) sends it to ttd, which drops work still queued past it;
   * other calls keep it here. Streams have none. */
  int64_t call_timeout_ms;
  uint64_t quota_bytes;     /* device memory this session asks for; 0: the most ttd allows */
  const char *token;        /* bearer token of your tenant; NULL: $TTD_TOKEN, if set */
  /* TCP targets use TLS unless insecure is set (or TTD_INSECURE=1); Unix sockets never do. */
  int insecure;             /* 1: plain-text TCP, for a ttd started with --insecure */
  const char *tls_ca_file;  /* PEM roots the server's certificate must chain to; NULL:
                             * $TTD_TLS_CA, else the system's roots */
  const char *tls_cert_file, *tls_key_file; /* client certificate for mutual TLS; NULL:
                             * $TTD_TLS_CERT and $TTD_TLS_KEY, if set */
  const char *tls_server_name; /* name to check in the server's certificate instead of the
                             * target's host */
  int disable_shm;          /* 1: no same-host shared-memory fast path (also TTD_SHM=0); by
                             * default host tensors of 256 KiB or more move through shared
                             * memory when the target is a local unix: socket */
  int disable_spin;         /* 1: a thread waiting for a call's answer sleeps at once (also
                             * TTD_SPIN=0); by default it first polls for it, yielding the CPU,
                             * for up to 1 ms, or 10 ms for device work (adaptive: less while
                             * answers take longer), which halves a small call's latency when
                             * ttd does the same (its --spin-us), and spares a training step
                             * the wake-up of a halted vCPU */
  int disable_malloc_tuning; /* 1: leave glibc's malloc thresholds as they are (also
                             * TTD_MALLOC_TUNING=0, or any glibc.malloc tunable in
                             * GLIBC_TUNABLES); by default the first tt_connect raises them
                             * (mmap 32 MiB, trim 128 MiB) so big transfers reuse memory */
} tt_connect_options;

/* Sets the defaults. */
void tt_connect_options_init(tt_connect_options *options);

/* Connects to ttd and opens a session. target: "unix:/path" or "host:port"; NULL means the
 * TTD_ADDRESS environment variable, then the first default socket where a ttd answers: the
 * user's own (tt_default_target), then the system service's unix:/run/ttd/ttd.sock (open to
 * group ttd). When none answers, UNAVAILABLE names every address tried. options may
 * be NULL for the defaults. *out_client is set even on failure (NULL only when out of
 * memory) so that tt_last_error can say why; release it with tt_disconnect either way.
 * A background thread renews the session every lease/3 unless disabled. Before it starts
 * gRPC, it turns off Abseil's debug deadlock detection for the process (the mode of release
 * builds; Debian's leaves it on, at 8k instructions per call): TTD_ABSL_DEADLOCK_DETECTION=1
 * keeps it. */
tt_status tt_connect(const char *target, const tt_connect_options *options, tt_client **out_client);

/* Closes the session (the daemon frees its tensors) and releases the client; tensors still
 * held keep the client's memory until they are freed, and report a closed client. NULL ok. */
void tt_disconnect(tt_client *client);

/* The address a ttd started without --listen serves, and the first a client tries:
 * $XDG_RUNTIME_DIR/ttd.sock, /run/ttd/ttd.sock as root, else /tmp/ttd-UID/ttd.sock, with the
 * "unix:" prefix. Returns 0, or -1 if buf is too small. */
int tt_default_target(char *buf, size_t len);

/* The code and message of the most recent failing call this thread made on this client, as
 * errno is per thread (a thread that made none: the most recent of any thread's); TT_OK and
 * "" when none failed. The message stays valid until this thread's next call on the client.
 * NULL client: "out of memory". */
tt_status tt_errcode(const tt_client *client);
const char *tt_last_error(const tt_client *client);

/* "OK", "INVALID_ARGUMENT", ... */
const char *tt_status_name(tt_status status);

/* The session id and the daemon instance id this client holds. */
uint64_t tt_session_id(const tt_client *client);
const char *tt_instance_id(const tt_client *client);

/* The session's device memory quota in bytes (0: none) and the tenant it belongs to. */
uint64_t tt_session_quota(const tt_client *client);
const char *tt_session_tenant(const tt_client *client);

/* ---- devices ---- */

typedef struct tt_memory_info {
  uint64_t capacity_bytes;
  uint64_t used_bytes;
} tt_memory_info;

typedef struct tt_device_info {
  char name[16];   /* "tt:0" */
  char kind[48];   /* "sim-wormhole-n150" */
  uint32_t cores;
  tt_memory_info dram;
  tt_memory_info l1;
} tt_device_info;

/* Lists the daemon's devices into a new array (free with tt_device_list_free). */
tt_status tt_list_devices(tt_client *client, tt_device_info **out_devices, size_t *out_count);
void tt_device_list_free(tt_device_info *devices);

/* ---- sessions, for operators (the caller's tenant must be admin: PERMISSION_DENIED) ---- */

typedef struct tt_session_info {
  uint64_t session_id;
  char tenant[64];
  char client_name[64];
  char peer[64];        /* "unix:uid=1000,pid=4242", "ipv4:10.0.0.7:51234", ... */
  uint64_t age_ms, idle_ms;
  uint64_t tensors;
  uint64_t used_bytes;  /* device memory charged to the session */
  uint64_t quota_bytes; /* 0: no quota */
} tt_session_info;

/* Every open session of every tenant, into a new array (free with tt_session_list_free). */
tt_status tt_list_sessions(tt_client *client, tt_session_info **out_sessions, size_t *out_count);
void tt_session_list_free(tt_session_info *sessions);

/* Closes a session at once, freeing its device memory; NOT_FOUND if it is not open. The
 * counts may be NULL. */
tt_status tt_kill_session(tt_client *client, uint64_t session_id, uint64_t *out_tensors, uint64_t *out_bytes);

/* ---- tensors ---- */

/* A new host tensor holding a copy of data (numel * dtype size bytes; may be NULL for
 * zeros). ndim 0 makes a scalar. NULL on error (bad dtype or shape): see tt_last_error. */
tt_tensor *tt_tensor_from_host(tt_client *client, const void *data, tt_dtype dtype, const int64_t *shape, int ndim);

/* A new host tensor whose data is the caller's memory, not a copy (torch's from_blob): data
 * holds numel * dtype size bytes, row-major, aligned to the element size. libttclient reads
 * it where it is and never writes or frees it. tt_to(.., "tt") streams the Upload straight
 * from it; only the same-host shared-memory path (256 KiB and more) copies it, once, into a
 * segment, and a deferred tt_to keeps a copy of the values it had then. A module on "cpu"
 * reads it at tt_forward; ops that keep their inputs for backward (tt_mul, tt_add, the
 * losses) read it again at tt_backward, which sees the values there then. tt_tensor_data
 * returns data itself.
 * Ownership: the tensor is the caller's (tt_tensor_free) and reference counted like any
 * other; libttclient may hold more references than the caller's (tt_to(t, "cpu") returns t
 * again; the result of tt_mul or a loss keeps its inputs until it is freed), so the memory
 * must stay valid until release(ctx) is called: exactly once, after the last reference is
 * gone. release NULL: nothing is called, and the memory must outlive every reference
 * (static data, say).
 * NULL: client NULL returns NULL (no message); data may be NULL only for a shape with a 0
 * dim (shape may be NULL when ndim is 0).
 * Threads: any thread may call it. release runs on the thread that drops the last
 * reference, inside that tt_tensor_free (of this tensor, or of a tensor holding it, such as
 * a loss); no libttclient lock is held then, and it must not use this tensor.
 * Errors: NULL with tt_last_error saying why, and release is not called (the memory stays
 * the caller's): TT_INVALID_ARGUMENT for a dtype other than TT_FLOAT32, TT_BFLOAT16 or
 * TT_INT32, ndim outside 0..TT_MAX_DIMS or a NULL shape with ndim > 0, a negative dim, a
 * shape whose byte size overflows int64, NULL data with elements, data not aligned to the
 * element size; TT_RESOURCE_EXHAUSTED when out of host memory. */
tt_tensor *tt_tensor_wrap_host(tt_client *client, void *data, tt_dtype dtype, const int64_t *shape, int ndim,
                               void (*release)(void *ctx), void *ctx);

/* A new zero-filled tensor on device ("cpu", "tt", "tt:N", "tt:N/l1"); on a device it is
 * allocated by the daemon. NULL on error. */
tt_tensor *tt_tensor_empty(tt_client *client, tt_dtype dtype, const int64_t *shape, int ndim, const char *device);

/* Drops one reference; the last one frees host memory, or the device tensor (a Free RPC).
 * Accepts NULL. */
void tt_tensor_free(tt_tensor *tensor);

/* Returns a tensor on device, torch's .to(): "cpu", "tt" (tt:0 DRAM), "tt:N", "tt:N/dram",
 * "tt:N/l1". To the place the tensor already is: the same tensor, with one more reference.
 * Device to device stays on the daemon (Move, no host trip). The source is untouched.
 * Fewer round trips: to the DRAM of a card where a module is in a training loop (it has been
 * backpropagated there), a tensor of at most 4 MiB is deferred: it keeps its bytes on the
 * host and travels inline with the Execute that uses it, or is uploaded when a handle is
 * needed (tt_tensor_handle, a move); it holds no device memory until then. Outputs that a
 * forward returned inline come back to "cpu" with no call. TTD_INLINE=0 turns this off.
 * NULL on error: tt_last_error(tt_tensor_client(tensor)). */
tt_tensor *tt_to(tt_tensor *tensor, const char *device);

/* Like tt_to, also converting the element type: float32 <-> bfloat16 (round to nearest
 * even), as a card's to_device does; host <-> device only, or host to host. */
tt_tensor *tt_to_dtype(tt_tensor *tensor, const char *device, tt_dtype dtype);

/* torch's dst.copy_(src): src's values written into dst's memory, in place (dst keeps its
 * handle, place and dtype): host or device either side, the same shape, float32 <->
 * bfloat16 converted. Work queued on either tensor (a step, a Backward into a .grad) runs
 * first, so writing averaged gradients into tt_param_grad's tensors before tt_step is what
 * a data-parallel step does. INVALID_ARGUMENT for another shape, an int32/float mix, or a
 * dst lending the caller's memory (tt_tensor_wrap_host). */
tt_status tt_copy_(tt_tensor *dst, tt_tensor *src);

/* A tensor's values written into the caller's memory: nbytes, the tensor's size
 * (tt_tensor_nbytes), at dst. The same bytes tt_to(tensor, "cpu") holds, without a host tensor
 * in between: a host tensor's are copied, an output a forward returned inline is copied with
 * no call, and a device tensor is downloaded after the work queued on it (a step, a Backward
 * into a .grad), through shared memory on the same host. INVALID_ARGUMENT for a NULL dst
 * (an empty tensor too) or another size, and for a NULL tensor (then with no error text).
 * On failure dst may hold part of the bytes. Any thread may call it, as tt_to. */
tt_status tt_read(tt_tensor *tensor, void *dst, uint64_t nbytes);

/* Accessors. They lend; nothing is copied. */
tt_client *tt_tensor_client(const tt_tensor *tensor);
tt_dtype tt_tensor_dtype(const tt_tensor *tensor);
int tt_tensor_ndim(const tt_tensor *tensor);
const int64_t *tt_tensor_shape(const tt_tensor *tensor);
uint64_t tt_tensor_numel(const tt_tensor *tensor);
uint64_t tt_tensor_nbytes(const tt_tensor *tensor);
/* "cpu", "tt:0", "tt:1/l1", ... */
const char *tt_tensor_device(const tt_tensor *tensor);
int tt_tensor_is_host(const tt_tensor *tensor);
/* Host data (numel * dtype size bytes), writable; NULL for a device tensor. For a tensor
 * of tt_tensor_wrap_host: the caller's memory it wraps. */
void *tt_tensor_data(tt_tensor *tensor);
/* The daemon's handle of a device tensor (a deferred one is uploaded first: 0 if that
 * fails); 0 for a host tensor. */
uint64_t tt_tensor_handle(const tt_tensor *tensor);

/* Bytes per element of dtype; 0 if unknown. */
size_t tt_dtype_size(tt_dtype dtype);

/* ---- graphs: building a model ----
 * A graph is built value by value; each op's output shape is inferred at once, so a shape
 * mistake fails at the line that makes it (the message names the op and the shapes). A
 * failed call returns a negative tt_value, records the error on the client, and every
 * later call given that value fails too, so a model can be written straight through and
 * checked once. Not thread-safe: one thread builds a graph. */
typedef struct tt_graph tt_graph;
typedef int tt_value;

typedef enum tt_init {
  TT_INIT_ZEROS,
  TT_INIT_ONES,
  TT_INIT_NORMAL,          /* N(0, a^2) */
  TT_INIT_UNIFORM,         /* U(-a, a) */
  TT_INIT_KAIMING_UNIFORM, /* bound sqrt(6 / ((1 + a^2) fan_in)); a = sqrt(5) is torch's Linear default */
  TT_INIT_XAVIER_UNIFORM,  /* bound a * sqrt(6 / (fan_in + fan_out)); a is the gain (0 means 1) */
} tt_init;

/* A new empty graph; initialisers draw from a generator seeded with seed. NULL if out of memory. */
tt_graph *tt_graph_create(tt_client *client, uint64_t seed);
void tt_graph_free(tt_graph *graph); /* accepts NULL */

/* A graph input (fed at each forward) of dtype and shape. */
tt_value tt_graph_input(tt_graph *graph, const char *name, tt_dtype dtype, const int64_t *shape, int ndim);
/* A float32 parameter, initialised on the host now. */
tt_value tt_graph_param(tt_graph *graph, const char *name, const int64_t *shape, int ndim, tt_init init, double a);
/* A parameter holding a copy of a host tensor's data (float32 or bfloat16). */
tt_value tt_graph_param_from(tt_graph *graph, const char *name, const tt_tensor *data);
/* Any op of the daemon (docs/training.md lists them) on inputs. attrs: NULL or "name=value;..." where a value
 * is an integer, a float (with '.' or 'e') or an integer list "[a,b]", e.g.
 * "kernel=2;stride=2" or "perm=[0,2,1]". */
tt_value tt_graph_op(tt_graph *graph, const char *op, const tt_value *inputs, int n_inputs, const char *attrs);
/* Marks a value as an output of the graph (in call order). Returns 0 or -1. */
int tt_graph_output(tt_graph *graph, tt_value value);
/* The number of outputs marked so far; -1 for a NULL graph. */
int tt_graph_output_count(const tt_graph *graph);
/* The inferred shape of value: *out_ndim dims into out_shape (TT_MAX_DIMS long). -1 if invalid. */
int tt_graph_shape(const tt_graph *graph, tt_value value, int64_t *out_shape, int *out_ndim);

/* Layers with torch's default initialisation; parameters are named "<layer><n>.weight"
 * and "<layer><n>.bias" (linear1.weight, conv1.bias, ...). */
tt_value tt_nn_linear(tt_graph *graph, tt_value x, int64_t out_features, int bias);
tt_value tt_nn_conv2d(tt_graph *graph, tt_value x, int64_t out_channels, int64_t kernel, int64_t stride,
                      int64_t padding, int bias);
tt_value tt_nn_layer_norm(tt_graph *graph, tt_value x, double eps);
tt_value tt_relu(tt_graph *graph, tt_value x);

/* ---- modules: a compiled graph with its parameters, on a device ----
 * torch semantics: a module starts on "cpu"; tt_module_to moves its parameters; forward
 * takes inputs on the module's device and returns outputs there. On "cpu" the module runs
 * in process on the same kernels as the card (no daemon call). */
typedef struct tt_module tt_module;

/* Checks the graph (with the daemon's compiler, in process) and makes a module on "cpu"
 * holding copies of the graph's initial parameters. The graph may be freed afterwards.
 * NULL on error (an invalid graph: INVALID_ARGUMENT naming the node). */
tt_module *tt_compile(tt_client *client, const tt_graph *graph);
/* Drops the caller's reference; outputs of a pending training forward keep the module alive
 * until they are freed. Accepts NULL. */
void tt_module_free(tt_module *module);

/* Moves every parameter to device ("cpu", "tt", "tt:N"; L1 is not offered for modules).
 * The daemon compiles the program the first time the module runs on a card. To where the
 * module is already, nothing moves: .grad, optimizer state and pending runs stay, as with
 * torch's module.to(). */
tt_status tt_module_to(tt_module *module, const char *device);
const char *tt_module_device(const tt_module *module);

int tt_module_param_count(const tt_module *module);
const char *tt_module_param_name(const tt_module *module, int index); /* NULL if out of range */
/* The number of outputs of the module's graph: tt_forward fills that many; -1 for NULL. */
int tt_module_output_count(const tt_module *module);
/* A new reference to the named parameter, where the module is; NULL (NOT_FOUND) if absent. */
tt_tensor *tt_module_param(tt_module *module, const char *name);

/* Runs forward: n_inputs tensors on the module's device, in the graph's input order, with
 * the declared dtypes and ranks; outputs[i] receives a new tensor on the module's device for
 * each graph output (tt_module_output_count), of the shape this forward's inputs give.
 * Dims may differ from the declared ones (a batch of 1, an epoch's last partial batch)
 * wherever the graph's shape inference accepts them: the first forward at new input dims
 * compiles the graph for them (on a card, a Compile call; an op that does not accept them,
 * such as a reshape naming the declared batch, fails with INVALID_ARGUMENT naming the node),
 * with the same parameters, and the module keeps that program for the next forward at those
 * dims: 8 such programs besides the declared one, the least recently used dropped. Its
 * backward, and the optimizer steps after it, follow. Another dtype or rank fails with
 * INVALID_ARGUMENT naming the input and the declared dtype and shape. A module is used by one
 * thread at a time. */
tt_status tt_forward(tt_module *module, tt_tensor *const *inputs, int n_inputs, tt_tensor **outputs);

/* Training mode (the default, as torch's train()): a forward keeps what backward needs until
 * its outputs are freed or backpropagated, and each forward draws new dropout masks (from
 * each dropout node's seed and the count of the module's training forwards, on a card and on
 * "cpu" alike, so the same forwards give the same masks on both). 0 is torch's eval():
 * dropout passes its input through, and the count stays. On a ttd too old for dropout
 * modes, a forward that needs one (in eval, or any training forward but the first) fails
 * with TT_UNIMPLEMENTED. */
void tt_module_train(tt_module *module, int training);

/* Saves the module's parameters (wherever they are) as a safetensors file named by
 * parameter ("linear1.weight", ...), the format the ecosystem reads. */
tt_status tt_module_save(tt_module *module, const char *path);
/* Loads parameters by name from a safetensors file into the module, where it is, as torch's
 * load_state_dict copies them into the parameters: .grad and optimizer state stay. Every
 * parameter must be present with its dtype and shape (INVALID_ARGUMENT naming the first that
 * is not, the module then unchanged); extra entries are ignored. */
tt_status tt_module_load(tt_module *module, const char *path);

/* ---- autograd across the host/device boundary ----
 * Losses run on the CPU on host tensors and are recorded. tt_backward(loss) walks them back;
 * a tensor that came from a module's device output through tt_to(.., "cpu") sends its
 * gradient to the card and runs the module's backward there, accumulating into each
 * parameter's .grad on the device. */
tt_tensor *tt_l1_loss(tt_tensor *input, tt_tensor *target);      /* mean |input - target| */
tt_tensor *tt_mse_loss(tt_tensor *input, tt_tensor *target);     /* mean (input - target)^2 */
tt_tensor *tt_cross_entropy(tt_tensor *logits, tt_tensor *labels); /* float [n, c], int32 [n]; mean */
/* Elementwise add and mul with numpy broadcasting, and sum and mean of all elements. */
tt_tensor *tt_add(tt_tensor *a, tt_tensor *b);
tt_tensor *tt_mul(tt_tensor *a, tt_tensor *b);
tt_tensor *tt_sum(tt_tensor *a);
tt_tensor *tt_mean(tt_tensor *a);
/* When the loss reaches one run of one module on a card, the device part is asynchronous,
 * as CUDA's is: the Backward (gradient inline) rides on that module's next Execute, so a
 * training step is one round trip, and an error in it comes back from that tt_forward
 * ("the Backward carried by this Execute failed ..."). Reading a parameter or a .grad of the
 * module (also as another module's forward input), tt_param_grad, tt_module_to,
 * tt_module_load/save and a CPU optimizer step send it first (that module's, no other's);
 * tt_module_free sends it, with the steps and zeroings queued after it (on "cpu" they ran).
 * A second tt_backward through the same run fails at once.
 * TTD_INLINE=0 makes every Backward its own call, answered before tt_backward returns. */
tt_status tt_backward(tt_tensor *loss);
/* torch.autograd.backward(tensors, grad_tensors, retain_graph): backward from n (<= 64)
 * tensors at once, each an output of a training forward (on a card, or on "cpu"), a
 * download of one, or a tensor tracked ops made of them; grads[i] is tensors[i]'s gradient,
 * a float32 host tensor of its shape (grads NULL, or an entry NULL, for a one-element tensor:
 * 1). Gradients reaching one run are summed, and each run's Backward runs once, as
 * tt_backward's. retain_graph 0 frees each run reached after its Backward, as torch frees
 * the graph; 1 keeps it for another backward, until tt_release_run or until its outputs are
 * freed. tt_backward(loss) is tt_backward_grads(&loss, NULL, 1, 0). INVALID_ARGUMENT names
 * the tensor or gradient at fault; FAILED_PRECONDITION when a run was already
 * backpropagated without retain_graph, or released. */
tt_status tt_backward_grads(tt_tensor *const *tensors, tt_tensor *const *grads, int n, int retain_graph);
/* Frees what the training forward that made output (or whose output it is a download of)
 * keeps for backward, at once: its activations on the card or in process, as torch frees a
 * graph it no longer needs. A Backward of it still waiting for the module's next Execute
 * frees them there instead (no call now). A later backward through it fails; the outputs
 * stay valid tensors. INVALID_ARGUMENT for a tensor of no training forward. */
tt_status tt_release_run(tt_tensor *output);

/* ---- gradients of a forward's inputs: torch's requires_grad ----
 * A float tensor marked here and given to a training forward (tt_forward, on a card or on
 * "cpu") gets its gradient from that forward's backward, accumulated (summed over backwards
 * and over the forwards it fed) into its .grad, a float32 tensor of its shape where it is.
 * So a chain of modules trains: the gradient of the second module's input is the first
 * module's output gradient (tt_backward_grads). Such a Backward is answered before
 * tt_backward returns (it does not wait for the next Execute). Not thread-safe for one
 * tensor. */
/* 1 marks, 0 unmarks (the .grad stays). INVALID_ARGUMENT for an int32 tensor, as torch. */
tt_status tt_tensor_set_requires_grad(tt_tensor *tensor, int requires_grad);
int tt_tensor_requires_grad(const tt_tensor *tensor); /* 0 for NULL */
/* A new reference to the tensor's .grad (free it; .grad stays); NULL with FAILED_PRECONDITION
 * before any backward reached it. */
tt_tensor *tt_tensor_grad(tt_tensor *tensor);
/* torch's tensor.grad = None: the next backward starts a new .grad. Accepts NULL. */
void tt_tensor_clear_grad(tt_tensor *tensor);

/* The value of a one-element host tensor (NaN otherwise). */
float tt_tensor_item(const tt_tensor *tensor);
/* The named parameter's .grad on the module's device (read it with tt_to(.., "cpu")).
 * FAILED_PRECONDITION before the first backward. Free the returned tensor; .grad stays. */
tt_tensor *tt_param_grad(tt_module *module, const char *name);

/* ---- optimizers: on the device, parameters never leave the card ----
 * torch.optim's SGD, Adam and AdamW over all of a module's parameters. An optimizer borrows
 * its module, which must outlive it, and belongs to one thread at a time. */
typedef struct tt_optimizer tt_optimizer;

/* torch.optim.SGD's arguments. */
typedef struct tt_sgd_options {
  float lr;           /* tt_sgd_options_init: 1e-3 (torch 2's default; torch 1 has none) */
  float momentum;     /* 0 */
  float dampening;    /* 0 */
  float weight_decay; /* 0: L2 added to the gradient */
  int nesterov;       /* 0; 1 needs momentum > 0 and dampening 0 */
} tt_sgd_options;

/* torch.optim.Adam's arguments, or AdamW's with decoupled = 1. */
typedef struct tt_adam_options {
  float lr;           /* 1e-3 */
  float beta1, beta2; /* 0.9, 0.999: torch's betas */
  float eps;          /* 1e-8 */
  float weight_decay; /* 0 (torch's AdamW defaults to 1e-2: set it) */
  int decoupled;      /* 0: Adam (L2 added to the gradient); 1: AdamW (decoupled decay) */
} tt_adam_options;

/* Fill options with torch's defaults. */
void tt_sgd_options_init(tt_sgd_options *options);
void tt_adam_options_init(tt_adam_options *options);

/* A new optimizer of module's parameters (the caller's: tt_optimizer_free), or NULL.
 * options NULL: the defaults. The arguments are checked here, as torch.optim's constructors
 * check theirs, and every value must also be finite: lr, momentum and weight_decay >= 0, a
 * finite dampening, nesterov only with momentum > 0 and dampening 0; beta1 and beta2 in
 * [0, 1), eps > 0. A bad one is TT_INVALID_ARGUMENT naming it, its value and the range, e.g.
 * "tt_adam_opts: beta2 is 1; it must be a finite number in [0, 1)". NULL module: NULL, no
 * message. */
tt_optimizer *tt_sgd_opts(tt_module *module, const tt_sgd_options *options);
tt_optimizer *tt_adam_opts(tt_module *module, const tt_adam_options *options);
/* The same with the common arguments (dampening 0; Adam's betas and eps torch's defaults). */
tt_optimizer *tt_sgd(tt_module *module, float lr, float momentum, float weight_decay, int nesterov);
tt_optimizer *tt_adam(tt_module *module, float lr, float weight_decay, int decoupled); /* decoupled: AdamW */

/* The learning rate, torch's param_groups[0]["lr"]; NAN for NULL. set_lr changes it for the
 * steps that follow (a scheduler's job), on the card and on the CPU alike; a step already
 * queued keeps the rate it was queued with. A negative or non-finite lr is
 * TT_INVALID_ARGUMENT ("tt_optimizer_set_lr: lr is nan; ..."), the rate unchanged. */
float tt_optimizer_lr(const tt_optimizer *optimizer);
tt_status tt_optimizer_set_lr(tt_optimizer *optimizer, float lr);

/* On a card, tt_step and tt_zero_grad are queued on the module and ride on its next forward
 * or backward (or go out first when a parameter or .grad is read), with the same results as
 * separate calls: a training step is one call. What the daemon would refuse about a step
 * (a parameter's dtype) is refused here; a failure on the device (e.g. the quota, for
 * optimizer state) is reported by the call it rode on. TTD_INLINE=0: sent at once. */
/* One update from the current .grad. The optimizer's state (momentum, Adam's moments) lives
 * where it stepped: after the module moved (tt_module_to) or the optimizer switched sides
 * (tt_optimizer_on_cpu), a step is TT_FAILED_PRECONDITION until tt_optimizer_load puts
 * a saved state where the module is (plain SGD has none and always steps). */
tt_status tt_step(tt_optimizer *optimizer);
tt_status tt_zero_grad(tt_optimizer *optimizer); /* .grad = 0 */
void tt_optimizer_free(tt_optimizer *optimizer); /* accepts NULL */
/* The alternative: update on the CPU (each .grad comes down, the parameter is updated on the
 * host and goes back up into the same handle). A module on "cpu" always updates on the host.
 * The optimizer state lives where the updates run (beside each parameter on the card, or in
 * the optimizer on the host): switching does not carry it over. */
tt_status tt_optimizer_on_cpu(tt_optimizer *optimizer, int on_cpu);

/* The optimizer's state, torch's optimizer.state_dict(), to a safetensors file of its own
 * (beside tt_module_save's, as torch saves model and optimizer state dicts apart): per
 * parameter "<name>.step" (I32, the steps it took; 0 before its first) and, once it has
 * stepped, "<name>.momentum_buffer" (SGD with momentum) or "<name>.exp_avg" and
 * "<name>.exp_avg_sq" (Adam, AdamW), float32 shaped like the parameter; the optimizer and
 * its arguments in the "__metadata__" ("optimizer": "SGD", "Adam" or "AdamW", "lr", ...).
 * Saved wherever the state is (on the card it is read there after queued work is sent),
 * atomically as tt_safetensors_save does. */
tt_status tt_optimizer_save(tt_optimizer *optimizer, const char *path);
/* Replaces the optimizer's state with a file's, as torch's load_state_dict does: the state
 * of every parameter and the arguments (lr, momentum, betas, ...), so that a run resumed
 * from tt_module_load and tt_optimizer_load, in either order, continues bit for bit as if
 * it had not stopped. Checked whole before anything changes (the optimizer is unchanged
 * on error): TT_INVALID_ARGUMENT for a file of another optimizer ("... was saved by SGD;
 * this optimizer is Adam"), one that is not an optimizer state, a parameter it lacks or
 * holds with another shape (named); file errors as tt_safetensors_open's. */
tt_status tt_optimizer_load(tt_optimizer *optimizer, const char *path);

/* ---- datasets ----
 * IDX files (the MNIST format) loaded into host memory. Functions are thread-safe (no
 * shared state); a tt_dataset is plain data the caller owns. */

typedef struct tt_dataset {
  int64_t count;      /* number of examples */
  int rows, cols;     /* image size */
  float *images;      /* count * rows * cols pixels scaled to [0, 1] (byte / 255.0f), row-major */
  int32_t *labels;    /* count labels, the file's bytes (0..255) */
} tt_dataset;

/* Loads an IDX3 image file (magic 0x00000803) and its IDX1 label file (0x00000801), each
 * gzip-compressed or plain. On success *out_dataset is a new dataset the caller owns (free it
 * with tt_dataset_free); images and labels are never NULL, even for count 0. *out_dataset is
 * set to NULL on entry and stays NULL on error. Sides must be 1..4096, there may be at most
 * 2^31 pixels, and the files must hold exactly the data their headers announce.
 * On error returns a code (TT_NOT_FOUND for a missing file, TT_PERMISSION_DENIED for an
 * unreadable one, TT_DATA_LOSS for a truncated or malformed one -- bad magic, dimensions out
 * of range, short data, bytes after the data, corrupt gzip --, TT_INVALID_ARGUMENT for
 * mismatched counts, a NULL argument or a directory, TT_RESOURCE_EXHAUSTED when out of
 * memory) and writes a message naming the file and the problem into err (err_len bytes,
 * truncated to fit; err may be NULL). err is set to "" on success. */
tt_status tt_dataset_load_idx(const char *images_path, const char *labels_path, tt_dataset **out_dataset, char *err,
                              size_t err_len);

/* Fashion-MNIST from dir (NULL: /usr/share/datasets/fashion-mnist), train=1 for the 60000
 * training examples (train-{images-idx3,labels-idx1}-ubyte.gz), 0 for the 10000 test ones
 * (t10k-*-ubyte.gz). Images are 28x28, labels 0..9. Ownership and errors as for
 * tt_dataset_load_idx (TT_NOT_FOUND when the files are not there). */
tt_status tt_dataset_load_fashion_mnist(const char *dir, int train, tt_dataset **out_dataset, char *err,
                                        size_t err_len);

/* Frees a dataset and its arrays. Accepts NULL. */
void tt_dataset_free(tt_dataset *dataset);

/* ---- progress ----
 * A progress display for training loops. A tt_progress belongs to one thread at a time. */
typedef struct tt_progress tt_progress;

/* Starts a progress display of total steps labelled label (NULL: none; copied) on out (NULL:
 * stderr; lent, must outlive p). On a terminal it redraws one line in place with '\r': a
 * bar, percent, steps/s, the latest loss and time left, at most ~10 redraws/s. Otherwise it
 * prints plain lines, one as each further 10% is reached (at most 9, plus the final one), e.g.
 *   "epoch 1/5: 30% 282/938 steps, 412 steps/s, loss 0.5123, 1.6 s left"
 * force_tty: -1 auto (a terminal per isatty and TERM is not "dumb"), 0 plain, 1 terminal
 * style. total <= 0 means unknown: no percent, bar or time left. Returns a new display the
 * caller owns (end it with tt_progress_finish), or NULL if out of memory. */
tt_progress *tt_progress_start(const char *label, int64_t total, FILE *out, int force_tty);

/* Records that done steps (of total; clamped to 0..total) are complete and the latest loss
 * (NAN: none yet, the previous one stays shown); draws when due. Accepts NULL (no-op). */
void tt_progress_update(tt_progress *p, int64_t done, double loss);

/* Prints the final line -- percent (100% when done reached total), steps, total time,
 * average steps/s and the last loss, e.g. "epoch 1/5: 100% 938/938 steps in 2.3 s, 412
 * steps/s, loss 0.3012" -- ending a terminal line with '\n', and frees p. Accepts NULL. */
void tt_progress_finish(tt_progress *p);

/* ---- checkpoints (safetensors) ---- */

/* Safetensors files, the checkpoint format of Hugging Face and torch: an 8-byte
 * little-endian header length, a JSON header naming each tensor's dtype ("F32", "BF16",
 * "I32"), shape and byte range, then the raw little-endian row-major data. Files written
 * here read in the Python safetensors library and the other way round. */

/* Writes n host tensors under the given names to path, atomically: the bytes go to
 * "<path>.tmp", which is fsynced and renamed over path (then the folder is synced), so a
 * crash leaves either the old file or the new one. Tensors are written in the order given
 * and tt_safetensors_name lists them in that order. Nothing is taken over: names and
 * tensors stay the caller's.
 * client: where the error is recorded; may be NULL when n > 0, and then it is
 * tt_tensor_client(tensors[0]). With n == 0 (a valid, empty checkpoint) pass it.
 * names, tensors: n entries each (may be NULL when n == 0).
 * Errors: TT_INVALID_ARGUMENT for a device tensor (move it with tt_to(t, "cpu") first), an
 * empty, NULL, duplicate or non-UTF-8 name, the reserved name "__metadata__", a NULL path
 * or tensor; the message names the tensor. TT_UNAVAILABLE for an I/O error; the message
 * names the path and the errno text, and "<path>.tmp" is removed. An existing file at path
 * is untouched by any failure before the rename. TT_INVALID_ARGUMENT without a message when
 * no client can be found. Thread safety: concurrent saves to one path are not supported
 * (they share "<path>.tmp"). */
tt_status tt_safetensors_save(tt_client *client, const char *path, const char *const *names, tt_tensor *const *tensors,
                              int n);
/* tt_safetensors_save with a "__metadata__" object: n_metadata string pairs, metadata[2i]
 * the key and metadata[2i + 1] its value (as Python's save_file(..., metadata=)). */
tt_status tt_safetensors_save_metadata(tt_client *client, const char *path, const char *const *names,
                                       tt_tensor *const *tensors, int n, const char *const *metadata, int n_metadata);

typedef struct tt_safetensors tt_safetensors;

/* Opens a safetensors file and validates its whole layout: the header length against the
 * file size, the JSON, every dtype, each shape against its byte range (with overflow
 * checks), and that the byte ranges are in range, non-overlapping and cover the data
 * buffer exactly. The data itself is read by tt_safetensors_get; the file stays open until
 * tt_safetensors_close (replacing it on disk, as tt_safetensors_save does, is safe).
 * "__metadata__" must be an object of strings and is otherwise ignored.
 * *out_file (owned by the caller, release with tt_safetensors_close) is set on success and
 * cleared on entry. Errors, with text in tt_last_error(client): TT_NOT_FOUND when path does
 * not exist; TT_DATA_LOSS for a malformed file, the message naming what is wrong;
 * TT_PERMISSION_DENIED, TT_UNAVAILABLE for other I/O errors; TT_INVALID_ARGUMENT for a NULL
 * path or out_file, or a path that is not a regular file. NULL client: TT_INVALID_ARGUMENT
 * and no message. Dtypes that safetensors defines but libttclient cannot hold (F16, I64, ...)
 * open fine; only tt_safetensors_get of such a tensor fails. */
tt_status tt_safetensors_open(tt_client *client, const char *path, tt_safetensors **out_file);

/* The number of tensors in the file ("__metadata__" not counted); 0 for NULL. */
int tt_safetensors_count(const tt_safetensors *file);

/* The name of tensor index (0 .. count-1), in the order of the file's header; lent, valid
 * until tt_safetensors_close. NULL for a NULL file or an index out of range. */
const char *tt_safetensors_name(const tt_safetensors *file, int index);

/* A new host tensor (of the file's client, owned by the caller: tt_tensor_free) holding a
 * copy of the named tensor. NULL on error, text in tt_last_error of the file's client:
 * TT_NOT_FOUND naming the tensor when the file has none of that name; TT_UNIMPLEMENTED for a
 * dtype other than F32, BF16, I32 or more than TT_MAX_DIMS dims; TT_DATA_LOSS if the file
 * shrank since it was opened; TT_INVALID_ARGUMENT for a NULL name. NULL file: NULL, no
 * message. Several threads may get tensors of one file at once. */
tt_tensor *tt_safetensors_get(tt_safetensors *file, const char *name);

/* Closes the file and frees it; names from tt_safetensors_name become invalid. Tensors
 * already returned stay valid. Accepts NULL. */
void tt_safetensors_close(tt_safetensors *file);
/* The value of key in the file's "__metadata__" (lent until tt_safetensors_close); NULL
 * when there is none. */
const char *tt_safetensors_metadata(const tt_safetensors *file, const char *key);

#ifdef __cplusplus
}
#endif

#endif
