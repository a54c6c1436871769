// The engine's scheduling (Engine, runtime/engine.h): who runs the engine
// and when. The background loop, or a caller that waits and drives the
// engine's cycles itself (drive, wait) under the same lock; waking the loop
// for new requests; and one pass of it (cycle): batching new requests,
// control messages, negotiation, running responses in the order every rank
// runs them, and point-to-point.
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "base/common.h"
#include "base/liveness.h"
#include "base/progress.h"
#include "base/timeline.h"
#include "runtime/engine.h"

namespace commlib {
namespace {

// How often the background thread looks whether the waiters still drive: as
// long as an idle one naps. Each look is a wake-up on a core a waiter needs;
// at 200 us, one 1 MiB transfer in eight copied at half speed (2 ranks, 2
// cores). What the drivers leave behind wakes it at once (wake_for, wait).
constexpr int64_t kYieldNapUs = kMaxNapUs;
// A request queued this soon after its thread's last wait ended, or after
// its last request that woke nobody, most likely belongs to a caller that
// waits, and drives, next (a training step's requests, a loop of blocking
// calls): no wake-up for it. One that does not wait after all is taken up
// at the end of the background thread's nap (at most kMaxNapUs).
constexpr int64_t kFollowUpUs = 50;
thread_local int64_t t_follow_us = -kFollowUpUs;  // this thread's last driving wait or quiet request
// How often a cycle runs the point-to-point part with none in flight (a
// peer's unexpected message, a send's bytes the lane could not take yet).
constexpr int64_t kIdleP2PUs = 200;
// How often a waiter driving only point-to-point runs the whole cycle.
constexpr int64_t kFullCycleUs = 50;

}  // namespace

bool Engine::step(bool full) {
  if (comm_over_.load()) return false;  // nothing can be sent any more: just idle until shutdown
  struct CycleMark {  // (describe_state: how long the running cycle has run)
    std::atomic<int64_t>& since;
    explicit CycleMark(std::atomic<int64_t>& s) : since(s) { since.store(now_us(), std::memory_order_relaxed); }
    ~CycleMark() { since.store(0, std::memory_order_relaxed); }
  } mark(cycle_since_us_);
  try {
    if (!full) {
      const bool worked = cycle_p2p();
      throw_if_peer_lost();
      return worked;
    }
    return cycle();
  } catch (const Error& e) {
    // A wait that timed out (a peer cut off or frozen mid-collective, or rank
    // 0 never answering) ends the engine: MPI_Finalize would wait forever.
    if (e.code() == COMMLIB_ERR_TIMED_OUT) lost_contact_.store(true);
    fail_everything(e.code(), e.what());
    return true;
  }
}

bool Engine::drive() {
  if (stop_.load() || !running_.load()) return false;  // the leave handshake is the loop's
  std::unique_lock<std::mutex> lock(cycle_mu_, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  // With only point-to-point in flight a waiter runs just its part, which
  // is most of a small message's latency saved; the whole cycle (this
  // rank's share of other ranks' negotiations) still runs every
  // kFullCycleUs, far more often than an idle background thread's naps.
  const int64_t now = now_us();
  if (outstanding_.load() == p2p_outstanding_.load() && now - last_full_cycle_us_ < kFullCycleUs) {
    return step(false);
  }
  last_full_cycle_us_ = now;
  return step();
}

bool Engine::wait(HandleState& h, double timeout_s, bool until_launched) {
  // When the last driver stops with requests still open (its own, if it
  // goes to sleep; or asynchronous ones), the background thread takes over.
  return handles_.wait(
      h, timeout_s, [this] { return drive(); },
      [this] {
        t_follow_us = now_us();
        if (handles_.driving() == 0 && bg_yields_.load() && outstanding_.load() > 0) wake_yielding();
      },
      until_launched);
}

void Engine::wake_for(bool caller_waits) {
  // An idle background thread is woken for a request, and so is one napping
  // while waiters drove once no one drives any more, so that an asynchronous
  // request submitted after computing starts now and not at the end of the
  // nap. A caller that waits next, or one whose request follows closely its
  // own last wait or last request (kFollowUpUs), drives it itself: a wake-up
  // there would cost it the futex call and, on a loaded machine, its core
  // to a background thread that only holds the batch while it grows.
  const int64_t now = now_us();
  if (!caller_waits && now - t_follow_us < kFollowUpUs) {
    t_follow_us = now;
    return;
  }
  if (bg_sleeping_.load()) {
    queue_cv_.notify_one();  // (it looks at the queues under queue_mu_ before it sleeps)
  } else if (!caller_waits && bg_yields_.load() && handles_.driving() == 0) {
    wake_yielding();
  }
}

void Engine::wake_yielding() {
  { std::lock_guard<std::mutex> lock(queue_mu_); }  // it is inside wait_for, or will see driving() == 0
  queue_cv_.notify_one();
}

void Engine::loop() {
  mark_background_thread();
  leave_deadline_us_ = 0;
  silent_deadline_us_ = 0;
  int64_t idle_since = now_us();
  int64_t nap = 20;
  for (;;) {
    if (handles_.driving() > 0 && !stop_.load()) {
      // A waiting thread drives the engine: stay off the cores it needs.
      // The last driver to leave with requests open wakes us (Engine::wait),
      // and so does a request queued later by a caller that does not drive
      // (wake_for); the rest is picked up at the next look.
      std::unique_lock<std::mutex> lock(queue_mu_);
      bg_yields_.store(true);
      if (handles_.driving() > 0) queue_cv_.wait_for(lock, std::chrono::microseconds(kYieldNapUs));
      bg_yields_.store(false);
      idle_since = now_us();
      continue;
    }
    bool worked, gpu_busy, holding;
    {
      std::lock_guard<std::mutex> lock(cycle_mu_);
      worked = step();
      gpu_busy = gpu_ && gpu_->busy();
      holding = !held_.empty();
    }
    if (stop_.load() && leave()) break;
    if (worked) {
      idle_since = now_us();
      nap = 20;
      // (a batch still growing: its submitter needs the core more than we do)
      if (holding) sched_yield();
      continue;
    }
    if (now_us() - idle_since < spin_budget_us()) {
      sched_yield();
      continue;
    }
    std::unique_lock<std::mutex> lock(queue_mu_);
    bg_sleeping_.store(true);
    if (queue_.empty() && aborts_.empty() && p2p_queue_.empty() && (!stop_.load() || lingering_))  // (rank 0 leaving: it naps too)
      queue_cv_.wait_for(lock, std::chrono::microseconds(gpu_busy ? std::min(nap, kGpuPollNapUs) : nap));
    bg_sleeping_.store(false);
    if (nap < kMaxNapUs) nap *= 2;
  }
  try {
    if (!broken()) p2p_->say_goodbye();
    if (coordinator_) send_shutdown_notice();  // workers said goodbye in leave()
  } catch (const Error&) {
    // The job is going away; a notice that cannot be sent changes nothing.
  }
  fail_everything(COMMLIB_ERR_NOT_INIT, "commlib was shut down before this collective completed");
}

bool Engine::cycle() {
  bool worked = take_requests();
  worked |= forward_tune_requests();
  // The point-to-point part only with some in flight, else now and then.
  const int64_t start = now_us();
  if (p2p_queued_.load() || p2p_outstanding_.load() > 0 || start - last_p2p_cycle_us_ >= kIdleP2PUs) {
    last_p2p_cycle_us_ = start;
    worked |= cycle_p2p();
  }
  worked |= poll_messages();
  if (coordinator_) worked |= coordinate();
  worked |= run_ready();
  worked |= poll_gpu();
  const int64_t now = now_us();
  cache_.expire_waiting(now);
  if (worker_) check_coordinator_alive(now);
  control_->progress();
  throw_if_peer_lost();
  if (worked && timeline().marks_cycles()) timeline().mark("", "CYCLE", now_us());
  return worked;
}

bool Engine::take_requests() {
  // The queue, held_ and taken_ trade buffers rather than entries: each keeps
  // its capacity, and a batch taken while nothing is held moves no entry.
  if (queued_.load()) {
    std::vector<RequestDesc> aborts;
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      taken_.swap(queue_);
      aborts.swap(aborts_);
      queued_.store(false);
    }
    if (!aborts.empty()) send_aborts(aborts);
  }
  bool worked = !taken_.empty();
  if (held_.empty() && taken_.empty()) return worked;
  const int64_t now = now_us();
  if (!taken_.empty()) {
    if (held_.empty()) {
      held_since_us_ = now;
      held_gpu_bytes_ = 0;
      held_cpu_ = false;
    }
    for (const Entry& e : taken_) {
      if (e.desc.device_type == COMMLIB_DEVICE_CUDA) {
        held_gpu_bytes_ += entry_bytes(e);
      } else {
        held_cpu_ = true;
      }
    }
    if (held_.empty()) {
      held_.swap(taken_);
    } else {
      for (Entry& e : taken_) held_.push_back(std::move(e));
      taken_.clear();
    }
    last_arrival_us_ = now;
  }
  held_count_.store(int64_t(held_.size()), std::memory_order_relaxed);
  // Report now unless more requests are still streaming in (then they are
  // negotiated, and fused, together).
  if (stop_.load()) {
    for (Entry& e : held_) finish(e, COMMLIB_ERR_NOT_INIT, "commlib was shut down before this collective started");
    held_.clear();
  } else if (release_held(now)) {
    submit(held_);
    held_.clear();
    worked = true;
  }
  if (held_.empty()) held_count_.store(0, std::memory_order_relaxed);
  return worked;
}

bool Engine::release_held(int64_t now) const {
  if (handles_.waiting() > 0) return true;
  if (held_cpu_ || gpu_bucket_bytes_ == 0) return now - last_arrival_us_ >= batch_gap_us_ || now - held_since_us_ >= cycle_us_;
  constexpr int64_t kGpuHoldCapUs = 50000;
  return held_gpu_bytes_ >= gpu_bucket_bytes_ || now - last_arrival_us_ >= std::max(cycle_us_, batch_gap_us_) ||
         now - held_since_us_ >= std::max(cycle_us_, kGpuHoldCapUs);
}

bool Engine::poll_messages() {
  bool worked = false;
  int source;
  std::string msg;
  while (control_->poll(&source, &msg)) {
    on_message(source, msg);
    worked = true;
  }
  return worked;
}

bool Engine::coordinate() {
  const bool worked = coordinator_->take_responses(fusion_threshold_.load(), ready_);
  coordinator_->check_stalls(now_us());
  return worked;
}

// With the order log, the log says when each response runs; otherwise they
// run as they come.
bool Engine::run_ready() {
  if (cache_.ordered_by_log()) return cache_.run_log();
  bool worked = false;
  while (execute_next_ready()) worked = true;
  if (worker_ && worker_->take_leaving()) coordinator_left();  // (kMsgLeaving)
  const std::string closing = worker_ ? worker_->take_closing() : std::string();
  if (!closing.empty()) fail_collectives(COMMLIB_ERR_NOT_INIT, closing);  // the coordinator's acknowledgement or departure
  return worked;
}

bool Engine::execute_next_ready() {
  if (ready_.empty()) return false;
  Response resp = std::move(ready_.front());
  ready_.pop_front();
  execute(resp);
  return true;
}

void Engine::check_coordinator_alive(int64_t now) {
  // Rank 0 fails them at the timeout (checked each second, its verdict here
  // a cycle later); this is for when it cannot. 4 s: a loaded rank 0 still
  // answers first, and with this check's own second, the linger at shutdown
  // (kCoordinatorSilentLingerUs) and the abort, a frozen rank 0 ends the job
  // within the timeout + 10 s.
  constexpr int64_t kGraceUs = 4000000;
  if (timeout_us_ <= 0 || now - last_timeout_check_us_ < 1000000 || !ready_.empty()) return;
  last_timeout_check_us_ = now;
  for (const auto& [key, e] : pending_) {
    if (e.desc.op_type == COMMLIB_OP_JOIN || now - e.submitted_us < timeout_us_ + kGraceUs) continue;
    coordinator_silent_.store(true);
    throw Error(COMMLIB_ERR_TIMED_OUT,
                std::string(op_type_name(e.desc.op_type)) + " '" + e.desc.name + "' has waited " +
                    std::to_string((now - e.submitted_us) / 1000000) +
                    " s and rank 0 (the coordinator) never answered, not even with a timeout "
                    "(COMMLIB_TIMEOUT): rank 0 is frozen, overloaded or unreachable");
  }
}

void Engine::start_p2p() {
  // An isend's header (or an irecv's match) goes out from the caller's
  // thread when no other thread is in the engine: the background thread,
  // asleep on a core that computes, can take a scheduler slice (ms) to run.
  if (stop_.load() || !running_.load()) return;  // (the leave handshake is the loop's)
  std::unique_lock<std::mutex> lock(cycle_mu_, std::try_to_lock);
  if (lock.owns_lock()) step(false);
}

bool Engine::cycle_p2p() {
  std::vector<P2PRequest>& batch = p2p_batch_;  // (swapped with the queue: both keep their capacity)
  if (p2p_queued_.load()) {
    std::lock_guard<std::mutex> lock(queue_mu_);
    batch.swap(p2p_queue_);
    p2p_queued_.store(false);
  }
  const bool waiting = handles_.driving() > 0;  // (a split copy needs a sender that answers)
  for (P2PRequest& r : batch) {
    const bool sender_waits = waiting || r.caller_waits;
    p2p_->post(std::move(r), sender_waits);
  }
  const bool posted = !batch.empty();
  batch.clear();
  bool worked = p2p_->progress() || posted;
  p2p_->check_stalls(now_us(), stall_warning_us_, timeout_us_);
  return worked;
}

}  // namespace commlib
