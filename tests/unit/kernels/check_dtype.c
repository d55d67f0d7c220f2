/* kernels/dtype.h: element sizes and names, float32 <-> bfloat16 conversion (round to
 * nearest even, NaN, Inf, zeros, denormals, overflow) and ttd_dtype_convert. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "dtype.h"
#include "suites.h"

static float f32_of_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

static uint32_t bits_of_f32(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

static uint16_t bf16_of_bits(uint32_t u) { return ttd_bf16_from_f32(f32_of_bits(u)); }

static int bf16_is_nan(uint16_t b) { return (b & 0x7f80u) == 0x7f80u && (b & 0x007fu) != 0; }

/* splitmix64: a deterministic stream for the randomised tests. */
static uint64_t next_random(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* The nearest bfloat16 to a finite float (ties to even), found by comparing the two
 * candidates around it in double precision: an independent reference. */
static uint16_t reference_bf16(uint32_t u) {
  uint32_t sign = u & 0x80000000u, mag = u & 0x7fffffffu;
  uint32_t lo = mag & 0xffff0000u, hi = lo + 0x00010000u; /* hi may be Inf: still a candidate */
  double x = (double)f32_of_bits(mag);
  double dlo = x - (double)f32_of_bits(lo);
  double dhi = (hi == 0x7f800000u) ? ldexp(1.0, 128) - x : (double)f32_of_bits(hi) - x;
  uint32_t pick;
  if (dlo < dhi) pick = lo;
  else if (dhi < dlo) pick = hi;
  else pick = ((lo >> 16) & 1u) ? hi : lo;
  return (uint16_t)((sign | pick) >> 16);
}

/* Sizes are 4/2/4 bytes and 0 for invalid or unknown dtypes. */
START_TEST(test_sizes) {
  ck_assert_uint_eq(ttd_dtype_size(TTD_DTYPE_FLOAT32), 4);
  ck_assert_uint_eq(ttd_dtype_size(TTD_DTYPE_BFLOAT16), 2);
  ck_assert_uint_eq(ttd_dtype_size(TTD_DTYPE_INT32), 4);
  ck_assert_uint_eq(ttd_dtype_size(TTD_DTYPE_INVALID), 0);
  ck_assert_uint_eq(ttd_dtype_size((ttd_dtype)4), 0);
  ck_assert_uint_eq(ttd_dtype_size((ttd_dtype)-1), 0);
  ck_assert_uint_eq(ttd_dtype_size((ttd_dtype)1000), 0);
}
END_TEST

/* Names are the wire names, "invalid" for anything unknown and never NULL. */
START_TEST(test_names) {
  ck_assert_str_eq(ttd_dtype_name(TTD_DTYPE_FLOAT32), "float32");
  ck_assert_str_eq(ttd_dtype_name(TTD_DTYPE_BFLOAT16), "bfloat16");
  ck_assert_str_eq(ttd_dtype_name(TTD_DTYPE_INT32), "int32");
  ck_assert_str_eq(ttd_dtype_name(TTD_DTYPE_INVALID), "invalid");
  ck_assert_str_eq(ttd_dtype_name((ttd_dtype)4), "invalid");
  ck_assert_str_eq(ttd_dtype_name((ttd_dtype)-7), "invalid");
}
END_TEST

/* Wire values match ttd.v1.DType. */
START_TEST(test_enum_values) {
  ck_assert_int_eq(TTD_DTYPE_INVALID, 0);
  ck_assert_int_eq(TTD_DTYPE_FLOAT32, 1);
  ck_assert_int_eq(TTD_DTYPE_BFLOAT16, 2);
  ck_assert_int_eq(TTD_DTYPE_INT32, 3);
}
END_TEST

/* Exactly-halfway values round to the even neighbour, in both directions and both signs. */
START_TEST(test_ties_to_even) {
  ck_assert_uint_eq(bf16_of_bits(0x3F808000u), 0x3F80u); /* tie, even below: down */
  ck_assert_uint_eq(bf16_of_bits(0x3F818000u), 0x3F82u); /* tie, odd below: up */
  ck_assert_uint_eq(bf16_of_bits(0xBF808000u), 0xBF80u);
  ck_assert_uint_eq(bf16_of_bits(0xBF818000u), 0xBF82u);
  ck_assert_uint_eq(bf16_of_bits(0x40490000u | 0x8000u), 0x4049u + 1u); /* 0x4049 odd: up */
  ck_assert_uint_eq(bf16_of_bits(0x3FFF8000u), 0x4000u);                 /* carry into exponent */
  ck_assert_uint_eq(bf16_of_bits(0x7F7E8000u), 0x7F7Eu);                 /* even: stays finite */
}
END_TEST

/* Values just above half round up, just below half round down. */
START_TEST(test_near_half) {
  ck_assert_uint_eq(bf16_of_bits(0x3F808001u), 0x3F81u);
  ck_assert_uint_eq(bf16_of_bits(0x3F807FFFu), 0x3F80u);
  ck_assert_uint_eq(bf16_of_bits(0x3F818001u), 0x3F82u);
  ck_assert_uint_eq(bf16_of_bits(0x3F817FFFu), 0x3F81u);
  ck_assert_uint_eq(bf16_of_bits(0xBF808001u), 0xBF81u);
  ck_assert_uint_eq(bf16_of_bits(0xBF817FFFu), 0xBF81u);
  ck_assert_uint_eq(bf16_of_bits(0x3FFFFFFFu), 0x4000u);
  ck_assert_uint_eq(bf16_of_bits(0x3F80FFFFu), 0x3F81u);
  ck_assert_uint_eq(bf16_of_bits(0x3F800001u), 0x3F80u);
}
END_TEST

/* Exactly representable values (low 16 bits zero) convert without change. */
START_TEST(test_exact_values) {
  ck_assert_uint_eq(ttd_bf16_from_f32(1.0f), 0x3F80u);
  ck_assert_uint_eq(ttd_bf16_from_f32(-2.0f), 0xC000u);
  ck_assert_uint_eq(ttd_bf16_from_f32(0.5f), 0x3F00u);
  ck_assert_uint_eq(ttd_bf16_from_f32(65536.0f), 0x4780u);
  ck_assert_uint_eq(bf16_of_bits(0x00800000u), 0x0080u); /* smallest normal */
  ck_assert_uint_eq(bf16_of_bits(0x7F7F0000u), 0x7F7Fu); /* largest finite bf16 */
}
END_TEST

/* Every NaN stays a quiet NaN with its sign, including payloads that rounding would carry. */
START_TEST(test_nan) {
  static const uint32_t nans[] = {0x7FC00000u, 0x7F800001u, 0x7F800100u, 0x7FBFFFFFu, 0x7FFFFFFFu,
                                  0x7F80FFFFu, 0x7FFF8000u, 0xFFC00000u, 0xFF800001u, 0xFFFFFFFFu};
  for (size_t i = 0; i < sizeof(nans) / sizeof(nans[0]); i++) {
    uint16_t b = bf16_of_bits(nans[i]);
    ck_assert_msg(bf16_is_nan(b), "0x%08X -> 0x%04X is not NaN", nans[i], b);
    ck_assert_msg(b & 0x0040u, "0x%08X -> 0x%04X is not a quiet NaN", nans[i], b);
    ck_assert_uint_eq(b & 0x8000u, (nans[i] >> 16) & 0x8000u);
    ck_assert(isnan(ttd_f32_from_bf16(b)));
  }
  ck_assert_uint_eq(ttd_bf16_from_f32(NAN) & 0x7FC0u, 0x7FC0u);
}
END_TEST

/* +Inf and -Inf convert to bf16 Inf and back. */
START_TEST(test_inf) {
  ck_assert_uint_eq(ttd_bf16_from_f32(INFINITY), 0x7F80u);
  ck_assert_uint_eq(ttd_bf16_from_f32(-INFINITY), 0xFF80u);
  ck_assert(isinf(ttd_f32_from_bf16(0x7F80u)) && ttd_f32_from_bf16(0x7F80u) > 0);
  ck_assert(isinf(ttd_f32_from_bf16(0xFF80u)) && ttd_f32_from_bf16(0xFF80u) < 0);
}
END_TEST

/* +0 and -0 keep their sign. */
START_TEST(test_zeros) {
  ck_assert_uint_eq(ttd_bf16_from_f32(0.0f), 0x0000u);
  ck_assert_uint_eq(ttd_bf16_from_f32(-0.0f), 0x8000u);
  ck_assert_uint_eq(bits_of_f32(ttd_f32_from_bf16(0x8000u)), 0x80000000u);
  ck_assert_uint_eq(bits_of_f32(ttd_f32_from_bf16(0x0000u)), 0x00000000u);
}
END_TEST

/* float32 denormals round to nearest even bf16 denormal, up into the smallest normal too. */
START_TEST(test_denormals) {
  ck_assert_uint_eq(bf16_of_bits(0x00000001u), 0x0000u);
  ck_assert_uint_eq(bf16_of_bits(0x80000001u), 0x8000u);
  ck_assert_uint_eq(bf16_of_bits(0x00008000u), 0x0000u); /* tie, even: down to +0 */
  ck_assert_uint_eq(bf16_of_bits(0x00018000u), 0x0002u); /* tie, odd: up */
  ck_assert_uint_eq(bf16_of_bits(0x00008001u), 0x0001u);
  ck_assert_uint_eq(bf16_of_bits(0x80008001u), 0x8001u);
  ck_assert_uint_eq(bf16_of_bits(0x00010000u), 0x0001u); /* exact bf16 denormal */
  ck_assert_uint_eq(bf16_of_bits(0x007FFFFFu), 0x0080u); /* rounds up into the smallest normal */
  ck_assert_uint_eq(bits_of_f32(ttd_f32_from_bf16(0x0001u)), 0x00010000u);
  ck_assert(fpclassify(ttd_f32_from_bf16(0x0001u)) == FP_SUBNORMAL);
}
END_TEST

/* Values beyond the largest finite bf16 plus half an ulp overflow to Inf; below stay finite. */
START_TEST(test_overflow) {
  ck_assert_uint_eq(bf16_of_bits(0x7F7FFFFFu), 0x7F80u); /* FLT_MAX */
  ck_assert_uint_eq(bf16_of_bits(0xFF7FFFFFu), 0xFF80u);
  ck_assert_uint_eq(bf16_of_bits(0x7F7F8000u), 0x7F80u); /* tie, odd: up to Inf */
  ck_assert_uint_eq(bf16_of_bits(0x7F7F7FFFu), 0x7F7Fu); /* just below half: finite */
  ck_assert_uint_eq(bf16_of_bits(0xFF7F7FFFu), 0xFF7Fu);
}
END_TEST

/* bfloat16 -> float32 is exact for all 65536 patterns (NaNs stay NaN). */
START_TEST(test_bf16_to_f32_exact) {
  for (uint32_t b = 0; b <= 0xFFFFu; b++) {
    float f = ttd_f32_from_bf16((uint16_t)b);
    ck_assert_uint_eq(bits_of_f32(f), b << 16);
    if (!bf16_is_nan((uint16_t)b)) ck_assert_uint_eq(ttd_bf16_from_f32(f), b);
    else ck_assert(isnan(f));
  }
}
END_TEST

/* For 1e5 random finite floats the round trip is within half a bf16 ulp: 2^(exponent-8). */
START_TEST(test_roundtrip_half_ulp) {
  uint64_t state = 0x5eed0001u;
  int checked = 0;
  while (checked < 100000) {
    uint32_t u = (uint32_t)next_random(&state);
    if ((u & 0x7f800000u) == 0x7f800000u) continue;   /* Inf/NaN */
    if ((u & 0x7fffffffu) >= 0x7F7F8000u) continue;   /* rounds to Inf: test_overflow */
    float x = f32_of_bits(u);
    float rt = ttd_f32_from_bf16(ttd_bf16_from_f32(x));
    ck_assert(isfinite(rt));
    int e;
    frexp(x, &e); /* x = m * 2^e, m in [0.5, 1): the unbiased exponent is e - 1 */
    int exponent = x == 0.0f ? -126 : e - 1;
    if (exponent < -126) exponent = -126; /* denormals share the smallest normal's spacing */
    double err = fabs((double)x - (double)rt);
    double bound = ldexp(1.0, exponent - 8);
    ck_assert_msg(err <= bound, "x=%a (0x%08X) rt=%a err=%a > %a", x, u, rt, err, bound);
    if (x != 0.0f) ck_assert_int_eq(signbit(rt) != 0, signbit(x) != 0);
    checked++;
  }
}
END_TEST

/* For 1e5 random bit patterns the result is the nearest bf16 with ties to even (reference). */
START_TEST(test_matches_reference) {
  uint64_t state = 0x5eed0002u;
  for (int i = 0; i < 100000; i++) {
    uint32_t u = (uint32_t)next_random(&state);
    if (i % 4 == 0) u = (u & 0xFFFF0000u) | 0x8000u; /* force many exact ties */
    if ((u & 0x7f800000u) == 0x7f800000u) continue;
    ck_assert_msg(bf16_of_bits(u) == reference_bf16(u), "0x%08X -> 0x%04X, want 0x%04X", u, bf16_of_bits(u),
                  reference_bf16(u));
  }
}
END_TEST

/* ttd_dtype_convert copies bytes for every same-type pair. */
START_TEST(test_convert_same_type) {
  static const ttd_dtype types[] = {TTD_DTYPE_FLOAT32, TTD_DTYPE_BFLOAT16, TTD_DTYPE_INT32};
  unsigned char src[64], dst[64 + 8];
  for (size_t i = 0; i < sizeof(src); i++) src[i] = (unsigned char)(i * 37 + 11);
  /* A NaN payload must survive a float32 copy untouched. */
  uint32_t snan = 0x7F800001u;
  memcpy(src, &snan, 4);
  for (size_t t = 0; t < 3; t++) {
    size_t n = sizeof(src) / ttd_dtype_size(types[t]);
    memset(dst, 0xAB, sizeof(dst));
    ck_assert(ttd_dtype_convertible(types[t], types[t]));
    ck_assert_int_eq(ttd_dtype_convert(dst, types[t], src, types[t], n), 0);
    ck_assert_mem_eq(dst, src, sizeof(src));
    for (size_t i = sizeof(src); i < sizeof(dst); i++) ck_assert_uint_eq(dst[i], 0xAB); /* no overrun */
  }
}
END_TEST

/* Converting zero elements succeeds and writes nothing. */
START_TEST(test_convert_zero_elements) {
  unsigned char dst[4] = {1, 2, 3, 4};
  ck_assert_int_eq(ttd_dtype_convert(dst, TTD_DTYPE_BFLOAT16, "\0\0\0\0", TTD_DTYPE_FLOAT32, 0), 0);
  ck_assert_int_eq(ttd_dtype_convert(dst, TTD_DTYPE_INT32, "\0\0\0\0", TTD_DTYPE_INT32, 0), 0);
  ck_assert_uint_eq(dst[0], 1);
  ck_assert_uint_eq(dst[3], 4);
}
END_TEST

/* float32 -> bfloat16 arrays match the scalar rounding element by element. */
START_TEST(test_convert_f32_to_bf16) {
  float src[] = {1.0f, -0.0f, INFINITY, NAN, f32_of_bits(0x3F818000u), f32_of_bits(0x7F7FFFFFu),
                 f32_of_bits(0x00018000u), 3.14159265f};
  uint16_t dst[8 + 1];
  dst[8] = 0xBEEF;
  ck_assert(ttd_dtype_convertible(TTD_DTYPE_FLOAT32, TTD_DTYPE_BFLOAT16));
  ck_assert_int_eq(ttd_dtype_convert(dst, TTD_DTYPE_BFLOAT16, src, TTD_DTYPE_FLOAT32, 8), 0);
  ck_assert_uint_eq(dst[0], 0x3F80u);
  ck_assert_uint_eq(dst[1], 0x8000u);
  ck_assert_uint_eq(dst[2], 0x7F80u);
  ck_assert(bf16_is_nan(dst[3]));
  ck_assert_uint_eq(dst[4], 0x3F82u);
  ck_assert_uint_eq(dst[5], 0x7F80u);
  ck_assert_uint_eq(dst[6], 0x0002u);
  ck_assert_uint_eq(dst[7], 0x4049u); /* pi = 0x40490FDB: low half below 0x8000 */
  ck_assert_uint_eq(dst[8], 0xBEEF);  /* no overrun */
}
END_TEST

/* bfloat16 -> float32 arrays are exact element by element. */
START_TEST(test_convert_bf16_to_f32) {
  uint16_t src[] = {0x3F80u, 0x8000u, 0xFF80u, 0x7FC1u, 0x0001u, 0x4049u};
  float dst[7];
  dst[6] = 42.0f;
  ck_assert(ttd_dtype_convertible(TTD_DTYPE_BFLOAT16, TTD_DTYPE_FLOAT32));
  ck_assert_int_eq(ttd_dtype_convert(dst, TTD_DTYPE_FLOAT32, src, TTD_DTYPE_BFLOAT16, 6), 0);
  for (int i = 0; i < 6; i++) ck_assert_uint_eq(bits_of_f32(dst[i]), (uint32_t)src[i] << 16);
  ck_assert(dst[6] == 42.0f);
}
END_TEST

/* int32 <-> float/bfloat16 and invalid dtypes are not convertible: -1, dst untouched. */
START_TEST(test_convert_refused) {
  static const ttd_dtype pairs[][2] = {
      {TTD_DTYPE_INT32, TTD_DTYPE_FLOAT32},   {TTD_DTYPE_FLOAT32, TTD_DTYPE_INT32},
      {TTD_DTYPE_INT32, TTD_DTYPE_BFLOAT16},  {TTD_DTYPE_BFLOAT16, TTD_DTYPE_INT32},
      {TTD_DTYPE_INVALID, TTD_DTYPE_INVALID}, {TTD_DTYPE_FLOAT32, TTD_DTYPE_INVALID},
      {TTD_DTYPE_INVALID, TTD_DTYPE_FLOAT32}, {(ttd_dtype)9, (ttd_dtype)9},
  };
  int32_t src[4] = {1, 2, 3, 4};
  for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++) {
    unsigned char dst[16];
    memset(dst, 0x5A, sizeof(dst));
    ck_assert_int_eq(ttd_dtype_convertible(pairs[i][0], pairs[i][1]), 0);
    ck_assert_int_eq(ttd_dtype_convert(dst, pairs[i][1], src, pairs[i][0], 4), -1);
    for (size_t k = 0; k < sizeof(dst); k++) ck_assert_uint_eq(dst[k], 0x5A);
  }
}
END_TEST

