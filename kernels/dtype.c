#include "dtype.h"

#include <stdint.h>
#include <string.h>

#include "kernel_internal.h"

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

/* Vectorised (TTD_KHOT): a bfloat16 parameter's step is narrowed through these, and the
 * bfloat16 matmul widens and rounds its operands through them as it packs. */
TTD_KHOT void ttd_bf16_from_f32_n(uint16_t *restrict dst, const float *restrict src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = ttd_bf16_from_f32(src[i]);
}

TTD_KHOT void ttd_f32_from_bf16_n(float *restrict dst, const uint16_t *restrict src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = ttd_f32_from_bf16(src[i]);
}

TTD_KHOT void ttd_bf16_round_n(float *x, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] = ttd_f32_from_bf16(ttd_bf16_from_f32(x[i]));
}

/* Converts n elements from src to dst, both aligned for their types. */
static void convert_aligned(void *dst, ttd_dtype to, const void *src, size_t n) {
  if (to == TTD_DTYPE_BFLOAT16) ttd_bf16_from_f32_n(dst, src, n);
  else ttd_f32_from_bf16_n(dst, src, n);
}

int ttd_dtype_convert(void *dst, ttd_dtype to, const void *src, ttd_dtype from, size_t n) {
  if (!ttd_dtype_convertible(from, to)) return -1;
  size_t in_size = ttd_dtype_size(from), out_size = ttd_dtype_size(to);
  if (from == to) {
    if (n) memcpy(dst, src, n * in_size);
  } else if ((uintptr_t)src % in_size == 0 && (uintptr_t)dst % out_size == 0) {
    convert_aligned(dst, to, src, n);
  } else { /* bytes straight off the wire may sit anywhere: go through aligned bounce buffers */
    _Alignas(64) unsigned char in[4096 * 4], out[4096 * 4];
    for (size_t done = 0; done < n;) {
      size_t k = n - done < 4096 ? n - done : 4096;
      memcpy(in, (const unsigned char *)src + done * in_size, k * in_size);
      convert_aligned(out, to, in, k);
      memcpy((unsigned char *)dst + done * out_size, out, k * out_size);
      done += k;
    }
  }
  return 0;
}
