// The persistent fusion buffer: many small tensors are packed into it and
// reduced as one message. It only grows, and new memory is touched once when
// it is allocated (a page fault costs ~2 us per 4 KiB page on this class of
// machine, so a fresh buffer per call would cost more than the reduction).
#pragma once

#include <cstddef>
#include <vector>

namespace commlib {

class FusionBuffer {
 public:
  // A buffer of at least bytes, 64-byte aligned; valid until the next get().
  char* get(size_t bytes);

 private:
  std::vector<char> storage_;
};

}  // namespace commlib
