/* Allocate, Move and Free: tensor lifetime within a session. */
#include "methods/methods.h"
#include "rpc/tensor_proto.h"


ttd_status_t ttd_method_allocate(ttd_call *call, const ProtobufCMessage *request, ProtobufCMessage **out_response) {
  const Ttd__V1__AllocateRequest *req = (const Ttd__V1__AllocateRequest *)request;
  ttd_tensor_spec spec;
  TTD_RETURN_IF_ERROR(ttd_tensor_spec_from_proto(call->core, req->spec, &spec));
  Ttd__V1__AllocateResponse *resp = ttd_call_alloc(call, sizeof(*resp));
  TTD_CHECK_ALLOC(resp);
  ttd__v1__allocate_response__init(resp);
  ttd_tensor *tensor = NULL;
  uint64_t handle = 0;
  TTD_RETURN_IF_ERROR(ttd_tensor_create_zeroed(call->core->backend, call->session->quota, &spec, &tensor));
  ttd_status_t status = ttd_session_tensor_add(call->session, tensor, &handle);
  ttd_tensor_release(tensor);
  if (status) return status;
  resp->tensor = ttd_tensor_info_to_proto(call, handle, &spec);
  TTD_CHECK_ALLOC(resp->tensor);
  *out_response = &resp->base;
  return TTD_OK;
}

ttd_status_t ttd_method_move(ttd_call *call, const ProtobufCMessage *request, ProtobufCMessage **out_response) {
  const Ttd__V1__MoveRequest *req = (const Ttd__V1__MoveRequest *)request;
  Ttd__V1__MoveResponse *resp = ttd_call_alloc(call, sizeof(*resp));
  TTD_CHECK_ALLOC(resp);
  ttd__v1__move_response__init(resp);
  ttd_tensor *src = NULL;
  TTD_RETURN_IF_ERROR(ttd_session_tensor_lookup(call->session, req->handle, &src));
  ttd_tensor_spec spec = src->spec;
  ttd_status_t status = TTD_OK;
  if (req->device && req->device[0]) status = ttd_core_parse_device(call->core, req->device, &spec.device);
  if (!status) status = ttd_memloc_from_proto(req->location, &spec.location);
  ttd_tensor *dst = NULL;
  uint64_t handle = 0;
  if (!status) status = ttd_tensor_create(call->core->backend, call->session->quota, &spec, &dst);
  if (!status) status = call->core->backend->vtable->buffer_copy(call->core->backend, src->buffer, dst->buffer);
  if (!status) status = ttd_session_tensor_add(call->session, dst, &handle);
  ttd_tensor_release(dst);
  ttd_tensor_release(src);
  if (status) return status;
  if (req->free_source) {
    uint64_t n, bytes;
    /* The source may have been freed by another call meanwhile; the move still stands. */
    ttd_status_free(ttd_session_tensors_free(call->session, &req->handle, 1, &n, &bytes));
  }
  resp->tensor = ttd_tensor_info_to_proto(call, handle, &spec);
  TTD_CHECK_ALLOC(resp->tensor);
  *out_response = &resp->base;
  return TTD_OK;
}

ttd_status_t ttd_method_free(ttd_call *call, const ProtobufCMessage *request, ProtobufCMessage **out_response) {
  const Ttd__V1__FreeRequest *req = (const Ttd__V1__FreeRequest *)request;
  Ttd__V1__FreeResponse *resp = ttd_call_alloc(call, sizeof(*resp));
  TTD_CHECK_ALLOC(resp);
  ttd__v1__free_response__init(resp);
  TTD_RETURN_IF_ERROR(ttd_session_tensors_free(call->session, req->handles, req->n_handles, &resp->tensors_freed,
                                               &resp->bytes_freed));
  *out_response = &resp->base;
  return TTD_OK;
}
