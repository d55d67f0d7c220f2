/* Reading a fuzz input as a stream of fields: each read takes what is left when the input
 * runs short (zeros for numbers), so every byte string is a valid input. */
#ifndef TTD_FUZZ_INPUT_H
#define TTD_FUZZ_INPUT_H

#include <stddef.h>
#include <stdint.h>

typedef struct fuzz_input {
  const uint8_t *data;
  size_t left;
} fuzz_input;

static inline uint8_t fuzz_u8(fuzz_input *in) {
  if (!in->left) return 0;
  in->left--;
  return *in->data++;
}

/* Little-endian. */
static inline uint16_t fuzz_u16(fuzz_input *in) {
  uint16_t lo = fuzz_u8(in);
  return (uint16_t)(lo | (uint16_t)fuzz_u8(in) << 8);
}

/* Up to n bytes, in place; *out_len says how many. */
static inline const uint8_t *fuzz_bytes(fuzz_input *in, size_t n, size_t *out_len) {
  const uint8_t *p = in->data;
  *out_len = n < in->left ? n : in->left;
  in->data += *out_len;
  in->left -= *out_len;
  return p;
}

/* A framed part of an input: a u8 tag, a u16 length (little-endian) and that many bytes,
 * data[at, at + len) of the whole input data (fewer when the input runs short). */
typedef struct fuzz_record {
  uint8_t tag;
  size_t at, len;
  int framed; /* its u16 length was all there, so a custom mutator may rewrite it */
} fuzz_record;

/* The next record of in (data: the start of the whole input); 0 at the end. */
static inline int fuzz_next_record(fuzz_input *in, const uint8_t *data, fuzz_record *r) {
  if (!in->left) return 0;
  r->tag = fuzz_u8(in);
  r->framed = in->left >= 2;
  r->at = (size_t)(fuzz_bytes(in, fuzz_u16(in), &r->len) - data);
  return 1;
}

#endif
