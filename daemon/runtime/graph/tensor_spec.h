/* What a tensor is before it has memory: dtype, shape, device and memory location, with its
 * element and byte counts. Programs, backends and device tensors share it. */
#ifndef TTD_TENSOR_SPEC_H
#define TTD_TENSOR_SPEC_H

#include <stdint.h>

#include "base/status.h"
#include "dtype.h"
#include "ttd/v1/protocol.h"

/* Memory locations of a device; values equal ttd.v1.MemoryLocation. */
typedef enum ttd_memloc {
  TTD_MEM_DRAM = 1,
  TTD_MEM_L1 = 2,
} ttd_memloc;
#define TTD_MEM_COUNT 2

typedef struct ttd_tensor_spec {
  ttd_dtype dtype;
  int ndim;
  int64_t shape[TTD_MAX_DIMS];
  int device;
  ttd_memloc location;
  uint64_t numel;  /* product of shape; 1 for 0-d */
  uint64_t nbytes; /* numel * dtype size */
} ttd_tensor_spec;

/* Fills numel and nbytes from dtype and shape. INVALID_ARGUMENT for an invalid dtype,
 * too many dims, a negative dim, or nonzero dims whose product passes 2^63 elements or
 * bytes (also when another dim is 0: strides of an empty tensor must fit as well). */
ttd_status_t ttd_tensor_spec_finish(ttd_tensor_spec *spec);

#endif
