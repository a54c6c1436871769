// The autotune search (csrc/runtime/autotune.h) in one process: a simulated
// training loop whose step time depends on the setting drives it, applying
// each decision a response later (as rank 0 does once the setting comes back
// through the order). Scores, the discarded window, the order of the search,
// the final choice and the CSV log.
//
// csrc: runtime/autotune.cc
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "check.h"
#include "runtime/autotune.h"

using commlib::Autotuner;
using commlib::TuneOptions;
using commlib::TuneSetting;

namespace {

constexpr int64_t kMiB = int64_t(1) << 20;
constexpr int kTensors = 4;
constexpr int64_t kTensorBytes = 1000;

// A training loop of kTensors named allreduces per step; step_us(setting)
// is a step's wall time under a setting; slow_first: the first step after a
// change takes that many times as long (what the discarded window absorbs).
struct Sim {
  Autotuner tuner;
  std::function<double(const TuneSetting&)> step_us;
  double slow_first = 1;
  TuneSetting now_setting;
  std::vector<TuneSetting> applied;  // in order
  std::vector<bool> finals;
  double now = 0;
  bool pending = false, just_changed = false;
  TuneSetting next;
  bool next_final = false;

  Sim(TuneSetting start, TuneOptions o, std::function<double(const TuneSetting&)> f)
      : tuner(start, o), step_us(std::move(f)), now_setting(start) {}

  void run_steps(int steps) {
    for (int s = 0; s < steps; ++s) {
      const double factor = just_changed ? slow_first : 1;
      just_changed = false;
      for (int i = 0; i < kTensors; ++i) {
        tuner.observe({"grad" + std::to_string(i)}, kTensorBytes, int64_t(now));
        if (pending) {  // (a response later)
          pending = false;
          now_setting = next;
          applied.push_back(next);
          finals.push_back(next_final);
          tuner.applied();
          just_changed = true;
        }
        if (tuner.take_decision(&next, &next_final)) pending = true;
        now += step_us(now_setting) * factor / kTensors;
      }
    }
  }
};

// The fastest at 16 MiB and 5 ms; the tree cutoff matters little.
double model(const TuneSetting& s) {
  const double f = std::fabs(std::log2(double(std::max<int64_t>(s.fusion_threshold, 1)) / double(16 * kMiB)));
  const double c = std::fabs(std::log2(double(std::max<int64_t>(s.cycle_us, 1)) / 5000.0));
  return 1000.0 * (1 + 0.1 * f + 0.05 * c) + (s.tree_max_bytes == (64 << 10) ? 0 : 10);
}

TuneOptions options(int steps, int windows, bool tree = false, const std::string& log = "") {
  return TuneOptions{steps, windows, tree, log};
}

}  // namespace

TEST_CASE("score is bytes per second of a window, the first window after a change discarded") {
  Sim sim({0, 1000, 16 << 10}, options(3, 2), [](const TuneSetting&) { return 2000.0; });
  sim.slow_first = 50;  // would drag a scored window down if it were not discarded
  sim.run_steps(200);
  CHECK(sim.tuner.done());
  CHECK(!sim.tuner.samples().empty());
  const double expect = double(kTensors * kTensorBytes) / 2000e-6;
  for (const auto& s : sim.tuner.samples()) {
    CHECK_EQ(s.window_scores.size(), size_t(2));
    for (double w : s.window_scores) CHECK(std::fabs(w - expect) < 1e-6 * expect);
    CHECK(std::fabs(s.score - expect) < 1e-6 * expect);
  }
}

