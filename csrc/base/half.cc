#include "base/half.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "base/common.h"

namespace commlib {
namespace {

inline uint32_t bits_of(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float float_of(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

inline float fp16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  if (exp == 0x1f) return float_of(sign | 0x7f800000u | (mant << 13));  // inf/nan
  if (exp == 0) {
    if (mant == 0) return float_of(sign);
    // subnormal: value = mant * 2^-24
    float v = float(mant) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return float_of(sign | ((exp + 112) << 23) | (mant << 13));
}

inline uint16_t f32_to_fp16(float f) {
  uint32_t u = bits_of(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000);
  u &= 0x7fffffffu;
  if (u >= 0x7f800000u) {  // inf or nan
    return sign | 0x7c00 | (u > 0x7f800000u ? 0x200 : 0);
  }
  if (u >= 0x477ff000u) return sign | 0x7c00;  // rounds to >= 65520: overflow
  if (u < 0x38800000u) {                       // below smallest normal 2^-14
    // subnormal or zero: round(value / 2^-24) with ties to even
    float v = float_of(u) * 16777216.0f;       // exact scaling by 2^24
    uint32_t m = uint32_t(v);
    float rem = v - float(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1))) ++m;
    return sign | uint16_t(m);
  }
  // normal: rebias exponent, round mantissa from 23 to 10 bits (ties to even)
  uint32_t r = u + 0xfffu + ((u >> 13) & 1);
  r -= (112u << 23);
  return sign | uint16_t(r >> 13);
}

inline float bf16_to_f32(uint16_t h) { return float_of(uint32_t(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  const uint32_t u = bits_of(f);
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1)) >> 16;
  return uint16_t(nan ? ((u >> 16) | 0x40) : rounded);  // branch-free: vectorises
}

#if defined(__x86_64__)
// float16 <-> float32 with the F16C instructions (8 lanes), when the CPU has
// them; the scalar code handles the tail and older CPUs.
__attribute__((target("avx,f16c"))) size_t fp16_to_f32_f16c(const uint16_t* in, float* out,
                                                             size_t n, float s) {
  const __m256 scale = _mm256_set1_ps(s);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_cvtph_ps(h), scale));
  }
  return i;
}

__attribute__((target("avx,f16c"))) size_t f32_to_fp16_f16c(const float* in, uint16_t* out,
                                                             size_t n, float s) {
  const __m256 scale = _mm256_set1_ps(s);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 f = _mm256_mul_ps(_mm256_loadu_ps(in + i), scale);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  return i;
}

bool have_f16c() {
  static const bool yes = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  return yes;
}
#endif

}  // namespace

void half_to_float(int dtype, const void* in_v, float* __restrict__ out, size_t n,
                   double scale) {
  const uint16_t* __restrict__ in = static_cast<const uint16_t*>(in_v);
  const float s = float(scale);
  if (dtype == COMMLIB_BFLOAT16) {
    for (size_t i = 0; i < n; ++i) out[i] = bf16_to_f32(in[i]) * s;
  } else {
    size_t i = 0;
#if defined(__x86_64__)
    if (have_f16c()) i = fp16_to_f32_f16c(in, out, n, s);
#endif
    for (; i < n; ++i) out[i] = fp16_to_f32(in[i]) * s;
  }
}

void float_to_half(int dtype, const float* __restrict__ in, void* out_v, size_t n,
                   double scale) {
  uint16_t* __restrict__ out = static_cast<uint16_t*>(out_v);
  const float s = float(scale);
  if (dtype == COMMLIB_BFLOAT16) {
    for (size_t i = 0; i < n; ++i) out[i] = f32_to_bf16(in[i] * s);
  } else {
    size_t i = 0;
#if defined(__x86_64__)
    if (have_f16c()) i = f32_to_fp16_f16c(in, out, n, s);
#endif
    for (; i < n; ++i) out[i] = f32_to_fp16(in[i] * s);
  }
}

}  // namespace commlib
