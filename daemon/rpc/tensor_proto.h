/* Conversions between wire tensor specs (ttd.v1.TensorSpec, TensorInfo) and the
 * daemon's ttd_tensor_spec, with every check a request needs. */
#ifndef TTD_TENSOR_PROTO_H
#define TTD_TENSOR_PROTO_H

#include "core/core.h"
#include "rpc/call.h"
#include "ttd/v1/ttd.pb-c.h"

/* Validates a wire spec: present, known dtype, sane shape, existing device and location. */
ttd_status_t ttd_tensor_spec_from_proto(const ttd_core *core, const Ttd__V1__TensorSpec *wire,
                                        ttd_tensor_spec *out_spec);

/* A memory location from the wire: unspecified means DRAM. */
ttd_status_t ttd_memloc_from_proto(int wire, ttd_memloc *out_loc);

/* A TensorInfo in the call's arena describing tensor under handle. NULL if out of memory. */
Ttd__V1__TensorInfo *ttd_tensor_info_to_proto(ttd_call *call, uint64_t handle, const ttd_tensor_spec *spec);

#endif
