// The GPU emulator's reductions (test infrastructure, never shipped):
// element-wise ncclRedOp over NCCL's data types, as NCCL defines them:
// ncclAvg divides the sum by the number of ranks (integers: truncating; floating
// point: every input multiplied by 1/n, then summed), a PreMulSum multiplies
// every input by its scalar before summing. Half types are computed in float
// and rounded to their type after each step.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace emu {

enum : int { kInt8, kUint8, kInt32, kUint32, kInt64, kUint64, kFloat16, kFloat32, kFloat64, kBfloat16 };
enum : int { kSum, kProd, kMax, kMin, kAvg, kPreMulSum = 1000 };

inline size_t dtype_bytes(int dt) {
  switch (dt) {
    case kInt8: case kUint8: return 1;
    case kFloat16: case kBfloat16: return 2;
    case kInt32: case kUint32: case kFloat32: return 4;
    case kInt64: case kUint64: case kFloat64: return 8;
    default: return 0;
  }
}

inline float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float mag;
  if (exp == 0) mag = std::ldexp(float(man), -24);
  else if (exp == 31) mag = man ? NAN : INFINITY;
  else mag = std::ldexp(float(man | 0x400), int(exp) - 25);
  uint32_t bits;
  std::memcpy(&bits, &mag, 4);
  bits |= sign;
  std::memcpy(&mag, &bits, 4);
  return mag;
}

inline uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000);
  const float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00;
  if (a >= 65520.0f) return sign | 0x7c00;
  if (a < 6.103515625e-05f) return sign | uint16_t(std::nearbyint(a * 16777216.0f));  // subnormal: units of 2^-24
  int e;
  const float m = std::frexp(a, &e);                          // a = m * 2^e, m in [0.5, 1)
  const uint32_t man = uint32_t(std::nearbyint(m * 2048.0f));  // 11 significant bits, rounded to even
  return uint16_t(sign | ((uint32_t(e + 14) << 10) + man - 1024));  // (a carry into the exponent is right)
}

inline float bf16_to_float(uint16_t h) {
  const uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t float_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if (std::isnan(f)) return uint16_t((x >> 16) | 0x40);
  x += 0x7fff + ((x >> 16) & 1);
  return uint16_t(x >> 16);
}

// The element type's arithmetic: Half and Bf16 as float.
template <typename T> struct Arith {
  using V = T;
  static V get(const void* p, size_t i) { return static_cast<const T*>(p)[i]; }
  static void put(void* p, size_t i, V v) { static_cast<T*>(p)[i] = v; }
};
struct Half {};
struct Bf16 {};
template <> struct Arith<Half> {
  using V = float;
  static V get(const void* p, size_t i) { return half_to_float(static_cast<const uint16_t*>(p)[i]); }
  static void put(void* p, size_t i, V v) { static_cast<uint16_t*>(p)[i] = float_to_half(v); }
};
template <> struct Arith<Bf16> {
  using V = float;
  static V get(const void* p, size_t i) { return bf16_to_float(static_cast<const uint16_t*>(p)[i]); }
  static void put(void* p, size_t i, V v) { static_cast<uint16_t*>(p)[i] = float_to_bf16(v); }
};

// v rounded to T's precision (a no-op but for the half types).
template <typename T, typename V>
V round_to(V v) {
  if constexpr (std::is_same<T, Half>::value) return half_to_float(float_to_half(v));
  if constexpr (std::is_same<T, Bf16>::value) return bf16_to_float(float_to_bf16(v));
  return v;
}

template <typename T>
void reduce_typed(void* out, const void* const* inputs, int nin, size_t n, int op, const void* scalar) {
  using A = Arith<T>;
  using V = typename A::V;
  constexpr bool floating = !std::is_integral<V>::value;
  V factor = V(1);
  if (op == kPreMulSum) factor = A::get(scalar, 0);
  if (op == kAvg && floating) factor = V(1) / V(nin);
  const bool premul = op == kPreMulSum || (op == kAvg && floating);
  for (size_t i = 0; i < n; ++i) {
    V acc = A::get(inputs[0], i);
    if (premul) acc = round_to<T>(acc * factor);
    for (int r = 1; r < nin; ++r) {
      V x = A::get(inputs[r], i);
      switch (op) {
        case kProd: acc = acc * x; break;
        case kMax: acc = x > acc ? x : acc; break;
        case kMin: acc = x < acc ? x : acc; break;
        default:
          if (premul) x = round_to<T>(x * factor);
          acc = acc + x;
      }
      acc = round_to<T>(acc);
    }
    if (op == kAvg && !floating) acc = acc / V(nin);
    A::put(out, i, acc);
  }
}

// out[i] = op over inputs[0..nin)[i] (rank order), n elements of dt; false
// for an unknown type. scalar: the PreMulSum factor, in dt.
inline bool reduce(int dt, int op, void* out, const void* const* inputs, int nin, size_t n, const void* scalar) {
  switch (dt) {
    case kInt8: reduce_typed<int8_t>(out, inputs, nin, n, op, scalar); return true;
    case kUint8: reduce_typed<uint8_t>(out, inputs, nin, n, op, scalar); return true;
    case kInt32: reduce_typed<int32_t>(out, inputs, nin, n, op, scalar); return true;
    case kUint32: reduce_typed<uint32_t>(out, inputs, nin, n, op, scalar); return true;
    case kInt64: reduce_typed<int64_t>(out, inputs, nin, n, op, scalar); return true;
    case kUint64: reduce_typed<uint64_t>(out, inputs, nin, n, op, scalar); return true;
    case kFloat16: reduce_typed<Half>(out, inputs, nin, n, op, scalar); return true;
    case kFloat32: reduce_typed<float>(out, inputs, nin, n, op, scalar); return true;
    case kFloat64: reduce_typed<double>(out, inputs, nin, n, op, scalar); return true;
    case kBfloat16: reduce_typed<Bf16>(out, inputs, nin, n, op, scalar); return true;
    default: return false;
  }
}

}  // namespace emu
