// The activity board (csrc/base/activity.h): what commlib_engine_state names
// while a pass of the engine is stuck. Nested steps read outermost first with
// their details and durations, a step that ended is gone (also out of order,
// from another thread), and a reader on another thread sees a step that is
// still running.
//
// csrc: base/activity.cc
#include <atomic>
#include <string>
#include <thread>

#include "base/activity.h"
#include "base/progress.h"
#include "check.h"

using commlib::Activity;
using commlib::running_activities;

TEST_CASE("nested steps read outermost first") {
  CHECK_EQ(running_activities(commlib::now_us()), std::string());
  const std::string name = "grad.fc.weight";
  {
    const Activity outer("broadcast", &name);
    {
      const Activity inner("ncclCommInitRank");
      const std::string now = running_activities(commlib::now_us() + 2500000);
      CHECK(now.find("broadcast 'grad.fc.weight' for 2.5 s; within it, ncclCommInitRank for 2.5 s") == 0);
    }
    const std::string after = running_activities(commlib::now_us());
    CHECK(after.find("broadcast 'grad.fc.weight' for ") == 0);
    CHECK(after.find("ncclCommInitRank") == std::string::npos);
  }
  CHECK_EQ(running_activities(commlib::now_us()), std::string());
}

TEST_CASE("another thread reads a running step, and steps end in any order") {
  std::atomic<int> phase{0};
  std::thread worker([&] {
    auto* first = new Activity("sharing its unique id");
    const Activity second("ncclCommInitRank");
    phase.store(1);
    while (phase.load() != 2) std::this_thread::yield();
    delete first;  // (the outer one ends first)
    phase.store(3);
    while (phase.load() != 4) std::this_thread::yield();
  });
  while (phase.load() != 1) std::this_thread::yield();
  CHECK(running_activities(commlib::now_us()).find("sharing its unique id for ") == 0);
  phase.store(2);
  while (phase.load() != 3) std::this_thread::yield();
  CHECK(running_activities(commlib::now_us()).find("ncclCommInitRank for ") == 0);
  phase.store(4);
  worker.join();
  CHECK_EQ(running_activities(commlib::now_us()), std::string());
}

CHECK_MAIN()
