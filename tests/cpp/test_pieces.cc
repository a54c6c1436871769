// A reduce-scatter's input in pieces (csrc/base/pieces.h): every
// window [first, first + n) of the virtual buffer reads as the packed buffer
// would, through copy() and for_each() alike, with NULL pieces as zeros,
// empty pieces skipped, and windows that start and end inside pieces.
//
// csrc: base/pieces.cc
#include <cstdint>
#include <random>
#include <vector>

#include "base/pieces.h"
#include "check.h"

using commlib::Piece;
using commlib::PieceInput;

namespace {

// Random pieces over `total` int32 elements; `packed` gets what they stand for.
std::vector<Piece> make_pieces(std::mt19937& rng, size_t total, std::vector<int32_t>* storage,
                               std::vector<int32_t>* packed) {
  storage->resize(total);
  packed->assign(total, 0);
  std::vector<Piece> pieces;
  size_t at = 0;
  while (at < total) {
    const size_t n = std::min(total - at, size_t(rng() % 9));  // 0..8 elements, empties too
    const bool zeros = rng() % 3 == 0;
    for (size_t i = 0; i < n; ++i) {
      (*storage)[at + i] = int32_t(1000 + at + i);
      if (!zeros) (*packed)[at + i] = int32_t(1000 + at + i);
    }
    pieces.push_back({zeros ? nullptr : storage->data() + at, n});
    at += n;
  }
  return pieces;
}

}  // namespace

TEST_CASE("pieces read as the packed buffer") {
  std::mt19937 rng(5);
  for (int round = 0; round < 40; ++round) {
    const size_t total = 1 + rng() % 60;
    std::vector<int32_t> storage, packed;
    const std::vector<Piece> pieces = make_pieces(rng, total, &storage, &packed);
    const PieceInput in(pieces, sizeof(int32_t));
    CHECK_EQ(in.elements(), total);
    for (size_t first = 0; first <= total; ++first) {
      for (size_t n = 0; first + n <= total; ++n) {
        std::vector<int32_t> got(n + 1, -7);
        in.copy(first, n, got.data());
        bool same = got[n] == -7;  // nothing written past the window
        for (size_t i = 0; i < n; ++i) same = same && got[i] == packed[first + i];
        std::vector<int32_t> walked(n, -7);
        size_t covered = 0;
        in.for_each(first, n, [&](const void* src, size_t k, size_t at) {
          same = same && at == covered && k > 0;
          for (size_t i = 0; i < k; ++i) walked[at + i] = src ? static_cast<const int32_t*>(src)[i] : 0;
          covered += k;
        });
        same = same && covered == n;
        for (size_t i = 0; i < n; ++i) same = same && walked[i] == packed[first + i];
        CHECK(same);
        if (!same) return;
      }
    }
  }
}

TEST_CASE("one buffer is contiguous") {
  std::vector<float> x = {1, 2, 3};
  const PieceInput one(x.data(), x.size(), sizeof(float));
  CHECK(one.contiguous() == x.data());
  const PieceInput two(std::vector<Piece>{{x.data(), 2}, {x.data() + 2, 1}}, sizeof(float));
  CHECK(two.contiguous() == nullptr);
  const PieceInput zeros(std::vector<Piece>{{nullptr, 3}}, sizeof(float));
  CHECK(zeros.contiguous() == nullptr);
  const PieceInput empty(std::vector<Piece>{{nullptr, 0}}, sizeof(float));
  CHECK_EQ(empty.elements(), size_t(0));
  empty.copy(0, 0, nullptr);  // an empty window touches nothing
}

CHECK_MAIN()
