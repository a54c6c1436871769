#include "base/reduce.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "base/common.h"
#include "base/half.h"

namespace commlib {
namespace {

// acc[i] = f(acc[i], in[i]) and, when copy is not null, copy[i] = acc[i].
// Two loops rather than a branch inside one, so each vectorises.
template <typename T, typename F>
void apply(void* acc_v, const void* in_v, void* copy_v, size_t n, F f) {
  T* __restrict__ acc = static_cast<T*>(acc_v);
  const T* __restrict__ in = static_cast<const T*>(in_v);
  if (copy_v) {
    T* __restrict__ copy = static_cast<T*>(copy_v);
    for (size_t i = 0; i < n; ++i) {
      const T v = f(acc[i], in[i]);
      acc[i] = v;
      copy[i] = v;
    }
  } else {
    for (size_t i = 0; i < n; ++i) acc[i] = f(acc[i], in[i]);
  }
}

// Integer sums and products wrap around (as in C, numpy and MPI): computed in
// an unsigned type at least as wide as unsigned int, so that neither signed
// overflow nor the promotion of small types to int (uint16 * uint16) is
// undefined behaviour.
template <typename T, bool = std::is_integral_v<T>>
struct WrapOf {
  using type = T;
};
template <typename T>
struct WrapOf<T, true> {
  using type = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
};
template <typename T>
using Wrap = typename WrapOf<T>::type;

// Min and Max give the same bits whichever operand comes first, so that every
// rank holds the same result however an algorithm (or MPI) orders the ranks'
// values: a NaN of either side wins (as numpy's minimum and maximum), and of
// two zeros Min takes -0 and Max +0.
template <typename T>
inline T min_of(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    return (b < a || b != b || (b == a && std::signbit(b))) ? b : a;
  } else {
    return b < a ? b : a;
  }
}
template <typename T>
inline T max_of(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    return (a < b || b != b || (b == a && !std::signbit(b))) ? b : a;
  } else {
    return a < b ? b : a;
  }
}

template <typename T>
void reduce_typed(int op, void* acc, const void* in, void* copy, size_t n) {
  using W = Wrap<T>;
  switch (op) {
    case COMMLIB_SUM:
      apply<T>(acc, in, copy, n, [](T a, T b) { return static_cast<T>(W(a) + W(b)); });
      return;
    case COMMLIB_MIN:
      apply<T>(acc, in, copy, n, [](T a, T b) { return min_of(a, b); });
      return;
    case COMMLIB_MAX:
      apply<T>(acc, in, copy, n, [](T a, T b) { return max_of(a, b); });
      return;
    case COMMLIB_PRODUCT:
      apply<T>(acc, in, copy, n, [](T a, T b) { return static_cast<T>(W(a) * W(b)); });
      return;
    default:
      throw Error(COMMLIB_ERR_TYPE, std::string("unsupported reduction op ") +
                                        reduce_op_name(op));
  }
}

// bool: Sum/Max are logical or, Product/Min are logical and.
void reduce_bool(int op, void* acc, const void* in, void* copy, size_t n) {
  if (op == COMMLIB_SUM || op == COMMLIB_MAX) {
    apply<uint8_t>(acc, in, copy, n, [](uint8_t a, uint8_t b) { return uint8_t(a | b); });
  } else if (op == COMMLIB_PRODUCT || op == COMMLIB_MIN) {
    apply<uint8_t>(acc, in, copy, n, [](uint8_t a, uint8_t b) { return uint8_t(a & b); });
  } else {
    throw Error(COMMLIB_ERR_TYPE, "unsupported reduction op for bool");
  }
}

