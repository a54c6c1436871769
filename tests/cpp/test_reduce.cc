// The reduction kernels (csrc/reduce.h): the fused reduce-and-scale that the
// shared-memory all-reduce applies to its pieces (Average's 1/N, postscale)
// gives bit for bit what the reduction followed by scale_buffer gives, for
// every op and the dtypes it fuses (and falls back for the others); half
// types reduce as float32 and round back once per call.
//
// csrc: base/reduce.cc base/common.cc base/half.cc
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "base/common.h"
#include "base/half.h"
#include "base/reduce.h"
#include "check.h"

namespace {

template <typename T>
std::vector<T> values(size_t n, uint64_t seed) {
  std::vector<T> v(n);
  uint64_t s = seed;
  for (auto& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const double u = double(s >> 11) / double(1ull << 53);  // [0, 1)
    x = static_cast<T>(std::is_floating_point_v<T> ? (u - 0.5) * 1e3 : u * 200.0);
  }
  return v;
}

template <typename T>
void check_fused_equals_two_passes(int dtype, int op, double scale) {
  const size_t n = 1037;  // (not a multiple of any vector width)
  const std::vector<T> a = values<T>(n, 1), b = values<T>(n, 2);
  std::vector<T> want = a, got = a, copy(n, T(0));
  commlib::reduce_into(dtype, op, want.data(), b.data(), n);
  commlib::scale_buffer(dtype, want.data(), n, scale);
  commlib::reduce_into_and_copy_scaled(dtype, op, got.data(), b.data(), copy.data(), n, scale);
  CHECK(std::memcmp(want.data(), got.data(), n * sizeof(T)) == 0);
  CHECK(std::memcmp(want.data(), copy.data(), n * sizeof(T)) == 0);
  std::vector<T> no_copy = a;  // (copy is optional)
  commlib::reduce_into_and_copy_scaled(dtype, op, no_copy.data(), b.data(), nullptr, n, scale);
  CHECK(std::memcmp(want.data(), no_copy.data(), n * sizeof(T)) == 0);
}

const int kOps[] = {COMMLIB_SUM, COMMLIB_MIN, COMMLIB_MAX, COMMLIB_PRODUCT};
const double kScales[] = {1.0, 0.5, 1.0 / 3.0, 0.1, 2.5};

}  // namespace

TEST_CASE("reduce: fused reduce-and-scale of float32 is bit for bit the two passes") {
  for (int op : kOps)
    for (double s : kScales) check_fused_equals_two_passes<float>(COMMLIB_FLOAT32, op, s);
}

TEST_CASE("reduce: fused reduce-and-scale of float64 is bit for bit the two passes") {
  for (int op : kOps)
    for (double s : kScales) check_fused_equals_two_passes<double>(COMMLIB_FLOAT64, op, s);
}

TEST_CASE("reduce: integers fall back to the two passes") {
  for (int op : kOps)
    for (double s : kScales) {
      check_fused_equals_two_passes<int32_t>(COMMLIB_INT32, op, s);
      check_fused_equals_two_passes<int64_t>(COMMLIB_INT64, op, s);
      check_fused_equals_two_passes<uint8_t>(COMMLIB_UINT8, op, s);
    }
}

TEST_CASE("reduce: Average of two ranks, scaled in the reduction") {
  const float a[3] = {1.0f, -3.0f, 0.25f}, b[3] = {2.0f, 5.0f, 0.5f};
  float acc[3], out[3];
  std::memcpy(acc, a, sizeof(a));
  commlib::reduce_into_and_copy_scaled(COMMLIB_FLOAT32, COMMLIB_SUM, acc, b, out, 3, 0.5);
  CHECK_EQ(acc[0], 1.5f);
  CHECK_EQ(acc[1], 1.0f);
  CHECK_EQ(acc[2], 0.375f);
  CHECK(std::memcmp(acc, out, sizeof(acc)) == 0);
}

