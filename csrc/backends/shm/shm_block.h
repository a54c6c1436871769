// One step ("block") of a shared-memory collective through the segment's
// fusion regions (backends/shm/shm.h).
//
// Blocks are numbered by one sequence shared by every shared-memory algorithm
// on the host, and each rank's three counters (posted, reduced, consumed)
// reach b+1 by the end of block b whatever the algorithm did in it: that is
// what lets an algorithm wait for "everyone is done with block b-K" without
// knowing which algorithms ran in between. A region has two slots, so a rank
// may fill block b+1 while others still read block b.
#pragma once

#include <cstdint>

#include "backends/shm/shm.h"
#include "base/progress.h"

namespace commlib {

class ShmBlock {
 public:
  // Claims the next block and waits until this rank's slot is free (every
  // rank has finished block b-2, the slot's previous use).
  explicit ShmBlock(ShmSegment& shm) : shm_(shm), block_(shm.next_block++), slot_(int(block_ % 2)) {
    if (block_ >= 2) wait_all(&ShmSegment::consumed, block_ - 1);
  }

  char* region(int r) { return shm_.region(r, slot_); }
  char* mine() { return region(shm_.rank()); }
  size_t capacity() const { return shm_.region_bytes(); }
  int rank() const { return shm_.rank(); }
  int size() const { return shm_.size(); }

  // This rank's region holds its data for the block.
  void post() { set(&ShmSegment::posted); }
  void wait_posted(int r) { wait(&ShmSegment::posted, r, block_ + 1); }
  void wait_all_posted() { wait_all(&ShmSegment::posted, block_ + 1); }
  // This rank has written its results.
  void mark_reduced() { set(&ShmSegment::reduced); }
  void wait_all_reduced() { wait_all(&ShmSegment::reduced, block_ + 1); }
  // This rank has read everything it needs from the block.
  void finish() {
    set(&ShmSegment::posted);
    set(&ShmSegment::reduced);
    set(&ShmSegment::consumed);
  }
  // Every rank has finished this block (after finish()).
  void wait_all_finished() { wait_all(&ShmSegment::consumed, block_ + 1); }

 private:
  using Counter = ShmCounter& (ShmSegment::*)(int);
  void set(Counter c) { (shm_.*c)(shm_.rank()).value.store(block_ + 1, std::memory_order_release); }
  void wait(Counter c, int r, uint64_t target) {
    ShmCounter& counter = (shm_.*c)(r);
    poll_until([&] { return counter.value.load(std::memory_order_acquire) >= target; });
  }
  void wait_all(Counter c, uint64_t target) {
    for (int r = 0; r < shm_.size(); ++r)
      if (r != shm_.rank()) wait(c, r, target);
  }

  ShmSegment& shm_;
  uint64_t block_;
  int slot_;
};

}  // namespace commlib
