// Recursive-doubling all-reduce: latency-optimal for small messages
// (log2 p exchange rounds for the largest power of two p <= n, plus a fold-in
// and a fold-out step when n is not a power of two), at the price of sending
// the whole buffer in every round.
//
// Schedule
// --------
// Let p be the largest power of two <= n and rem = n - p.
//
//  1. Fold-in. Among the first 2*rem ranks, each even rank r sends its buffer
//     to r+1 and drops out; r+1 now holds x[r] (op) x[r+1]. The p remaining
//     ranks get virtual ranks 0..p-1 in rank order (v = r/2 for the odd ranks
//     below 2*rem, v = r - rem above).
//  2. Recursive doubling. For mask = 1, 2, 4, .. < p, virtual ranks v and
//     v^mask exchange their whole buffers and both combine them. Before the
//     round each holds the reduction of an aligned block of `mask` virtual
//     ranks; afterwards both hold that of the 2*mask block.
//  3. Fold-out. Each odd rank below 2*rem sends the result back to r-1.
//
// Bitwise identical results. Floating-point reduction is not associative,
// and min/max are not even commutative bit for bit (signed zeros, NaN
// payloads). Partners therefore always combine as
//     (value of the lower block of ranks) (op) (value of the higher block),
// whichever of the two they are: every rank evaluates the same expression
// tree over x[0] .. x[n-1] in rank order, and the fold-out only copies.
// reduce_into computes acc = acc (op) in, so the lower partner reduces the
// received buffer into its own, while the higher partner reduces its own
// buffer into the received one and then treats that as its buffer (the two
// buffers swap roles instead of paying for a copy each round).
//
// Completion handshake. With MPICH over UCX a send can stay incomplete at
// the sender until the receiver makes further MPI progress after its receive
// completed; a rank that left the collective and then stopped calling MPI
// (e.g. blocked in MPI_Finalize) would leave a partner waiting forever. Every
// pair of ranks that exchanged data here does so in both directions, so at
// the end, with all its own sends complete, each rank sends an empty message
// to each of its partners and waits for theirs (one batch, one latency hop;
// it cost about 2 us per call at 2 ranks here).
#include <cstring>
#include <utility>
#include <vector>

#include "collectives/allreduce.h"
#include "collectives/tree_schedule.h"
#include "common.h"
#include "fusion_buffer.h"
#include "reduce.h"

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

void allreduce_tree(Transport& t, void* buf, size_t count, int dtype, int op) {
  const int n = t.size();
  const int r = t.rank();
  if (n == 1 || count == 0) return;
  const size_t bytes = count * dtype_size(dtype);

  const TreeSchedule sched(n);

  // `cur` holds this rank's partial result, `other` receives the partner's.
  char* cur = static_cast<char*>(buf);
  char* other = state.scratch.get(bytes);
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
    reduce_into(dtype, op, other, cur, count);  // x[r-1] (op) x[r]
    std::swap(cur, other);
    state.partners.push_back(sched.fold_partner(r));
  }
  const int vrank = sched.vrank(r);

  // 2. Recursive doubling among the p virtual ranks.
  for (int mask = 1; mask < sched.p; mask <<= 1) {
    const int vpeer = vrank ^ mask;
    const int peer = sched.rank_of(vpeer);
    exchange(t, peer, cur, other, bytes);
    state.partners.push_back(peer);
    if (vrank < vpeer) {
      reduce_into(dtype, op, cur, other, count);  // mine (op) theirs
    } else {
      reduce_into(dtype, op, other, cur, count);  // theirs (op) mine
      std::swap(cur, other);
    }
  }
  if (cur != buf) std::memcpy(buf, cur, bytes);

  // 3. Fold-out: return the result to the partner that dropped out.
  if (sched.folds_in(r)) exchange(t, sched.fold_partner(r), buf, nullptr, bytes);
  release_partners(t);
}

}  // namespace commlib
