// Executing one negotiated response on this rank: packing tensors into the
// fusion buffer, applying scale factors, widening half types to float32, and
// calling the collective algorithm over the transport.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "exec/algorithm.h"
#include "fusion_buffer.h"
#include "runtime/handles.h"
#include "message.h"
#include "backends/transport.h"

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

// Rows of dim 0 that reducescatter leaves on rank r (first ranks get extras).
int64_t reducescatter_rows(int64_t dim0, int size, int r);

void run_allreduce(OpContext& ctx, const std::vector<Entry*>& entries);
void run_allgather(OpContext& ctx, Entry& e, const std::vector<int64_t>& rows);
void run_broadcast(OpContext& ctx, Entry& e);
void run_alltoall(OpContext& ctx, Entry& e, const std::vector<int64_t>& matrix);
void run_reducescatter(OpContext& ctx, Entry& e);

}  // namespace commlib
