// The autotune search (see autotune.h).
#include "runtime/autotune.h"

#include <algorithm>
#include <cstdio>
#include <fstream>

namespace commlib {

const std::vector<int64_t>& Autotuner::candidates(Param p) {
  static const std::vector<int64_t> fusion = {int64_t(1) << 20, int64_t(4) << 20, int64_t(16) << 20,
                                              int64_t(64) << 20};
  static const std::vector<int64_t> cycle = {250, 1000, 5000};
  static const std::vector<int64_t> tree = {int64_t(4) << 10, int64_t(16) << 10, int64_t(64) << 10,
                                            int64_t(256) << 10};
  switch (p) {
    case kFusion: return fusion;
    case kCycle: return cycle;
    case kTree: break;
  }
  return tree;
}

Autotuner::Autotuner(const TuneSetting& start, const TuneOptions& options) : opt_(options), current_(start) {
  opt_.window_steps = std::max(opt_.window_steps, 1);
  opt_.windows = std::max(opt_.windows, 1);
  params_ = {kFusion, kCycle};
  if (opt_.tune_tree) params_.push_back(kTree);
}

void Autotuner::observe(const std::vector<std::string>& names, int64_t bytes, int64_t now_us) {
  if (done_) return;
  bool recurs = false;
  for (const std::string& n : names) recurs |= step_names_.count(n) > 0;
  if (recurs) {
    step_names_.clear();
    step_boundary(now_us);
  }
  step_names_.insert(names.begin(), names.end());
  if (window_open_) window_bytes_ += bytes;
}

// A step starts at now_us: windows open and close on step boundaries.
void Autotuner::step_boundary(int64_t now_us) {
  if (!measuring_) return;
  if (window_open_) {
    if (++window_step_ < opt_.window_steps) return;
    const double seconds = double(std::max<int64_t>(now_us - window_start_us_, 1)) * 1e-6;
    if (windows_seen_++ > 0) scores_.push_back(double(window_bytes_) / seconds);  // (the first is discarded)
    window_open_ = false;
    if (int(scores_.size()) == opt_.windows) return setting_scored();
  }
  window_open_ = true;
  window_step_ = 0;
  window_start_us_ = now_us;
  window_bytes_ = 0;
}

void Autotuner::setting_scored() {
  TuneSample s;
  s.setting = current_;
  s.window_scores = scores_;
  std::vector<double> sorted = scores_;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  s.score = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
  samples_.push_back(std::move(s));
  scores_.clear();
  measuring_ = false;
  decide_next();
  write_log();
}

// The next candidate not scored yet, the other parameters at the best
// setting so far; the best setting for good once there is none.
void Autotuner::decide_next() {
  const TuneSetting best_setting = samples_[size_t(best())].setting;
  for (; phase_ < params_.size(); ++phase_, candidate_ = 0) {
    const std::vector<int64_t>& values = candidates(params_[phase_]);
    while (candidate_ < values.size()) {
      TuneSetting s = best_setting;
      const int64_t v = values[candidate_++];
      switch (params_[phase_]) {
        case kFusion: s.fusion_threshold = v; break;
        case kCycle: s.cycle_us = v; break;
        case kTree: s.tree_max_bytes = v; break;
      }
      const bool tried = std::any_of(samples_.begin(), samples_.end(),
                                     [&](const TuneSample& x) { return x.setting == s; });
      if (tried) continue;
      decision_ = s;
      decided_ = true;
      return;
    }
  }
  decision_ = best_setting;
  decided_ = final_ = true;
}

bool Autotuner::take_decision(TuneSetting* s, bool* final) {
  if (!decided_) return false;
  decided_ = false;
  *s = decision_;
  *final = final_;
  current_ = decision_;
  return true;
}

void Autotuner::applied() {
  if (final_) {
    done_ = true;
    write_log();
    return;
  }
  measuring_ = true;
  window_open_ = false;
  windows_seen_ = 0;
}

int Autotuner::best() const {
  int b = -1;
  for (size_t i = 0; i < samples_.size(); ++i)
    if (b < 0 || samples_[i].score > samples_[size_t(b)].score) b = int(i);
  return b;
}

// The whole CSV again (it is small): every setting scored, the chosen one
// marked once the search is over.
void Autotuner::write_log() const {
  if (opt_.log_path.empty()) return;
  std::ofstream f(opt_.log_path, std::ios::out | std::ios::trunc);
  if (!f) {
    if (!warned_) std::fprintf(stderr, "commlib (rank 0): WARNING: COMMLIB_AUTOTUNE_LOG: cannot write %s\n",
                               opt_.log_path.c_str());
    warned_ = true;
    return;
  }
  f << "sample,fusion_threshold_bytes,cycle_time_ms,tree_max_bytes,score_bytes_per_s,window_scores,chosen\n";
  const int chosen = done_ ? best() : -1;
  for (size_t i = 0; i < samples_.size(); ++i) {
    const TuneSample& s = samples_[i];
    std::string windows;
    for (double w : s.window_scores) windows += (windows.empty() ? "" : ";") + std::to_string(int64_t(w));
    f << i << ',' << s.setting.fusion_threshold << ',' << double(s.setting.cycle_us) / 1000 << ','
      << s.setting.tree_max_bytes << ',' << int64_t(s.score) << ',' << windows << ',' << (int(i) == chosen)
      << '\n';
  }
}

}  // namespace commlib
