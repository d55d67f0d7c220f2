/* Bad-input rows of the tensor RPCs: Allocate, Upload, Download, Move and Free; and the
 * Upload messages too large to write as literals, built at run time. */
#include <stdint.h>
#include <stdlib.h>

#include "bad_inputs.h"

static size_t make_upload_4m_past_end(unsigned char **out);
static size_t make_upload_9m(unsigned char **out);

const bad_row bad_inputs_tensor_rows[] = {
    /* Allocate (e2e_errors has the missing spec, dtype 0 and 17, -3, 9 dims, INT64_MAX x 2 x 3, 2^62 floats,
     * tt:2, gpu:0 and location 9) */
    ROW(WRONG_TYPE, "Allocate", AS_ALICE, "a FreeRequest: its packed handles read as a TensorSpec", INVALID_ARGUMENT,
        "not a valid ttd.v1.AllocateRequest", .msg = {FREE(0x0102030405060708ull)}),
    ROW(DIMS, "Allocate", AS_ALICE, "dims 2^16 x 2^16 x 2^16 x 2^16: the product passes 2^63 at the last", INVALID_ARGUMENT,
        "more than 2^63 elements (overflow at dim 3)", .msg = {ALLOCATE(.dtype = F32, SHAPE(65536, 65536, 65536, 65536))}),
    ROW(DIMS, "Allocate", AS_ALICE, "dims 2^32 x 2^31: exactly 2^63 elements", INVALID_ARGUMENT,
        "more than 2^63 elements (overflow at dim 1)", .msg = {ALLOCATE(.dtype = I32, SHAPE(1ll << 32, 1ll << 31))}),
    ROW(DIMS, "Allocate", AS_ALICE, "2^61 int32: exactly 2^63 bytes", INVALID_ARGUMENT, "exceeds 2^63 bytes",
        .msg = {ALLOCATE(.dtype = I32, SHAPE(1ll << 61))}),
    ROW(DIMS, "Allocate", AS_ALICE, "dims 0 x INT64_MAX x -1: a negative dim after a zero", INVALID_ARGUMENT,
        "dim 2 of the shape is -1", .msg = {ALLOCATE(.dtype = F32, SHAPE(0, INT64_MAX, -1))}),
    ROW(DIMS, "Allocate", AS_ALICE, "2^60 float32 (4 EiB): past the device's 64 MiB", RESOURCE_EXHAUSTED,
        "tt:0 dram is full: requested 4611686018427387904 bytes", .msg = {ALLOCATE(.dtype = F32, SHAPE(1ll << 30, 1ll << 30))}),
    ROW(DIMS, "Allocate", AS_ALICE, "16M + 1 floats: one element past the device's 64 MiB", RESOURCE_EXHAUSTED,
        "requested 67108868 bytes", .msg = {ALLOCATE(.dtype = F32, SHAPE((16 << 20) + 1))}),
    ROW(DIMS, "Allocate", AS_ALICE, "2 MiB in L1, past its 1 MiB", RESOURCE_EXHAUSTED, "tt:1 l1 is full",
        .msg = {ALLOCATE(.dtype = F32, SHAPE(512, 1024), .device = "tt:1",
                         .location = TTD__V1__MEMORY_LOCATION__MEMORY_LOCATION_L1)}),
    ROW(DIMS, "Allocate", AS_ALICE, "zero dims [3, 0]: a legal empty tensor, no bytes", OK, NULL,
        .msg = {ALLOCATE(.dtype = F32, SHAPE(3, 0))}),
    ROW(OPTIONS, "Allocate", AS_ALICE, "device 'tt:-1'", INVALID_ARGUMENT, "device 'tt:-1' does not exist",
        .msg = {ALLOCATE(.dtype = F32, SHAPE(4), .device = "tt:-1")}),
    ROW(OPTIONS, "Allocate", AS_ALICE, "device 'tt:0 ' with a trailing space", INVALID_ARGUMENT,
        "device 'tt:0 ' does not exist", .msg = {ALLOCATE(.dtype = F32, SHAPE(4), .device = "tt:0 ")}),
    ROW(OPTIONS, "Allocate", AS_ALICE, "device 'tt:99999999999999999999' (overflows a long)", INVALID_ARGUMENT,
        "does not exist; this daemon has tt:0 .. tt:1", .msg = {ALLOCATE(.dtype = F32, SHAPE(4), .device = "tt:99999999999999999999")}),
    ROW(DTYPES, "Allocate", AS_ALICE, "dtype -1", INVALID_ARGUMENT, "dtype -1 is not supported",
        .msg = {ALLOCATE(.dtype = -1, SHAPE(4))}),

    /* Upload (e2e_errors has: no header, two headers, 16+4 into 16, 12 of 16, int32 into float32, nothing,
     * garbage, a 2^63-byte header length and an aliased field number) */
    ROW(WRONG_TYPE, "Upload", AS_ALICE, "a DownloadRequest as the first message: no header", INVALID_ARGUMENT,
        "must carry a header naming the target tensor", .msg = {DOWNLOAD(.handle = H(T_F32))}),
    ROW(WRONG_TYPE, "Upload", AS_ALICE, "a header naming no target", INVALID_ARGUMENT, "names no target",
        .msg = {REQ(Ttd__V1__UploadRequest, ttd__v1__upload_request__descriptor,
                    .header = NEW(Ttd__V1__UploadHeader, ttd__v1__upload_header__descriptor, .source_dtype = F32))}),
    ROW(DIMS, "Upload", AS_ALICE, "a new tensor with dim -1", INVALID_ARGUMENT, "dim 1 of the shape is -1",
        .msg = {UP_SPEC(16, 0, .dtype = F32, SHAPE(4, -1))}),
    ROW(DIMS, "Upload", AS_ALICE, "a new tensor of 2^40 x 2^40 elements", INVALID_ARGUMENT, "more than 2^63 elements",
        .msg = {UP_SPEC(16, 0, .dtype = F32, SHAPE(1ll << 40, 1ll << 40))}),
    ROW(DIMS, "Upload", AS_ALICE, "a new tensor of 2^40 floats, past the device", RESOURCE_EXHAUSTED, "dram is full",
        .msg = {UP_SPEC(16, 0, .dtype = F32, SHAPE(1ll << 40))}),
    ROW(DIMS, "Upload", AS_ALICE, "4 bytes into a [2, 0] tensor, which holds none", INVALID_ARGUMENT,
        "past the tensor's end: it holds 0 float32 bytes, the stream sent 4", .msg = {UP_SPEC(4, 0, .dtype = F32, SHAPE(2, 0))}),
    ROW(DIMS, "Upload", AS_ALICE, "an empty tensor [0] and no data: legal", OK, NULL,
        .msg = {UP_INTO(H(T_EMPTY), 0, 0)}),
    ROW(DTYPES, "Upload", AS_ALICE, "int32 bytes into a bfloat16 tensor", INVALID_ARGUMENT,
        "cannot upload int32 bytes into a bfloat16 tensor", .msg = {UP_INTO(H(T_BF16), 16, I32)}),
    ROW(DTYPES, "Upload", AS_ALICE, "float32 bytes into an int32 tensor", INVALID_ARGUMENT,
        "cannot upload float32 bytes into a int32 tensor", .msg = {UP_INTO(H(T_I32), 16, F32)}),
    ROW(DTYPES, "Upload", AS_ALICE, "source_dtype 42", INVALID_ARGUMENT, "source_dtype 42",
        .msg = {UP_SPEC(16, 42, .dtype = F32, SHAPE(4))}),
    ROW(STREAMS, "Upload", AS_ALICE, "20 bytes in the header's message for a 16-byte tensor", INVALID_ARGUMENT,
        "past the tensor's end: it holds 16 float32 bytes, the stream sent 20", .msg = {UP_SPEC(20, 0, .dtype = F32, SHAPE(4))}),
    ROW(STREAMS, "Upload", AS_ALICE, "8 + 8 + 4 bytes into an allocated 16-byte tensor (it keeps its handle)",
        INVALID_ARGUMENT, "the stream sent 20", .msg = {UP_INTO(H(T_F32), 8, 0), UP_DATA(8), UP_DATA(4)}),
    ROW(STREAMS, "Upload", AS_ALICE, "float32 into bfloat16 [4]: 12 + 8 source bytes for 16", INVALID_ARGUMENT,
        "it holds 16 float32 bytes, the stream sent 20", .msg = {UP_SPEC(12, F32, .dtype = BF16, SHAPE(4)), UP_DATA(8)}),
    ROW(STREAMS, "Upload", AS_ALICE, "a 4 MiB chunk into a 16-byte tensor", INVALID_ARGUMENT,
        "it holds 16 float32 bytes, the stream sent 4194320", .msg = {UP_INTO(H(T_F32), 16, 0)},
        .make = make_upload_4m_past_end),
    ROW(STREAMS, "Upload", AS_ALICE, "one 9 MiB message, past the 8 MiB a message may hold", RESOURCE_EXHAUSTED,
        "larger than max", .make = make_upload_9m),

    /* Download (e2e_errors has chunk_bytes 64 MiB and float32 as int32) */
    ROW(WRONG_TYPE, "Download", AS_ALICE, "an AllocateRequest: field 1 a message, not a fixed64", INVALID_ARGUMENT,
        "not a valid ttd.v1.DownloadRequest", .msg = {ALLOCATE(.dtype = F32, SHAPE(4))}),
    ROW(DTYPES, "Download", AS_ALICE, "an int32 tensor as float32", INVALID_ARGUMENT,
        "cannot download a int32 tensor as float32; ask for int32",
        .msg = {DOWNLOAD(.handle = H(T_I32), .target_dtype = F32)}),
    ROW(DTYPES, "Download", AS_ALICE, "target_dtype 42", INVALID_ARGUMENT, "target_dtype 42",
        .msg = {DOWNLOAD(.handle = H(T_F32), .target_dtype = 42)}),
    ROW(DIMS, "Download", AS_ALICE, "an empty tensor [0]: legal, no bytes", OK, NULL,
        .msg = {DOWNLOAD(.handle = H(T_EMPTY))}),
    ROW(OPTIONS, "Download", AS_ALICE, "chunk_bytes 2^32-1", INVALID_ARGUMENT, "chunk_bytes 4294967295 is above the limit",
        .msg = {DOWNLOAD(.handle = H(T_F32), .chunk_bytes = UINT32_MAX)}),
    ROW(HANDLE_LISTS, "Download", AS_ALICE, "handle 0", NOT_FOUND, "tensor 0x0000000000000000 not found in this session",
        .msg = {DOWNLOAD(.handle = 0)}),
    ROW(FOREIGN, "Download", AS_ALICE, "a program handle as a tensor", NOT_FOUND, "not found in this session",
        .msg = {DOWNLOAD(.handle = H(P_RELU))}),

    /* Move */
    ROW(OPTIONS, "Move", AS_ALICE, "to device 'tt:2' of a 2-device daemon", INVALID_ARGUMENT,
        "device 'tt:2' does not exist; this daemon has tt:0 .. tt:1", .msg = {MOVE(.handle = H(T_F32), .device = "tt:2")}),
    ROW(OPTIONS, "Move", AS_ALICE, "to device 'TT:1' (case)", INVALID_ARGUMENT, "device 'TT:1' does not exist",
        .msg = {MOVE(.handle = H(T_F32), .device = "TT:1")}),
    ROW(OPTIONS, "Move", AS_ALICE, "to memory location 7", INVALID_ARGUMENT, "memory location 7 is unknown",
        .msg = {MOVE(.handle = H(T_F32), .location = 7)}),
    ROW(HANDLE_LISTS, "Move", AS_ALICE, "a freed handle with free_source", NOT_FOUND, "not found in this session",
        .msg = {MOVE(.handle = H(T_FREED), .device = "tt:1", .free_source = 1)}),

    /* Free (e2e_errors has the empty list, a duplicate pair and one unknown among good ones) */
    ROW(HANDLE_LISTS, "Free", AS_ALICE, "a handle listed twice, apart: [a, b, a]", INVALID_ARGUMENT,
        "is listed twice (at 2); list each once", .msg = {FREE(H(T_F32), H(T_I32), H(T_F32))}),
    ROW(HANDLE_LISTS, "Free", AS_ALICE, "[0]", NOT_FOUND, "tensor 0x0000000000000000 not found", .msg = {FREE(0)}),
    ROW(HANDLE_LISTS, "Free", AS_ALICE, "a run handle and a program handle as tensors", NOT_FOUND,
        "not found in this session", .msg = {FREE(H(P_LIN), H(RUN))}),
};
const size_t bad_inputs_tensor_rows_count = sizeof(bad_inputs_tensor_rows) / sizeof(bad_inputs_tensor_rows[0]);

/* ---- requests built at run time ---- */

/* An UploadRequest carrying len bytes of data and no header. */
static size_t make_data_message(unsigned char **out, size_t len) {
  Ttd__V1__UploadRequest req = TTD__V1__UPLOAD_REQUEST__INIT;
  req.data.len = len;
  req.data.data = calloc(len, 1);
  size_t packed = ttd__v1__upload_request__get_packed_size(&req);
  *out = malloc(packed);
  ttd__v1__upload_request__pack(&req, *out);
  free(req.data.data);
  return packed;
}

static size_t make_upload_4m_past_end(unsigned char **out) { return make_data_message(out, 4 << 20); }
static size_t make_upload_9m(unsigned char **out) { return make_data_message(out, 9 << 20); }
