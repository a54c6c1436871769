// The schedule of the recursive-doubling all-reduce (allreduce_tree.cc), as
// pure logic: who folds into whom, the virtual ranks, and each round's
// partner. No transport, no memory: tests/cpp/test_tree_schedule.cc
// simulates it.
//
// p is the largest power of two <= n and rem = n - p. Among the first 2*rem
// ranks each even rank hands its data to r+1 and drops out (fold-in), gets
// the result back at the end (fold-out). The p others take virtual ranks
// 0..p-1 in rank order and exchange with virtual rank v ^ mask for
// mask = 1, 2, 4, .. < p.
#pragma once

namespace commlib {

struct TreeSchedule {
  int n, p, rem;

  explicit TreeSchedule(int ranks) : n(ranks), p(1), rem(0) {
    while (p * 2 <= n) p *= 2;
    rem = n - p;
  }
  // An even rank below 2*rem: hands its data to r+1 and waits for the result.
  bool drops_out(int r) const { return r < 2 * rem && r % 2 == 0; }
  // An odd rank below 2*rem: takes in the data of r-1 and returns the result.
  bool folds_in(int r) const { return r < 2 * rem && r % 2 == 1; }
  // The partner of the fold-in/fold-out (for ranks that drop out or fold in).
  int fold_partner(int r) const { return r % 2 == 0 ? r + 1 : r - 1; }
  // The virtual rank of a rank that does not drop out.
  int vrank(int r) const { return r < 2 * rem ? r / 2 : r - rem; }
  // The rank of virtual rank v.
  int rank_of(int v) const { return v < rem ? 2 * v + 1 : v + rem; }
  // The partner of rank r (not dropping out) in the round of `mask`.
  int peer(int r, int mask) const { return rank_of(vrank(r) ^ mask); }
};

}  // namespace commlib
