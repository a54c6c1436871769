// Shared-memory reduce-scatter: per window of elements [a, b), every rank
// copies its input window into its region and posts; rank r then reduces the
// part of its own slice that falls in the window, reading every rank's region
// (in rank order), straight into its output. Each element is reduced by one
// rank only; per rank: one copy of the input in, one pass over its slice.
#include <algorithm>
#include <cstring>

#include "backends/shm/shm_block.h"
#include "collectives/shm_collectives.h"
#include "common.h"
#include "reduce.h"

namespace commlib {

void reducescatter_shm(ShmSegment& shm, const void* in, void* out, const std::vector<size_t>& counts,
                       int dtype, int op) {
  const int P = shm.size(), me = shm.rank();
  const size_t esize = dtype_size(dtype);
  size_t total = 0, lo = 0;
  for (int r = 0; r < P; ++r) {
    if (r == me) lo = total;
    total += counts[r];
  }
  const size_t hi = lo + counts[me];  // my slice [lo, hi) of the reduced vector
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  for (size_t a = 0; a < total;) {
    ShmBlock blk(shm);
    const size_t b = std::min(total, a + blk.capacity() / esize);
    std::memcpy(blk.mine(), src + a * esize, (b - a) * esize);
    blk.post();
    blk.wait_all_posted();
    const size_t s = std::max(a, lo), e = std::min(b, hi);
    if (s < e) {
      char* o = dst + (s - lo) * esize;
      std::memcpy(o, blk.region(0) + (s - a) * esize, (e - s) * esize);
      for (int r = 1; r < P; ++r) reduce_into(dtype, op, o, blk.region(r) + (s - a) * esize, e - s);
    }
    blk.finish();
    a = b;
  }
}

}  // namespace commlib
