#include "wire/wire_frame.h"

#include <grpc/byte_buffer_reader.h>
#include <stdbool.h>

/* A read position over the slices of a byte buffer. */
typedef struct cursor {
  grpc_byte_buffer_reader reader;
  grpc_slice slice;
  bool have;
  size_t pos;
  uint64_t left; /* bytes of the message not read yet */
} cursor;

/* The current slice with bytes left, advancing through the buffer; 0 at the end. */
static int current(cursor *c) {
  while (!c->have || c->pos == GRPC_SLICE_LENGTH(c->slice)) {
    if (c->have) grpc_slice_unref(c->slice);
    c->have = false;
    c->pos = 0;
    if (!grpc_byte_buffer_reader_next(&c->reader, &c->slice)) return 0;
    c->have = true;
  }
  return 1;
}

static int read_byte(cursor *c, uint8_t *out) {
  if (!current(c)) return -1;
  *out = GRPC_SLICE_START_PTR(c->slice)[c->pos++];
  c->left--;
  return 0;
}

static int read_varint(cursor *c, uint64_t *out) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    uint8_t b;
    if (read_byte(c, &b) != 0) return -1;
    v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      *out = v;
      return 0;
    }
  }
  return -1;
}

int ttd_wire_walk(grpc_byte_buffer *bb, const ttd_wire_visitor *visitor, void *ctx) {
  cursor c = {0};
  if (!grpc_byte_buffer_reader_init(&c.reader, bb)) return -1;
  c.left = grpc_byte_buffer_length(bb);
  int rc = 0;
  while (rc == 0) {
    if (!current(&c)) break; /* a clean end between fields */
    uint64_t key;
    if (read_varint(&c, &key) != 0) {
      rc = -1;
      break;
    }
    uint32_t field = (uint32_t)(key >> 3), type = (uint32_t)(key & 7);
    if (field == 0 || key >> 3 > 0x1fffffff) { /* field numbers end at 2^29 - 1 */
      rc = -1;
    } else if (type == 0) {
      uint64_t v;
      rc = read_varint(&c, &v) != 0 ? -1 : visitor->number ? visitor->number(ctx, field, v) : 0;
    } else if (type == 1 || type == 5) {
      uint64_t v = 0;
      for (int i = 0; i < (type == 1 ? 8 : 4) && rc == 0; i++) {
        uint8_t b = 0;
        rc = read_byte(&c, &b);
        if (rc == 0) v |= (uint64_t)b << (8 * i);
      }
      if (rc == 0 && visitor->number) rc = visitor->number(ctx, field, v);
    } else if (type == 2) {
      uint64_t total;
      if (read_varint(&c, &total) != 0) {
        rc = -1;
        break;
      }
      if (total > c.left) { /* a length past the message's end: truncated or garbage */
        rc = -1;
        break;
      }
      uint64_t at = 0;
      if (total == 0 && visitor->bytes) rc = visitor->bytes(ctx, field, NULL, 0, 0, 0);
      while (rc == 0 && at < total) {
        if (!current(&c)) {
          rc = -1; /* truncated */
          break;
        }
        size_t avail = GRPC_SLICE_LENGTH(c.slice) - c.pos;
        size_t n = total - at < avail ? (size_t)(total - at) : avail;
        if (visitor->bytes) rc = visitor->bytes(ctx, field, GRPC_SLICE_START_PTR(c.slice) + c.pos, n, at, total);
        c.pos += n;
        c.left -= n;
        at += n;
      }
    } else {
      rc = -1; /* groups (3, 4) and reserved types */
    }
  }
  if (c.have) grpc_slice_unref(c.slice);
  grpc_byte_buffer_reader_destroy(&c.reader);
  return rc;
}

static size_t put_varint(uint8_t *out, uint64_t v) {
  size_t n = 0;
  do {
    out[n++] = (uint8_t)((v & 0x7f) | (v >= 0x80 ? 0x80 : 0));
    v >>= 7;
  } while (v);
  return n;
}

grpc_byte_buffer *ttd_wire_frame(const ProtobufCMessage *head, uint32_t field, grpc_slice data) {
  size_t head_len = head ? protobuf_c_message_get_packed_size(head) : 0;
  grpc_slice first = grpc_slice_malloc(head_len + 20);
  uint8_t *p = GRPC_SLICE_START_PTR(first);
  if (head) protobuf_c_message_pack(head, p);
  size_t n = head_len;
  n += put_varint(p + n, ((uint64_t)field << 3) | 2);
  n += put_varint(p + n, GRPC_SLICE_LENGTH(data));
  grpc_slice parts[2] = {grpc_slice_sub_no_ref(first, 0, n), data};
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(parts, GRPC_SLICE_LENGTH(data) ? 2 : 1);
  grpc_slice_unref(first);
  grpc_slice_unref(data);
  return bb;
}