TEST_CASE("coordinate search: fusion candidates, then cycle times, then the best setting for good") {
  Sim sim({0, 1000, 16 << 10}, options(2, 2), model);
  sim.run_steps(400);
  CHECK(sim.tuner.done());
  const auto& samples = sim.tuner.samples();
  // start, 4 fusion thresholds, then 2 cycle times (1000 us was scored with the start)
  CHECK_EQ(samples.size(), size_t(7));
  CHECK_EQ(samples[0].setting.fusion_threshold, int64_t(0));
  const std::vector<int64_t> fusion = Autotuner::candidates(Autotuner::kFusion);
  for (size_t i = 0; i < fusion.size(); ++i) {
    CHECK_EQ(samples[1 + i].setting.fusion_threshold, fusion[i]);
    CHECK_EQ(samples[1 + i].setting.cycle_us, int64_t(1000));
  }
  CHECK_EQ(samples[5].setting.fusion_threshold, 16 * kMiB);  // the best of phase one, held
  CHECK_EQ(samples[5].setting.cycle_us, int64_t(250));
  CHECK_EQ(samples[6].setting.cycle_us, int64_t(5000));
  for (const auto& s : samples) CHECK_EQ(s.setting.tree_max_bytes, int64_t(16 << 10));  // not tuned
  // The final setting, applied last and once, is the best-scored one.
  const TuneSetting best = samples[size_t(sim.tuner.best())].setting;
  CHECK_EQ(best.fusion_threshold, 16 * kMiB);
  CHECK_EQ(best.cycle_us, int64_t(5000));
  CHECK(sim.applied.back() == best);
  CHECK(sim.finals.back());
  CHECK_EQ(std::count(sim.finals.begin(), sim.finals.end(), true), 1l);
  CHECK_EQ(sim.applied.size(), size_t(7));  // 6 trials after the start, then the final
  CHECK(sim.now_setting == best);
}

TEST_CASE("a setting already scored is not scored again; the tree cutoff is tuned where it is used") {
  Sim sim({64 * kMiB, 1000, 16 << 10}, options(1, 1, true), model);
  sim.run_steps(400);
  CHECK(sim.tuner.done());
  const auto& samples = sim.tuner.samples();
  // start (64 MiB), 3 other thresholds, 2 cycle times, 3 tree cutoffs
  CHECK_EQ(samples.size(), size_t(9));
  for (size_t i = 0; i < samples.size(); ++i)
    for (size_t j = 0; j < i; ++j) CHECK(!(samples[i].setting == samples[j].setting));
  const TuneSetting best = samples[size_t(sim.tuner.best())].setting;
  CHECK_EQ(best.tree_max_bytes, int64_t(64 << 10));
  CHECK(sim.applied.back() == best);
}

TEST_CASE("nothing is decided while names never recur (no steps), nor after the search") {
  Autotuner t({0, 1000, 16 << 10}, options(1, 1));
  TuneSetting s;
  bool final = false;
  for (int i = 0; i < 1000; ++i) {
    t.observe({"unique." + std::to_string(i)}, 100, i * 10);
    CHECK(!t.take_decision(&s, &final));
  }
  CHECK(t.samples().empty());
  CHECK_EQ(t.best(), -1);
}

TEST_CASE("the CSV has a row per setting scored, the chosen one marked once the search is over") {
  const std::string path = "autotune_test_log.csv";
  Sim sim({0, 1000, 16 << 10}, options(1, 2, false, path), model);
  auto rows = [&] {
    std::ifstream f(path);
    std::vector<std::string> out;
    for (std::string line; std::getline(f, line);) out.push_back(line);
    return out;
  };
  sim.run_steps(12);  // a few settings scored, not all
  CHECK(!sim.tuner.done());
  std::vector<std::string> partial = rows();
  CHECK(partial.size() >= 2);
  CHECK_EQ(partial.at(0),
           std::string("sample,fusion_threshold_bytes,cycle_time_ms,tree_max_bytes,score_bytes_per_s,window_scores,chosen"));
  for (size_t i = 1; i < partial.size(); ++i) CHECK(partial[i].back() == '0');
  sim.run_steps(200);
  CHECK(sim.tuner.done());
  std::vector<std::string> all = rows();
  CHECK_EQ(all.size(), sim.tuner.samples().size() + 1);
  int chosen = -1, marked = 0;
  for (size_t i = 1; i < all.size(); ++i) {
    if (all[i].back() == '1') {
      chosen = int(i) - 1;
      ++marked;
    }
  }
  CHECK_EQ(marked, 1);
  CHECK_EQ(chosen, sim.tuner.best());
  std::remove(path.c_str());
}

CHECK_MAIN()
