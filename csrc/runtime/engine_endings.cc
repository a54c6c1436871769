// The engine's endings (Engine, runtime/engine.h): requests finished, the
// failures that end collectives or all communication, and what they mean at
// exit (whether MPI may be finalized).
#include <cstdio>

#include "base/common.h"
#include "base/progress.h"
#include "base/timeline.h"
#include "runtime/engine.h"
#include "runtime/trace_events.h"

namespace commlib {

int Engine::unsafe_to_finalize() {
  const int code = broken();
  return code ? code : timed_out_.load() ? COMMLIB_ERR_TIMED_OUT : 0;
}

int Engine::broken() {
  if (lost_contact_.load()) return COMMLIB_ERR_PEER_LOST;
  std::lock_guard<std::mutex> lock(queue_mu_);
  return (dead_code_ == COMMLIB_ERR_PEER_LOST || dead_code_ == COMMLIB_ERR_INTERNAL) ? dead_code_ : 0;
}

void Engine::finish(Entry& e, int status, const std::string& message) {
  if (e.stand_in) return;  // (a joined rank's stand-in is no request of this rank's)
  if (e.ready_event) gpu::destroy_event(e.ready_event);
  if (status != COMMLIB_OK && timeline().on()) trace_failure(e, status, message, now_us());
  outstanding_.fetch_sub(1);
  {
    std::string buf;
    const std::string& key = key_of(e.desc, buf);
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (!e.handle->launched.load()) in_flight_spare_.erase(in_flight_, key);  // (else at launch_gpu)
  }
  note_ending(status, e.desc.process_set == 0);
  HandleState& h = *e.handle;
  handles_.complete(h, status, message);
  if (h.detached.load() && h.done.load() && !h.claimed.exchange(true)) settle_detached(h);
}

void Engine::note_ending(int status, bool whole_job) {
  if (status == COMMLIB_ERR_TIMED_OUT) {
    timed_out_.store(true);
  } else if (status == COMMLIB_OK && whole_job) {
    timed_out_.store(false);
  }
}

void Engine::fail_everything(int code, const std::string& message) {
  std::vector<P2PRequest> p2p_queued;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    p2p_queued.swap(p2p_queue_);
    p2p_queued_.store(false);
    // With the order log, a rank that dropped its requests cannot stay in
    // step with the others: every failure ends its communication.
    if (dead_code_ == 0 && (cache_.ordered_by_log() || (code != COMMLIB_ERR_VALUE && code != COMMLIB_ERR_TYPE))) {
      dead_code_ = code;
      dead_message_ = message;
      if (code == COMMLIB_ERR_PEER_LOST || code == COMMLIB_ERR_INTERNAL) {
        comm_over_.store(true);
        std::fprintf(stderr, "commlib (rank %d): ERROR: %s\n", topo_.rank, message.c_str());
      }
    }
  }
  for (P2PRequest& r : p2p_queued) {
    p2p_outstanding_.fetch_sub(1);
    outstanding_.fetch_sub(1);
    handles_.complete(*r.handle, code, message);
  }
  if (p2p_) p2p_->fail_all(code, message);
  fail_pending(code, message);
}

void Engine::fail_collectives(int code, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (coll_code_ == 0) {
      coll_code_ = code;
      coll_message_ = message;
    }
  }
  fail_pending(code, message);
}

void Engine::fail_pending(int code, const std::string& message) {
  std::vector<Entry> queued;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    queued.swap(queue_);
  }
  for (Entry& e : queued) finish(e, code, message);
  for (Entry& e : held_) finish(e, code, message);
  held_.clear();
  held_count_.store(0, std::memory_order_relaxed);
  for (auto& [name, e] : pending_) finish(e, code, message);
  pending_.clear();
  if (code == COMMLIB_ERR_NOT_INIT) drain_gpu();  // (a shutdown: what every rank launched may finish)
  abandon_gpu(code, message);
  joins_pending_ = 0;
  ready_.clear();
  cache_.abandon();
}

// Coordinator only: tells every worker still listening that no further
// collectives are possible.
void Engine::send_shutdown_notice() {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (dead_code_ != 0) return;
  }
  coordinator_->send_shutdown_notice();
}

}  // namespace commlib