TEST_CASE("reduce: half types widen to float32, reduce and scale there, and round back once") {
  const size_t n = 2500;  // (several float32 blocks, and a tail for the vector converters)
  const std::vector<float> fa = values<float>(n, 3), fb = values<float>(n, 4);
  for (int dtype : {COMMLIB_FLOAT16, COMMLIB_BFLOAT16}) {
    std::vector<uint16_t> a(n), b(n);
    commlib::float_to_half(dtype, fa.data(), a.data(), n, 1e-3);  // (values within float16's range)
    commlib::float_to_half(dtype, fb.data(), b.data(), n, 1e-3);
    for (int op : kOps)
      for (double s : kScales) {
        std::vector<float> wa(n), wb(n);
        commlib::half_to_float(dtype, a.data(), wa.data(), n, 1.0);
        commlib::half_to_float(dtype, b.data(), wb.data(), n, 1.0);
        commlib::reduce_into_and_copy_scaled(COMMLIB_FLOAT32, op, wa.data(), wb.data(), nullptr, n, s);
        std::vector<uint16_t> want(n), got = a, copy(n, 0);
        commlib::float_to_half(dtype, wa.data(), want.data(), n, 1.0);
        commlib::reduce_into_and_copy_scaled(dtype, op, got.data(), b.data(), copy.data(), n, s);
        CHECK(got == want);
        CHECK(copy == want);
        if (s == 1.0) {
          std::vector<uint16_t> plain = a;
          commlib::reduce_into(dtype, op, plain.data(), b.data(), n);
          CHECK(plain == want);
        }
      }
    std::vector<uint16_t> scaled = a, want(n);
    std::vector<float> wa(n);
    commlib::half_to_float(dtype, a.data(), wa.data(), n, 0.1);
    commlib::float_to_half(dtype, wa.data(), want.data(), n, 1.0);
    commlib::scale_buffer(dtype, scaled.data(), n, 0.1);
    CHECK(scaled == want);
  }
  // float16: 1 + 2^-11 is a tie between 1 and 1 + 2^-10; it rounds to even.
  const uint16_t one = 0x3c00, tiny = 0x1000;  // 1.0, 2^-11
  uint16_t acc = one;
  commlib::reduce_into(COMMLIB_FLOAT16, COMMLIB_SUM, &acc, &tiny, 1);
  CHECK_EQ(acc, one);
  acc = tiny;
  commlib::reduce_into(COMMLIB_FLOAT16, COMMLIB_SUM, &acc, &tiny, 1);
  CHECK_EQ(acc, uint16_t(0x1400));  // 2^-10
}

template <typename T>
void check_nan_wins(int dtype) {
  const T nan = std::numeric_limits<T>::quiet_NaN();
  const T a[4] = {nan, T(1), nan, T(-2)}, b[4] = {T(3), nan, nan, T(5)};
  for (int op : {COMMLIB_MIN, COMMLIB_MAX})
    for (double s : {1.0, 0.5}) {
      T acc[4], copy[4];
      std::memcpy(acc, a, sizeof(a));
      commlib::reduce_into_and_copy_scaled(dtype, op, acc, b, copy, 4, s);
      CHECK(std::isnan(acc[0]) && std::isnan(acc[1]) && std::isnan(acc[2]));
      CHECK_EQ(acc[3], T((op == COMMLIB_MIN ? -2 : 5) * s));
      CHECK(std::isnan(copy[1]));
    }
}

TEST_CASE("reduce: Min and Max keep a NaN of either side") {
  check_nan_wins<float>(COMMLIB_FLOAT32);
  check_nan_wins<double>(COMMLIB_FLOAT64);
  for (int dtype : {COMMLIB_FLOAT16, COMMLIB_BFLOAT16}) {
    const float f[2] = {std::nanf(""), 1.0f};
    uint16_t a[2], b[2];
    commlib::float_to_half(dtype, f, a, 2, 1.0);
    b[0] = a[1];
    b[1] = a[0];  // (NaN first on one side, then on the other)
    for (int op : {COMMLIB_MIN, COMMLIB_MAX}) {
      uint16_t acc[2] = {a[0], a[1]};
      commlib::reduce_into(dtype, op, acc, b, 2);
      float back[2];
      commlib::half_to_float(dtype, acc, back, 2, 1.0);
      CHECK(std::isnan(back[0]) && std::isnan(back[1]));
    }
  }
}

TEST_CASE("reduce: Min and Max of two zeros are -0 and +0 in either order") {
  for (int op : {COMMLIB_MIN, COMMLIB_MAX})
    for (bool flip : {false, true}) {
      float acc = flip ? -0.0f : 0.0f;
      const float in = flip ? 0.0f : -0.0f;
      commlib::reduce_into(COMMLIB_FLOAT32, op, &acc, &in, 1);
      CHECK_EQ(acc, 0.0f);
      CHECK_EQ(std::signbit(acc), op == COMMLIB_MIN);
    }
}

TEST_CASE("reduce: Adasum is a reduction of floating-point dtypes only") {
  for (int dtype : {COMMLIB_FLOAT16, COMMLIB_BFLOAT16, COMMLIB_FLOAT32, COMMLIB_FLOAT64})
    CHECK(commlib::reduction_supported(dtype, COMMLIB_ADASUM));
  for (int dtype : {COMMLIB_INT32, COMMLIB_UINT8, COMMLIB_BOOL, COMMLIB_INT64})
    CHECK(!commlib::reduction_supported(dtype, COMMLIB_ADASUM));
  CHECK(!commlib::reduction_supported(COMMLIB_FLOAT32, COMMLIB_ADASUM + 1));
}

CHECK_MAIN()
