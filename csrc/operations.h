// Executing one negotiated response on this rank: packing tensors into the
// fusion buffer, applying scale factors, widening half types to float32, and
// calling the collective algorithm over the transport.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "collectives/allreduce.h"
#include "fusion.h"
#include "handles.h"
#include "message.h"
#include "transport/transport.h"

namespace commlib {

// One tensor of an allreduce.
struct Member {
  int dtype;
  size_t count;
  const void* input;
  void* output;
};

// One local request waiting for (or under) execution.
struct Entry {
  std::shared_ptr<HandleState> handle;
  RequestDesc desc;
  const void* input = nullptr;
  void* output = nullptr;
  std::vector<Member> members;  // a grouped allreduce (desc.group_size >= 0)
  // Arrived at this response cache bit and generation (-1: negotiated by rank 0).
  int cache_bit = -1;
  uint32_t cache_gen = 0;
  int64_t cached_since_us = 0;
  bool cache_expired = false;  // waited too long; its bit's invalidation is in the log
};

struct OpContext {
  Transport& transport;
  FusionBuffer& fusion;
  FusionBuffer& scratch;  // second buffer (reducescatter of half types)
  AllreduceAlgo algo;
  size_t fusion_threshold;  // bytes per fused reduction
  ShmSegment* shm;        // this host's ranks; null if alone or hosts differ in size
  Transport* cross;       // same local rank across hosts; null on one host
  int shm_collectives;    // kShmAuto / kShmAlways / kShmNever (COMMLIB_SHM_COLLECTIVES)
};

// Where broadcast/allgather/reducescatter go through shared memory.
enum { kShmAuto = 0, kShmAlways = 1, kShmNever = 2 };

// Measured here (MPICH 5 wheel, against the MPI path of the same build):
// - broadcast through shared memory: 1.3-2.4x MPI's time from 16 KiB to
//   1 MiB at 2 and 3 ranks, where the MPI path took 0.6-0.84x; even from
//   4 MiB on (0.94-1.32x against 0.84-1.38x); so auto always uses it;
// - allgather through shared memory: 0.56-1.37x (2 ranks) and 0.74-1.73x
//   (3 ranks) up to a 4 MiB result, where the MPI path took 0.27-0.86x; at
//   16 MiB it lost at 2 ranks (0.53 against 0.62x); so auto uses it up to
//   kShmAllgatherMaxBytes of result;
// - reducescatter through shared memory beats MPI's non-blocking one at every
//   size (64 KiB-256 MiB: 1.0-9x the MPI_Reduce_scatter time, where the MPI
//   path took 0.15-0.9x), so auto uses it.
// COMMLIB_SHM_COLLECTIVES=always forces all three (tests use it), =never
// disables them.
constexpr size_t kShmAllgatherMaxBytes = size_t(4) << 20;

// Rows of dim 0 that reducescatter leaves on rank r (first ranks get extras).
int64_t reducescatter_rows(int64_t dim0, int size, int r);

void run_allreduce(OpContext& ctx, const std::vector<Entry*>& entries);
void run_allgather(OpContext& ctx, Entry& e, const std::vector<int64_t>& rows);
void run_broadcast(OpContext& ctx, Entry& e);
void run_alltoall(OpContext& ctx, Entry& e, const std::vector<int64_t>& matrix);
void run_reducescatter(OpContext& ctx, Entry& e);

}  // namespace commlib
