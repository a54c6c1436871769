#include "runtime/progress.h"

#include <cstdlib>

namespace commlib {

int64_t spin_budget_us() {
  static const int64_t budget = [] {
    const char* v = std::getenv("COMMLIB_SPIN_US");
    return v ? std::atoll(v) : int64_t(2000);
  }();
  return budget;
}

}  // namespace commlib
