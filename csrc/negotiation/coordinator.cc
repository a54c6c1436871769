#include "negotiation/coordinator.h"

#include <algorithm>
#include <cstdio>

#include "base/common.h"
#include "base/progress.h"
#include "base/timeline.h"

namespace commlib {

bool addressed_to(const Response& resp, int r) {
  return resp.to.empty() || std::find(resp.to.begin(), resp.to.end(), r) != resp.to.end();
}

Coordinator::Coordinator(int size, int64_t fusion_threshold, int64_t stall_warning_us,
                         ControlChannel& control, CacheProtocol& cache)
    : size_(size),
      stall_warning_us_(stall_warning_us),
      control_(control),
      cache_(cache),
      controller_(size, fusion_threshold),
      worker_left_(size_t(size), false),
      awaited_(size_t(size), false),
      notified_(size_t(size), false),
      silent_(size_t(size), false) {}

void Coordinator::add(int rank, RequestDesc desc, int64_t now) {
  if (timeline().on()) timeline().mark(desc.name, "RANK_READY", now, "\"rank\": " + std::to_string(rank));
  cache_.on_full_request(desc);
  if (desc.op_type == COMMLIB_OP_JOIN) cache_.pause();
  controller_.add(rank, std::move(desc), now);
}

bool Coordinator::on_message(int source, int kind, Reader& r) {
  silent_[size_t(source)] = false;  // whatever it says, it can reach rank 0
  if (kind == kMsgRequests) {
    const uint32_t n = r.get<uint32_t>();
    const int64_t now = now_us();
    for (uint32_t i = 0; i < n; ++i) add(source, decode_request(r), now);
  } else if (kind == kMsgArrived || kind == kMsgExpire) {
    const std::vector<int64_t> words = r.get_vec();
    const std::vector<uint64_t> w(words.begin(), words.end());
    if (kind == kMsgArrived) {
      cache_.on_arrived(w);
    } else {
      cache_.on_expire(w);
    }
  } else if (kind == kMsgShutdown) {
    on_worker_left(source);
  } else if (kind == kMsgTune) {
    Response tune;
    tune.kind = Response::kTune;
    tune.rows = r.get_vec();
    post(std::move(tune));
  } else {
    return false;
  }
  return true;
}

// Acknowledge: every response sent to the leaving rank precedes this (and,
// with the order log, every marker precedes its departure's entry).
void Coordinator::on_worker_left(int source) {
  worker_left_[size_t(source)] = true;
  controller_.rank_left(source);
  cache_.on_rank_left(source);
  if (cache_.ordered_by_log()) {
    cache_.append_left(source);  // (the log is its acknowledgement)
  } else if (!notified_[size_t(source)] || awaited_[size_t(source)]) {  // (else the notice was its acknowledgement)
    Writer w;
    w.put<int32_t>(kMsgShutdown);
    control_.send(source, w.take());
  }
}

bool Coordinator::take_responses(int64_t fusion_threshold, std::deque<Response>& mine) {
  controller_.set_fusion_threshold(fusion_threshold);
  std::vector<Response> resps = controller_.take_ready();
  cache_.prepare_responses(resps, fusion_threshold);
  for (Response& p : posted_) resps.push_back(std::move(p));
  posted_.clear();
  // (a join that completed: the responses after it may be cached again)
  if (!controller_.joining()) cache_.resume();
  if (resps.empty()) return false;
  send_responses(resps);
  // With the order log, a marker says where every rank runs its share.
  std::vector<uint64_t> counts(cache_.ordered_by_log() ? size_t(size_) : 0, 0);
  for (Response& r : resps) {
    for (size_t k = 0; k < counts.size(); ++k)
      counts[k] += addressed_to(r, int(k)) && (k == 0 || !worker_left_[k]) ? 1 : 0;
    if (addressed_to(r, 0)) mine.push_back(std::move(r));
  }
  if (cache_.ordered_by_log()) cache_.append_marker(std::move(counts));
  return true;
}

// Each worker gets, in order, the responses addressed to it.
void Coordinator::send_responses(const std::vector<Response>& resps) {
  std::string common;  // the message of workers that get every response
  for (int r = 1; r < size_; ++r) {
    if (worker_left_[size_t(r)]) continue;
    std::vector<const Response*> mine;
    for (const Response& x : resps)
      if (addressed_to(x, r)) mine.push_back(&x);
    if (mine.empty()) continue;
    const bool all = mine.size() == resps.size();
    if (all && !common.empty()) {
      control_.send(r, common);
      continue;
    }
    Writer w;
    w.put<int32_t>(kMsgResponses);
    w.put<uint32_t>(uint32_t(mine.size()));
    for (const Response* x : mine) encode(w, *x);
    std::string bytes = w.take();
    if (all) common = bytes;
    control_.send(r, std::move(bytes));
  }
}

void Coordinator::check_stalls(int64_t now) {
  if (now - last_stall_check_us_ <= 1000000) return;
  last_stall_check_us_ = now;
  for (const std::string& w : controller_.stall_warnings(now, stall_warning_us_)) {
    std::fprintf(stderr, "commlib (rank 0): WARNING: %s\n", w.c_str());
  }
  if (timeout_us_ <= 0) return;
  controller_.time_out(now, timeout_us_);
  for (int r : controller_.take_timed_out_missing())
    if (r != 0) silent_[size_t(r)] = true;
}

std::vector<int> Coordinator::silent_since_timeout() const {
  std::vector<int> out;
  for (int r = 1; r < size_; ++r)
    if (silent_[size_t(r)] && !worker_left_[size_t(r)]) out.push_back(r);
  return out;
}

bool Coordinator::leave() {
  controller_.rank_left(0);
  for (const auto& [id, members] : controller_.sets()) {
    if (std::find(members.begin(), members.end(), 0) != members.end()) continue;
    for (int r : members) awaited_[size_t(r)] = awaited_[size_t(r)] || !worker_left_[size_t(r)];
  }
  const bool waits = !awaited_left();
  if (!waits || cache_.ordered_by_log()) return waits;  // (its departure is in the order log)
  Writer w;
  w.put<int32_t>(kMsgLeaving);
  const std::string bytes = w.take();
  for (int r = 1; r < size_; ++r) {
    if (worker_left_[size_t(r)]) continue;
    control_.send(r, bytes);
    notified_[size_t(r)] = true;
  }
  return true;
}

bool Coordinator::awaited_left() const {
  for (int r = 1; r < size_; ++r)
    if (awaited_[size_t(r)] && !worker_left_[size_t(r)]) return false;
  return true;
}

void Coordinator::send_shutdown_notice() {
  if (cache_.ordered_by_log()) return;  // its departure is in the order log
  Writer w;
  w.put<int32_t>(kMsgShutdown);
  const std::string bytes = w.take();
  for (int r = 1; r < size_; ++r)
    if (!worker_left_[size_t(r)] && !notified_[size_t(r)]) control_.send(r, bytes);
  control_.progress();
}

}  // namespace commlib
