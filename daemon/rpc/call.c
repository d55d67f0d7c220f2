#include "rpc/call.h"

#include <stdlib.h>
#include <string.h>

/* ---- arena ---- */

struct ttd_arena_block {
  ttd_arena_block *next;
  size_t used, size;
  _Alignas(16) unsigned char data[];
};

void *ttd_call_alloc(ttd_call *call, size_t bytes) {
  bytes = (bytes + 15) & ~(size_t)15;
  ttd_arena_block *b = call->arena;
  if (!b || b->size - b->used < bytes) {
    size_t size = bytes > 4096 ? bytes : 4096;
    b = malloc(sizeof(*b) + size);
    if (!b) return NULL;
    b->size = size;
    b->used = 0;
    b->next = call->arena;
    call->arena = b;
  }
  void *p = b->data + b->used;
  b->used += bytes;
  memset(p, 0, bytes);
  return p;
}

char *ttd_call_strdup(ttd_call *call, const char *s) {
  size_t n = strlen(s) + 1;
  char *copy = ttd_call_alloc(call, n);
  if (copy) memcpy(copy, s, n);
  return copy;
}

size_t ttd_call_held_bytes(const ttd_call *call) {
  size_t bytes = call->received ? grpc_byte_buffer_length(call->received) : 0;
  for (const ttd_arena_block *b = call->arena; b; b = b->next) bytes += b->used;
  return bytes;
}

void ttd_call_arena_free(ttd_call *call) {
  while (call->arena) {
    ttd_arena_block *next = call->arena->next;
    free(call->arena);
    call->arena = next;
  }
}

static void *arena_pb_alloc(void *data, size_t size) { return ttd_call_alloc(data, size); }
static void arena_pb_free(void *data, void *p) {
  (void)data;
  (void)p;
}

const char *ttd_call_metadata(const ttd_call *call, const char *key, size_t *out_len) {
  for (size_t i = 0; i < call->request_metadata.count; i++) {
    const grpc_metadata *md = &call->request_metadata.metadata[i];
    if (grpc_slice_str_cmp(md->key, key) == 0) {
      *out_len = GRPC_SLICE_LENGTH(md->value);
      return (const char *)GRPC_SLICE_START_PTR(md->value);
    }
  }
  *out_len = 0;
  return NULL;
}

/* ---- lifecycle ---- */

void ttd_call_init(ttd_call *call, ttd_core *core, const ttd_method *method) {
  call->method = method;
  call->core = core;
  call->status_details = grpc_empty_slice();
  call->allocator = (ProtobufCAllocator){arena_pb_alloc, arena_pb_free, call};
  grpc_metadata_array_init(&call->request_metadata);
}

void ttd_call_deinit(ttd_call *call) {
  if (call->received) grpc_byte_buffer_destroy(call->received);
  if (call->sending) grpc_byte_buffer_destroy(call->sending);
  call->received = call->sending = NULL;
  grpc_slice_unref(call->status_details);
  call->status_details = grpc_empty_slice();
  grpc_metadata_array_destroy(&call->request_metadata);
  ttd_session_release(call->session);
  call->session = NULL;
  ttd_call_arena_free(call);
}
