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
 * Threads: a client may be used from several threads; each call is independent. The last
 * error is per client and belongs to the most recent failing call on any thread.
 * Ownership: every tt_tensor returned is owned by the caller and released with
 * tt_tensor_free; free functions accept NULL. Tensors must be freed before their client
 * is disconnected. */
#ifndef TTCLIENT_H
#define TTCLIENT_H

#include <stddef.h>
#include <stdint.h>

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
  int64_t call_timeout_ms;  /* deadline of unary calls; 0: 60 s. Streams have none. */
} tt_connect_options;

/* Sets the defaults. */
void tt_connect_options_init(tt_connect_options *options);

/* Connects to ttd and opens a session. target: "unix:/path" or "host:port"; NULL means the
 * TTD_ADDRESS environment variable, then the default socket (tt_default_target). options may
 * be NULL for the defaults. *out_client is set even on failure (NULL only when out of
 * memory) so that tt_last_error can say why; release it with tt_disconnect either way.
 * A background thread renews the session every lease/3 unless disabled. */
tt_status tt_connect(const char *target, const tt_connect_options *options, tt_client **out_client);

/* Closes the session (the daemon frees its tensors) and releases the client. NULL ok. */
void tt_disconnect(tt_client *client);

/* The default target: $XDG_RUNTIME_DIR/ttd.sock, /run/ttd/ttd.sock as root, else
 * /tmp/ttd-UID/ttd.sock, with the "unix:" prefix. Returns 0, or -1 if buf is too small. */
int tt_default_target(char *buf, size_t len);

/* The code and message of the most recent failing call on this client; TT_OK and "" when
 * none failed. The message stays valid until the next call on the client. NULL client:
 * "out of memory". */
tt_status tt_errcode(const tt_client *client);
const char *tt_last_error(const tt_client *client);

/* "OK", "INVALID_ARGUMENT", ... */
const char *tt_status_name(tt_status status);

/* The session id and the daemon instance id this client holds. */
uint64_t tt_session_id(const tt_client *client);
const char *tt_instance_id(const tt_client *client);

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

/* ---- tensors ---- */

/* A new host tensor holding a copy of data (numel * dtype size bytes; may be NULL for
 * zeros). ndim 0 makes a scalar. NULL on error (bad dtype or shape): see tt_last_error. */
tt_tensor *tt_tensor_from_host(tt_client *client, const void *data, tt_dtype dtype, const int64_t *shape, int ndim);

/* A new zero-filled tensor on device ("cpu", "tt", "tt:N", "tt:N/l1"); on a device it is
 * allocated by the daemon. NULL on error. */
tt_tensor *tt_tensor_empty(tt_client *client, tt_dtype dtype, const int64_t *shape, int ndim, const char *device);

/* Drops one reference; the last one frees host memory, or the device tensor (a Free RPC).
 * Accepts NULL. */
void tt_tensor_free(tt_tensor *tensor);

/* Returns a tensor on device, torch's .to(): "cpu", "tt" (tt:0 DRAM), "tt:N", "tt:N/dram",
 * "tt:N/l1". To the place the tensor already is: the same tensor, with one more reference.
 * Device to device stays on the daemon (Move, no host trip). The source is untouched.
 * NULL on error: tt_last_error(tt_tensor_client(tensor)). */
tt_tensor *tt_to(tt_tensor *tensor, const char *device);

/* Like tt_to, also converting the element type: float32 <-> bfloat16 (round to nearest
 * even), as a card's to_device does; host <-> device only, or host to host. */
tt_tensor *tt_to_dtype(tt_tensor *tensor, const char *device, tt_dtype dtype);

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
/* Host data (numel * dtype size bytes), writable; NULL for a device tensor. */
void *tt_tensor_data(tt_tensor *tensor);
/* The daemon's handle of a device tensor; 0 for a host tensor. */
uint64_t tt_tensor_handle(const tt_tensor *tensor);

/* Bytes per element of dtype; 0 if unknown. */
size_t tt_dtype_size(tt_dtype dtype);

#ifdef __cplusplus
}
#endif

#endif
