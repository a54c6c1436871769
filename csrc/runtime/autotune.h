// Autotune (COMMLIB_AUTOTUNE=1): rank 0's search for the fusion threshold,
// the cycle time and the tree/ring cutoff that give the most allreduced
// bytes per second of wall time during the first training steps.
//
// The Autotuner is the search alone, with no communication: the engine
// (runtime/engine_tune.cc) feeds it every allreduce response rank 0 executes,
// sends each setting it decides to every rank inside the ordered stream of
// responses (so every rank applies it at the same point of its sequence of
// collectives), and tells it when the setting took effect here.
//
// Steps: a step ends where a tensor name recurs (gradients keep their names
// from step to step). A window is window_steps steps; its score is the bytes
// allreduced in it divided by its wall time. Each setting is scored by the
// median of `windows` windows, after one more window that is discarded (the
// first after a change).
//
// Search: coordinate descent over a small grid. The starting setting (the
// configuration's) is scored first; then each parameter in turn (fusion
// threshold, cycle time, and the tree/ring cutoff where the ring and the tree
// run) takes each of its candidate values, the others held at the best
// setting scored so far; a setting already scored is not scored again. Once
// every candidate is scored, the best-scored setting is applied for good.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_set>
#include <vector>

namespace commlib {

struct TuneSetting {
  int64_t fusion_threshold = 0;  // bytes
  int64_t cycle_us = 0;
  int64_t tree_max_bytes = 0;    // the tree below, the ring from it (collectives/allreduce_across.h)
  bool operator==(const TuneSetting& o) const {
    return fusion_threshold == o.fusion_threshold && cycle_us == o.cycle_us && tree_max_bytes == o.tree_max_bytes;
  }
};

struct TuneOptions {
  int window_steps = 5;    // COMMLIB_AUTOTUNE_WINDOW_STEPS
  int windows = 2;         // COMMLIB_AUTOTUNE_WINDOWS (scored, after one discarded)
  bool tune_tree = false;  // the tree/ring cutoff is in use (no shared memory, or several hosts)
  std::string log_path;    // COMMLIB_AUTOTUNE_LOG: the CSV ("" none)
};

struct TuneSample {
  TuneSetting setting;
  std::vector<double> window_scores;  // bytes/s of each scored window
  double score = 0;                   // their median
};

class Autotuner {
 public:
  enum Param { kFusion = 0, kCycle = 1, kTree = 2 };
  // The candidate values of a parameter (bytes, us, bytes).
  static const std::vector<int64_t>& candidates(Param p);

  Autotuner(const TuneSetting& start, const TuneOptions& options);

  // Rank 0 executed an allreduce response: its request keys, the bytes it
  // reduced, and when it started (us).
  void observe(const std::vector<std::string>& names, int64_t bytes, int64_t now_us);
  // The next setting to apply on every rank (true, once per decision);
  // *final: the best one, after which the search is over.
  bool take_decision(TuneSetting* s, bool* final);
  // The setting last taken took effect here: its measurement starts (after
  // the final one, nothing more is measured).
  void applied();
  bool done() const { return done_; }
  const std::vector<TuneSample>& samples() const { return samples_; }
  // The index of the best-scored sample (-1: none yet).
  int best() const;

 private:
  void step_boundary(int64_t now_us);
  void setting_scored();
  void decide_next();
  void write_log() const;

  TuneOptions opt_;
  std::vector<Param> params_;
  size_t phase_ = 0, candidate_ = 0;
  TuneSetting current_;
  std::vector<TuneSample> samples_;
  std::vector<double> scores_;  // the current setting's scored windows
  bool measuring_ = true;       // false from a decision until it is applied
  bool decided_ = false, final_ = false, done_ = false;
  TuneSetting decision_;
  std::unordered_set<std::string> step_names_;  // names seen in the current step
  bool window_open_ = false;
  int window_step_ = 0, windows_seen_ = 0;
  int64_t window_start_us_ = 0, window_bytes_ = 0;
  mutable bool warned_ = false;
};

}  // namespace commlib
