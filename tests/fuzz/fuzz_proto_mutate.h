/* Structure-aware mutation of protobuf-c messages, for the harnesses' libFuzzer custom
 * mutators. Byte-level mutation rarely turns a 1-byte varint into a 10-byte one without
 * breaking the lengths around it, so it seldom reaches the dims, handles and attributes
 * past 2^31 or 2^62 where overflow bugs live; this unpacks the message, sets one scalar
 * field anywhere in its tree (repeated elements included) to an edge value or one string
 * field to a word of a list, and packs it again. */
#ifndef TTD_FUZZ_PROTO_MUTATE_H
#define TTD_FUZZ_PROTO_MUTATE_H

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>
#include <stdint.h>

/* libFuzzer's own mutator, for the byte-level share of a custom mutator. Weak: the corpus
 * replay build (no libFuzzer) never calls a custom mutator. */
size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size) __attribute__((weak));

/* The message of desc in in[0, len) with one field mutated (words: NULL-terminated list for
 * string fields), packed into out (max bytes). Returns its length, or 0 when in does not
 * unpack, holds no field to mutate or the result does not fit. */
size_t fuzz_proto_mutate(const ProtobufCMessageDescriptor *desc, const uint8_t *in, size_t len, uint8_t *out,
                         size_t max, uint32_t seed, const char *const *words);

/* The same on a message framed in a harness input: data[at, at + len), its length the
 * little-endian u16 at data[at - 2] (at >= 2). Returns the new input size (at most
 * max_size), or 0 with data unchanged. */
size_t fuzz_proto_mutate_framed(const ProtobufCMessageDescriptor *desc, uint8_t *data, size_t size, size_t max_size,
                                size_t at, size_t len, uint32_t seed, const char *const *words);

/* A custom mutator for inputs made of framed records (fuzz_input.h) after skip bytes: one
 * time in three (by seed) one of the first max_records records, as a message of
 * desc_of(its tag), goes through fuzz_proto_mutate_framed; otherwise, or when that fails,
 * libFuzzer's own mutation. Returns the new size. */
size_t fuzz_proto_mutate_records(uint8_t *data, size_t size, size_t max_size, unsigned int seed, size_t skip,
                                 int max_records, const ProtobufCMessageDescriptor *(*desc_of)(uint8_t tag),
                                 const char *const *words);

#endif