// Floating point: (acc op in) * f in one pass, the same operations in the
// same order as the reduction followed by scale_typed.
template <typename T, typename F>
void apply_scaled(void* acc_v, const void* in_v, void* copy_v, size_t n, T f, F op) {
  T* __restrict__ acc = static_cast<T*>(acc_v);
  const T* __restrict__ in = static_cast<const T*>(in_v);
  T* __restrict__ copy = static_cast<T*>(copy_v);
  for (size_t i = 0; i < n; ++i) {
    const T v = op(acc[i], in[i]) * f;
    acc[i] = v;
    if (copy) copy[i] = v;
  }
}

template <typename T>
bool reduce_scaled_float(int op, void* acc, const void* in, void* copy, size_t n, double scale) {
  const T f = static_cast<T>(scale);
  switch (op) {
    case COMMLIB_SUM:
      apply_scaled<T>(acc, in, copy, n, f, [](T a, T b) { return a + b; });
      return true;
    case COMMLIB_MIN:
      apply_scaled<T>(acc, in, copy, n, f, [](T a, T b) { return min_of(a, b); });
      return true;
    case COMMLIB_MAX:
      apply_scaled<T>(acc, in, copy, n, f, [](T a, T b) { return max_of(a, b); });
      return true;
    case COMMLIB_PRODUCT:
      apply_scaled<T>(acc, in, copy, n, f, [](T a, T b) { return a * b; });
      return true;
    default:
      return false;
  }
}

template <typename T>
void scale_typed(void* buf_v, size_t n, double factor) {
  T* __restrict__ buf = static_cast<T*>(buf_v);
  if constexpr (std::is_floating_point_v<T>) {
    const T f = static_cast<T>(factor);
    for (size_t i = 0; i < n; ++i) buf[i] *= f;
  } else {
    for (size_t i = 0; i < n; ++i) buf[i] = static_cast<T>(static_cast<double>(buf[i]) * factor);
  }
}

// Half types (float16, bfloat16), for the algorithms that move them as they
// are: a block at a time widened to float32, reduced and scaled there, and
// rounded back once, so each step of an algorithm rounds its partial result
// to the half type (as NCCL's half reductions and Horovod's MPI float16 sum).
constexpr size_t kHalfBlock = 1024;

void reduce_half(int dtype, int op, void* acc_v, const void* in_v, void* copy_v, size_t n,
                 double scale) {
  uint16_t* acc = static_cast<uint16_t*>(acc_v);
  const uint16_t* in = static_cast<const uint16_t*>(in_v);
  uint16_t* copy = static_cast<uint16_t*>(copy_v);
  float a[kHalfBlock], b[kHalfBlock];
  for (size_t i = 0; i < n; i += kHalfBlock) {
    const size_t m = std::min(kHalfBlock, n - i);
    half_to_float(dtype, acc + i, a, m, 1.0);
    half_to_float(dtype, in + i, b, m, 1.0);
    if (!reduce_scaled_float<float>(op, a, b, nullptr, m, scale)) {
      throw Error(COMMLIB_ERR_TYPE, std::string("unsupported reduction op ") + reduce_op_name(op));
    }
    float_to_half(dtype, a, acc + i, m, 1.0);
    if (copy) std::memcpy(copy + i, acc + i, m * sizeof(uint16_t));
  }
}

void scale_half(int dtype, void* buf_v, size_t n, double factor) {
  uint16_t* buf = static_cast<uint16_t*>(buf_v);
  float a[kHalfBlock];
  for (size_t i = 0; i < n; i += kHalfBlock) {
    const size_t m = std::min(kHalfBlock, n - i);
    half_to_float(dtype, buf + i, a, m, factor);
    float_to_half(dtype, a, buf + i, m, 1.0);
  }
}

}  // namespace

bool reduction_supported(int dtype, int op) {
  if (!is_valid_dtype(dtype)) return false;
  if (op == COMMLIB_ADASUM) return is_float_dtype(dtype);
  if (op < COMMLIB_SUM || op > COMMLIB_PRODUCT) return false;
  if (dtype == COMMLIB_BOOL && op == COMMLIB_AVERAGE) return false;
  return true;
}

