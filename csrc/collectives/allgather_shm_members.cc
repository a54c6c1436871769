// Several allgathers through the shared segment as one (a fused response):
// per window (kShmWindowBytes) over the ranks' blocks (rank r's block: its
// part of each member in turn), every rank copies its window straight from
// the members' inputs into its region and posts; then every rank copies every
// other rank's window straight into the members' outputs. Each rank's own
// part goes from input to output directly. Against packing the block into
// the fusion buffer first (allgather_shm on it) this saves copying the
// inputs into it and the whole result out of it.
#include <algorithm>
#include <cstring>

#include "backends/shm/shm_block.h"
#include "collectives/shm_collectives.h"

namespace commlib {
namespace {

// For each member m whose part of rank r's block overlaps [a, a + w):
// fn(m, offset in m's part, offset in the window, bytes).
template <class Fn>
void for_window(const std::vector<GatherMember>& members, int r, size_t a, size_t w, Fn&& fn) {
  size_t start = 0;  // of member m's part in r's block
  for (size_t m = 0; m < members.size() && start < a + w; ++m) {
    const size_t n = members[m].bytes[size_t(r)];
    const size_t lo = std::max(a, start), hi = std::min(a + w, start + n);
    if (lo < hi) fn(m, lo - start, lo - a, hi - lo);
    start += n;
  }
}

}  // namespace

void allgather_shm_members(ShmSegment& shm, const std::vector<GatherMember>& members) {
  const int P = shm.size(), me = shm.rank();
  // displ[m * P + r]: where rank r's part of member m starts in m's output
  std::vector<size_t> displ(members.size() * size_t(P));
  std::vector<size_t> block(size_t(P), 0);
  for (size_t m = 0; m < members.size(); ++m) {
    size_t at = 0;
    for (int r = 0; r < P; ++r) {
      displ[m * size_t(P) + size_t(r)] = at;
      at += members[m].bytes[size_t(r)];
      block[size_t(r)] += members[m].bytes[size_t(r)];
    }
  }
  for (size_t m = 0; m < members.size(); ++m) {  // (my own parts need no staging)
    char* dst = static_cast<char*>(members[m].out) + displ[m * size_t(P) + size_t(me)];
    if (members[m].bytes[size_t(me)] && dst != members[m].in) std::memcpy(dst, members[m].in, members[m].bytes[size_t(me)]);
  }
  const size_t largest = *std::max_element(block.begin(), block.end());
  for (size_t a = 0; a < largest;) {
    ShmBlock blk(shm);
    const size_t w = std::min(std::min(blk.capacity(), kShmWindowBytes), largest - a);
    char* mine = static_cast<char*>(blk.mine());
    for_window(members, me, a, w, [&](size_t m, size_t off, size_t at, size_t n) {
      std::memcpy(mine + at, static_cast<const char*>(members[m].in) + off, n);
    });
    blk.post();
    for (int r = 0; r < P; ++r) {
      if (r == me) continue;
      blk.wait_posted(r);
      const char* theirs = static_cast<const char*>(blk.region(r));
      for_window(members, r, a, w, [&](size_t m, size_t off, size_t at, size_t n) {
        std::memcpy(static_cast<char*>(members[m].out) + displ[m * size_t(P) + size_t(r)] + off, theirs + at, n);
      });
    }
    blk.finish();
    a += w;
  }
}

}  // namespace commlib
