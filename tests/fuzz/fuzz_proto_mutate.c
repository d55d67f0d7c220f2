#include "fuzz_proto_mutate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_input.h"

/* Edge values: zero and small counts, the limits of 32 and 64 bits and their neighbours,
 * and the first handles of an input (fuzz_random.h: the session is 0x13, its segment 0x14,
 * then 0x15 up), and the size of that segment. */
static const int64_t edge_ints[] = {
    0, 1, -1, 2, 3, 4, 8, 9, 255, 256, 4096, 65536, 1 << 20,
    INT32_MAX, INT32_MIN, (int64_t)1 << 31, UINT32_MAX, (int64_t)1 << 32, ((int64_t)1 << 32) + 1,
    (int64_t)1 << 40, (int64_t)1 << 61, (int64_t)1 << 62, INT64_MAX, INT64_MIN, -((int64_t)1 << 31),
    0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 65535,
};

typedef struct walk {
  uint32_t rng;
  size_t target; /* the index of the field to mutate, or SIZE_MAX to count them */
  size_t seen;
  const char *const *words;
  int done; /* 1 mutated, -1 out of memory */
} walk;

static uint32_t next(walk *w) {
  w->rng ^= w->rng << 13;
  w->rng ^= w->rng >> 17;
  w->rng ^= w->rng << 5;
  return w->rng;
}

static int64_t edge_int(walk *w, int64_t old) {
  uint32_t r = next(w);
  if (r % 4 == 0) return (int64_t)((uint64_t)old + next(w) % 5 - 2); /* a neighbour of the old value, wrapping */
  return edge_ints[r / 4 % (sizeof(edge_ints) / sizeof(edge_ints[0]))];
}

static double edge_float(walk *w) {
  static const double v[] = {0, -0.0, 1, -1, 0.5, 1e-45, 3.4e38, 1e30, -1e30, NAN, INFINITY, -INFINITY};
  return v[next(w) % (sizeof(v) / sizeof(v[0]))];
}

static size_t word_count(const char *const *words) {
  size_t n = 0;
  while (words && words[n]) n++;
  return n;
}

/* Mutates the scalar or string at p (one element) of field f. */
static void mutate_value(walk *w, const ProtobufCFieldDescriptor *f, void *p, int owned_string) {
  switch (f->type) {
    case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32: case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_UINT32: case PROTOBUF_C_TYPE_FIXED32: case PROTOBUF_C_TYPE_ENUM: {
      int32_t v;
      memcpy(&v, p, 4);
      v = (int32_t)(uint32_t)edge_int(w, v);
      memcpy(p, &v, 4);
      break;
    }
    case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64: {
      int64_t v;
      memcpy(&v, p, 8);
      v = edge_int(w, v);
      memcpy(p, &v, 8);
      break;
    }
    case PROTOBUF_C_TYPE_FLOAT: *(float *)p = (float)edge_float(w); break;
    case PROTOBUF_C_TYPE_DOUBLE: *(double *)p = edge_float(w); break;
    case PROTOBUF_C_TYPE_BOOL: *(protobuf_c_boolean *)p = !*(protobuf_c_boolean *)p; break;
    case PROTOBUF_C_TYPE_STRING: {
      size_t n = word_count(w->words);
      char *copy = strdup(n ? w->words[next(w) % n] : "");
      if (!copy) {
        w->done = -1;
        return;
      }
      char **s = p;
      if (owned_string) free(*s); /* protobuf_c_message_free_unpacked frees it otherwise */
      *s = copy;
      break;
    }
    default: return;
  }
  w->done = 1;
}

static int mutable_type(ProtobufCType t) { return t != PROTOBUF_C_TYPE_BYTES && t != PROTOBUF_C_TYPE_MESSAGE; }

/* Bytes of one value of a scalar or string field in a protobuf-c struct. */
static size_t value_size(ProtobufCType t) {
  switch (t) {
    case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64: case PROTOBUF_C_TYPE_DOUBLE: return 8;
    case PROTOBUF_C_TYPE_BOOL: return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_STRING: return sizeof(char *);
    default: return 4;
  }
}

