// Shared-memory all-reduce: a reduce-scatter and an allgather through one
// persistent segment, pipelined in blocks.
//
// The buffer is cut into blocks of P pieces (P = ranks on the host; a piece is
// at most C bytes). For each block, rank j:
//   1. post:    copies the pieces other ranks own (not its own piece, and not
//               the whole block) into its stage slot, then bumps posted[j];
//   2. reduce:  waits for every rank's post, reduces piece j from the staged
//               copies into its own buffer (in rank order); the last step
//               also writes the reduced piece into the result slot (one pass
//               instead of reduce-then-copy); bumps reduced[j];
//   3. gather:  waits for every rank's reduce and copies the other reduced
//               pieces into its buffer, bumps consumed[j].
// Each rank thus moves about one copy of the buffer in and one out, the
// memory-traffic floor. K slots let a fast rank post block b+1 while a slow
// one still gathers block b; a slot is rewritten only after every rank is
// done with its previous use. Piece j is reduced by rank j alone and copied
// by the others, so results are bitwise identical on all ranks.
// Across hosts (hierarchical), rank j all-reduces its reduced piece with the
// ranks of the same local rank on the other hosts before publishing it, so
// every local rank drives its own slice of the inter-host traffic.
#include "collectives/allreduce_shm.h"

#include <algorithm>
#include <cstring>

#include "base/common.h"
#include "base/progress.h"
#include "base/reduce.h"
#include "collectives/allreduce_across.h"

