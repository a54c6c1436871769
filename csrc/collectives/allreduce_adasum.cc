// Adasum (Maleki et al., "Scaling Distributed Training with Adaptive
// Summation", MLSys 2021; Horovod's op=Adasum): ranks combine their values
// pairwise along the recursive-doubling tree of pairwise_tree.h. Two values
// a (the lower block of ranks) and b (the higher block) combine, per tensor,
// as
//     acoeff * a + bcoeff * b,   acoeff = 1 - a.b / (2 |a|^2),
//                                bcoeff = 1 - a.b / (2 |b|^2),
// with a coefficient of 1 where its squared norm is below 1e-8. Orthogonal
// values add up, equal ones average; the dot products and norms are taken in
// float64 over the whole tensor, and the result is computed in float64 and
// rounded once to the buffer's type.
//
// Ranks beyond a power of two. Horovod refuses them; here the tree's
// fold-in applies: with p the largest power of two <= n and rem = n - p,
// ranks 2k and 2k+1 (k < rem) first combine as a = x[2k], b = x[2k+1], then
// the p values combine along the tree (lower virtual ranks as a), and the
// result goes back to the ranks that folded in. For a power of two this is
// Horovod's order exactly: at level l = 1, 2, 4, .. rank r's group combines
// with group r ^ l.
//
// The first version exchanges whole buffers each level (Horovod halves the
// vector each level and all-reduces the partial dot products instead).
// Both partners evaluate combine(lower, higher) with the same code on the
// same bits, so every rank ends with a bitwise identical result.
#include <vector>

#include "base/common.h"
#include "collectives/allreduce.h"
#include "collectives/pairwise_tree.h"

namespace commlib {
namespace {

constexpr double kMinNormSq = 1e-8;

// lower = combine(lower, higher) over n elements of one tensor. The sums run
// in four fixed lanes (element i in lane i % 4, lanes added in one order):
// the same order on every rank whatever the buffers' alignment.
template <typename T>
void combine_tensor(T* a, const T* b, size_t n) {
  double dot[4] = {0, 0, 0, 0}, an[4] = {0, 0, 0, 0}, bn[4] = {0, 0, 0, 0};
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (size_t k = 0; k < 4; ++k) {
      const double x = a[i + k], y = b[i + k];
      dot[k] += x * y;
      an[k] += x * x;
      bn[k] += y * y;
    }
  }
  for (size_t k = 0; i < n; ++i, ++k) {
    const double x = a[i], y = b[i];
    dot[k] += x * y;
    an[k] += x * x;
    bn[k] += y * y;
  }
  const double d = (dot[0] + dot[1]) + (dot[2] + dot[3]);
  const double asq = (an[0] + an[1]) + (an[2] + an[3]);
  const double bsq = (bn[0] + bn[1]) + (bn[2] + bn[3]);
  const double acoeff = asq >= kMinNormSq ? 1.0 - d / asq / 2.0 : 1.0;
  const double bcoeff = bsq >= kMinNormSq ? 1.0 - d / bsq / 2.0 : 1.0;
  for (size_t j = 0; j < n; ++j) a[j] = static_cast<T>(acoeff * double(a[j]) + bcoeff * double(b[j]));
}

template <typename T>
void combine_all(char* lower, const char* higher, const std::vector<size_t>& counts) {
  T* a = reinterpret_cast<T*>(lower);
  const T* b = reinterpret_cast<const T*>(higher);
  for (size_t c : counts) {
    combine_tensor(a, b, c);
    a += c;
    b += c;
  }
}

}  // namespace

void allreduce_adasum(Transport& t, void* buf, int dtype, const std::vector<size_t>& counts) {
  if (dtype != COMMLIB_FLOAT32 && dtype != COMMLIB_FLOAT64) {
    throw Error(COMMLIB_ERR_INTERNAL, std::string("allreduce_adasum on ") + dtype_name(dtype));
  }
  size_t count = 0;
  for (size_t c : counts) count += c;
  pairwise_tree(t, buf, count * dtype_size(dtype), [&](char* lower, char* higher) {
    if (dtype == COMMLIB_FLOAT32) {
      combine_all<float>(lower, higher, counts);
    } else {
      combine_all<double>(lower, higher, counts);
    }
    return lower;
  });
}

}  // namespace commlib
