// float16 / bfloat16 <-> float32 conversion (round to nearest even), used to
// reduce half-precision tensors with float32 accumulation.
#pragma once

#include <cstddef>

namespace commlib {

// out[i] = float(in[i]) * scale, for dtype COMMLIB_FLOAT16 or COMMLIB_BFLOAT16.
void half_to_float(int dtype, const void* in, float* out, size_t n, double scale);
// out[i] = half(in[i] * scale).
void float_to_half(int dtype, const float* in, void* out, size_t n, double scale);

}  // namespace commlib
