// The ring all-reduce schedule (csrc/collectives/ring_schedule.h), simulated
// for 1..7 ranks without any transport: every element of every rank must end
// up holding each rank's contribution exactly once, reduced by exactly one
// rank and copied to the others, with sends matching receives in order.
//
// csrc: (header-only)
#include <cstddef>
#include <vector>

#include "check.h"
#include "collectives/ring_schedule.h"

using commlib::RingItem;
using commlib::RingItems;
using commlib::RingSegments;

namespace {

std::vector<RingItem> items_of(const RingItems& seq) {
  std::vector<RingItem> out;
  for (RingItem it = seq.first(0); !seq.done(it); it = seq.next(it)) out.push_back(it);
  return out;
}

bool same(const RingItem& a, const RingItem& b) { return a.step == b.step && a.lo == b.lo && a.hi == b.hi; }

// The sends rank r posts, in posting order, as allreduce_ring does: all of
// step 0 first, then each received item forwarded one step later.
std::vector<RingItem> posted_sends(const RingSegments& segs, int r, size_t chunk) {
  const int steps = commlib::ring_steps(segs.n);
  std::vector<RingItem> out;
  const RingItems send = commlib::ring_send_items(segs, r, chunk);
  for (RingItem s = send.first(0); !send.done(s) && s.step == 0; s = send.next(s)) out.push_back(s);
  for (const RingItem& it : items_of(commlib::ring_recv_items(segs, r, chunk)))
    if (it.step + 1 < steps) out.push_back(RingItem{it.step + 1, it.lo, it.hi});
  return out;
}

// contrib[r][e][k]: how many times rank k's input is in element e of rank r.
using Buffers = std::vector<std::vector<std::vector<int>>>;

struct SimResult {
  Buffers bufs;
  std::vector<int> reductions;  // per element, over all ranks
  std::vector<int> finishers;   // per element: ranks whose reduction completed it
  bool allgather_copied_partial = false;
};

SimResult simulate(size_t count, int n, size_t chunk) {
  const RingSegments segs{count, n};
  SimResult s;
  s.bufs.assign(size_t(n), std::vector<std::vector<int>>(count, std::vector<int>(size_t(n), 0)));
  for (int r = 0; r < n; ++r)
    for (size_t e = 0; e < count; ++e) s.bufs[size_t(r)][e][size_t(r)] = 1;
  s.reductions.assign(count, 0);
  s.finishers.assign(count, 0);
  const auto complete = [n](const std::vector<int>& c) {
    for (int k = 0; k < n; ++k)
      if (c[size_t(k)] != 1) return false;
    return true;
  };
  for (int t = 0; t < commlib::ring_steps(n); ++t) {
    // Every message of step t is read from its sender before anything of step t lands.
    using Message = std::pair<RingItem, std::vector<std::vector<int>>>;
    std::vector<std::vector<Message>> inbox(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      for (const RingItem& it : posted_sends(segs, r, chunk)) {
        if (it.step != t) continue;
        std::vector<std::vector<int>> payload(s.bufs[size_t(r)].begin() + long(it.lo),
                                              s.bufs[size_t(r)].begin() + long(it.hi));
        inbox[size_t(commlib::ring_right(r, n))].push_back({it, payload});
      }
    }
    for (int r = 0; r < n; ++r) {
      for (const auto& [it, payload] : inbox[size_t(r)]) {
        for (size_t e = it.lo; e < it.hi; ++e) {
          std::vector<int>& mine = s.bufs[size_t(r)][e];
          const std::vector<int>& in = payload[e - it.lo];
          if (t <= commlib::ring_last_reduce_step(n)) {
            for (int k = 0; k < n; ++k) mine[size_t(k)] += in[size_t(k)];
            ++s.reductions[e];
            if (complete(mine)) ++s.finishers[e];
          } else {
            if (!complete(in)) s.allgather_copied_partial = true;
            mine = in;
          }
        }
      }
    }
  }
  return s;
}

const size_t kChunks[] = {1, 2, 3, 1000};

std::vector<size_t> counts_for(int n) {
  return {0, 1, size_t(n) - 1, size_t(n), size_t(n) + 1, 3 * size_t(n) + 2, 50};
}

}  // namespace

TEST_CASE("ring: neighbours are distinct from the rank and inverse to each other") {
  for (int n = 2; n <= 7; ++n) {
    for (int r = 0; r < n; ++r) {
      CHECK(commlib::ring_right(r, n) != r);
      CHECK(commlib::ring_left(r, n) != r);
      CHECK_EQ(commlib::ring_left(commlib::ring_right(r, n), n), r);
      CHECK(commlib::ring_right(r, n) >= 0 && commlib::ring_right(r, n) < n);
    }
  }
  CHECK_EQ(commlib::ring_steps(1), 0);
  CHECK_EQ(commlib::ring_steps(7), 12);
}