/* Bytes off the wire may start at any address: misaligned source and destination convert
 * exactly like aligned ones, across the bounce buffers' 4096-element boundary. */
START_TEST(test_convert_misaligned) {
  enum { N = 10000 };
  static float src[N];
  static unsigned char raw_in[N * 4 + 3], raw_out[N * 4 + 3];
  static uint16_t want[N], got[N];
  for (int i = 0; i < N; i++) src[i] = (float)i * 1.0001f - 5000.5f;
  ck_assert_int_eq(ttd_dtype_convert(want, TTD_DTYPE_BFLOAT16, src, TTD_DTYPE_FLOAT32, N), 0);
  memcpy(raw_in + 1, src, sizeof(src));
  ck_assert_int_eq(ttd_dtype_convert(raw_out + 3, TTD_DTYPE_BFLOAT16, raw_in + 1, TTD_DTYPE_FLOAT32, N), 0);
  memcpy(got, raw_out + 3, sizeof(got));
  ck_assert_int_eq(memcmp(got, want, sizeof(want)), 0);
  static float back_want[N], back_got[N];
  ck_assert_int_eq(ttd_dtype_convert(back_want, TTD_DTYPE_FLOAT32, want, TTD_DTYPE_BFLOAT16, N), 0);
  memcpy(raw_in + 1, want, sizeof(want));
  ck_assert_int_eq(ttd_dtype_convert(raw_out + 2, TTD_DTYPE_FLOAT32, raw_in + 1, TTD_DTYPE_BFLOAT16, N), 0);
  memcpy(back_got, raw_out + 2, sizeof(back_got));
  ck_assert_int_eq(memcmp(back_got, back_want, sizeof(back_want)), 0);
}
END_TEST

