// Engine::describe_state (runtime/engine.h): one line on where this rank's
// engine is, for a job that hangs (commlibrun --timeout prints it next to
// each rank's Python stacks, commlib/stack_dumps.py).
#include <cstdio>
#include <string>

#include "base/activity.h"
#include "base/progress.h"
#include "runtime/engine.h"

namespace commlib {
namespace {

// A cycle is named as running only past this (most take microseconds).
constexpr int64_t kLongCycleUs = 100000;

}  // namespace

std::string Engine::describe_state() const {
  if (!running_.load()) return "not running (commlib is not initialized, or was shut down)";
  const int64_t now = now_us();
  std::string s = std::to_string(outstanding_.load()) + " requests open (" + std::to_string(p2p_outstanding_.load()) +
                  " point-to-point), " + std::to_string(held_count_.load()) + " held for batching, " +
                  std::to_string(gpu_launches_.load()) + " CUDA launches in flight; " +
                  (core_per_rank_ ? "waits look " + std::to_string(kNoYieldUs) + " us before yielding (a core per rank here)"
                                  : std::string("waits yield at once (this host's ranks share cores)"));
  const int64_t since = cycle_since_us_.load();
  if (since > 0 && now - since >= kLongCycleUs) {
    char took[64];
    std::snprintf(took, sizeof(took), "; one engine cycle has run for %.1f s", double(now - since) / 1e6);
    s += took;
    const std::string steps = running_activities(now);
    s += steps.empty() ? " (in no named step)" : ", in: " + steps;
  }
  if (comm_over_.load()) s += "; the engine cannot communicate any more (a peer was lost)";
  return s;
}

}  // namespace commlib
