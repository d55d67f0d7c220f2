/* Bad-input rows below the RPCs: streams cut short (the client killed, or the connection
 * closed inside a message) and bytes that are not gRPC on the daemon's sockets. */
#include <stddef.h>

#include "bad_inputs.h"

const cut_row bad_inputs_cut_rows[] = {
    {"an Upload into alice's tensor: 8 of 16 bytes, then the client is killed (the tensor stays)", "Upload", CUT_KILL,
     {UP_INTO(H(T_F32), 8, 0)}, 0, 1},
    {"an Upload of float32 into a new bfloat16 [4]: 6 bytes (half an element carried), then killed", "Upload", CUT_KILL,
     {UP_SPEC(6, F32, .dtype = BF16, SHAPE(4))}, 0, 1},
    {"an Upload of a new 16 MiB tensor: the header, then killed", "Upload", CUT_KILL,
     {UP_SPEC(0, 0, .dtype = F32, SHAPE(4 << 20))}, 0, 1},
    {"an Upload whose header message is cut after 10 bytes", "Upload", CUT_H2, {UP_SPEC(64, 0, .dtype = F32, SHAPE(16))}, 10, 1},
    {"an Upload of a new [8192] tensor: a 16 KiB message, then one cut at 8 of its 16 KiB", "Upload", CUT_H2,
     {UP_SPEC(16384, 0, .dtype = F32, SHAPE(8192)), UP_DATA(16384)}, 8192, 1},
    {"an Upload into alice's tensor cut inside its data", "Upload", CUT_H2, {UP_INTO(H(T_F32), 16, 0)}, 14, 1},
    {"an Execute request cut mid-message (gRPC drops it unseen)", "Execute", CUT_H2,
     {EXECUTE(.program = H(P_RELU), HANDLES(inputs, H(T_F32)), .keep_for_backward = 1)}, 6, 0},
    {"a Compile request cut mid-message (gRPC drops it unseen)", "Compile", CUT_H2,
     {COMPILE(INPUTS(VALUE("x", F32, SHAPE(4))), OUTPUTS("y"), NODES(NODE("y", "relu", INS("x"))))}, 12, 0},
    {"a Download of a 4 MiB tensor whose client hangs up after asking", "Download", CUT_H2,
     {DOWNLOAD(.handle = H(T_BIG))}, 0, 1},
};
const size_t bad_inputs_cut_rows_count = sizeof(bad_inputs_cut_rows) / sizeof(bad_inputs_cut_rows[0]);

#define PREFACE "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
const socket_row bad_inputs_socket_rows[] = {
    {"an HTTP/1.1 GET", RAW("GET /ttd.v1.Device/ListDevices HTTP/1.1\r\nHost: ttd\r\n\r\n")},
    {"the HTTP/2 preface, then 4 KiB of random bytes", RAW(PREFACE), .random = 4096},
    {"the preface, then a DATA frame on a stream never opened, claiming 16 MiB",
     RAW(PREFACE "\xff\xff\xff\x00\x00\x00\x00\x00\x01"), .random = 1000},
    {"the preface, then HEADERS whose HPACK block is garbage",
     RAW(PREFACE "\x00\x00\x00\x04\x00\x00\x00\x00\x00"
                 "\x00\x00\x06\x01\x04\x00\x00\x00\x01\xff\xff\xff\xff\xff\xff")},
    {"the preface, then a SETTINGS frame 7 bytes long", RAW(PREFACE "\x00\x00\x07\x04\x00\x00\x00\x00\x00" "1234567")},
    {"the preface, then WINDOW_UPDATEs of 2^31-1 on stream 0 twice (a window overflow)",
     RAW(PREFACE "\x00\x00\x04\x08\x00\x00\x00\x00\x00\x7f\xff\xff\xff"
                 "\x00\x00\x04\x08\x00\x00\x00\x00\x00\x7f\xff\xff\xff")},
    {"half the preface, the connection left open through the rest of the table", RAW("PRI * HTTP/2.0\r\n"),
     .keep_open = 1},
    {"64 KiB of random bytes", NULL, 0, .random = 65536},
    {"7 bytes on the shared-memory side socket", RAW("garbage"), .side = 1},
    {"4 KiB of random bytes on the shared-memory side socket", NULL, 0, .random = 4096, .side = 1},
};
const size_t bad_inputs_socket_rows_count = sizeof(bad_inputs_socket_rows) / sizeof(bad_inputs_socket_rows[0]);
