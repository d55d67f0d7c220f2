#include "raw_rpc.h"

#include <check.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "ttd/v1/ttd.pb-c.h"
#include "ttd_harness.h"

typedef struct raw_call_ctx {
  grpc_channel *channel;
  grpc_completion_queue *cq;
  grpc_call *call;
  grpc_metadata md[3];
  size_t md_count;
  grpc_metadata_array initial, trailing;
  grpc_status_code status;
  grpc_slice details;
} raw_call_ctx;

static void op(grpc_op *o, grpc_op_type t) {
  memset(o, 0, sizeof(*o));
  o->op = t;
}

static int batch(raw_call_ctx *c, grpc_op *ops, size_t n) {
  static int tag;
  if (grpc_call_start_batch(c->call, ops, n, &tag, NULL) != GRPC_CALL_OK) return 0;
  grpc_event ev = grpc_completion_queue_pluck(c->cq, &tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
  return ev.type == GRPC_OP_COMPLETE && ev.success;
}

static void begin(raw_call_ctx *c, const char *target, const char *method, raw_md md) {
  memset(c, 0, sizeof(*c));
  grpc_init();
  grpc_channel_credentials *creds = grpc_insecure_credentials_create();
  c->channel = grpc_channel_create(target, creds, NULL);
  grpc_channel_credentials_release(creds);
  c->cq = grpc_completion_queue_create_for_pluck(NULL);
  grpc_slice m = grpc_slice_from_copied_string(method);
  c->call = grpc_channel_create_call(c->channel, NULL, GRPC_PROPAGATE_DEFAULTS, c->cq, m, NULL,
                                     gpr_time_add(gpr_now(GPR_CLOCK_REALTIME),
                                                  gpr_time_from_millis(md.timeout_ms ? md.timeout_ms : 30000, GPR_TIMESPAN)),
                                     NULL);
  grpc_slice_unref(m);
  if (md.session) {
    c->md[c->md_count].key = grpc_slice_from_static_string("ttd-session");
    c->md[c->md_count++].value = grpc_slice_from_copied_string(md.session);
  }
  if (md.instance) {
    c->md[c->md_count].key = grpc_slice_from_static_string("ttd-instance");
    c->md[c->md_count++].value = grpc_slice_from_copied_string(md.instance);
  }
  if (md.authorization) {
    c->md[c->md_count].key = grpc_slice_from_static_string("authorization");
    c->md[c->md_count++].value = grpc_slice_from_copied_string(md.authorization);
  }
  grpc_metadata_array_init(&c->initial);
  grpc_metadata_array_init(&c->trailing);
  c->details = grpc_empty_slice();
  grpc_op o;
  op(&o, GRPC_OP_SEND_INITIAL_METADATA);
  o.data.send_initial_metadata.count = c->md_count;
  o.data.send_initial_metadata.metadata = c->md;
  ck_assert(batch(c, &o, 1));
}

static void keep_body(grpc_byte_buffer *bb, raw_result *out) {
  grpc_byte_buffer_reader r;
  ck_assert(grpc_byte_buffer_reader_init(&r, bb));
  grpc_slice s = grpc_byte_buffer_reader_readall(&r);
  grpc_byte_buffer_reader_destroy(&r);
  free(out->body);
  out->body_len = GRPC_SLICE_LENGTH(s);
  out->body = malloc(out->body_len + 1);
  memcpy(out->body, GRPC_SLICE_START_PTR(s), out->body_len);
  grpc_slice_unref(s);
  grpc_byte_buffer_destroy(bb);
}

static int send_bytes(raw_call_ctx *c, const void *data, size_t len) {
  grpc_slice s = grpc_slice_from_copied_buffer(data, len);
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  grpc_op o;
  op(&o, GRPC_OP_SEND_MESSAGE);
  o.data.send_message.send_message = bb;
  int ok = batch(c, &o, 1);
  grpc_byte_buffer_destroy(bb);
  return ok;
}

static void finish(raw_call_ctx *c, int close_first, raw_result *out) {
  grpc_op ops[2];
  size_t n = 0;
  if (close_first) op(&ops[n++], GRPC_OP_SEND_CLOSE_FROM_CLIENT);
  op(&ops[n], GRPC_OP_RECV_INITIAL_METADATA);
  ops[n++].data.recv_initial_metadata.recv_initial_metadata = &c->initial;
  batch(c, ops, n);
  for (;;) {
    grpc_byte_buffer *bb = NULL;
    op(&ops[0], GRPC_OP_RECV_MESSAGE);
    ops[0].data.recv_message.recv_message = &bb;
    if (!batch(c, ops, 1) || !bb) break;
    keep_body(bb, out);
  }
  op(&ops[0], GRPC_OP_RECV_STATUS_ON_CLIENT);
  ops[0].data.recv_status_on_client.trailing_metadata = &c->trailing;
  ops[0].data.recv_status_on_client.status = &c->status;
  ops[0].data.recv_status_on_client.status_details = &c->details;
  ck_assert(batch(c, ops, 1));
  out->code = c->status;
  snprintf(out->details, sizeof(out->details), "%.*s", (int)GRPC_SLICE_LENGTH(c->details),
           (const char *)GRPC_SLICE_START_PTR(c->details));
  out->request_id[0] = '\0';
  for (size_t i = 0; i < c->initial.count; i++) {
    if (grpc_slice_str_cmp(c->initial.metadata[i].key, "ttd-request-id") == 0) {
      snprintf(out->request_id, sizeof(out->request_id), "%.*s", (int)GRPC_SLICE_LENGTH(c->initial.metadata[i].value),
               (const char *)GRPC_SLICE_START_PTR(c->initial.metadata[i].value));
    }
  }
  grpc_call_unref(c->call);
  grpc_metadata_array_destroy(&c->initial);
  grpc_metadata_array_destroy(&c->trailing);
  grpc_slice_unref(c->details);
  for (size_t i = 0; i < c->md_count; i++) grpc_slice_unref(c->md[i].value);
  grpc_completion_queue_shutdown(c->cq);
  while (grpc_completion_queue_pluck(c->cq, NULL, gpr_inf_past(GPR_CLOCK_REALTIME), NULL).type != GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(c->cq);
  grpc_channel_destroy(c->channel);
  grpc_shutdown();
}

void raw_call(const char *target, const char *method, raw_md md, const void *request, size_t len, raw_result *out) {
  memset(out, 0, sizeof(*out));
  raw_call_ctx c;
  begin(&c, target, method, md);
  send_bytes(&c, request, len);
  finish(&c, 1, out);
}

void raw_stream(const char *target, const char *method, raw_md md, const void *const *messages, const size_t *lens,
                int n, int die_after_sending, raw_result *out) {
  memset(out, 0, sizeof(*out));
  raw_call_ctx c;
  begin(&c, target, method, md);
  for (int i = 0; i < n; i++) {
    if (!send_bytes(&c, messages[i], lens[i])) break;
  }
  if (die_after_sending) raise(SIGKILL);
  finish(&c, 1, out);
}

void raw_result_free(raw_result *result) {
  free(result->body);
  result->body = NULL;
}

void raw_open_session(const char *target, char session_hex[17], char instance[40]) {
  raw_open_session_as(target, NULL, session_hex, instance);
}

void raw_open_session_as(const char *target, const char *authorization, char session_hex[17], char instance[40]) {
  Ttd__V1__OpenSessionRequest req = TTD__V1__OPEN_SESSION_REQUEST__INIT;
  req.client_name = "raw";
  req.protocol_version = 1;
  raw_md md = {.authorization = authorization};
  Ttd__V1__OpenSessionResponse *resp = (Ttd__V1__OpenSessionResponse *)raw_unary(
      target, "/ttd.v1.Device/OpenSession", &req.base, md, &ttd__v1__open_session_response__descriptor, 0, NULL);
  snprintf(session_hex, 17, "%016llx", (unsigned long long)resp->session_id);
  snprintf(instance, 40, "%s", resp->instance_id);
  ttd__v1__open_session_response__free_unpacked(resp, NULL);
}

uint64_t raw_allocate(const char *target, const char *session_hex, int64_t n) {
  return raw_allocate_shape(target, session_hex, &n, 1);
}

uint64_t raw_allocate_shape(const char *target, const char *session_hex, const int64_t *shape, int ndim) {
  Ttd__V1__TensorSpec spec = TTD__V1__TENSOR_SPEC__INIT;
  spec.dtype = TTD__V1__DTYPE__DTYPE_FLOAT32;
  spec.n_shape = (size_t)ndim;
  spec.shape = (int64_t *)shape;
  Ttd__V1__AllocateRequest req = TTD__V1__ALLOCATE_REQUEST__INIT;
  req.spec = &spec;
  unsigned char buf[128];
  size_t len = ttd__v1__allocate_request__pack(&req, buf);
  raw_result r;
  raw_call(target, "/ttd.v1.Device/Allocate", (raw_md){.session = session_hex, .instance = NULL}, buf, len, &r);
  ck_assert_msg(r.code == 0, "Allocate: %s", r.details);
  Ttd__V1__AllocateResponse *resp = ttd__v1__allocate_response__unpack(NULL, r.body_len, r.body);
  ck_assert_ptr_nonnull(resp);
  uint64_t h = resp->tensor->handle;
  ttd__v1__allocate_response__free_unpacked(resp, NULL);
  raw_result_free(&r);
  return h;
}

ProtobufCMessage *raw_unary(const char *target, const char *method, const ProtobufCMessage *msg, raw_md md,
                            const ProtobufCMessageDescriptor *resp_type, int code, const char *needle) {
  unsigned char *buf = malloc(protobuf_c_message_get_packed_size(msg) + 1);
  size_t len = protobuf_c_message_pack(msg, buf);
  raw_result r;
  raw_call(target, method, md, buf, len, &r);
  free(buf);
  ck_assert_msg(r.code == code, "%s: expected code %d, got %d (%s)", method, code, r.code, r.details);
  if (needle) ck_assert_msg(strstr(r.details, needle) != NULL, "%s: message '%s' lacks '%s'", method, r.details, needle);
  ProtobufCMessage *resp = NULL;
  if (r.code == 0 && resp_type) {
    resp = protobuf_c_message_unpack(resp_type, NULL, r.body_len, r.body);
    ck_assert_msg(resp != NULL, "%s: the response is not a %s", method, resp_type->name);
  }
  raw_result_free(&r);
  return resp;
}

void raw_expect(const char *target, const char *method, const ProtobufCMessage *msg, raw_md md, int code,
                const char *needle) {
  raw_unary(target, method, msg, md, NULL, code, needle);
}

/* ---- HTTP/2 by hand ---- */

/* A frame header: 24-bit length, type, flags, stream id. */
static size_t h2_frame(unsigned char *out, size_t len, int type, int flags, uint32_t stream) {
  unsigned char h[9] = {(unsigned char)(len >> 16), (unsigned char)(len >> 8), (unsigned char)len, (unsigned char)type,
                        (unsigned char)flags, (unsigned char)(stream >> 24), (unsigned char)(stream >> 16),
                        (unsigned char)(stream >> 8), (unsigned char)stream};
  memcpy(out, h, 9);
  return 9;
}

/* An HPACK literal header field without indexing, new name, no Huffman (RFC 7541 6.2.2);
 * name and value shorter than 127 bytes. */
static size_t hpack_literal(unsigned char *out, const char *name, const char *value) {
  size_t n = strlen(name), v = strlen(value), at = 0;
  ck_assert(n < 127 && v < 127);
  out[at++] = 0x00;
  out[at++] = (unsigned char)n;
  memcpy(out + at, name, n);
  at += n;
  out[at++] = (unsigned char)v;
  memcpy(out + at, value, v);
  return at + v;
}

void raw_h2_cut(const char *target, const char *method, raw_md md, const void *const *messages, const size_t *lens,
                int n, size_t keep) {
  ck_assert(strncmp(target, "unix:", 5) == 0 && n > 0);
  /* The gRPC frames: a 5-byte prefix promising each whole message, then what goes out of it. */
  size_t total = 0;
  for (int i = 0; i < n; i++) total += 5 + lens[i];
  ck_assert_uint_le(total, 65535);
  unsigned char *payload = malloc(total), *buf = malloc(1024 + total + 9 * (total / 16384 + 1));
  size_t plen = 0, at = 0;
  for (int i = 0; i < n; i++) {
    size_t len = lens[i], sent = i == n - 1 && keep ? keep : len;
    unsigned char prefix[5] = {0, (unsigned char)(len >> 24), (unsigned char)(len >> 16), (unsigned char)(len >> 8),
                               (unsigned char)len};
    memcpy(payload + plen, prefix, 5);
    memcpy(payload + plen + 5, messages[i], sent);
    plen += 5 + sent;
  }
  static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  memcpy(buf, preface, sizeof(preface) - 1);
  at += sizeof(preface) - 1;
  at += h2_frame(buf + at, 0, 0x4 /* SETTINGS */, 0, 0);
  unsigned char block[768];
  size_t b = 0;
  const char *fields[][2] = {{":method", "POST"},        {":scheme", "http"}, {":path", method},
                             {":authority", "localhost"}, {"content-type", "application/grpc"}, {"te", "trailers"},
                             {"ttd-session", md.session}, {"ttd-instance", md.instance},
                             {"authorization", md.authorization}};
  for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
    if (fields[i][1]) b += hpack_literal(block + b, fields[i][0], fields[i][1]);
  }
  at += h2_frame(buf + at, b, 0x1 /* HEADERS */, 0x4 /* END_HEADERS */, 1);
  memcpy(buf + at, block, b);
  at += b;
  for (size_t done = 0; done < plen;) { /* DATA frames of at most 16 KiB, none ending the stream */
    size_t chunk = plen - done < 16384 ? plen - done : 16384;
    at += h2_frame(buf + at, chunk, 0x0 /* DATA */, 0, 1);
    memcpy(buf + at, payload + done, chunk);
    at += chunk;
    done += chunk;
  }
  free(payload);
  int fd = harness_unix_connect(target + 5, SOCK_STREAM);
  ck_assert_int_eq(write(fd, buf, at), (ssize_t)at);
  free(buf);
  shutdown(fd, SHUT_WR);
  /* Read what the daemon says (its SETTINGS, perhaps data or a GOAWAY) until it closes. */
  struct timeval tv = {0, 200000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  unsigned char sink[4096];
  for (int i = 0; i < 10 && read(fd, sink, sizeof(sink)) > 0; i++) {
  }
  close(fd);
}

uint64_t raw_upload(const char *target, raw_md md, const void *data, int dtype, int ndim, int64_t d0, int64_t d1,
                    const char *device) {
  Ttd__V1__TensorSpec spec = TTD__V1__TENSOR_SPEC__INIT;
  int64_t shape[2] = {d0, d1};
  spec.dtype = dtype;
  spec.n_shape = (size_t)ndim;
  spec.shape = shape;
  if (device) spec.device = (char *)device;
  Ttd__V1__UploadHeader header = TTD__V1__UPLOAD_HEADER__INIT;
  header.target_case = TTD__V1__UPLOAD_HEADER__TARGET_SPEC;
  header.spec = &spec;
  Ttd__V1__UploadRequest req = TTD__V1__UPLOAD_REQUEST__INIT;
  req.header = &header;
  req.data.data = (uint8_t *)data;
  req.data.len = (size_t)(d0 * (ndim > 1 ? d1 : 1)) * 4;
  size_t len = ttd__v1__upload_request__get_packed_size(&req);
  unsigned char *msg = malloc(len);
  ttd__v1__upload_request__pack(&req, msg);
  const void *msgs[1] = {msg};
  raw_result r;
  raw_stream(target, "/ttd.v1.Device/Upload", md, msgs, &len, 1, 0, &r);
  free(msg);
  ck_assert_msg(r.code == 0, "upload: %s", r.details);
  Ttd__V1__UploadResponse *resp = ttd__v1__upload_response__unpack(NULL, r.body_len, r.body);
  uint64_t h = resp->tensor->handle;
  ttd__v1__upload_response__free_unpacked(resp, NULL);
  raw_result_free(&r);
  return h;
}

void raw_download(const char *target, raw_md md, uint64_t handle, void *out, size_t n) {
  Ttd__V1__DownloadRequest req = TTD__V1__DOWNLOAD_REQUEST__INIT;
  req.handle = handle;
  unsigned char buf[64];
  size_t len = ttd__v1__download_request__pack(&req, buf);
  raw_result r;
  raw_call(target, "/ttd.v1.Device/Download", md, buf, len, &r);
  ck_assert_msg(r.code == 0, "download: %s", r.details);
  Ttd__V1__DownloadResponse *resp = ttd__v1__download_response__unpack(NULL, r.body_len, r.body);
  ck_assert_uint_eq(resp->data.len, n * 4);
  memcpy(out, resp->data.data, n * 4);
  ttd__v1__download_response__free_unpacked(resp, NULL);
  raw_result_free(&r);
}
