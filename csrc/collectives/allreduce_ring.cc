// Ring all-reduce: a reduce-scatter followed by an allgather, chunked and
// pipelined. Bandwidth-optimal: every rank sends and receives 2(n-1)/n of
// the buffer, whatever the number of ranks n.
//
// Schedule
// --------
// The buffer of `count` elements is cut into n segments; segment j starts at
// j*(count/n) + min(j, count%n) (the first count%n segments hold one element
// more; with count < n the last segments are empty). Rank r only ever sends
// to its right neighbour r+1 and receives from its left neighbour r-1 (mod n),
// in 2(n-1) steps t = 0 .. 2n-3:
//
//   receive: in step t, segment (r-1-t) mod n arrives from the left.
//            t <= n-2 (reduce-scatter): it lands in scratch memory and is
//              reduced into the local copy: local = local (op) received.
//            t >= n-1 (allgather): it is a final value and lands directly in
//              the buffer.
//   send:    in step 0 segment r (the local input) goes to the right; in step
//            t >= 1 exactly the segment received in step t-1 (after its
//            reduction) is forwarded.
//
// After the reduce-scatter (step n-2) rank r holds the final value of segment
// r+1; the allgather then passes every final segment once around the ring.
// The final value of each element is computed by exactly one rank and merely
// copied by the others, so the result is bitwise identical on all ranks.
//
// Pipelining
// ----------
// Each segment is further cut into chunks of at most kChunkBytes; one chunk
// of one step is an "item". Both neighbours cut a segment the same way, so
// the items rank r sends form the same sequence (same order, same sizes) as
// the items rank r+1 receives, and MPI-style in-order matching pairs them up
// without tags. The loop over received items is
//
//   post receive i+1;  wait receive i;  reduce item i;  post send of item i
//
// so the reduction of one chunk overlaps the transfer of the next, and a
// reduced chunk moves on to the next rank at once instead of waiting for its
// whole segment. Receives use two alternating chunk-sized slots of a
// persistent scratch buffer; sends complete in the background and are only
// waited for when their memory is about to be overwritten (see
// wait_sends_through) and at the end.
//
// Completion handshake
// --------------------
// With MPICH over UCX a rendezvous send can stay incomplete at the sender
// until the receiver makes further MPI progress after its receive completed
// (observed here with tens of chunks in flight). A receiver that leaves the
// collective and then stops calling MPI (e.g. blocks in MPI_Finalize) would
// leave its left neighbour waiting forever. So, last, each rank waits for all
// its own sends, then sends an empty message to the right and waits for the
// one from the left: no rank leaves while a send addressed to it is pending.
#include <algorithm>
#include <vector>

#include "base/common.h"
#include "base/fusion_buffer.h"
#include "base/reduce.h"
#include "collectives/allreduce.h"
#include "collectives/ring_schedule.h"

