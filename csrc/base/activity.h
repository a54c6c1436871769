// What the engine is busy with, for a hung job's report: commlib_engine_state
// (c_api.h), which commlibrun --timeout prints next to each rank's Python
// stacks. A step that can block for long (a communicator's creation, a
// collective's execution, a device launch) names itself for its duration
// with an Activity; any thread may read the steps running now. Naming costs
// a short lock and no allocation: the label is a literal, the detail a
// string that outlives the scope.
#pragma once

#include <cstdint>
#include <string>

namespace commlib {

class Activity {
 public:
  explicit Activity(const char* what, const std::string* detail = nullptr);
  ~Activity();
  Activity(const Activity&) = delete;
  Activity& operator=(const Activity&) = delete;

 private:
  int64_t id_;
};

// The steps running now, outermost first, each with how long it has run:
// "creating the NCCL communicator 'x' for 41.2 s"; empty when none.
std::string running_activities(int64_t now_us);

}  // namespace commlib
