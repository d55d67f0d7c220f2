/* Raw gRPC calls for end-to-end tests: arbitrary request bytes and metadata to any
 * method, to check what the daemon answers to malformed input, foreign handles and broken
 * streams, with no help from libttclient. */
#ifndef TTD_TESTS_RAW_RPC_H
#define TTD_TESTS_RAW_RPC_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

typedef struct raw_result {
  int code;             /* gRPC status */
  char details[1024];
  unsigned char *body;  /* the (last) response message, malloc'd; NULL if none */
  size_t body_len;
  char request_id[24];  /* the daemon's ttd-request-id metadata, "" if none */
} raw_result;

typedef struct raw_md {
  const char *session;  /* "ttd-session" value, or NULL */
  const char *instance; /* "ttd-instance" value, or NULL */
  const char *authorization; /* "authorization" value ("Bearer ..."), or NULL */
  int timeout_ms;       /* the call's deadline from its start; 0: 30 s */
} raw_md;

/* A unary call (also used for Download: every response is read, the last kept). */
void raw_call(const char *target, const char *method, raw_md md, const void *request, size_t len, raw_result *out);

/* A client stream of n messages. With die_after_sending, the process SIGKILLs itself
 * after the messages went out, before closing the stream. */
void raw_stream(const char *target, const char *method, raw_md md, const void *const *messages, const size_t *lens,
                int n, int die_after_sending, raw_result *out);

void raw_result_free(raw_result *result);

/* Opens a session with raw calls; fills the 16-hex-digit id and the instance id. */
void raw_open_session(const char *target, char session_hex[17], char instance[40]);

/* The same with "authorization" metadata (a daemon with --tokens), or NULL for none. */
void raw_open_session_as(const char *target, const char *authorization, char session_hex[17], char instance[40]);

/* Packs msg, calls method and asserts the status code and (if needle) a part of the message. */
void raw_expect(const char *target, const char *method, const ProtobufCMessage *msg, raw_md md, int code,
                const char *needle);

/* The same, and returns the response unpacked as resp_type when the code is OK (free it with
 * protobuf_c_message_free_unpacked), else NULL; resp_type NULL: never unpacked. */
ProtobufCMessage *raw_unary(const char *target, const char *method, const ProtobufCMessage *msg, raw_md md,
                            const ProtobufCMessageDescriptor *resp_type, int code, const char *needle);

/* HTTP/2 spoken by hand on a "unix:" target, below gRPC: the client preface, SETTINGS, a
 * HEADERS frame opening a call of method with md, then DATA frames holding n messages, gRPC
 * framed, of which the last is cut after keep bytes (0: sent whole); then the connection
 * closes: a call cut in the middle of a message, or a client that hangs up. At most 64 KiB
 * in all (HTTP/2's first window). Returns once the daemon closed its side or 2 s passed. */
void raw_h2_cut(const char *target, const char *method, raw_md md, const void *const *messages, const size_t *lens,
                int n, size_t keep);

/* Allocates n float32 elements on tt:0 DRAM in the session; returns the handle. */
uint64_t raw_allocate(const char *target, const char *session_hex, int64_t n);

/* The same with any shape (float32, tt:0 DRAM). */
uint64_t raw_allocate_shape(const char *target, const char *session_hex, const int64_t *shape, int ndim);

/* Uploads a float32 or int32 tensor (dtype, a Ttd__V1__DType) of ndim 0, 1 or 2 dims
 * (d0 x d1; a scalar has d0 = 1) from data onto device ("tt:N", or NULL for the default),
 * in the session md names; asserts OK and returns the handle. */
uint64_t raw_upload(const char *target, raw_md md, const void *data, int dtype, int ndim, int64_t d0, int64_t d1,
                    const char *device);

/* Downloads a tensor of n 4-byte elements into out; asserts OK and the size. */
void raw_download(const char *target, raw_md md, uint64_t handle, void *out, size_t n);

#endif
