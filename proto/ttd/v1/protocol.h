/* The protocol's version and limits: what a request of ttd.v1 may carry. Daemon, runtime,
 * kernels and libttclient read them from here; ttclient.h repeats TT_MAX_DIMS for programs,
 * and the client asserts at compile time that the two agree. */
#ifndef TTD_V1_PROTOCOL_H
#define TTD_V1_PROTOCOL_H

#include <stdint.h>

/* The version a client and ttd exchange at OpenSession; a mismatch is refused. */
#define TTD_PROTOCOL_VERSION 1

/* Dims of a tensor (TensorSpec.shape). */
#define TTD_MAX_DIMS 8

/* The largest gRPC message either side accepts. */
#define TTD_MAX_MESSAGE_BYTES (8 * 1024 * 1024)

/* Bytes of tensor data that travel inside an Execute or Backward request or response
 * (inline inputs, outputs and gradients): half the message limit, so the rest of a
 * message always fits. Larger tensors go by Upload and Download. */
#define TTD_INLINE_MAX_BYTES ((uint64_t)4 << 20)

#endif
