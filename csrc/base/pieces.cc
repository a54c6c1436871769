#include "base/pieces.h"

#include <algorithm>
#include <cstring>

namespace commlib {

PieceInput::PieceInput(const void* data, size_t elements, size_t esize)
    : PieceInput(std::vector<Piece>{{data, elements}}, esize) {}

PieceInput::PieceInput(const std::vector<Piece>& pieces, size_t esize) : esize_(esize) {
  starts_.push_back(0);
  for (const Piece& p : pieces) {
    if (p.elements == 0) continue;
    pieces_.push_back(p);
    starts_.push_back(starts_.back() + p.elements);
  }
}

const void* PieceInput::contiguous() const {
  if (pieces_.empty()) return nullptr;
  return pieces_.size() == 1 ? pieces_[0].data : nullptr;
}

size_t PieceInput::piece_at(size_t element) const {
  // the last piece whose start is <= element
  auto it = std::upper_bound(starts_.begin(), starts_.end() - 1, element);
  return size_t(it - starts_.begin()) - 1;
}

void PieceInput::copy(size_t first, size_t n, void* dst) const {
  char* out = static_cast<char*>(dst);
  for_each(first, n, [&](const void* src, size_t k, size_t at) {
    if (src) {
      std::memcpy(out + at * esize_, src, k * esize_);
    } else {
      std::memset(out + at * esize_, 0, k * esize_);
    }
  });
}

}  // namespace commlib
