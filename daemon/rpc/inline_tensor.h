/* Small tensors travelling inside Execute and Backward (ttd.v1.InlineTensor): checked before
 * anything is allocated, then made into device tensors charged to the session's quota, and
 * program outputs read back into the response. */
#ifndef TTD_INLINE_TENSOR_H
#define TTD_INLINE_TENSOR_H

#include "graph/program.h"
#include "rpc/call.h"
#include "device/tensor.h"
#include "ttd/v1/ttd.pb-c.h"

/* Checks one inline tensor against what the program expects (want: dtype and shape) and
 * fills *out_spec on device. what and index name it in messages ("inline input 0 ('x')").
 * INVALID_ARGUMENT for a missing or invalid spec, another device, another dtype or shape, or
 * data (or a shared-memory range) of the wrong size or over TTD_INLINE_MAX_BYTES, or both
 * data and a range. */
ttd_status_t ttd_inline_check(const ttd_core *core, const Ttd__V1__InlineTensor *wire, const ttd_value_type *want,
                              const char *what, int index, const char *name, int device, ttd_tensor_spec *out_spec);

/* INVALID_ARGUMENT when total bytes exceed TTD_INLINE_MAX_BYTES; what says whose ("inline inputs"). */
ttd_status_t ttd_inline_check_total(uint64_t total, const char *what, const char *instead);

/* A device tensor holding the wire tensor's bytes (its data, or its range of a shared-memory
 * segment of the session), charged to the call's session (counted as bytes to the device).
 * NOT_FOUND for a segment the session does not have, INVALID_ARGUMENT for a range outside it,
 * RESOURCE_EXHAUSTED when the session's quota or the card's memory has no room. */
ttd_status_t ttd_inline_create(ttd_call *call, const ttd_tensor_spec *spec, const Ttd__V1__InlineTensor *wire,
                               ttd_tensor **out_tensor);

/* A copy of tensor's bytes in the call's arena (counted as bytes to the host). */
ttd_status_t ttd_inline_read(ttd_call *call, const ttd_tensor *tensor, ProtobufCBinaryData *out_data);

/* The bytes of a program value of type t. */
uint64_t ttd_value_type_nbytes(const ttd_value_type *t);

#endif
