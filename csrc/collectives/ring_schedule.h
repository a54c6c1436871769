// The schedule of the ring all-reduce (allreduce_ring.cc), as pure logic: how
// the buffer is cut into segments and chunks, and which chunk moves in which
// step. No transport, no memory: tests/cpp/test_ring_schedule.cc simulates it.
//
// Rank r of n sends only to ring_right(r, n) and receives only from
// ring_left(r, n), in ring_steps(n) = 2(n-1) steps. In step t it receives
// segment (r-1-t) mod n (reduce-scatter for t <= n-2, allgather after) and
// sends segment (r-t) mod n: its own input in step 0, afterwards what it
// received in step t-1.
#pragma once

#include <algorithm>
#include <cstddef>

namespace commlib {

inline int ring_right(int r, int n) { return (r + 1) % n; }
inline int ring_left(int r, int n) { return (r - 1 + n) % n; }
inline int ring_steps(int n) { return 2 * (n - 1); }
// Steps 0 .. ring_last_reduce_step(n) reduce; the later ones only copy.
inline int ring_last_reduce_step(int n) { return n - 2; }

// Balanced split of count elements into n segments: segment j starts at
// j*(count/n) + min(j, count%n) (the first count%n hold one element more).
struct RingSegments {
  size_t count;
  int n;
  size_t begin(int j) const {
    const size_t base = count / size_t(n), extra = count % size_t(n);
    return size_t(j) * base + std::min(size_t(j), extra);
  }
  size_t end(int j) const { return begin(j + 1); }
};

// One chunk of one step: elements [lo, hi) of the segment of that step.
struct RingItem {
  int step;
  size_t lo, hi;
};

// The sequence of items one rank receives (or, shifted by one step, sends).
// Empty segments yield no items.
class RingItems {
 public:
  // seg0: the segment of step 0; step t covers segment (seg0 - t) mod n.
  RingItems(const RingSegments& segs, int seg0, int steps, size_t chunk)
      : segs_(segs), seg0_(seg0), steps_(steps), chunk_(chunk) {}

  // The first item at or after step t (done() if there is none).
  RingItem first(int t) const {
    for (; t < steps_; ++t) {
      const int j = segment(t);
      if (segs_.begin(j) < segs_.end(j)) return make(t, segs_.begin(j));
    }
    return RingItem{steps_, 0, 0};
  }
  RingItem next(const RingItem& it) const {
    if (it.hi < segs_.end(segment(it.step))) return make(it.step, it.hi);
    return first(it.step + 1);
  }
  bool done(const RingItem& it) const { return it.step >= steps_; }
  int segment(int t) const { return ((seg0_ - t) % segs_.n + segs_.n) % segs_.n; }

 private:
  RingItem make(int t, size_t lo) const {
    return RingItem{t, lo, std::min(lo + chunk_, segs_.end(segment(t)))};
  }

  RingSegments segs_;
  int seg0_, steps_;
  size_t chunk_;
};

// What rank r of n receives (from the left) and sends (to the right).
inline RingItems ring_recv_items(const RingSegments& segs, int r, size_t chunk) {
  return RingItems(segs, r - 1, ring_steps(segs.n), chunk);
}
inline RingItems ring_send_items(const RingSegments& segs, int r, size_t chunk) {
  return RingItems(segs, r, ring_steps(segs.n), chunk);
}

}  // namespace commlib
