#include "dtype.h"

#include <string.h>

size_t ttd_dtype_size(ttd_dtype dtype) {
  switch (dtype) {
    case TTD_DTYPE_FLOAT32: return 4;
    case TTD_DTYPE_BFLOAT16: return 2;
    case TTD_DTYPE_INT32: return 4;
    default: return 0;
  }
}

const char *ttd_dtype_name(ttd_dtype dtype) {
  switch (dtype) {
    case TTD_DTYPE_FLOAT32: return "float32";
    case TTD_DTYPE_BFLOAT16: return "bfloat16";
    case TTD_DTYPE_INT32: return "int32";
    default: return "invalid";
  }
}

int ttd_dtype_convertible(ttd_dtype from, ttd_dtype to) {
  if (ttd_dtype_size(from) == 0 || ttd_dtype_size(to) == 0) return 0;
  if (from == to) return 1;
  return (from == TTD_DTYPE_FLOAT32 && to == TTD_DTYPE_BFLOAT16) ||
         (from == TTD_DTYPE_BFLOAT16 && to == TTD_DTYPE_FLOAT32);
}

static void bf16_from_f32_n(uint16_t *restrict dst, const float *restrict src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = ttd_bf16_from_f32(src[i]);
}

static void f32_from_bf16_n(float *restrict dst, const uint16_t *restrict src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = ttd_f32_from_bf16(src[i]);
}

int ttd_dtype_convert(void *dst, ttd_dtype to, const void *src, ttd_dtype from, size_t n) {
  if (!ttd_dtype_convertible(from, to)) return -1;
  if (from == to) {
    if (n) memcpy(dst, src, n * ttd_dtype_size(from));
  } else if (to == TTD_DTYPE_BFLOAT16) {
    bf16_from_f32_n(dst, src, n);
  } else {
    f32_from_bf16_n(dst, src, n);
  }
  return 0;
}
