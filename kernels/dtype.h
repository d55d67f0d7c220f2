/* Element types shared by the daemon, the backends and the client's in-process path.
 * The numeric values equal ttd.v1.DType on the wire. */
#ifndef TTD_KERNELS_DTYPE_H
#define TTD_KERNELS_DTYPE_H

#include <stddef.h>
#include <stdint.h>

typedef enum ttd_dtype {
  TTD_DTYPE_INVALID = 0,
  TTD_DTYPE_FLOAT32 = 1,
  TTD_DTYPE_BFLOAT16 = 2,
  TTD_DTYPE_INT32 = 3,
} ttd_dtype;

/* Bytes per element; 0 for an unknown dtype. */
size_t ttd_dtype_size(ttd_dtype dtype);

/* "float32", "bfloat16", "int32"; "invalid" for anything else. Never NULL. */
const char *ttd_dtype_name(ttd_dtype dtype);

/* Whether bytes of type `from` can be converted into `to` by ttd_dtype_convert. */
int ttd_dtype_convertible(ttd_dtype from, ttd_dtype to);

/* Converts n elements from src (type `from`) into dst (type `to`). Same types copy;
 * float32 -> bfloat16 rounds to nearest even (NaN stays NaN); bfloat16 -> float32 is
 * exact. The buffers must not overlap. Returns 0, or -1 if the pair is not convertible. */
int ttd_dtype_convert(void *dst, ttd_dtype to, const void *src, ttd_dtype from, size_t n);

/* dst[i] = src[i] narrowed to bfloat16 bits, i < n (as ttd_bf16_from_f32; no overlap). */
void ttd_bf16_from_f32_n(uint16_t *restrict dst, const float *restrict src, size_t n);

/* dst[i] = src[i] widened to float32, i < n (exact; the buffers do not overlap). */
void ttd_f32_from_bf16_n(float *restrict dst, const uint16_t *restrict src, size_t n);

/* x[i] rounded to bfloat16's precision in place (to nearest even, NaN stays NaN), i < n:
 * the float32 that widening its bfloat16 gives. */
void ttd_bf16_round_n(float *x, size_t n);

/* One float32 to bfloat16 bits, round to nearest even. Without a branch (a select), so that
 * a loop of it vectorizes wherever it is inlined (the pairs packer's narrowing loop took
 * twice the time with a branch). */
static inline uint16_t ttd_bf16_from_f32(float f) {
  union { float f; uint32_t u; } v = {.f = f};
  uint32_t rounded = (v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16;
  uint32_t quiet_nan = (v.u >> 16) | 0x0040u; /* sign kept */
  return (uint16_t)((v.u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded); /* NaN: above infinity */
}

/* One bfloat16 to float32, exact. */
static inline float ttd_f32_from_bf16(uint16_t b) {
  union { float f; uint32_t u; } v = {.u = (uint32_t)b << 16};
  return v.f;
}

#endif
