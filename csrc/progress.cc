#include "progress.h"

#include <atomic>

#include "runtime/config.h"

namespace commlib {
namespace {

std::atomic<int64_t>& budget() {
  static std::atomic<int64_t> us{Config::defaults().spin_us};
  return us;
}

}  // namespace

int64_t spin_budget_us() { return budget().load(std::memory_order_relaxed); }

void set_spin_budget_us(int64_t us) { budget().store(us, std::memory_order_relaxed); }

}  // namespace commlib
