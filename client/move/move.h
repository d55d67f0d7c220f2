/* Layer client/move: tensors between the host and the cards: tt_to (Upload, Download,
 * Move), deferred uploads and inline transfers that save round trips. Calls only
 * client/tensor and client/conn; what a higher layer queued for a tensor's device bytes
 * it sends through the hook that layer installs (tt_to_set_pending_flush). */
#ifndef TT_CLIENT_MOVE_H
#define TT_CLIENT_MOVE_H

#include "tensor/tensor.h"

/* Deferred device tensors from this size travel by shared memory instead of inside the call:
 * the segment is reused step after step, so a copy less and no bytes through gRPC. */
#define TT_SHM_INLINE_MIN_BYTES (32u << 10)

/* ---- uploads (upload.c) ---- */

/* Uploads bytes of source_dtype and shape to place as a new tensor of dtype; *out_handle its
 * handle. With a segment, data is that shared-memory segment's start and the daemon reads
 * it there. */
tt_status tt_upload_new(tt_client *client, const tt_place *place, tt_dtype dtype, tt_dtype source_dtype,
                        const int64_t *shape, int ndim, const void *data, uint64_t nbytes, uint64_t segment,
                        uint64_t *out_handle);

/* ---- tt_to (to.c) ---- */

/* Sends the work a higher layer has queued for tensor's device bytes (a module's step or
 * zeroing of its parameters); OK when there is none. */
typedef tt_status (*tt_pending_flush_fn)(const tt_tensor *tensor);

/* Sends what the hook says is queued for tensor's device bytes; OK when nothing is. */
tt_status tt_to_flush_pending(const tt_tensor *tensor);

/* Installs the hook tt_to calls before it reads or moves a device tensor; any thread, at any
 * time (the module layer installs it when it compiles a module). */
void tt_to_set_pending_flush(tt_pending_flush_fn flush);

/* ---- fewer round trips (inline.c) ---- */

/* Whether inline transfers, deferred uploads and queued parameter work are on for client:
 * yes unless TTD_INLINE=0 (then every call goes out on its own). */
bool tt_inline_enabled(tt_client *client);

/* Whether a host -> device tt_to of nbytes to place should be deferred: small, DRAM, and a
 * module on that device is in a training loop (a Backward in training mode reached it there). */
bool tt_inline_defer_wanted(tt_client *client, const tt_place *place, uint64_t nbytes);

/* A deferred device tensor: src's bytes (converted to dtype) kept on the host, no handle. */
tt_tensor *tt_inline_defer(tt_tensor *src, const tt_place *place, tt_dtype dtype);

/* Gives a deferred tensor its handle (an Upload of its bytes); OK for any other tensor. */
tt_status tt_tensor_materialize(tt_tensor *tensor);

/* A host tensor (dtype) from a device tensor's host copy. */
tt_tensor *tt_inline_to_host(tt_tensor *src, tt_dtype dtype);

/* One inline tensor of a request, with the storage its message points into. */
typedef struct tt_inline_wire {
  Ttd__V1__InlineTensor wire;
  Ttd__V1__TensorSpec spec;
  Ttd__V1__ShmRange range;
  char device[16];
} tt_inline_wire;

/* Fills w to send tensor's host copy inline. */
void tt_inline_fill(tt_inline_wire *w, const tt_tensor *tensor);

#endif
