#include "base/fusion_buffer.h"

#include <cstdint>

namespace commlib {

char* FusionBuffer::get(size_t bytes) {
  const size_t need = bytes + 64;
  if (storage_.size() < need) {
    // Grow geometrically; resize() zero-fills, which pre-touches the pages.
    size_t cap = storage_.size() ? storage_.size() : (size_t(1) << 20);
    while (cap < need) cap *= 2;
    storage_.clear();
    storage_.shrink_to_fit();
    storage_.resize(cap);
  }
  const uintptr_t p = reinterpret_cast<uintptr_t>(storage_.data());
  return reinterpret_cast<char*>((p + 63) & ~uintptr_t(63));
}

}  // namespace commlib
