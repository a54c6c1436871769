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
#pragma once

#include <cstddef>

#include "backends/shm/shm.h"
#include "backends/shm/shm_block.h"
#include "backends/transport.h"

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
  void finish() { block_.finish(); }

 private:
  ShmBlock block_;
  size_t piece_bytes_ = 0;  // bytes of each rank's piece in this block
};

}  // namespace commlib
