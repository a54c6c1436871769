// Fused all-reduce whose fusion buffer lives in the shared segment.
//
// Small tensors must be packed into one buffer anyway; packing them straight
// into this rank's region of the segment makes that copy also the "post" of
// the shared-memory algorithm, and unpacking reads the reduced pieces straight
// from their owners' regions. Per rank: one pack, one reduction of its own
// 1/P of the data, one unpack — against pack, post, reduce, publish, gather
// and unpack through a private fusion buffer.
//
// Usage (every local rank, same sizes, in the same order):
//   ShmFusedAllreduce f(shm);
//   char* buf = f.buffer();                        // capacity() bytes
//   ... pack `count` elements into buf ...
//   f.reduce(count, dtype, op, postscale, cross);  // every piece reduced
//   f.copy_out(byte_offset, dst, bytes) ...        // read results
//   f.finish();
//
// Or, for tensors with nothing to scale before the sum, on one host, in one
// call: f.reduce_members(first, last, count, dtype, op, postscale), which
// leaves this rank's own piece where it is: it packs only the other ranks'
// pieces, reduces its own straight from its inputs into its outputs (then
// copies the result into its region for the others) and copies out only the
// other pieces. Bit for bit the same results, a quarter of the copies saved
// at 2 ranks. allreduce_members_in_shm picks the way for a window of tensors.
#pragma once

#include <cstddef>

#include "backends/shm/shm.h"
#include "backends/shm/shm_block.h"
#include "backends/transport.h"
#include "base/entry.h"

namespace commlib {

class ShmFusedAllreduce {
 public:
  explicit ShmFusedAllreduce(ShmSegment& shm) : block_(shm) {}
  size_t capacity() const { return block_.capacity(); }
  char* buffer() { return block_.mine(); }
  // cross: ranks of this local rank on other hosts (null on one host);
  // travel: the half type the float32 values cross hosts in (-1: dtype).
  void reduce(size_t count, int dtype, int op, double postscale, Transport* cross, int travel = -1);
  void copy_out(size_t byte_offset, void* dst, size_t bytes);
  // The members [first, last) (count elements in all, of dtype) reduced
  // into their outputs, the block finished (no finish() after it).
  void reduce_members(const Member* first, const Member* last, size_t count, int dtype, int op,
                      double postscale);
  void finish() { block_.finish(); }

 private:
  // Sets piece_bytes_ (64-byte multiples; the last pieces may be short or
  // empty) and returns this rank's piece, [*lo, *hi) in elements.
  void cut(size_t count, size_t esize, size_t* lo, size_t* hi);

  ShmBlock block_;
  size_t piece_bytes_ = 0;  // bytes of each rank's piece in this block
};

// The tensors [first, last) (total elements, of dtype; float16/bfloat16
// reduced in float32) allreduced through the segment's fusion regions, which
// must hold them; cross: this local rank's peers on other hosts (or null).
void allreduce_members_in_shm(ShmSegment& shm, Transport* cross, const Member* first, const Member* last,
                              size_t total, int dtype, int op, double pre, double post);

}  // namespace commlib
