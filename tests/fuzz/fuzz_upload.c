/* Fuzz harness: the chunked assembly of an Upload stream (daemon/methods/upload.c), message
 * by message, each message cut into slices as gRPC may deliver it, against the in-process
 * daemon core (fuzz_core.h).
 *
 * Input:
 *   u8  flags: bit 0 ends the stream (else the client breaks it off: abort); bit 1 gives
 *       the session a quota of 4 KiB
 *   then up to 32 messages, each: u8 slice size (0: one slice), u16 length
 *       (little-endian) and that many bytes of UploadRequest.
 * The session (0x13) holds a shared-memory segment (0x14, 64 KiB) and two tensors an
 * upload may target by handle: 0x15, float32 [4, 5] in tt:0 DRAM, and 0x16, bfloat16
 * [3, 3] in tt:1 L1. */
#include <stdio.h>
#include <stdlib.h>

#include "rpc/dispatch.h"
#include "rpc/method.h"
#include "fuzz_core.h"
#include "fuzz_input.h"
#include "fuzz_proto_mutate.h"
#include "ttd/v1/ttd.pb-c.h"

#define MAX_MESSAGES 32

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void allocate(ttd_core *core, uint64_t session_id, ttd_dtype dtype, int64_t d0, int64_t d1, int device,
                     ttd_memloc location) {
  ttd_session *session = NULL;
  ttd_tensor *tensor = NULL;
  uint64_t handle = 0;
  ttd_tensor_spec spec = {.dtype = dtype, .ndim = 2, .shape = {d0, d1}, .device = device, .location = location};
  ttd_status_t status = ttd_session_table_lookup(&core->sessions, session_id, NULL, ttd_now_ms(), &session);
  if (!status) status = ttd_tensor_spec_finish(&spec);
  if (!status) status = ttd_tensor_create_zeroed(core->backend, session->quota, &spec, &tensor);
  if (!status) status = ttd_session_tensor_add(session, tensor, &handle);
  if (status) {
    fprintf(stderr, "fuzz: cannot allocate an upload target: %s\n", ttd_status_message(status));
    abort();
  }
  ttd_tensor_release(tensor);
  ttd_session_release(session);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ttd_core *core = fuzz_core_begin_input();
  fuzz_input in = {data, size};
  uint8_t flags = fuzz_u8(&in);
  uint64_t session = fuzz_core_open_session(core, flags & 2 ? 4096 : 0);
  allocate(core, session, TTD_DTYPE_FLOAT32, 4, 5, 0, TTD_MEM_DRAM);
  allocate(core, session, TTD_DTYPE_BFLOAT16, 3, 3, 1, TTD_MEM_L1);

  const ttd_method *m = fuzz_method("/ttd.v1.Device/Upload");
  fuzz_call fc;
  fuzz_call_begin(&fc, core, m, session, FUZZ_MD_SESSION);
  ProtobufCMessage *request = NULL;
  ttd_status_t status = ttd_dispatch_prepare(&fc.call, &request);
  if (status) {
    fprintf(stderr, "fuzz: Upload refused its session: %s\n", ttd_status_message(status));
    abort();
  }
  fuzz_record r; /* its tag is the slice size */
  for (int i = 0; i < MAX_MESSAGES && !status && fuzz_next_record(&in, data, &r); i++) {
    grpc_byte_buffer *message = fuzz_byte_buffer(data + r.at, r.len, r.tag);
    status = m->stream_message(&fc.call, message);
    grpc_byte_buffer_destroy(message);
  }
  if (status || !(flags & 1)) {
    m->stream_abort(&fc.call);
  } else {
    ProtobufCMessage *response = NULL;
    status = m->stream_end(&fc.call, &response);
    if (!status) fuzz_check_response(m, response);
  }
  fuzz_check_status(m->path, status);
  fuzz_call_end(&fc);
  fuzz_core_end_input(core);
  return 0;
}

static const ProtobufCMessageDescriptor *upload_request(uint8_t tag) {
  (void)tag;
  return &ttd__v1__upload_request__descriptor;
}

/* libFuzzer's mutations, and one time in three a field of one message set to an edge value
 * (fuzz_proto_mutate.h): a dim, a handle, a dtype, a device, a shared-memory range. */
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed);
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed) {
  static const char *const words[] = {"tt:0", "tt:1", "tt:2", "", "tt:-1", NULL};
  return fuzz_proto_mutate_records(data, size, max_size, seed, 1, MAX_MESSAGES, upload_request, words);
}
