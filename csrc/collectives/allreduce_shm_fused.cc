#include "collectives/allreduce_shm_fused.h"

#include <algorithm>
#include <cstring>

#include "base/common.h"
#include "base/reduce.h"
#include "collectives/allreduce_across.h"

namespace commlib {

void ShmFusedAllreduce::reduce(size_t count, int dtype, int op, double postscale,
                               Transport* cross, int travel) {
  const int P = block_.size(), me = block_.rank();
  const size_t esize = dtype_size(dtype);
  // Pieces of 64-byte multiples; the last ones may be short or empty.
  const size_t align = std::max<size_t>(1, 64 / esize);
  const size_t piece = ((count + P - 1) / P + align - 1) / align * align;
  piece_bytes_ = piece * esize;
  const size_t first = std::min(count, me * piece), last = std::min(count, (me + 1) * piece);

  block_.post();
  block_.wait_all_posted();
  char* mine = block_.mine() + first * esize;
  for (int r = 0; r < P; ++r) {
    if (r != me) reduce_into(dtype, op, mine, block_.region(r) + first * esize, last - first);
  }
  if (cross) {
    allreduce_across(*cross, mine, last - first, dtype, op, postscale, travel);
  } else {
    scale_buffer(dtype, mine, last - first, postscale);
  }
  block_.mark_reduced();
  block_.wait_all_reduced();
}

void ShmFusedAllreduce::copy_out(size_t byte_offset, void* dst, size_t bytes) {
  char* out = static_cast<char*>(dst);
  while (bytes > 0) {
    const int owner = int(byte_offset / piece_bytes_);
    const size_t in_piece = std::min(bytes, (owner + 1) * piece_bytes_ - byte_offset);
    std::memcpy(out, block_.region(owner) + byte_offset, in_piece);
    out += in_piece;
    byte_offset += in_piece;
    bytes -= in_piece;
  }
}

}  // namespace commlib
