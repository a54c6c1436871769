// Settings that change while collectives run: the fusion threshold, the
// cycle time and the tree/ring cutoff, set by autotune (runtime/autotune.h)
// or by commlib_set_fusion_threshold.
//
// They must change at the same point of every rank's sequence of
// collectives: the executor cuts a fused allreduce into windows of at most
// the fusion threshold, and every rank must cut the same windows (a rank
// that cut others would wait for, or reduce, data its peers never send). So
// no rank changes them on its own: rank 0 puts a Response::kTune into the
// ordered stream of responses (a worker's request goes to rank 0 first), and
// every rank applies it where it runs it, after the same collectives.
#include <algorithm>

#include "base/progress.h"
#include "collectives/allreduce_across.h"
#include "exec/algorithm.h"
#include "negotiation/fusion.h"
#include "runtime/engine.h"

namespace commlib {

namespace {

// rows[3], who asked: commlib_set_fusion_threshold, an autotune trial, or
// autotune's final choice.
enum { kByCall = 0, kByTrial = 1, kByFinal = 2 };

Response tune_response(const std::vector<int64_t>& rows) {
  Response r;
  r.kind = Response::kTune;
  r.rows = rows;
  return r;
}

}  // namespace

void Engine::set_fusion_threshold(int64_t bytes) {
  if (bytes < 0) throw Error(COMMLIB_ERR_VALUE, "fusion threshold must be >= 0");
  if (!running_.load()) {
    fusion_threshold_.store(bytes);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    tune_requests_.push_back(bytes);
    tune_queued_.store(true);
  }
  queue_cv_.notify_one();
}

// At start(): the settings back to the configuration's; rank 0 starts the
// search when COMMLIB_AUTOTUNE=1.
void Engine::start_autotune() {
  set_tree_max_bytes(kTreeMaxBytes);
  tuner_.reset();
  executed_ = 0;
  {
    std::lock_guard<std::mutex> lock(tune_mu_);
    tune_history_.clear();
  }
  if (!config_.autotune || topo_.rank != 0 || topo_.size < 2) return;
  TuneOptions o;
  o.window_steps = int(config_.autotune_window_steps);
  o.windows = int(config_.autotune_windows);
  o.tune_tree = algo_ == AllreduceAlgo::kAuto && (!shm_ || cross_);
  o.log_path = config_.autotune_log;
  tuner_ = std::make_unique<Autotuner>(TuneSetting{fusion_threshold_.load(), cycle_us_, int64_t(tree_max_bytes())}, o);
}

// Requests of commlib_set_fusion_threshold go to rank 0, which orders them.
bool Engine::forward_tune_requests() {
  if (!tune_queued_.load()) return false;
  std::vector<int64_t> requests;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    requests.swap(tune_requests_);
    tune_queued_.store(false);
  }
  for (int64_t bytes : requests) {
    const std::vector<int64_t> rows = {bytes, -1, -1, kByCall};
    if (coordinator_) {
      coordinator_->post(tune_response(rows));
    } else {
      Writer w;
      w.put<int32_t>(kMsgTune);
      w.put_vec(rows);
      control_->send(0, w.take());
    }
  }
  return true;
}

// Every collective response, before it runs: counted (the point where
// settings change, for autotune_history), and on rank 0 measured.
void Engine::note_executed(const Response& resp, const std::vector<Entry*>& entries) {
  ++executed_;
  if (!tuner_ || tuner_->done() || resp.op_type != COMMLIB_OP_ALLREDUCE) return;
  int64_t bytes = 0;
  for (const Entry* e : entries) bytes += fusion_bytes(e->desc, {});
  tuner_->observe(resp.names, bytes, now_us());
  TuneSetting s;
  bool final = false;
  if (tuner_->take_decision(&s, &final))
    coordinator_->post(tune_response({s.fusion_threshold, s.cycle_us, s.tree_max_bytes, final ? kByFinal : kByTrial}));
}

void Engine::apply_tune(const Response& resp) {
  const std::vector<int64_t>& v = resp.rows;
  if (v.size() < 4) throw Error(COMMLIB_ERR_INTERNAL, "malformed settings response");
  if (v[0] >= 0) fusion_threshold_.store(v[0]);
  if (v[1] >= 0) cycle_us_ = v[1];
  if (v[2] >= 0) set_tree_max_bytes(size_t(v[2]));
  if (tuner_ && v[3] != kByCall) tuner_->applied();
  std::lock_guard<std::mutex> lock(tune_mu_);
  tune_history_.push_back({executed_, fusion_threshold_.load(), cycle_us_, int64_t(tree_max_bytes()), v[3]});
}

int64_t Engine::tune_history(int64_t* out, int64_t max_rows) {
  std::lock_guard<std::mutex> lock(tune_mu_);
  const int64_t n = std::min<int64_t>(max_rows, int64_t(tune_history_.size()));
  for (int64_t i = 0; i < n; ++i) std::copy(tune_history_[size_t(i)].begin(), tune_history_[size_t(i)].end(), out + 5 * i);
  return int64_t(tune_history_.size());
}

}  // namespace commlib
