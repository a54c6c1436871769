// Handles: the completion state of one request, shared between the caller's
// thread (poll/wait) and the background thread (complete).
#pragma once

#include <atomic>
#include <cstdlib>
#include <new>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/node_pool.h"
#include "base/result_pool.h"

namespace commlib {

struct HandleState {
  std::atomic<int> done{0};
  int remaining = 1;            // requests left (a grouped handle has several)
  int status = 0;
  std::string message;
  // allgather / alltoall output: from result_pool.h (not zero-filled: fresh pages cost
  // ~2 us per 4 KiB here) and handed over to the caller without a copy.
  char* result = nullptr;
  size_t result_bytes = 0;
  char* alloc_result(size_t bytes) {
    result_free(result);
    result = nullptr;
    result = result_alloc(bytes);
    result_bytes = bytes;
    return result;
  }
  ~HandleState() { result_free(result); }
  int64_t rows = 0;             // dim 0 of the result
  std::vector<int64_t> splits;  // rows from/of each rank
  // recv: the message's dtype and shape
  int dtype = -1;
  std::vector<int64_t> shape;
  void* device_result = nullptr;  // recv: a device message in device memory the core allocated
  int64_t id = 0;  // in the HandleTable
  // CUDA collectives (runtime/engine_gpu.cc): once launched on the device,
  // the launch's completion event (a caller's stream may wait on it). A
  // caller that let go (detached: commlib_wait_on_stream) leaves the rest to
  // the engine, which releases the handle when it completes; claimed: the
  // outcome was taken, by the caller or by the engine, exactly once.
  std::shared_ptr<void> done_event;
  std::atomic<int> launched{0};
  std::atomic<bool> detached{false};
  std::atomic<bool> claimed{false};
};

class HandleTable {
 public:
  std::pair<int64_t, std::shared_ptr<HandleState>> create();
  int64_t adopt(std::shared_ptr<HandleState> h);  // a handle made elsewhere; its id
  std::shared_ptr<HandleState> find(int64_t id);
  void release(int64_t id);
  // Records one request's outcome (the first error wins); the handle is
  // complete, and waiters wake, when its last request is done. Called only
  // by the background thread.
  void complete(HandleState& h, int status, const std::string& message);
  // h was launched on a device with completion event `done` (background
  // thread); wakes the threads waiting for the launch.
  void mark_launched(HandleState& h, std::shared_ptr<void> done);
  // Threads currently inside wait(): nobody will enqueue more from them.
  int waiting() const { return waiting_.load(); }
  // Threads currently driving progress from wait() (see below).
  int driving() const { return driving_.load(); }
  const std::atomic<int>& driving_count() const { return driving_; }
  // Waits for completion. For up to the spin budget the waiting thread calls
  // drive() (the engine's progress, one cycle at a time; false when it did
  // nothing or could not run) and otherwise yields the core; after that it
  // sleeps on a condvar. stopped_driving() runs when this thread stops
  // driving. Returns false on timeout (timeout_s < 0: none). until_launched:
  // also returns once h was launched on a device (mark_launched).
  bool wait(HandleState& h, double timeout_s, const std::function<bool()>& drive,
            const std::function<void()>& stopped_driving, bool until_launched = false);

 private:
  void wake();  // the threads sleeping in wait()
  std::mutex mu_;
  using Table = std::unordered_map<int64_t, std::shared_ptr<HandleState>>;
  Table handles_;
  NodePool<Table> spare_{[](Table::node_type& n) { n.mapped().reset(); }};  // (under mu_)
  int64_t next_id_ = 1;
  std::mutex wait_mu_;
  std::condition_variable wait_cv_;
  std::atomic<int> sleepers_{0};
  std::atomic<int> waiting_{0};
  std::atomic<int> driving_{0};
};

}  // namespace commlib