namespace commlib {
namespace {

// Waits until counter(r) >= target for every rank r other than me.
template <typename Counter>
void wait_all(ShmSegment& shm, Counter counter, uint64_t target) {
  const int me = shm.rank();
  for (int r = 0; r < shm.size(); ++r) {
    if (r == me) continue;
    ShmCounter& c = counter(r);
    poll_until([&] { return c.value.load(std::memory_order_acquire) >= target; });
  }
}

// An all-reduce on one host whose other ranks' buffers add up to at most
// this many bytes takes one step (below) instead of the three of a block:
// 8 KiB at 2 ranks, 4 KiB at 3, 1 KiB at 9 (each rank reads them all).
constexpr size_t kOneStepBytes = 8192;

// The one step: every rank posts its whole buffer, waits for every post and
// reduces all of them itself, rank 0's copy first and the others in rank
// order (so the result is bitwise the same everywhere). One wait for the
// other ranks instead of two, for a reduction of (P - 1) small buffers that
// costs less than a wait. The counters advance as for a block (a slot is
// rewritten only after every rank has reduced from it).
void allreduce_one_step(ShmSegment& shm, char* data, const char* src, size_t count, int dtype, int op,
                        double post) {
  const int P = shm.size(), me = shm.rank(), K = shm.slots();
  const size_t bytes = count * dtype_size(dtype);
  const uint64_t b = shm.next_block++;
  const int slot = int(b % K);
  if (b >= uint64_t(K)) wait_all(shm, [&](int r) -> ShmCounter& { return shm.reduced(r); }, b - K + 1);
  std::memcpy(shm.stage(me, slot, 0), src, bytes);
  shm.posted(me).value.store(b + 1, std::memory_order_release);
  wait_all(shm, [&](int r) -> ShmCounter& { return shm.posted(r); }, b + 1);
  std::memcpy(data, shm.stage(0, slot, 0), bytes);
  for (int r = 1; r < P; ++r) {
    if (r == P - 1) {
      reduce_into_and_copy_scaled(dtype, op, data, shm.stage(r, slot, 0), nullptr, count, post);
    } else {
      reduce_into(dtype, op, data, shm.stage(r, slot, 0), count);
    }
  }
  if (P == 1) scale_buffer(dtype, data, count, post);
  shm.reduced(me).value.store(b + 1, std::memory_order_release);
  shm.consumed(me).value.store(b + 1, std::memory_order_release);
}

}  // namespace

void allreduce_shm(ShmSegment& shm, Transport* cross, void* buf, size_t count, int dtype, int op,
                   double post, const void* in, int travel) {
  const int P = shm.size();
  const int me = shm.rank();
  const int K = shm.slots();
  if (count == 0) return;
  const size_t esize = dtype_size(dtype);
  if (!cross && count * esize * size_t(std::max(1, P - 1)) <= kOneStepBytes &&
      count * esize <= size_t(P) * shm.piece_bytes()) {
    return allreduce_one_step(shm, static_cast<char*>(buf), static_cast<const char*>(in ? in : buf), count,
                              dtype, op, post);
  }
  // Elements per piece: at most C bytes, 64-byte multiples so pieces stay
  // cache-line aligned; a short (last) block is split evenly.
  const size_t max_piece = shm.piece_bytes() / esize;
  const size_t align = std::max<size_t>(1, 64 / esize);
  char* data = static_cast<char*>(buf);
  const char* src = in ? static_cast<const char*>(in) : data;  // (out of place: read from in)

  for (size_t start = 0; start < count;) {
    const size_t left = count - start;
    size_t piece = std::min(max_piece, (left + P - 1) / P);
    piece = std::min(max_piece, (piece + align - 1) / align * align);
    const size_t block = std::min(left, piece * P);
    auto range = [&](int i, size_t* off, size_t* len) {
      const size_t b = std::min(block, i * piece), e = std::min(block, (i + 1) * piece);
      *off = start + b;
      *len = e - b;
    };
    const uint64_t b = shm.next_block++;
    const int slot = int(b % K);

    // 1. post: my copies of the pieces others own. The slot's previous use
    //    (block b-K) must have been reduced by all before it is overwritten.
    if (b >= uint64_t(K)) wait_all(shm, [&](int r) -> ShmCounter& { return shm.reduced(r); }, b - K + 1);
    for (int i = 0; i < P; ++i) {
      if (i == me) continue;
      size_t off, len;
      range(i, &off, &len);
      std::memcpy(shm.stage(me, slot, i), src + off * esize, len * esize);
    }
    shm.posted(me).value.store(b + 1, std::memory_order_release);

    // 2. reduce my piece from everyone's staged copy, then publish it once
    //    every rank has gathered the slot's previous result.
    size_t off, len;
    range(me, &off, &len);
    // (out of place: my piece of the input, into the output, while the
    // others post; it is in cache for the reduction that follows)
    if (src != data) std::memcpy(data + off * esize, src + off * esize, len * esize);
    wait_all(shm, [&](int r) -> ShmCounter& { return shm.posted(r); }, b + 1);
    if (b >= uint64_t(K)) wait_all(shm, [&](int r) -> ShmCounter& { return shm.consumed(r); }, b - K + 1);
    // The final local reduction also publishes, unless the piece must first
    // be all-reduced across hosts.
    // (and scales it, in the same pass).
    const int last = cross ? -1 : (me == P - 1 ? P - 2 : P - 1);
    for (int r = 0; r < P; ++r) {
      if (r == me) continue;
      if (r == last) {
        reduce_into_and_copy_scaled(dtype, op, data + off * esize, shm.stage(r, slot, me),
                                    shm.result(slot, me), len, post);
      } else {
        reduce_into_and_copy(dtype, op, data + off * esize, shm.stage(r, slot, me), nullptr, len);
      }
    }
    if (cross) {
      allreduce_across(*cross, data + off * esize, len, dtype, op, post, travel);
      std::memcpy(shm.result(slot, me), data + off * esize, len * esize);
    } else if (P == 1) {
      scale_buffer(dtype, data + off * esize, len, post);
    }
    shm.reduced(me).value.store(b + 1, std::memory_order_release);

    // 3. gather the pieces the others reduced.
    for (int i = 0; i < P; ++i) {
      if (i == me) continue;
      ShmCounter& c = shm.reduced(i);
      poll_until([&] { return c.value.load(std::memory_order_acquire) >= b + 1; });
      range(i, &off, &len);
      std::memcpy(data + off * esize, shm.result(slot, i), len * esize);
    }
    shm.consumed(me).value.store(b + 1, std::memory_order_release);
    start += block;
  }
}

}  // namespace commlib
