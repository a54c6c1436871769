// One NCCL communicator: the ranks of one process set on one CUDA device
// each, with its own high-priority stream and a device fusion buffer.
//
// create() is collective over the set's MPI transport: its rank 0 makes the
// unique id, which travels over MPI (Transport::broadcast), and every rank
// then joins ncclCommInitRank on its device, for at most timeout_us
// (COMMLIB_TIMEOUT; 0: no limit), then COMMLIB_ERR_TIMED_OUT. Called by the engine's thread
// while it executes a negotiated response, so every member creates it at the
// same point of the same order.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/nccl/loader.h"
#include "backends/transport.h"

namespace commlib {
namespace gpu {

// Throws Error(COMMLIB_ERR_INTERNAL) "<what>: <NCCL's message>" unless rc is success.
void check_nccl(const NcclLib& nccl, ncclResult rc, const std::string& what);
// The same for a CUDA runtime call.
void check_cuda(const CudaRuntime& cuda, cudaError rc, const std::string& what);

// An event recorded on stream (of device), for another stream to wait on
// (backends/nccl/event_pool.cc: taken from a pool of reusable events).
void* record_event(const CudaRuntime& cuda, int device, void* stream);
// Gives an event of record_event back to the pool, once nothing waits on or
// queries it any more (its pending work still completes).
void destroy_event(void* event);

// rank 0 of t calls ncclGetUniqueId; every rank of t returns its bytes.
NcclUniqueId shared_unique_id(const NcclLib& nccl, Transport& t);

// "" when NCCL and the CUDA runtime are both usable, else why not.
std::string unusable_reason(const GpuLibs& libs);

// A non-blocking stream of device with the highest priority.
cudaStream priority_stream(const CudaRuntime& cuda, int device);

// One ncclCommInitRank running on a helper thread: it blocks until every
// member has joined, and NCCL's bootstrap has no deadline of its own, so the
// caller polls `done` and may give up (the thread is then left behind:
// nothing can interrupt it; it ends with the process).
struct InitCall {
  std::atomic<bool> done{false};
  ncclResult rc = kNcclSuccess;
  ncclComm comm = nullptr;
};
std::shared_ptr<InitCall> start_comm_init(const GpuLibs& libs, const NcclUniqueId& id, int rank, int size,
                                          int device);

// Makes device current on the calling thread for the object's lifetime.
class DeviceGuard {
 public:
  DeviceGuard(const CudaRuntime& cuda, int device);
  ~DeviceGuard();

 private:
  const CudaRuntime& cuda_;
  int previous_ = -1;
};

class NcclComm {
 public:
  // warn_after_us (0: never): a creation still waiting that long says so on
  // stderr, once (what it waits for, and that COMMLIB_TIMEOUT ends it).
  static std::unique_ptr<NcclComm> create(const GpuLibs& libs, Transport& t, int device, int64_t timeout_us,
                                          int64_t warn_after_us = 0);
  ~NcclComm();  // ncclCommDestroy (nothing left to destroy after abort())

  // ncclCommAbort: ends every operation in flight on the communicator; it
  // cannot be used afterwards.
  void abort();
  bool aborted() const { return aborted_; }
  // NCCL's asynchronous error of the communicator (kNcclSuccess when none).
  ncclResult async_error() const;
  std::string error_text(ncclResult rc) const { return libs_.nccl.get_error_string(rc); }

  // At least bytes of device memory for fusion, owned by the communicator:
  // allocated once with fusion_headroom bytes if that is more (a fused
  // collective is never larger than the fusion threshold), so the first
  // step's growing fused launches do not allocate again and again; a larger
  // one replaces it (the old one is freed with the communicator).
  void* fusion_buffer(size_t bytes);
  size_t fusion_headroom = 0;
  // A joined rank's stand-in buffers (runtime/join.h), grown like the fusion
  // buffer: zeros (set on the communicator's stream once, never written
  // after) and a sink for results nobody reads.
  void* zeros(size_t bytes);
  void* sink(size_t bytes);

  const GpuLibs& libs() const { return libs_; }
  ncclComm comm() const { return comm_; }
  cudaStream stream() const { return stream_; }
  int device() const { return device_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  // When an operation on it last completed (engine clock, us); the timeout
  // of the oldest one in flight counts from here or from its launch.
  int64_t last_progress_us = 0;

 private:
  NcclComm(const GpuLibs& libs, int device, int rank, int size);
  static ncclComm init_bounded(const GpuLibs& libs, const NcclUniqueId& id, int rank, int size, int device,
                               int64_t timeout_us, int64_t warn_after_us);
  const GpuLibs& libs_;
  ncclComm comm_ = nullptr;
  cudaStream stream_ = nullptr;
  int device_, rank_, size_;
  bool aborted_ = false;
  // Device memory of at least bytes in *buf (of *have bytes; allocated with
  // at least `headroom`), replacing a smaller one.
  void* grow(void** buf, size_t* have, size_t bytes, size_t headroom = 0);
  void* fusion_ = nullptr;
  size_t fusion_bytes_ = 0;
  void* zeros_ = nullptr;
  size_t zeros_bytes_ = 0;
  void* sink_ = nullptr;
  size_t sink_bytes_ = 0;
  std::vector<void*> retired_;
};

}  // namespace gpu
}  // namespace commlib
