// The GPU emulator's streams and events (test infrastructure, never shipped).
//
// A stream is a FIFO of tasks run by its own thread, so work enqueued on it
// runs after the enqueueing call has returned, as on a GPU. An event marks a
// point of one stream's FIFO: it is complete once the stream has run every
// task enqueued before the cudaEventRecord (an event never recorded is
// complete). COMMLIB_GPU_EMULATOR_DELAY_US makes every task start that much
// later, so a host that reads a result before the stream has produced it
// sees stale data; COMMLIB_GPU_EMULATOR_TAIL_US makes every task end that
// much later than its work (a kernel still finishing on one rank after the
// others are done). Both are read when a stream starts.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace emu {

class Stream {
 public:
  Stream();
  ~Stream();  // runs what is queued, then stops its thread

  // Enqueues task; returns its ticket (1, 2, ...).
  uint64_t push(std::function<void()> task);
  // The ticket of the last task enqueued so far (0: none).
  uint64_t tail();
  bool reached(uint64_t ticket);
  // Blocks until ticket has run.
  void wait(uint64_t ticket);

 private:
  void run();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  uint64_t enqueued_ = 0, done_ = 0;
  bool stop_ = false;
  std::thread worker_;
};

struct Event {
  Stream* stream = nullptr;  // null: never recorded
  uint64_t ticket = 0;
  bool complete() { return !stream || stream->reached(ticket); }
};

// The stream a handle names: 0 is the legacy default stream.
Stream* stream_of(void* handle);
// The environment variable name as a number of microseconds (0 if unset).
int64_t env_us(const char* name);

// What a process asked of the emulator, counted per entry point class (for
// tests of what a step costs; commlib_gpu_emulator_count reads them).
enum Count : int {
  kCommInit,     // ncclCommInitRank
  kStreamCreate, // cudaStreamCreate*
  kEventCreate,  // cudaEventCreate*
  kMalloc,       // device memory: cudaMalloc, cudaMallocAsync
  kFree,         // cudaFree, cudaFreeAsync
  kHostAlloc,    // pinned host memory: cudaHostAlloc, cudaMallocHost
  kSync,         // blocking host waits: cudaStreamSynchronize, cudaEventSynchronize, cudaDeviceSynchronize, cudaMemcpy
  kCopy,         // cudaMemcpyAsync
  kNcclCall,     // every NCCL collective or point-to-point call
  kCallAllReduce, kCallBroadcast, kCallAllGather, kCallReduceScatter, kCallReduce, kCallSendRecv,
  kGroup,        // ncclGroupEnd closing the outermost group
  kCountKinds
};
void count(Count what);

}  // namespace emu