/* The array conversions and the rounding in place (vectorised, picked for the CPU at load
 * time) give, at every length
 * around their vector widths and from every start in a vector, the bits of the scalar
 * conversions on random patterns with NaNs, infinities, denormals and exact ties. */
START_TEST(test_convert_arrays_match_scalar) {
  enum { N = 4099 + 16 };
  static const size_t lens[] = {1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 511, 513, 4099};
  static float src[N], back[N];
  static uint16_t half[N];
  uint64_t state = 0x5eed0003u;
  for (int i = 0; i < N; i++) {
    uint32_t u = (uint32_t)next_random(&state);
    switch (i % 8) {
      case 0: u = (u & 0xFFFF0000u) | 0x8000u; break;               /* a tie */
      case 1: u = (u & 0x807FFFFFu) | 0x7F800000u; break;           /* NaN or infinity */
      case 2: u &= 0x807FFFFFu; break;                              /* denormal or zero */
      case 3: u = (u & 0x80000000u) | 0x7F7F8000u | (u & 0x7FFFu); break; /* rounds to infinity */
      default: break;
    }
    memcpy(&src[i], &u, sizeof(u));
  }
  for (size_t l = 0; l < sizeof(lens) / sizeof(lens[0]); l++) {
    for (size_t start = 0; start < 16; start += 5) {
      size_t n = lens[l];
      memset(half, 0xA5, sizeof(half));
      ck_assert_int_eq(ttd_dtype_convert(half + start, TTD_DTYPE_BFLOAT16, src + start, TTD_DTYPE_FLOAT32, n), 0);
      for (size_t i = 0; i < n; i++)
        ck_assert_msg(half[start + i] == ttd_bf16_from_f32(src[start + i]), "n=%zu start=%zu i=%zu: 0x%04X want 0x%04X",
                      n, start, i, half[start + i], ttd_bf16_from_f32(src[start + i]));
      ck_assert_uint_eq(half[start + n], 0xA5A5u); /* no overrun */
      memset(back, 0xA5, sizeof(back));
      ck_assert_int_eq(ttd_dtype_convert(back + start, TTD_DTYPE_FLOAT32, half + start, TTD_DTYPE_BFLOAT16, n), 0);
      for (size_t i = 0; i < n; i++) ck_assert_uint_eq(bits_of_f32(back[start + i]), (uint32_t)half[start + i] << 16);
      ck_assert_uint_eq(bits_of_f32(back[start + n]), 0xA5A5A5A5u);
      /* rounding in place: the widening of the narrowed value, bit for bit, NaN included */
      memset(back, 0xA5, sizeof(back));
      memcpy(back + start, src + start, n * sizeof(float));
      ttd_bf16_round_n(back + start, n);
      for (size_t i = 0; i < n; i++)
        ck_assert_msg(bits_of_f32(back[start + i]) == (uint32_t)ttd_bf16_from_f32(src[start + i]) << 16,
                      "round n=%zu start=%zu i=%zu: 0x%08X", n, start, i, bits_of_f32(back[start + i]));
      ck_assert_uint_eq(bits_of_f32(back[start + n]), 0xA5A5A5A5u);
    }
  }
}
END_TEST

