// Point-to-point between CUDA buffers through NCCL (p2p/device_links.h):
// each link is a communicator of two ranks (the sender is its rank 0, the
// receiver its rank 1) with its own stream, created on first use without
// blocking the engine (ncclCommInitRank runs on a helper thread). A transfer
// waits on the device for its request's ready event (recorded on the
// caller's stream at submission) and completes when an event recorded after
// it on the link's stream is reached. A receive without device memory of its
// own gets some from the stream-ordered allocator (cudaMallocAsync on the
// link's stream; cudaMalloc before CUDA 11.2), which the caller frees. A link
// that makes no progress for timeout_us (COMMLIB_TIMEOUT; 0: no limit), or
// whose creation does not complete in that time, is aborted (ncclCommAbort)
// and its requests fail with COMMLIB_ERR_TIMED_OUT naming the peer; the next
// message between the two ranks starts a new link.
#pragma once

#include <cstdint>
#include <memory>

#include "backends/nccl/loader.h"
#include "p2p/device_links.h"

namespace commlib {
namespace gpu {

std::unique_ptr<DeviceLinks> make_nccl_links(const GpuLibs& libs, int64_t timeout_us, DeviceLinks::Done done);

}  // namespace gpu
}  // namespace commlib
