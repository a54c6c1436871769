// join(): a rank that has joined takes part in collectives it never
// submitted. For each, it builds a stand-in request from the description the
// coordinator sends (base/message.h, Response::descs) with buffers of its own:
// zeros into reductions, no rows into allgather/alltoall, a buffer to receive
// a broadcast or its part of a reducescatter. The results are discarded.
#pragma once

#include "base/entry.h"
#include "base/message.h"

namespace commlib {

// The stand-in for request d on this rank (set_rank of set_size in d's
// process set). A CUDA request's stand-in has no buffers here: the NCCL
// executor gives it device ones (GpuExecutor::stand_in_buffers).
Entry joined_entry(const RequestDesc& d, int set_rank, int set_size);

}  // namespace commlib
