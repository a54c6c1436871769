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
//   char* buf = f.begin();                    // waits until the slot is free
//   ... pack `count` elements into buf ...
//   f.reduce(count, dtype, op, postscale);    // every piece reduced
//   f.copy_out(byte_offset, dst, bytes) ...   // read results
//   f.end();
#pragma once

#include <cstddef>
#include <cstdint>

#include "../transport/shm.h"
#include "../transport/transport.h"

namespace commlib {

class ShmFusedAllreduce {
 public:
  explicit ShmFusedAllreduce(ShmSegment& shm) : shm_(shm) {}
  size_t capacity() const { return shm_.region_bytes(); }
  char* begin();
  // cross: ranks of this local rank on other hosts (null on one host).
  void reduce(size_t count, int dtype, int op, double postscale, Transport* cross);
  void copy_out(size_t byte_offset, void* dst, size_t bytes);
  void end();

 private:
  ShmSegment& shm_;
  uint64_t block_ = 0;
  int slot_ = 0;
  size_t piece_bytes_ = 0;  // bytes of each rank's piece in this window
};

}  // namespace commlib