void reduce_into(int dtype, int op, void* acc, const void* in, size_t n) {
  reduce_into_and_copy(dtype, op, acc, in, nullptr, n);
}

void reduce_into_and_copy(int dtype, int op, void* acc, const void* in, void* copy, size_t n) {
  switch (dtype) {
    case COMMLIB_UINT8: return reduce_typed<uint8_t>(op, acc, in, copy, n);
    case COMMLIB_INT8: return reduce_typed<int8_t>(op, acc, in, copy, n);
    case COMMLIB_INT32: return reduce_typed<int32_t>(op, acc, in, copy, n);
    case COMMLIB_INT64: return reduce_typed<int64_t>(op, acc, in, copy, n);
    case COMMLIB_FLOAT32: return reduce_typed<float>(op, acc, in, copy, n);
    case COMMLIB_FLOAT64: return reduce_typed<double>(op, acc, in, copy, n);
    case COMMLIB_BOOL: return reduce_bool(op, acc, in, copy, n);
    case COMMLIB_INT16: return reduce_typed<int16_t>(op, acc, in, copy, n);
    case COMMLIB_UINT16: return reduce_typed<uint16_t>(op, acc, in, copy, n);
    case COMMLIB_UINT32: return reduce_typed<uint32_t>(op, acc, in, copy, n);
    case COMMLIB_UINT64: return reduce_typed<uint64_t>(op, acc, in, copy, n);
    case COMMLIB_FLOAT16:
    case COMMLIB_BFLOAT16: return reduce_half(dtype, op, acc, in, copy, n, 1.0);
    default:
      throw Error(COMMLIB_ERR_TYPE, std::string("reduce_into: unknown dtype ") + dtype_name(dtype));
  }
}

void scale_buffer(int dtype, void* buf, size_t n, double factor) {
  if (factor == 1.0) return;
  switch (dtype) {
    case COMMLIB_UINT8: return scale_typed<uint8_t>(buf, n, factor);
    case COMMLIB_INT8: return scale_typed<int8_t>(buf, n, factor);
    case COMMLIB_INT32: return scale_typed<int32_t>(buf, n, factor);
    case COMMLIB_INT64: return scale_typed<int64_t>(buf, n, factor);
    case COMMLIB_FLOAT32: return scale_typed<float>(buf, n, factor);
    case COMMLIB_FLOAT64: return scale_typed<double>(buf, n, factor);
    case COMMLIB_INT16: return scale_typed<int16_t>(buf, n, factor);
    case COMMLIB_UINT16: return scale_typed<uint16_t>(buf, n, factor);
    case COMMLIB_UINT32: return scale_typed<uint32_t>(buf, n, factor);
    case COMMLIB_UINT64: return scale_typed<uint64_t>(buf, n, factor);
    case COMMLIB_FLOAT16:
    case COMMLIB_BFLOAT16: return scale_half(dtype, buf, n, factor);
    default:
      throw Error(COMMLIB_ERR_TYPE, std::string("cannot scale dtype ") + dtype_name(dtype));
  }
}

void reduce_into_and_copy_scaled(int dtype, int op, void* acc, const void* in, void* copy, size_t n,
                                 double scale) {
  if (scale == 1.0) return reduce_into_and_copy(dtype, op, acc, in, copy, n);
  if (dtype == COMMLIB_FLOAT32 && reduce_scaled_float<float>(op, acc, in, copy, n, scale)) return;
  if (dtype == COMMLIB_FLOAT64 && reduce_scaled_float<double>(op, acc, in, copy, n, scale)) return;
  if (is_half_dtype(dtype)) return reduce_half(dtype, op, acc, in, copy, n, scale);
  reduce_into_and_copy(dtype, op, acc, in, nullptr, n);
  scale_buffer(dtype, acc, n, scale);
  if (copy) std::memcpy(copy, acc, n * dtype_size(dtype));
}

}  // namespace commlib
