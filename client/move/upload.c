/* Uploads that make a new device tensor: tt_to's, a deferred tensor's and a Backward's. */
#include "move/move.h"

tt_status tt_upload_new(tt_client *c, const tt_place *place, tt_dtype dtype, tt_dtype source_dtype,
                        const int64_t *shape, int ndim, const void *data, uint64_t nbytes, uint64_t segment,
                        uint64_t *out_handle) {
  *out_handle = 0;
  char device[16];
  Ttd__V1__TensorSpec spec = TTD__V1__TENSOR_SPEC__INIT;
  spec.location = tt_place_wire(place, device, sizeof(device));
  spec.dtype = (Ttd__V1__DType)dtype;
  spec.n_shape = (size_t)ndim;
  spec.shape = (int64_t *)shape;
  spec.device = device;
  Ttd__V1__UploadHeader header = TTD__V1__UPLOAD_HEADER__INIT;
  header.target_case = TTD__V1__UPLOAD_HEADER__TARGET_SPEC;
  header.spec = &spec;
  header.source_dtype = (Ttd__V1__DType)source_dtype;
  Ttd__V1__ShmRange shm = TTD__V1__SHM_RANGE__INIT;
  if (segment) { /* same host: the daemon copies straight from the segment */
    shm.segment = segment;
    shm.length = nbytes;
    header.shm = &shm;
    data = NULL;
    nbytes = 0;
  }
  Ttd__V1__UploadResponse *resp = NULL;
  TT_RETURN_IF_FAILED(tt_rpc_upload(c, &header, data, nbytes, &resp));
  *out_handle = resp->tensor ? resp->tensor->handle : 0;
  protobuf_c_message_free_unpacked(&resp->base, NULL);
  return *out_handle ? TT_OK : tt_client_fail(c, TT_INTERNAL, "ttd answered Upload without a tensor");
}