namespace commlib {
namespace {

// Chunk size of the pipeline. Smaller chunks pay more per-message overhead,
// larger ones overlap less. On the 2-core test VM (1-64 MiB float32, 2 and 3
// ranks) 256 KiB, 512 KiB and 1 MiB were within noise of each other, 64 KiB
// was 20-30% slower at 64 MiB and 4 MiB slightly slower at 16 MiB.
constexpr size_t kChunkBytes = size_t(256) << 10;

// Per-thread state kept across calls so the hot path does not allocate once
// warmed up (the engine runs every collective on its one background thread).
struct RingState {
  FusionBuffer scratch;  // two receive slots of kChunkBytes
  std::vector<P2POp> op = std::vector<P2POp>(1);  // the batch passed to start()
  char token = 0;  // (never read or written: empty messages)
  struct PendingSend {
    int step;
    int ticket;
  };
  std::vector<PendingSend> sends;  // posted, not yet waited; in posting order
  size_t sends_head = 0;           // sends[0, sends_head) are already waited
};

thread_local RingState state;

int post(Transport& t, P2POp::Kind kind, int peer, void* buf, size_t bytes) {
  state.op[0] = P2POp{kind, peer, buf, bytes};
  return t.start(state.op);
}

// Waits for every pending send of steps <= step (sends are posted in step
// order, so they are a prefix of the queue).
void wait_sends_through(Transport& t, int step) {
  while (state.sends_head < state.sends.size() && state.sends[state.sends_head].step <= step) {
    t.wait(state.sends[state.sends_head++].ticket);
  }
}

}  // namespace

void allreduce_ring(Transport& t, void* buf, size_t count, int dtype, int op, double scale) {
  const int n = t.size();
  const int r = t.rank();
  if (n == 1 || count == 0) return;
  const int right = ring_right(r, n), left = ring_left(r, n);
  const size_t esize = dtype_size(dtype);
  char* data = static_cast<char*>(buf);
  const int steps = ring_steps(n);
  const int last_reduce_step = ring_last_reduce_step(n);

  const size_t chunk = std::max<size_t>(1, kChunkBytes / esize);  // elements
  char* slots[2];
  slots[0] = state.scratch.get(2 * chunk * esize);
  slots[1] = slots[0] + chunk * esize;
  state.sends.clear();
  state.sends_head = 0;

  const RingSegments segs{count, n};
  const RingItems recv_items = ring_recv_items(segs, r, chunk);
  const RingItems send_items = ring_send_items(segs, r, chunk);

  const auto bytes = [esize](const RingItem& it) { return (it.hi - it.lo) * esize; };

  // Step 0: the local input of segment r goes to the right, all chunks at once.
  for (RingItem s = send_items.first(0); !send_items.done(s) && s.step == 0; s = send_items.next(s)) {
    state.sends.push_back({0, post(t, P2POp::kSend, right, data + s.lo * esize, bytes(s))});
  }

  // Posts the receive of item number i. Reduce-scatter items land in a scratch
  // slot (i alternates the two); allgather items land in place, once the sends
  // that still read that memory are complete: the allgather receive of step t
  // overwrites the segment sent in step t-(n-1) (an intermediate value).
  const auto post_recv = [&](const RingItem& it, size_t i) {
    char* dst;
    if (it.step <= last_reduce_step) {
      dst = slots[i % 2];
    } else {
      wait_sends_through(t, it.step - (n - 1));
      dst = data + it.lo * esize;
    }
    return post(t, P2POp::kRecv, left, dst, bytes(it));
  };

  RingItem cur = recv_items.first(0);
  int ticket = recv_items.done(cur) ? -1 : post_recv(cur, 0);
  for (size_t i = 0; !recv_items.done(cur); ++i) {
    // Keep the next transfer in flight while this chunk is reduced.
    const RingItem nxt = recv_items.next(cur);
    const int next_ticket = recv_items.done(nxt) ? -1 : post_recv(nxt, i + 1);
    t.wait(ticket);
    char* mine = data + cur.lo * esize;
    if (cur.step <= last_reduce_step) {  // (the last reduction completes the element: scaled)
      reduce_into_and_copy_scaled(dtype, op, mine, slots[i % 2], nullptr, cur.hi - cur.lo,
                                  cur.step == last_reduce_step ? scale : 1.0);
    }
    // Forward the chunk: what arrived in step t is sent in step t+1.
    if (cur.step + 1 < steps) {
      state.sends.push_back({cur.step + 1, post(t, P2POp::kSend, right, mine, bytes(cur))});
    }
    cur = nxt;
    ticket = next_ticket;
  }
  wait_sends_through(t, steps);

  // Completion handshake (see the top of the file).
  state.op.resize(2);
  state.op[0] = P2POp{P2POp::kSend, right, &state.token, 0};
  state.op[1] = P2POp{P2POp::kRecv, left, &state.token, 0};
  t.exchange(state.op);
  state.op.resize(1);
}

}  // namespace commlib
