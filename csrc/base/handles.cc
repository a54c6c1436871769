#include "base/handles.h"

#include <sched.h>

#include "base/progress.h"

namespace commlib {

std::pair<int64_t, std::shared_ptr<HandleState>> HandleTable::create() {
  auto h = std::make_shared<HandleState>();
  return {adopt(h), h};
}

int64_t HandleTable::adopt(std::shared_ptr<HandleState> h) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t id = next_id_++;
  h->id = id;
  spare_.emplace(handles_, id, std::move(h));  // (ids are never reused: it is new)
  return id;
}

std::shared_ptr<HandleState> HandleTable::find(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = handles_.find(id);
  return it == handles_.end() ? nullptr : it->second;
}

void HandleTable::release(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  spare_.erase(handles_, id);
}

void HandleTable::complete(HandleState& h, int status, const std::string& message) {
  if (status != 0 && h.status == 0) {
    h.status = status;
    h.message = message;
  }
  if (--h.remaining > 0) return;
  h.done.store(1);
  wake();
}

void HandleTable::mark_launched(HandleState& h, std::shared_ptr<void> done) {
  h.done_event = std::move(done);
  h.launched.store(1);
  wake();
}

void HandleTable::wake() {
  if (sleepers_.load() > 0) {
    std::lock_guard<std::mutex> lock(wait_mu_);
    wait_cv_.notify_all();
  }
}

bool HandleTable::wait(HandleState& h, double timeout_s, const std::function<bool()>& drive,
                       const std::function<void()>& stopped_driving, bool until_launched) {
  auto is_done = [&] {
    return h.done.load(std::memory_order_acquire) != 0 || (until_launched && h.launched.load() != 0);
  };
  if (is_done()) return true;  // (before any clock read: the common case of a finished handle)
  const int64_t start = now_us();
  const int64_t limit = timeout_s < 0 ? -1 : int64_t(timeout_s * 1e6);
  const int64_t budget = spin_budget_us();
  waiting_.fetch_add(1);
  struct Leave {
    std::atomic<int>& w;
    ~Leave() { w.fetch_sub(1); }
  } leave{waiting_};
  {
    // The waiting thread runs the engine itself while it spins: no hand-off
    // to the background thread and back, which costs several microseconds
    // each on this class of VM (it then naps while a waiter drives).
    struct Driving {
      std::atomic<int>& n;
      const std::function<void()>& after;
      ~Driving() {
        n.fetch_sub(1);
        if (after) after();
      }
    } driving{driving_, stopped_driving};
    driving_.fetch_add(1);
    while (!is_done()) {
      const int64_t elapsed = now_us() - start;
      if (limit >= 0 && elapsed >= limit) return false;
      if (elapsed >= budget) break;
      // The first microseconds without yielding: a peer's answer often comes
      // that soon, and a yield costs a system call (about 1 us here).
      if ((!drive || !drive()) && elapsed >= no_yield_us()) sched_yield();
    }
  }
  while (!is_done()) {
    const int64_t elapsed = now_us() - start;
    if (limit >= 0 && elapsed >= limit) return false;
    std::unique_lock<std::mutex> lock(wait_mu_);
    sleepers_.fetch_add(1);
    if (!is_done()) wait_cv_.wait_for(lock, std::chrono::milliseconds(10));
    sleepers_.fetch_sub(1);
  }
  return true;
}

}  // namespace commlib
