// The engine's shutdown handshake (Engine, runtime/engine.h; on its thread,
// while stop_ is set). A worker tells rank 0 and runs responses until its
// acknowledgement. Rank 0 ends at once, or once it ran everything the order
// log placed before its departure; while process sets without it are
// registered, it first negotiates on for them until each of their members has
// left: their collectives do not need it, only its negotiation.
#include <cstdio>
#include <string>
#include <vector>

#include "base/common.h"
#include "base/progress.h"
#include "runtime/engine.h"

namespace commlib {
namespace {

// How long a rank waits for the acknowledgement of its departure (a worker,
// from rank 0) or for its own departure in the order log (rank 0) before it
// takes the other side for frozen.
constexpr int64_t kLeaveWaitUs = 30000000;

}  // namespace

// True when the loop may end. A worker keeps executing responses until the
// coordinator's acknowledgement: it must run every collective the others run.
bool Engine::leave() {
  if (broken()) return true;
  const int64_t now = now_us();
  if (coordinator_) return coordinator_leaves(now);
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (dead_code_ != 0 || coll_code_ != 0) return true;  // acknowledged, or the coordinator left
  }
  if (cache_.log_done()) return true;  // the coordinator's record of it has been read
  if (leave_deadline_us_ == 0) {
    leave_deadline_us_ = now + kLeaveWaitUs;
    worker_->send_leaving();
  }
  if (now <= leave_deadline_us_) return false;
  lost_contact_.store(true);  // rank 0 never acknowledged: it is frozen or unreachable
  std::fprintf(stderr, "commlib (rank %d): ERROR: rank 0 never acknowledged this rank's shutdown within 30 s: "
               "it is frozen or unreachable; MPI is aborted at exit\n", topo_.rank);
  return true;
}

// Without the order log rank 0 has executed everything it sent; with it, it
// runs everything placed before its departure (cached collectives other
// ranks may already run with it).
bool Engine::coordinator_leaves(int64_t now) {
  const bool by_log = cache_.ordered_by_log();
  if (cache_.start_leaving()) {
    lingering_ = coordinator_->leave();  // whatever involves rank 0 fails, now and later
    if (by_log) cache_.append_left(0);
    if (by_log && !lingering_) leave_deadline_us_ = now + kLeaveWaitUs;
  }
  if (lingering_) {
    // Their members' collectives go on: only ranks proved lost end the wait.
    if (!coordinator_->awaited_left()) {
      return !coordinator_->silent_since_timeout().empty() && coordinator_may_leave(now);
    }
    lingering_ = false;
    if (by_log) {
      cache_.stop_reading();
      leave_deadline_us_ = now + kLeaveWaitUs;
    }
  }
  if (!by_log) return coordinator_may_leave(now);
  // (the last acknowledgement may wait for room in the log)
  return (cache_.log_done() && !cache_.appends_pending()) || now > leave_deadline_us_;
}

bool Engine::coordinator_may_leave(int64_t now) {
  const std::vector<int> silent = coordinator_->silent_since_timeout();
  if (silent.empty()) return true;
  // Longer than they wait for rank 0 before they give up (check_coordinator_alive:
  // the timeout + 4-5 s), up to the timeout + 10 s: they get to raise their own errors before the abort ends the job.
  if (silent_deadline_us_ == 0) silent_deadline_us_ = now + timeout_us_ + 10000000;
  if (now <= silent_deadline_us_) return false;
  std::string ranks;
  for (int r : silent) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  lost_contact_.store(true);
  fail_everything(COMMLIB_ERR_PEER_LOST,
                  "ranks [" + ranks + "] sent nothing since their collectives timed out, not even their " +
                      "shutdown, within COMMLIB_TIMEOUT + 10 s: they are unreachable (a network partition?) or " +
                      "frozen; MPI is aborted at exit");
  return true;
}

bool Engine::coordinator_left() {
  if (coordinator_) return lingering_;
  bool goes_on = false;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    rank0_left_ = true;
    for (const auto& [id, members] : sets_) {
      bool has0 = false, mine = false;
      for (int r : members) {
        has0 = has0 || r == 0;
        mine = mine || r == topo_.rank;
      }
      goes_on = goes_on || (mine && !has0);
    }
  }
  if (!goes_on) fail_collectives(COMMLIB_ERR_NOT_INIT, kCoordinatorLeft);
  return goes_on;
}

}  // namespace commlib
