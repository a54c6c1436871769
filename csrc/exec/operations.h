// Executing one negotiated response on this rank: packing tensors into the
// fusion buffer, applying scale factors, widening half types to float32, and
// calling the collective algorithm over the transport.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backends/transport.h"
#include "exec/algorithm.h"
#include "fusion_buffer.h"
#include "message.h"
#include "runtime/entry.h"

namespace commlib {

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
// The same for a request: its explicit splits (rows per rank) when it has them.
int64_t reducescatter_rows(const RequestDesc& d, int size, int r);

void run_allreduce(OpContext& ctx, const std::vector<Entry*>& entries);
void run_allgather(OpContext& ctx, Entry& e, const std::vector<int64_t>& rows);
void run_broadcast(OpContext& ctx, Entry& e);
void run_alltoall(OpContext& ctx, Entry& e, const std::vector<int64_t>& matrix);
void run_reducescatter(OpContext& ctx, Entry& e);

}  // namespace commlib
