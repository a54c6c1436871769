#include "allreduce_shm_fused.h"

#include <algorithm>
#include <cstring>

#include "../common.h"
#include "../progress.h"
#include "../reduce.h"

namespace commlib {
namespace {

void wait_others(ShmSegment& shm, ShmCounter& (ShmSegment::*counter)(int), uint64_t target) {
  for (int r = 0; r < shm.size(); ++r) {
    if (r == shm.rank()) continue;
    ShmCounter& c = (shm.*counter)(r);
    poll_until([&] { return c.value.load(std::memory_order_acquire) >= target; });
  }
}

}  // namespace

char* ShmFusedAllreduce::begin() {
  // Blocks share one sequence (and the counters) with allreduce_shm.
  block_ = shm_.next_block++;
  slot_ = int(block_ % 2);
  // Others may still read this slot of my region for block_ - 2.
  if (block_ >= 2) wait_others(shm_, &ShmSegment::consumed, block_ - 1);
  return shm_.region(shm_.rank(), slot_);
}

void ShmFusedAllreduce::reduce(size_t count, int dtype, int op, double postscale,
                               Transport* cross) {
  const int P = shm_.size(), me = shm_.rank();
  const size_t esize = dtype_size(dtype);
  // Pieces of 64-byte multiples; the last ones may be short or empty.
  const size_t align = std::max<size_t>(1, 64 / esize);
  const size_t piece = ((count + P - 1) / P + align - 1) / align * align;
  piece_bytes_ = piece * esize;
  const size_t first = std::min(count, me * piece), last = std::min(count, (me + 1) * piece);

  shm_.posted(me).value.store(block_ + 1, std::memory_order_release);
  wait_others(shm_, &ShmSegment::posted, block_ + 1);
  char* mine = shm_.region(me, slot_) + first * esize;
  for (int r = 0; r < P; ++r) {
    if (r != me) reduce_into(dtype, op, mine, shm_.region(r, slot_) + first * esize, last - first);
  }
  if (cross) cross->allreduce(mine, mine, last - first, dtype, op);
  scale_buffer(dtype, mine, last - first, postscale);
  shm_.reduced(me).value.store(block_ + 1, std::memory_order_release);
  wait_others(shm_, &ShmSegment::reduced, block_ + 1);
}

void ShmFusedAllreduce::copy_out(size_t byte_offset, void* dst, size_t bytes) {
  char* out = static_cast<char*>(dst);
  while (bytes > 0) {
    const int owner = int(byte_offset / piece_bytes_);
    const size_t in_piece = std::min(bytes, (owner + 1) * piece_bytes_ - byte_offset);
    std::memcpy(out, shm_.region(owner, slot_) + byte_offset, in_piece);
    out += in_piece;
    byte_offset += in_piece;
    bytes -= in_piece;
  }
}

void ShmFusedAllreduce::end() {
  shm_.consumed(shm_.rank()).value.store(block_ + 1, std::memory_order_release);
}

}  // namespace commlib
