// CUDA events for ordering (no timing), kept for reuse: a request's ready
// event and a launch's completion event are taken from here and given back
// when their last user is done, so a training loop creates events only until
// the pool holds as many as one step keeps alive at once (then none).
#include <mutex>
#include <unordered_map>
#include <vector>

#include "backends/nccl/nccl_comm.h"

namespace commlib {
namespace gpu {
namespace {

struct Pool {
  std::mutex mu;
  std::unordered_map<int, std::vector<cudaEvent>> free;  // by device
  std::unordered_map<cudaEvent, int> device_of;           // every event made
};

Pool& pool() {
  static auto* p = new Pool();  // (never destroyed: events may be given back during exit)
  return *p;
}

cudaEvent take(const CudaRuntime& cuda, int device) {
  Pool& p = pool();
  {
    std::lock_guard<std::mutex> lock(p.mu);
    std::vector<cudaEvent>& spare = p.free[device];
    if (!spare.empty()) {
      cudaEvent ev = spare.back();
      spare.pop_back();
      return ev;
    }
  }
  cudaEvent ev = nullptr;  // (the caller made device current)
  check_cuda(cuda, cuda.event_create_with_flags(&ev, kCudaEventDisableTiming), "cudaEventCreateWithFlags");
  std::lock_guard<std::mutex> lock(p.mu);
  p.device_of[ev] = device;
  return ev;
}

}  // namespace

void* record_event(const CudaRuntime& cuda, int device, void* stream) {
  DeviceGuard on(cuda, device);
  cudaEvent ev = take(cuda, device);
  const cudaError rc = cuda.event_record(ev, static_cast<cudaStream>(stream));
  if (rc != kCudaSuccess) destroy_event(ev);
  check_cuda(cuda, rc, "cudaEventRecord");
  return ev;
}

void destroy_event(void* event) {
  if (!event) return;
  // Recording it again later is safe: a stream that waits on it has taken
  // its state at cudaStreamWaitEvent, and nobody queries it any more.
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mu);
  auto it = p.device_of.find(static_cast<cudaEvent>(event));
  if (it != p.device_of.end()) p.free[it->second].push_back(it->first);
}

}  // namespace gpu
}  // namespace commlib