Suite *dtype_suite(void) {
  Suite *s = suite_create("dtype");
  TCase *tc = tcase_create("basics");
  tcase_add_test(tc, test_sizes);
  tcase_add_test(tc, test_names);
  tcase_add_test(tc, test_enum_values);
  suite_add_tcase(s, tc);

  tc = tcase_create("bf16_rounding");
  tcase_add_test(tc, test_ties_to_even);
  tcase_add_test(tc, test_near_half);
  tcase_add_test(tc, test_exact_values);
  tcase_add_test(tc, test_nan);
  tcase_add_test(tc, test_inf);
  tcase_add_test(tc, test_zeros);
  tcase_add_test(tc, test_denormals);
  tcase_add_test(tc, test_overflow);
  tcase_add_test(tc, test_bf16_to_f32_exact);
  tcase_add_test(tc, test_roundtrip_half_ulp);
  tcase_add_test(tc, test_matches_reference);
  suite_add_tcase(s, tc);

  tc = tcase_create("convert");
  tcase_add_test(tc, test_convert_same_type);
  tcase_add_test(tc, test_convert_zero_elements);
  tcase_add_test(tc, test_convert_f32_to_bf16);
  tcase_add_test(tc, test_convert_bf16_to_f32);
  tcase_add_test(tc, test_convert_refused);
  tcase_add_test(tc, test_convert_misaligned);
  tcase_add_test(tc, test_convert_arrays_match_scalar);
  suite_add_tcase(s, tc);
  return s;
}
