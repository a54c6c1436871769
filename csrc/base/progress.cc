#include "base/progress.h"

#include <atomic>

#include "base/common.h"
#include "base/config.h"

namespace commlib {
namespace {

std::atomic<int64_t>& budget() {
  static std::atomic<int64_t> us{Config::defaults().spin_us};
  return us;
}

std::atomic<int64_t>& bg_budget() {
  static std::atomic<int64_t> us{Config::defaults().bg_spin_us};
  return us;
}

thread_local bool t_background = false;

std::atomic<int64_t> g_stuck_timeout_us{0};
std::atomic<int64_t> g_no_yield_us{0};

}  // namespace

int64_t stuck_timeout_us() { return g_stuck_timeout_us.load(std::memory_order_relaxed); }

void set_stuck_timeout_us(int64_t us) { g_stuck_timeout_us.store(us, std::memory_order_relaxed); }

void throw_stuck(int64_t waited_us, const std::string& waited_for) {
  throw Error(COMMLIB_ERR_TIMED_OUT, "made no progress for " + std::to_string(waited_us / 1000000) +
                                         " s (COMMLIB_TIMEOUT) waiting for " + waited_for +
                                         " (unreachable, frozen or dead?)");
}
int64_t no_yield_us() { return t_background ? 0 : g_no_yield_us.load(std::memory_order_relaxed); }

void set_no_yield_us(int64_t us) { g_no_yield_us.store(us, std::memory_order_relaxed); }

int64_t spin_budget_us() {
  return (t_background ? bg_budget() : budget()).load(std::memory_order_relaxed);
}

void set_spin_budget_us(int64_t us) { budget().store(us, std::memory_order_relaxed); }

void set_bg_spin_budget_us(int64_t us) { bg_budget().store(us, std::memory_order_relaxed); }

void mark_background_thread() { t_background = true; }

bool transfer_may_nap() {
  return !t_background || g_drivers == nullptr || g_drivers->load(std::memory_order_relaxed) == 0;
}

}  // namespace commlib
