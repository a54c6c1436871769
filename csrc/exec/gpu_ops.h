// The NCCL calls of one negotiated collective, enqueued on a communicator's
// stream (nothing here waits for the device). Buffers are the entries'
// device pointers; allgather/alltoall write into the output the caller
// allocated (Entry::output_rows rows, checked against the negotiated rows).
#pragma once

#include <cstdint>
#include <vector>

#include "backends/nccl/nccl_comm.h"
#include "base/entry.h"

namespace commlib {

// Allreduce of entries (several: fused through the communicator's device
// buffer), dtype/op/scale factors of the first (fusion groups share them).
void nccl_allreduce(gpu::NcclComm& c, const std::vector<Entry*>& entries);
// Broadcast of entries (several: one root's, fused through the
// communicator's device buffer, any dtypes); root: rank in the communicator.
void nccl_broadcast(gpu::NcclComm& c, const std::vector<Entry*>& entries);
// rows: dim-0 rows of each rank (negotiated).
void nccl_allgather(gpu::NcclComm& c, Entry& e, const std::vector<int64_t>& rows);
// matrix: rows sent from src to dst at [src * size + dst] (negotiated).
void nccl_alltoall(gpu::NcclComm& c, Entry& e, const std::vector<int64_t>& matrix);
// Rank r keeps reducescatter_rows(dim0, size, r) rows.
void nccl_reducescatter(gpu::NcclComm& c, Entry& e);

}  // namespace commlib
