/* Fuzz harness: sequences of ttd.v1.Device calls, each request through unpack and its
 * handler, against the in-process daemon core (fuzz_core.h), one session per input.
 *
 * Input, up to 16 calls, each:
 *   u8  selector: the method is (selector & 31) modulo the method count, in the order of
 *       daemon/methods/table.c; selector >> 5 picks the session metadata: 0-3 the input's
 *       session, 4 the latest session an OpenSession of this input opened, 5 none, 6 not
 *       hex, 7 with the ttd-instance of another daemon
 *   u16 length (little-endian) and that many bytes: the request message. Upload takes
 *       them as the one message of its stream, then ends it; Download takes at most 16
 *       messages of its stream and then drops it, as a client that goes away.
 * Handles count up from 0x15 in each input (fuzz_random.h: the session is 0x13 and its
 * shared-memory segment 0x14), so a sequence can Allocate, Upload, Compile, Execute and
 * Backward on what it made, and move bytes through the segment. */
#include <stdlib.h>

#include "methods/methods.h"
#include "rpc/dispatch.h"
#include "fuzz_core.h"
#include "fuzz_input.h"
#include "fuzz_proto_mutate.h"
#include "ttd/v1/ttd.pb-c.h"

#define MAX_CALLS 16
#define MAX_DOWNLOAD_MESSAGES 16

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Runs a unary call; returns its response (in the call's arena), NULL when it failed. */
static const ProtobufCMessage *run_unary(fuzz_call *fc, const ProtobufCMessage *request) {
  ttd_call *call = &fc->call;
  const ttd_method *m = call->method;
  if (m->device_of) (void)m->device_of(call, request); /* the server asks it first; any answer will do */
  ProtobufCMessage *response = NULL;
  ttd_status_t status = m->unary(call, request, &response);
  if (!status) fuzz_check_response(m, response);
  fuzz_check_status(m->path, status);
  return status ? NULL : response;
}

static void run_download(fuzz_call *fc, const ProtobufCMessage *request) {
  ttd_call *call = &fc->call;
  const ttd_method *m = call->method;
  ttd_status_t status = m->stream_begin(call, request);
  bool last = false;
  for (int i = 0; !status && !last && i < MAX_DOWNLOAD_MESSAGES; i++) {
    grpc_byte_buffer *message = NULL;
    status = m->stream_next(call, &message, &last);
    if (message) grpc_byte_buffer_destroy(message);
  }
  m->stream_done(call);
  fuzz_check_status(m->path, status);
}

static void run_upload(fuzz_call *fc, const uint8_t *body, size_t len) {
  ttd_call *call = &fc->call;
  const ttd_method *m = call->method;
  grpc_byte_buffer *message = fuzz_byte_buffer(body, len, 0);
  ttd_status_t status = m->stream_message(call, message);
  grpc_byte_buffer_destroy(message);
  if (status) {
    m->stream_abort(call);
  } else {
    ProtobufCMessage *response = NULL;
    status = m->stream_end(call, &response);
    if (!status) fuzz_check_response(m, response);
  }
  fuzz_check_status(m->path, status);
}

/* Runs one call; returns the session an OpenSession opened, else 0. */
static uint64_t run_call(ttd_core *core, const ttd_method *m, uint64_t session_id, fuzz_session_md md,
                         const uint8_t *body, size_t len) {
  fuzz_call fc;
  fuzz_call_begin(&fc, core, m, session_id, md);
  if (m->kind != TTD_METHOD_CLIENT_STREAM) fc.call.received = fuzz_byte_buffer(body, len, 0);
  ProtobufCMessage *request = NULL;
  ttd_status_t status = ttd_dispatch_prepare(&fc.call, &request);
  uint64_t opened = 0;
  if (status) {
    fuzz_check_status(m->path, status);
  } else if (m->kind == TTD_METHOD_CLIENT_STREAM) {
    run_upload(&fc, body, len);
  } else if (m->kind == TTD_METHOD_SERVER_STREAM) {
    run_download(&fc, request);
  } else {
    const ProtobufCMessage *response = run_unary(&fc, request);
    if (response && m->unary == ttd_method_open_session) { /* for selector 4 */
      opened = ((const Ttd__V1__OpenSessionResponse *)response)->session_id;
    }
  }
  fuzz_call_end(&fc);
  return opened;
}

/* The method a call record selects (its tag: see the top of this file). */
static const ttd_method *method_of(const fuzz_record *r) {
  return &ttd_methods[(size_t)(r->tag & 31) % ttd_method_count];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const fuzz_session_md mds[8] = {FUZZ_MD_SESSION, FUZZ_MD_SESSION, FUZZ_MD_SESSION, FUZZ_MD_SESSION,
                                         FUZZ_MD_SESSION, FUZZ_MD_NONE,    FUZZ_MD_BAD_ID,  FUZZ_MD_OTHER_INSTANCE};
  ttd_core *core = fuzz_core_begin_input();
  uint64_t session = fuzz_core_open_session(core, 0), latest = session;
  fuzz_input in = {data, size};
  fuzz_record r;
  for (int i = 0; i < MAX_CALLS && fuzz_next_record(&in, data, &r); i++) {
    int variant = r.tag >> 5;
    uint64_t opened = run_call(core, method_of(&r), variant == 4 ? latest : session, mds[variant], data + r.at, r.len);
    if (opened) latest = opened;
  }
  fuzz_core_end_input(core);
  return 0;
}

static const ProtobufCMessageDescriptor *request_of(uint8_t tag) {
  return method_of(&(fuzz_record){.tag = tag})->request;
}

/* libFuzzer's mutations, and one time in three a field of one call's request set to an edge
 * value or a name (fuzz_proto_mutate.h). */
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed);
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed) {
  static const char *const words[] = {"tt:0", "tt:1", "tt:2", "", "tt:", "tt:-1", "tt:1x", "tt:99999999999999999999",
                                      "x", "y", "w", "b", "t", "a", "loss", "relu", "matmul", "linear", "reshape",
                                      "conv2d", "max_pool2d", "cross_entropy", "embedding", "shape", "axes", NULL};
  return fuzz_proto_mutate_records(data, size, max_size, seed, 0, MAX_CALLS, request_of, words);
}
