// Shared-memory alltoall: per window (kShmWindowBytes, W bytes for each rank),
// every rank copies into its region the next W bytes of each block it sends
// to another rank (piece d of the region: its block for rank d) and posts;
// then every rank copies its piece of every other rank's region straight into
// its output. Each byte is copied twice,
// the first copy by the rank that sends it and the second by the one that
// receives it, all ranks at once. A rank's block for itself is copied
// directly. Windows run over the largest block of the whole matrix, so every
// rank runs the same number of them.
#include <algorithm>
#include <cstring>

#include "backends/shm/shm_block.h"
#include "collectives/shm_collectives.h"

namespace commlib {

void alltoall_shm(ShmSegment& shm, const void* in, const std::vector<size_t>& send, void* out,
                  const std::vector<size_t>& recv, size_t largest) {
  const int P = shm.size(), me = shm.rank();
  std::vector<size_t> sd(P, 0), rd(P, 0);
  for (int r = 1; r < P; ++r) {
    sd[r] = sd[r - 1] + send[r - 1];
    rd[r] = rd[r - 1] + recv[r - 1];
  }
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  if (send[me] > 0) std::memcpy(dst + rd[me], src + sd[me], send[me]);
  // (64-byte pieces at least: the region holds that many for every rank)
  const size_t w = std::max<size_t>(64, std::min(shm.region_bytes(), kShmWindowBytes) / size_t(P) / 64 * 64);
  auto part = [w](size_t block, size_t a) { return a < block ? std::min(w, block - a) : size_t(0); };
  for (size_t a = 0; a < largest; a += w) {
    ShmBlock blk(shm);
    for (int d = 0; d < P; ++d) {
      const size_t n = part(send[d], a);
      if (d != me && n > 0) std::memcpy(blk.mine() + size_t(d) * w, src + sd[d] + a, n);
    }
    blk.post();
    for (int k = 1; k < P; ++k) {  // starting after this rank, so that ranks read different regions first
      const int s = (me + k) % P;
      blk.wait_posted(s);
      const size_t n = part(recv[s], a);
      if (n > 0) std::memcpy(dst + rd[s] + a, blk.region(s) + size_t(me) * w, n);
    }
    blk.finish();
  }
}

}  // namespace commlib
