/* Layer client/tensor: host and device tensors (struct, storage, reference counts, device
 * strings), the layer every client part above builds on. Calls only client/conn, the
 * shared runtime and the protocol; what a higher layer hangs on a tensor it releases
 * through a tt_tensor_tie, never by name. */
#ifndef TT_CLIENT_TENSOR_H
#define TT_CLIENT_TENSOR_H

#include <stdbool.h>

#include "conn/conn.h"

#define TT_SHM_MIN_BYTES (256u << 10) /* smaller host tensors stay in malloc memory */

/* Where a tensor lives. */
typedef struct tt_place {
  bool is_host;
  int device; /* tt:N */
  bool l1;    /* L1, else DRAM */
} tt_place;

/* Something of a higher layer that a tensor holds one reference to (the autograd node that
 * made it, the module run it is an output of) and drops through release when it is freed.
 * The higher layer's struct begins with it. */
typedef struct tt_tensor_tie {
  void (*release)(struct tt_tensor_tie *tie);
} tt_tensor_tie;

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
  void *data;           /* host tensors */
  uint64_t shm_segment; /* host data in this shared-memory segment (offset 0), or 0 */
  size_t host_block;    /* else: the size of the block cache's block behind data */
  bool wrapped;         /* host data is the caller's (tt_tensor_wrap_host): read, never written or freed */
  void (*release)(void *ctx); /* a wrapped tensor's last free calls release(release_ctx), when set */
  void *release_ctx;
  uint64_t handle;      /* device tensors */
  tt_tensor_tie *grad_fn; /* host tensors made by tracked ops: their autograd node (module/autograd.c) */
  tt_tensor *from_output; /* host tensors downloaded from a device output of a training forward:
                           * that output (one reference), whose run takes their gradient */
  float *grad;            /* during tt_backward only */
  tt_tensor_tie *run;     /* outputs of a training forward: the run kept for backward (module/run.c) */
  int output_index;
  bool borrowed;          /* a view of a daemon-owned tensor (.grad): free does not Free it */
  bool param;             /* a module's parameter: reading it sends queued parameter work first */
  uint64_t owner;         /* a parameter's or borrowed .grad's module (its tt_module.key), or 0 */
  void *host_copy;        /* device tensors: their bytes on the host (move/inline.c). With handle 0
                           * the tensor is deferred: it travels inline or is uploaded when needed */
  uint64_t host_copy_segment; /* host_copy lies in this shared-memory segment (offset 0), or 0 */
  bool requires_grad;         /* tt_tensor_set_requires_grad: Backward of a forward it fed fills acc_grad */
  tt_tensor *acc_grad;        /* its .grad (float32, its shape and place; one reference), or NULL */
};

/* ---- device strings (place.c) ---- */

/* Parses "cpu", "tt", "tt:N", "tt:N/dram", "tt:N/l1", "tt/l1". Returns 0 or -1. */
int tt_place_parse(const char *text, tt_place *out_place);

/* "cpu", "tt:N", "tt:N/l1". */
void tt_place_format(const tt_place *place, char *buf, size_t len);

/* A card place as the protocol names it: the device ("tt:N") into device, and its memory. */
Ttd__V1__MemoryLocation tt_place_wire(const tt_place *place, char *device, size_t len);

/* ---- tensors (tensor.c) ---- */

/* A new tensor struct for client with one reference and no storage. */
tt_tensor *tt_tensor_alloc(tt_client *client);

/* One more reference to tensor (NULL stays NULL). */
tt_tensor *tt_tensor_retain(tt_tensor *tensor);

/* Checks dtype and shape and fills a tensor's dtype, shape, numel and nbytes. */
tt_status tt_tensor_describe(tt_client *client, tt_tensor *tensor, tt_dtype dtype, const int64_t *shape, int ndim);

/* A new tensor struct of src's client and shape with dtype, placed at place, with no
 * storage or handle yet; NULL (the client's last error says why) on failure. */
tt_tensor *tt_tensor_like(const tt_tensor *src, const tt_place *place, tt_dtype dtype);

/* A host tensor whose bytes are not initialised (they are about to be overwritten). */
tt_tensor *tt_tensor_host_uninit(tt_client *client, tt_dtype dtype, const int64_t *shape, int ndim);

/* Frees a device tensor's host copy (malloc or shared memory). */
void tt_tensor_host_copy_free(tt_tensor *tensor);

#endif
