/* Layer runtime/wire: what both ends of the wire need (framing, completion-queue polling,
 * the default address, tokens, the shared-memory protocol, safetensors files). Calls
 * runtime/base, kernels/dtype.h, jansson and gRPC core.
 *
 * Hand-framed protobuf messages for bulk tensor bytes, so that they never pass through
 * protobuf-c's copy of a `bytes` field. Sending: the small part of the message packed by
 * protobuf-c, then the tag and length of the bytes field, then a slice that points at the
 * tensor's memory (zero copy). Receiving: the message's slices are walked field by field
 * and the bytes field is handed over in place, slice by slice, for the one copy into its
 * destination. The wire format is plain protobuf: any gRPC peer reads and writes it.
 * Shared by ttd and libttclient. */
#ifndef TTD_WIRE_FRAME_H
#define TTD_WIRE_FRAME_H

#include <grpc/grpc.h>
#include <protobuf-c/protobuf-c.h>
#include <stddef.h>
#include <stdint.h>

/* Fields of a message being read. Returning nonzero stops the walk with that value. */
typedef struct ttd_wire_visitor {
  /* A varint, fixed64 or fixed32 field. */
  int (*number)(void *ctx, uint32_t field, uint64_t value);
  /* A part of a length-delimited field: its bytes [at, at + len) of total. Every such
   * field is reported at least once (a zero-length one with len 0). */
  int (*bytes)(void *ctx, uint32_t field, const uint8_t *data, size_t len, uint64_t at, uint64_t total);
} ttd_wire_visitor;

/* Walks the top-level fields of the message in bb. Returns 0, -1 for a malformed message
 * (truncated, bad varint, group wire types), or what a visitor returned. Fields before the
 * fault have been reported by then: a caller undoes what they did. Unlike protobuf's
 * readers, it reports a known field of an unexpected wire type to the visitor as it comes
 * (number or bytes) and every occurrence of a repeated bytes field; the visitor decides. */
int ttd_wire_walk(grpc_byte_buffer *bb, const ttd_wire_visitor *visitor, void *ctx);

/* A message made of head (packed; may be NULL) followed by field `field` of wire type
 * bytes holding data. Takes the caller's reference to data. */
grpc_byte_buffer *ttd_wire_frame(const ProtobufCMessage *head, uint32_t field, grpc_slice data);

#endif