TEST_CASE("ring: segments partition the buffer, balanced within one element") {
  for (int n = 1; n <= 7; ++n) {
    for (size_t count : counts_for(n)) {
      const RingSegments segs{count, n};
      CHECK_EQ(segs.begin(0), size_t(0));
      CHECK_EQ(segs.end(n - 1), count);
      for (int j = 0; j < n; ++j) {
        CHECK(segs.begin(j) <= segs.end(j));
        const size_t len = segs.end(j) - segs.begin(j);
        CHECK(len == count / size_t(n) || len == count / size_t(n) + 1);
        if (j > 0) CHECK(len <= segs.end(j - 1) - segs.begin(j - 1));  // bigger ones first
      }
    }
  }
}

TEST_CASE("ring: one rank has nothing to send or receive") {
  const RingSegments segs{10, 1};
  CHECK(items_of(commlib::ring_recv_items(segs, 0, 3)).empty());
  CHECK(posted_sends(segs, 0, 3).empty());
}

TEST_CASE("ring: items are non-empty chunks of the step's segment, in step order") {
  for (int n = 2; n <= 7; ++n) {
    for (size_t count : counts_for(n)) {
      for (size_t chunk : kChunks) {
        const RingSegments segs{count, n};
        for (int r = 0; r < n; ++r) {
          const RingItems recv = commlib::ring_recv_items(segs, r, chunk);
          int last_step = -1;
          for (const RingItem& it : items_of(recv)) {
            const int j = recv.segment(it.step);
            CHECK_EQ(j, ((r - 1 - it.step) % n + n) % n);
            CHECK(it.lo < it.hi && it.hi - it.lo <= chunk);
            CHECK(segs.begin(j) <= it.lo && it.hi <= segs.end(j));
            CHECK(it.step >= last_step && it.step < commlib::ring_steps(n));
            last_step = it.step;
          }
        }
      }
    }
  }
}

TEST_CASE("ring: posted sends equal the send sequence and the right neighbour's receives") {
  for (int n = 2; n <= 7; ++n) {
    for (size_t count : counts_for(n)) {
      for (size_t chunk : kChunks) {
        const RingSegments segs{count, n};
        for (int r = 0; r < n; ++r) {
          const std::vector<RingItem> posted = posted_sends(segs, r, chunk);
          const std::vector<RingItem> planned = items_of(commlib::ring_send_items(segs, r, chunk));
          const std::vector<RingItem> theirs =
              items_of(commlib::ring_recv_items(segs, commlib::ring_right(r, n), chunk));
          CHECK_EQ(posted.size(), planned.size());
          CHECK_EQ(posted.size(), theirs.size());
          bool match = posted.size() == planned.size() && posted.size() == theirs.size();
          for (size_t i = 0; match && i < posted.size(); ++i)
            match = same(posted[i], planned[i]) && same(posted[i], theirs[i]);
          CHECK(match);
        }
      }
    }
  }
}

TEST_CASE("ring: every rank ends with every element reduced from all ranks exactly once") {
  for (int n = 1; n <= 7; ++n) {
    for (size_t count : counts_for(n)) {
      for (size_t chunk : kChunks) {
        const SimResult s = simulate(count, n, chunk);
        bool all_complete = true, once = true;
        for (int r = 0; r < n; ++r)
          for (size_t e = 0; e < count; ++e)
            for (int k = 0; k < n; ++k) all_complete &= s.bufs[size_t(r)][e][size_t(k)] == 1;
        for (size_t e = 0; e < count; ++e) {
          // n-1 reductions make one complete value on one rank (none for n = 1).
          once &= s.reductions[e] == n - 1 && s.finishers[e] == (n > 1 ? 1 : 0);
        }
        CHECK(all_complete);
        CHECK(once);
        CHECK(!s.allgather_copied_partial);
      }
    }
  }
}

TEST_CASE("ring: an allgather receive overwrites memory only sends already waited for read") {
  // allreduce_ring waits for the sends of steps <= t-(n-1) before posting the
  // allgather receive of step t into the buffer: no later send of an earlier
  // step may read the elements it overwrites.
  for (int n = 2; n <= 7; ++n) {
    for (size_t count : counts_for(n)) {
      const RingSegments segs{count, n};
      for (int r = 0; r < n; ++r) {
        const std::vector<RingItem> sends = posted_sends(segs, r, 2);
        bool safe = true;
        for (const RingItem& in : items_of(commlib::ring_recv_items(segs, r, 2))) {
          if (in.step <= commlib::ring_last_reduce_step(n)) continue;
          for (const RingItem& out : sends) {
            const bool overlaps = out.lo < in.hi && in.lo < out.hi;
            if (overlaps && out.step < in.step && out.step > in.step - (n - 1)) safe = false;
          }
        }
        CHECK(safe);
      }
    }
  }
}

CHECK_MAIN()