/* Counts the mutable values of m (target SIZE_MAX) or mutates the target-th. */
static void visit(walk *w, ProtobufCMessage *m) {
  const ProtobufCMessageDescriptor *d = m->descriptor;
  for (unsigned i = 0; i < d->n_fields && !w->done; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    char *field = (char *)m + f->offset;
    if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
      uint32_t which;
      memcpy(&which, (char *)m + f->quantifier_offset, sizeof(which));
      if (which != f->id) continue; /* another member of the oneof holds the memory */
    }
    size_t n = 1;
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
      memcpy(&n, (char *)m + f->quantifier_offset, sizeof(n));
      field = *(char **)field;
    }
    for (size_t k = 0; k < n && !w->done; k++) {
      if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
        ProtobufCMessage *sub = ((ProtobufCMessage **)field)[k]; /* the array, or the one field */
        if (sub) visit(w, sub);
        continue;
      }
      if (!mutable_type(f->type)) continue;
      if (w->seen++ != w->target) continue;
      void *p = field + k * value_size(f->type);
      int owned = f->type == PROTOBUF_C_TYPE_STRING &&
                  (f->label == PROTOBUF_C_LABEL_REPEATED || *(char **)p != f->default_value);
      mutate_value(w, f, p, owned);
    }
  }
}

size_t fuzz_proto_mutate(const ProtobufCMessageDescriptor *desc, const uint8_t *in, size_t len, uint8_t *out,
                         size_t max, uint32_t seed, const char *const *words) {
  ProtobufCMessage *m = protobuf_c_message_unpack(desc, NULL, len, in);
  if (!m) return 0;
  walk w = {.rng = seed | 1, .target = SIZE_MAX, .words = words};
  visit(&w, m);
  size_t result = 0;
  if (w.seen) {
    w.target = next(&w) % w.seen;
    w.seen = 0;
    visit(&w, m);
    size_t packed = protobuf_c_message_get_packed_size(m);
    if (w.done == 1 && packed <= max) result = protobuf_c_message_pack(m, out);
  }
  protobuf_c_message_free_unpacked(m, NULL);
  return result;
}

size_t fuzz_proto_mutate_framed(const ProtobufCMessageDescriptor *desc, uint8_t *data, size_t size, size_t max_size,
                                size_t at, size_t len, uint32_t seed, const char *const *words) {
  size_t room = max_size - (size - len);
  uint8_t *body = malloc(room ? room : 1);
  if (!body) return 0;
  size_t n = fuzz_proto_mutate(desc, data + at, len, body, room < 0xffff ? room : 0xffff, seed, words);
  if (n) {
    memmove(data + at + n, data + at + len, size - at - len);
    memcpy(data + at, body, n);
    data[at - 2] = (uint8_t)n;
    data[at - 1] = (uint8_t)(n >> 8);
  }
  free(body);
  return n ? size - len + n : 0;
}

/* The k-th framed record among the first max_records of the input after skip bytes, or how
 * many there are (k < 0). */
static int framed_record(const uint8_t *data, size_t size, size_t skip, int max_records, int k, fuzz_record *out) {
  fuzz_input in = {data + skip, size - skip};
  fuzz_record r;
  int n = 0;
  for (int i = 0; i < max_records && fuzz_next_record(&in, data, &r); i++) {
    if (!r.framed) continue;
    if (n++ == k) *out = r;
  }
  return n;
}

size_t fuzz_proto_mutate_records(uint8_t *data, size_t size, size_t max_size, unsigned int seed, size_t skip,
                                 int max_records, const ProtobufCMessageDescriptor *(*desc_of)(uint8_t tag),
                                 const char *const *words) {
  int n = seed % 3 == 0 && size > skip ? framed_record(data, size, skip, max_records, -1, NULL) : 0;
  if (n) {
    fuzz_record pick;
    framed_record(data, size, skip, max_records, (int)(seed / 3 % (unsigned)n), &pick);
    size_t grown = fuzz_proto_mutate_framed(desc_of(pick.tag), data, size, max_size, pick.at, pick.len, seed, words);
    if (grown) return grown;
  }
  return LLVMFuzzerMutate(data, size, max_size);
}
