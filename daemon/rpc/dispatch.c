#include "rpc/dispatch.h"

#include <grpc/byte_buffer_reader.h>
#include <string.h>
#include <unistd.h>

#include "rpc/server.h"

/* Unpacks a request into the call's arena: it lives with the call. (Stream messages are
 * walked in place by their handlers: wire_frame.h.) */
static ttd_status_t unpack_message(ttd_call *c, grpc_byte_buffer *buffer, const ProtobufCMessageDescriptor *desc,
                                   ProtobufCMessage **out) {
  *out = NULL;
  grpc_byte_buffer_reader reader;
  if (!grpc_byte_buffer_reader_init(&reader, buffer)) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "request of %s could not be read (bad compression?)",
                           c->method->path);
  }
  grpc_slice flat = grpc_byte_buffer_reader_readall(&reader);
  grpc_byte_buffer_reader_destroy(&reader);
  size_t len = GRPC_SLICE_LENGTH(flat);
  *out = protobuf_c_message_unpack(desc, &c->allocator, len, GRPC_SLICE_START_PTR(flat));
  grpc_slice_unref(flat);
  if (!*out) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                           "request is not a valid %s message (%zu bytes could not be decoded); "
                           "send a message generated from proto/ttd/v1/ttd.proto",
                           desc->name, len);
  }
  return TTD_OK;
}

static int hexval(char ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
  return -1;
}

static int parse_hex64(const char *s, size_t len, uint64_t *out) {
  if (len == 0 || len > 16) return -1;
  uint64_t v = 0;
  for (size_t i = 0; i < len; i++) {
    int d = hexval(s[i]);
    if (d < 0) return -1;
    v = (v << 4) | (uint64_t)d;
  }
  *out = v;
  return 0;
}

/* Resolves the ttd-session (and ttd-instance) metadata into c->session. */
static ttd_status_t attach_session(ttd_call *c) {
  size_t len;
  const char *instance = ttd_call_metadata(c, "ttd-instance", &len);
  if (instance && len == 0) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                           "'ttd-instance' metadata is empty; send the instance id OpenSession returned, or "
                           "leave it out");
  }
  if (instance && (len != strlen(c->core->instance_id) || memcmp(instance, c->core->instance_id, len) != 0)) {
    return ttd_make_status(GRPC_STATUS_FAILED_PRECONDITION,
                           "daemon restarted, tensors are gone: this call names daemon instance %.*s, "
                           "the running one is %s; reconnect and upload again",
                           (int)(len > 32 ? 32 : len), instance, c->core->instance_id);
  }
  const char *value = ttd_call_metadata(c, "ttd-session", &len);
  if (!value) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                           "%s needs a session: call OpenSession and send its id in 'ttd-session' metadata",
                           c->method->path);
  }
  uint64_t id;
  if (parse_hex64(value, len, &id) != 0) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                           "'ttd-session' metadata must be the 16 hex digits OpenSession returned, got '%.*s'",
                           (int)(len > 32 ? 32 : len), value);
  }
  return ttd_session_table_lookup(&c->core->sessions, id, c->principal.tenant, ttd_now_ms(), &c->session);
}

/* Without tokens, whether the caller may call admin methods: only ttd's own user and root,
 * over a Unix socket file, whose credentials the gate read at accept (rpc/conn_gate.h); a
 * call run in process (neither a gRPC call nor a call lane's) is one too. Else PERMISSION_DENIED naming the caller
 * and what to do. Every other caller is the tenant "local" without admin rights. */
static ttd_status_t admin_without_token(ttd_call *c) {
  if (!c->call && !c->lane) return TTD_OK;
  ttd_conn_peer peer;
  ttd_call_peer(c, &peer);
  unsigned self = (unsigned)geteuid();
  if (peer.kind == TTD_CONN_PEER_UNIX_FILE && (peer.uid == self || peer.uid == 0)) return TTD_OK;
  const char *path = c->method->path;
  if (peer.kind == TTD_CONN_PEER_UNIX_FILE) {
    return ttd_make_status(GRPC_STATUS_PERMISSION_DENIED,
                           "%s is for administrators: without --tokens only ttd's own user (uid %u) and root are, "
                           "over a Unix socket file; this caller is uid %u (tenant %s): run it as uid %u or root, or "
                           "give ttd a tokens file with an admin tenant",
                           path, self, (unsigned)peer.uid, c->principal.tenant, self);
  }
  const char *door = peer.kind == TTD_CONN_PEER_UNIX_ABSTRACT
                         ? "an abstract socket, which every local user may reach"
                         : peer.kind == TTD_CONN_PEER_TCP ? "a network listener" : "a connection ttd cannot name";
  return ttd_make_status(GRPC_STATUS_PERMISSION_DENIED,
                         "%s is for administrators: without --tokens only ttd's own user (uid %u) and root are, over "
                         "a Unix socket file; this call (peer %s) came over %s: call over the socket file as uid %u "
                         "or root, or give ttd a tokens file with an admin tenant",
                         path, self, peer.name[0] ? peer.name : "?", door, self);
}

ttd_status_t ttd_dispatch_prepare(ttd_call *c, ProtobufCMessage **out_request) {
  const ttd_method *m = c->method;
  *out_request = NULL;
  size_t len;
  const char *authorization = ttd_call_metadata(c, "authorization", &len);
  TTD_RETURN_IF_ERROR(ttd_auth_check(&c->core->auth, authorization, len, &c->principal));
  if (m->needs_admin && !c->principal.admin) {
    return ttd_make_status(GRPC_STATUS_PERMISSION_DENIED,
                           "%s is for administrators; tenant %s is not one (mark it 'admin' in the tokens file)",
                           m->path, c->principal.tenant);
  }
  if (m->needs_admin && !c->principal.by_token) TTD_RETURN_IF_ERROR(admin_without_token(c));
  if (m->kind != TTD_METHOD_CLIENT_STREAM) {
    if (!c->received) {
      return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "%s needs a request message, got none", m->path);
    }
    ttd_status_t status = unpack_message(c, c->received, m->request, out_request);
    grpc_byte_buffer_destroy(c->received);
    c->received = NULL;
    TTD_RETURN_IF_ERROR(status);
  }
  if (m->needs_session) TTD_RETURN_IF_ERROR(attach_session(c));
  return TTD_OK;
}
