/* The table of RPC methods: path, registered-method handle, request type and handler.
 * Methods are registered with gRPC before the server starts and calls are dispatched
 * through this table, never by comparing method strings per call. */
#ifndef TTD_RPC_METHOD_H
#define TTD_RPC_METHOD_H

#include <stdbool.h>

#include "rpc/call.h"

typedef enum ttd_method_kind {
  TTD_METHOD_UNARY,
  TTD_METHOD_CLIENT_STREAM,
  TTD_METHOD_SERVER_STREAM,
} ttd_method_kind;

struct ttd_method {
  const char *path; /* "/ttd.v1.Device/Allocate" */
  ttd_method_kind kind;
  const ProtobufCMessageDescriptor *request;
  bool needs_session;
  bool needs_admin;  /* only tenants marked admin may call it */
  /* Its events may take long (tensor bytes copied, a graph compiled, tensors freed): they
   * run on the server's work queue, not on the completion-queue poller (rpc/server.h). */
  bool heavy;

  /* UNARY: the response is allocated from the call arena (ttd_call_alloc). */
  /* With device_of, the call is device work: it waits its session's turn in the device's
   * queue (scheduler.h) and the handler runs on that device's executor thread. device_of
   * names the device from the request (any device for a bad handle: the handler reports it). */
  int (*device_of)(ttd_call *call, const ProtobufCMessage *request);
  ttd_status_t (*unary)(ttd_call *call, const ProtobufCMessage *request, ProtobufCMessage **out_response);

  /* CLIENT_STREAM: each message in order, as received (bulk handlers walk it with
   * wire_frame.h rather than copy it through protobuf-c), then the end of the stream;
   * abort is called instead of end when the stream breaks or a message fails, and must
   * undo everything. */
  ttd_status_t (*stream_message)(ttd_call *call, grpc_byte_buffer *message);
  ttd_status_t (*stream_end)(ttd_call *call, ProtobufCMessage **out_response);
  void (*stream_abort)(ttd_call *call);

  /* SERVER_STREAM: begin with the request, then next until it sets *out_last; next makes
   * each message ready to send (the server owns it from there: wire_frame.h builds bulk
   * ones over tensor memory). done always runs at the end, success or not. cancel runs
   * when the call's session closes between a successful begin and done, on the closing
   * thread while next may run on another: it drops what the stream holds of the session
   * at once, since the send it waits on may end only when the client next reads. */
  ttd_status_t (*stream_begin)(ttd_call *call, const ProtobufCMessage *request);
  ttd_status_t (*stream_next)(ttd_call *call, grpc_byte_buffer **out_message, bool *out_last);
  void (*stream_done)(ttd_call *call);
  void (*stream_cancel)(ttd_call *call);
};

/* The methods of ttd.v1.Device. */
extern const ttd_method ttd_methods[];
extern const size_t ttd_method_count;

#endif
