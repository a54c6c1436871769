#include "collectives/pairwise_tree.h"

#include <cstring>
#include <utility>
#include <vector>

#include "base/fusion_buffer.h"
#include "collectives/tree_schedule.h"

namespace commlib {
namespace {

// Per-thread state kept across calls (the engine runs every collective on its
// one background thread): the second buffer, grown as needed and reused.
struct TreeState {
  FusionBuffer scratch;
  std::vector<P2POp> ops;
  std::vector<int> partners;  // ranks this call exchanged data with
  char token = 0;             // (never read or written: empty messages)
};

thread_local TreeState state;

// Sends and/or receives with one peer and waits for both.
void exchange(Transport& t, int peer, const void* send, void* recv, size_t bytes) {
  state.ops.clear();
  if (send) state.ops.push_back(P2POp{P2POp::kSend, peer, const_cast<void*>(send), bytes});
  if (recv) state.ops.push_back(P2POp{P2POp::kRecv, peer, recv, bytes});
  t.exchange(state.ops);
}

// The completion handshake with every partner of this call.
void release_partners(Transport& t) {
  state.ops.clear();
  for (int peer : state.partners) {
    state.ops.push_back(P2POp{P2POp::kSend, peer, &state.token, 0});
    state.ops.push_back(P2POp{P2POp::kRecv, peer, &state.token, 0});
  }
  t.exchange(state.ops);
}

}  // namespace

void pairwise_tree(Transport& t, void* buf, size_t bytes, const PairCombine& combine) {
  const int n = t.size();
  const int r = t.rank();
  if (n == 1 || bytes == 0) return;
  const TreeSchedule sched(n);

  // `cur` holds this rank's partial result, `other` receives the partner's;
  // the two swap roles when combine leaves the result in `other` (no copy).
  char* cur = static_cast<char*>(buf);
  char* other = state.scratch.get(bytes);
  auto take = [&](char* result) {
    if (result != cur) std::swap(cur, other);
  };
  state.partners.clear();

  // 1. Fold-in: even ranks below 2*rem hand their data to r+1 and wait.
  if (sched.drops_out(r)) {
    const int to = sched.fold_partner(r);
    exchange(t, to, buf, nullptr, bytes);
    exchange(t, to, nullptr, buf, bytes);  // 3. the result comes back
    state.partners.push_back(to);
    release_partners(t);
    return;
  }
  if (sched.folds_in(r)) {
    exchange(t, sched.fold_partner(r), nullptr, other, bytes);
    take(combine(other, cur));  // x[r-1], x[r]
    state.partners.push_back(sched.fold_partner(r));
  }
  const int vrank = sched.vrank(r);

  // 2. Recursive doubling among the p virtual ranks.
  for (int mask = 1; mask < sched.p; mask <<= 1) {
    const int vpeer = vrank ^ mask;
    const int peer = sched.rank_of(vpeer);
    exchange(t, peer, cur, other, bytes);
    state.partners.push_back(peer);
    take(vrank < vpeer ? combine(cur, other) : combine(other, cur));
  }
  if (cur != buf) std::memcpy(buf, cur, bytes);

  // 3. Fold-out: return the result to the partner that dropped out.
  if (sched.folds_in(r)) exchange(t, sched.fold_partner(r), buf, nullptr, bytes);
  release_partners(t);
}

}  // namespace commlib
