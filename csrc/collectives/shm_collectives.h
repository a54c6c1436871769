// Broadcast, allgather, alltoall and reduce-scatter among the ranks of one host through
// the shared segment's regions, in windows (ShmBlock) of at most
// kShmWindowBytes. Each algorithm is in its own file; every local rank calls
// with the same sizes, in the same order.
#pragma once

#include <cstddef>
#include <vector>

#include "backends/shm/shm.h"
#include "base/pieces.h"

namespace commlib {

// Bytes a rank copies into its region per window (at most the region). A
// region has two slots, so short windows let one window's copies out overlap
// the next one's copies in, all of it cache hot; whole 4 MiB regions left the
// copies in turn, from memory. 2 ranks, alternating jobs against whole
// regions: broadcast 1 MiB 78 against 101 us, 4 MiB 382 against 607 (32 KiB
// windows: 100 and 464); allgather 4 MiB result 160-260 against 240-340 us,
// 16 MiB 1.7-2.0 against 2.8-3.4 ms; alltoall 4 MiB 200-280 against 390-490
// us; reducescatter 4 MiB 220-230 against 260-360 us, 64 MiB 6.9-7.6 against
// 9.1-10.9 ms; 3 ranks alike (allgather 16 MiB 3.4 against 4.9-5.5 ms,
// reducescatter 64 MiB 14.2-14.9 against 19.4-19.7). 128 KiB and 1 MiB
// windows were no faster.
constexpr size_t kShmWindowBytes = size_t(256) << 10;

// The root's bytes are copied into its region once and out by every other rank.
void broadcast_shm(ShmSegment& shm, void* buf, size_t bytes, int root);

// The same with one copy (broadcast_direct.cc): every other rank reads the
// root's bytes straight from its buffer (process_vm_readv). Needs regions and
// shm.direct_read_pids(); throws Error if the kernel refuses a read.
void broadcast_direct(ShmSegment& shm, void* buf, size_t bytes, int root);
// 2 ranks, with one copy split between them: the receiver reads one half of
// the root's buffer, the root writes the other into the receiver's.
void broadcast_split(ShmSegment& shm, void* buf, size_t bytes, int root);

// Rank r contributes bytes[r]; out receives them concatenated in rank order.
void allgather_shm(ShmSegment& shm, const void* in, void* out, const std::vector<size_t>& bytes);

// One allgather of several (a fused response): its input (this rank's part),
// its output (every rank's part, rank after rank) and the bytes each rank
// contributes (bytes[r]). Inputs must not overlap any output but at their
// own rank's place there.
struct GatherMember {
  const void* in;
  void* out;
  std::vector<size_t> bytes;
};

// allgather_shm of several allgathers at once (allgather_shm_members.cc):
// rank r's block is its part of each member in turn, copied into its region
// straight from the inputs and out of it straight into the outputs.
void allgather_shm_members(ShmSegment& shm, const std::vector<GatherMember>& members);

// The same with one copy (allgather_direct.cc): each rank reads the others'
// contributions straight from their inputs (process_vm_readv). Needs regions
// and shm.direct_read_pids(); throws Error if the kernel refuses a read.
void allgather_direct(ShmSegment& shm, const void* in, void* out, const std::vector<size_t>& bytes);

// Rank r's input holds send[d] bytes for each rank d in rank order; out
// receives recv[s] bytes from each rank s in rank order. largest: the largest
// block between two different ranks in the whole exchange (the same on every
// rank). The region must hold 64 bytes per rank.
void alltoall_shm(ShmSegment& shm, const void* in, const std::vector<size_t>& send, void* out,
                  const std::vector<size_t>& recv, size_t largest);

// The same with one copy (alltoall_direct.cc): each rank reads its blocks
// straight from the others' inputs (process_vm_readv), given
// matrix[s * size + d], the bytes rank s sends to rank d. Needs regions and
// shm.direct_read_pids(); throws Error if the kernel refuses a read.
void alltoall_direct(ShmSegment& shm, const void* in, void* out, const std::vector<size_t>& matrix);

// Reduces count elements (sum of counts) across ranks; rank r receives
// counts[r] elements of the result at its offset into out. dtype is not a half
// type and op not Average (the caller scales and widens).
void reducescatter_shm(ShmSegment& shm, const PieceInput& in, void* out, const std::vector<size_t>& counts,
                       int dtype, int op);

}  // namespace commlib
