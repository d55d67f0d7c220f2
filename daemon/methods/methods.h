/* Layer daemon/methods: one file per RPC family of ttd.v1.Device, and the method table
 * (table.c) that daemon/rpc dispatches through. Calls daemon/rpc and below.
 *
 * RPC handlers of ttd.v1.Device, one file per group. Each runs on a worker thread with
 * the call's session attached (for methods that need one) and returns a status that
 * becomes the RPC's. See rpc/method.h for the calling conventions. */
#ifndef TTD_HANDLERS_H
#define TTD_HANDLERS_H

#include "rpc/method.h"
#include "ttd/v1/protocol.h"


/* An arena allocation that failed becomes RESOURCE_EXHAUSTED. */
#define TTD_CHECK_ALLOC(p)                                                                     \
  do {                                                                                         \
    if (!(p)) return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "daemon is out of host memory"); \
  } while (0)

ttd_status_t ttd_method_open_session(ttd_call *call, const ProtobufCMessage *request, ProtobufCMessage **out_response);
ttd_status_t ttd_method_keep_alive(ttd_call *call, const ProtobufCMessage *request, ProtobufCMessage **out_response);
ttd_status_t ttd_method_close_session(ttd_call *call, const ProtobufCMessage *request, ProtobufCMessage **out_response);
ttd_status_t ttd_method_list_devices(ttd_call *call, const ProtobufCMessage *request, ProtobufCMessage **out_response);
ttd_status_t ttd_method_allocate(ttd_call *call, const ProtobufCMessage *request, ProtobufCMessage **out_response);
ttd_status_t ttd_method_move(ttd_call *call, const ProtobufCMessage *request, ProtobufCMessage **out_response);
ttd_status_t ttd_method_compile(ttd_call *call, const ProtobufCMessage *request, ProtobufCMessage **out_response);
ttd_status_t ttd_method_execute(ttd_call *call, const ProtobufCMessage *request, ProtobufCMessage **out_response);
ttd_status_t ttd_method_backward(ttd_call *call, const ProtobufCMessage *request, ProtobufCMessage **out_response);
ttd_status_t ttd_method_release_run(ttd_call *call, const ProtobufCMessage *request, ProtobufCMessage **out_response);
ttd_status_t ttd_method_zero_grad(ttd_call *call, const ProtobufCMessage *request, ProtobufCMessage **out_response);
ttd_status_t ttd_method_optimizer_step(ttd_call *call, const ProtobufCMessage *request, ProtobufCMessage **out_response);
ttd_status_t ttd_method_list_sessions(ttd_call *call, const ProtobufCMessage *request, ProtobufCMessage **out_response);
ttd_status_t ttd_method_kill_session(ttd_call *call, const ProtobufCMessage *request, ProtobufCMessage **out_response);
ttd_status_t ttd_method_optimizer_state(ttd_call *call, const ProtobufCMessage *request, ProtobufCMessage **out_response);
/* The device a call of Execute, Backward, ZeroGrad or OptimizerStep works on (rpc/method.h). */
int ttd_device_of_execute(ttd_call *call, const ProtobufCMessage *request);
int ttd_device_of_backward(ttd_call *call, const ProtobufCMessage *request);
int ttd_device_of_parameters(ttd_call *call, const ProtobufCMessage *request);
int ttd_device_of_optimizer_state(ttd_call *call, const ProtobufCMessage *request); /* OptimizerState */

ttd_status_t ttd_method_free(ttd_call *call, const ProtobufCMessage *request, ProtobufCMessage **out_response);

ttd_status_t ttd_upload_message(ttd_call *call, grpc_byte_buffer *message);
ttd_status_t ttd_upload_end(ttd_call *call, ProtobufCMessage **out_response);
void ttd_upload_abort(ttd_call *call);

ttd_status_t ttd_download_begin(ttd_call *call, const ProtobufCMessage *request);
ttd_status_t ttd_download_next(ttd_call *call, grpc_byte_buffer **out_message, bool *out_last);
void ttd_download_done(ttd_call *call);
void ttd_download_cancel(ttd_call *call);

#endif
