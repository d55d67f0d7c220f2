/* What every call of the method table goes through between its arrival and its handler,
 * with no transport in it: the caller is authenticated (nothing of an unauthenticated
 * caller's request is parsed) and held to the method's admin flag, the request of a unary
 * or server-stream method is unpacked into the call's arena, and the session the metadata
 * names is attached. rpc/server.c runs it on each gRPC call; the fuzz harnesses run it in
 * process on bytes of their own (tests/fuzz/). */
#ifndef TTD_RPC_DISPATCH_H
#define TTD_RPC_DISPATCH_H

#include "rpc/method.h"

/* Readies call (ttd_call_init'd, request metadata and call->received set) for its
 * method's handler. *out_request is the unpacked request (NULL for a client stream, whose
 * messages go to stream_message one by one); call->received is consumed. Errors are the
 * call's answer: UNAUTHENTICATED, PERMISSION_DENIED, INVALID_ARGUMENT for a missing or
 * undecodable request or bad session metadata, FAILED_PRECONDITION for another daemon
 * instance, NOT_FOUND for a session that is not open. Thread-safe. */
ttd_status_t ttd_dispatch_prepare(ttd_call *call, ProtobufCMessage **out_request);

#endif
