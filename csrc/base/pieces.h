// A reduce-scatter's input read in place from consecutive pieces (the
// parameters' gradients of a ZeRO bucket, its padding) as if they were one
// contiguous buffer, so that nobody packs them first.
#pragma once

#include <cstddef>
#include <vector>

namespace commlib {

// `elements` elements at `data`; data == nullptr: that many zeros.
struct Piece {
  const void* data;
  size_t elements;
};

class PieceInput {
 public:
  // One contiguous buffer.
  PieceInput(const void* data, size_t elements, size_t esize);
  // The pieces end to end (their elements sum to the input's).
  PieceInput(const std::vector<Piece>& pieces, size_t esize);

  size_t esize() const { return esize_; }
  size_t elements() const { return starts_.back(); }
  // The one buffer, or nullptr when there are several pieces or zeros.
  const void* contiguous() const;
  // Copies elements [first, first + n) into dst (zeros where a piece has none).
  void copy(size_t first, size_t n, void* dst) const;
  // Calls f(src, count, at) for the parts of [first, first + n) in order;
  // src == nullptr for zeros; at counts from first.
  template <class F>
  void for_each(size_t first, size_t n, F f) const;

 private:
  size_t piece_at(size_t element) const;

  std::vector<Piece> pieces_;
  std::vector<size_t> starts_;  // starts_[i]: first element of piece i; back(): the total
  size_t esize_;
};

template <class F>
void PieceInput::for_each(size_t first, size_t n, F f) const {
  if (n == 0) return;
  size_t i = piece_at(first), done = 0;
  while (done < n) {
    const size_t at = first + done, end = starts_[i + 1];
    const size_t k = (end - at < n - done) ? end - at : n - done;
    if (k > 0) {
      const char* base = static_cast<const char*>(pieces_[i].data);
      f(base ? base + (at - starts_[i]) * esize_ : nullptr, k, done);
    }
    done += k;
    ++i;
  }
}

}  // namespace commlib
