#include "backends/nccl/nccl_comm.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "base/activity.h"
#include "base/common.h"
#include "base/progress.h"

namespace commlib {
namespace gpu {

void check_nccl(const NcclLib& nccl, ncclResult rc, const std::string& what) {
  if (rc == kNcclSuccess) return;
  throw Error(COMMLIB_ERR_INTERNAL, what + ": NCCL error " + std::to_string(rc) + " (" +
                                        nccl.get_error_string(rc) + ")");
}

void check_cuda(const CudaRuntime& cuda, cudaError rc, const std::string& what) {
  if (rc == kCudaSuccess) return;
  throw Error(COMMLIB_ERR_INTERNAL, what + ": CUDA error " + std::to_string(rc) + " (" +
                                        cuda.get_error_string(rc) + ")");
}

NcclUniqueId shared_unique_id(const NcclLib& nccl, Transport& t) {
  NcclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (t.rank() == 0) {
    const Activity making("ncclGetUniqueId");
    check_nccl(nccl, nccl.get_unique_id(&id), "ncclGetUniqueId");
  }
  // (a failure on rank 0 leaves zeros: the others then fail in ncclCommInitRank)
  t.broadcast(&id, sizeof(id), 0);
  return id;
}

DeviceGuard::DeviceGuard(const CudaRuntime& cuda, int device) : cuda_(cuda) {
  check_cuda(cuda_, cuda_.get_device(&previous_), "cudaGetDevice");
  if (previous_ == device) {
    previous_ = -1;
    return;
  }
  check_cuda(cuda_, cuda_.set_device(device), "cudaSetDevice(" + std::to_string(device) + ")");
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) cuda_.set_device(previous_);
}

NcclComm::NcclComm(const GpuLibs& libs, int device, int rank, int size)
    : libs_(libs), device_(device), rank_(rank), size_(size) {}

std::string unusable_reason(const GpuLibs& libs) {
  if (!libs.nccl.ok) return libs.nccl.error;
  return libs.cuda.ok ? std::string() : libs.cuda.error;
}

cudaStream priority_stream(const CudaRuntime& cuda, int device) {
  DeviceGuard on(cuda, device);
  int least = 0, greatest = 0;  // (numerically lower = higher priority)
  check_cuda(cuda, cuda.get_stream_priority_range(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
  cudaStream s = nullptr;
  check_cuda(cuda, cuda.stream_create_with_priority(&s, kCudaStreamNonBlocking, greatest),
             "cudaStreamCreateWithPriority");
  return s;
}

std::shared_ptr<InitCall> start_comm_init(const GpuLibs& libs, const NcclUniqueId& id, int rank, int size,
                                          int device) {
  auto call = std::make_shared<InitCall>();
  std::thread([call, nccl = &libs.nccl, cuda = &libs.cuda, id, rank, size, device] {
    if (cuda->set_device(device) != kCudaSuccess) {
      call->rc = kNcclUnhandledCudaError;
    } else {
      call->rc = nccl->comm_init_rank(&call->comm, size, id, rank);
    }
    call->done.store(true, std::memory_order_release);
  }).detach();
  return call;
}

// A member that froze or died after the unique id went out, or hosts that
// cannot reach each other on the interface NCCL picked, leave
// ncclCommInitRank waiting forever: it is waited for at most timeout_us (0:
// no limit); past that the call fails with COMMLIB_ERR_TIMED_OUT. While it
// waits, this rank's pending control sends move on (the engine's wait hook,
// as in a shared-memory wait): the other members may still be receiving the
// response that makes them join, and one above MPI's eager size completes
// only while its sender calls into MPI (without that, both waited forever:
// ResNet-50's first fused broadcast on a GPU machine).
ncclComm NcclComm::init_bounded(const GpuLibs& libs, const NcclUniqueId& id, int rank, int size, int device,
                                int64_t timeout_us, int64_t warn_after_us) {
  std::shared_ptr<InitCall> call = start_comm_init(libs, id, rank, size, device);
  const auto start = std::chrono::steady_clock::now();
  bool warned = false;
  while (!call->done.load(std::memory_order_acquire)) {
    const auto waited = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start);
    if (!warned && warn_after_us > 0 && waited.count() >= warn_after_us) {
      warned = true;
      std::fprintf(stderr,
                   "commlib: WARNING: ncclCommInitRank (rank %d of %d, device %d) has waited %lld s for the other "
                   "members (COMMLIB_STALL_CHECK_TIME); COMMLIB_TIMEOUT (%lld s, 0: none) ends it. NCCL_DEBUG=INFO "
                   "shows where its bootstrap stops.\n",
                   rank, size, device, static_cast<long long>(waited.count() / 1000000),
                   static_cast<long long>(timeout_us / 1000000));
    }
    if (timeout_us > 0 && waited.count() >= timeout_us) {
      throw Error(COMMLIB_ERR_TIMED_OUT,
                  "ncclCommInitRank (rank " + std::to_string(rank) + " of " + std::to_string(size) + ", device " +
                      std::to_string(device) + ") did not complete within " + std::to_string(timeout_us / 1000000) +
                      " s (COMMLIB_TIMEOUT): a member froze or died after the communicator's unique id went out, "
                      "or NCCL cannot reach the other ranks (check NCCL_SOCKET_IFNAME; NCCL_DEBUG=INFO shows "
                      "where its bootstrap stops)");
    }
    if (g_wait_hook) g_wait_hook(g_wait_hook_arg);
    std::this_thread::sleep_for(std::chrono::microseconds(waited.count() < 10000 ? 20 : 1000));
  }
  check_nccl(libs.nccl, call->rc,
             "ncclCommInitRank (rank " + std::to_string(rank) + " of " + std::to_string(size) + ", device " +
                 std::to_string(device) + ")");
  return call->comm;
}

std::unique_ptr<NcclComm> NcclComm::create(const GpuLibs& libs, Transport& t, int device, int64_t timeout_us,
                                           int64_t warn_after_us) {
  const Activity creating("creating an NCCL communicator");
  NcclUniqueId id;
  {
    const Activity sharing("making its unique id (rank 0) and sharing it over MPI");
    id = shared_unique_id(libs.nccl, t);
  }
  std::unique_ptr<NcclComm> c(new NcclComm(libs, device, t.rank(), t.size()));
  c->stream_ = priority_stream(libs.cuda, device);
  const Activity init("ncclCommInitRank");
  c->comm_ = init_bounded(libs, id, t.rank(), t.size(), device, timeout_us, warn_after_us);
  return c;
}

NcclComm::~NcclComm() {
  try {
    DeviceGuard on(libs_.cuda, device_);
    if (comm_ && !aborted_) libs_.nccl.comm_destroy(comm_);
    for (void* p : retired_) libs_.cuda.free(p);
    for (void* p : {fusion_, zeros_, sink_})
      if (p) libs_.cuda.free(p);
    if (stream_) libs_.cuda.stream_destroy(stream_);
  } catch (const Error&) {
    // (the device is unusable: nothing more can be released)
  }
}

void NcclComm::abort() {
  if (aborted_ || !comm_) return;
  aborted_ = true;
  libs_.nccl.comm_abort(comm_);
}

ncclResult NcclComm::async_error() const {
  if (aborted_ || !comm_) return kNcclSuccess;
  ncclResult err = kNcclSuccess;
  const ncclResult rc = libs_.nccl.comm_get_async_error(comm_, &err);
  return rc != kNcclSuccess ? rc : err;
}

void* NcclComm::grow(void** buf, size_t* have, size_t bytes, size_t headroom) {
  if (bytes <= *have) return *buf;
  DeviceGuard on(libs_.cuda, device_);
  // The old buffer may still be in use by an operation in flight (and
  // cudaFree would wait for it, a hang if it hangs): freed at destruction.
  if (*buf) retired_.push_back(*buf);
  *buf = nullptr;
  *have = 0;
  const size_t want = std::max({bytes, headroom, size_t(1) << 20});
  check_cuda(libs_.cuda, libs_.cuda.malloc(buf, want), "cudaMalloc(" + std::to_string(want) + " bytes)");
  *have = want;
  return *buf;
}

void* NcclComm::fusion_buffer(size_t bytes) { return grow(&fusion_, &fusion_bytes_, bytes, fusion_headroom); }

void* NcclComm::sink(size_t bytes) { return grow(&sink_, &sink_bytes_, bytes); }

void* NcclComm::zeros(size_t bytes) {
  if (bytes <= zeros_bytes_) return zeros_;
  void* z = grow(&zeros_, &zeros_bytes_, bytes);
  DeviceGuard on(libs_.cuda, device_);
  check_cuda(libs_.cuda, libs_.cuda.memset_async(z, 0, zeros_bytes_, stream_), "cudaMemsetAsync");
  return z;
}

}  // namespace gpu
}  // namespace commlib
