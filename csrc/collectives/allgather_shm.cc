// Shared-memory allgather: per window of W bytes (kShmWindowBytes), every rank
// copies bytes [a, a+W) of its contribution into its region and posts; then
// every rank copies every other rank's window straight into its output (two
// slots: while others still read window w, a rank fills window w+1).
// Contributions may differ in size: windows run over the largest one.
#include <algorithm>
#include <cstring>

#include "backends/shm/shm_block.h"
#include "collectives/shm_collectives.h"

namespace commlib {

void allgather_shm(ShmSegment& shm, const void* in, void* out, const std::vector<size_t>& bytes) {
  const int P = shm.size(), me = shm.rank();
  std::vector<size_t> displ(P, 0);
  size_t largest = 0;
  for (int r = 0; r < P; ++r) {
    if (r > 0) displ[r] = displ[r - 1] + bytes[r - 1];
    largest = std::max(largest, bytes[r]);
  }
  char* dst = static_cast<char*>(out);
  if (dst + displ[me] != in) std::memcpy(dst + displ[me], in, bytes[me]);  // my own part needs no staging
  for (size_t a = 0; a < largest;) {
    ShmBlock blk(shm);
    const size_t w = std::min(std::min(blk.capacity(), kShmWindowBytes), largest - a);
    auto part = [&](int r) { return a < bytes[r] ? std::min(w, bytes[r] - a) : size_t(0); };
    std::memcpy(blk.mine(), static_cast<const char*>(in) + a, part(me));
    blk.post();
    for (int r = 0; r < P; ++r) {
      if (r == me) continue;
      blk.wait_posted(r);
      std::memcpy(dst + displ[r] + a, blk.region(r), part(r));
    }
    blk.finish();
    a += w;
  }
}

}  // namespace commlib
