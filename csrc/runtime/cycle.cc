// One pass of the background loop (Engine::cycle): batching new requests,
// handing them to the cache or to negotiation, control messages, and running
// responses in the order every rank runs them.
#include <algorithm>
#include <string>
#include <vector>

#include "common.h"
#include "runtime/engine.h"
#include "runtime/join.h"
#include "runtime/liveness.h"
#include "runtime/progress.h"
#include "runtime/timeline.h"
#include "runtime/trace_events.h"

namespace commlib {

bool Engine::cycle() {
  bool worked = take_requests();
  worked |= forward_tune_requests();
  worked |= cycle_p2p();
  worked |= poll_messages();
  if (coordinator_) worked |= coordinate();
  worked |= run_ready();
  worked |= poll_gpu();
  const int64_t now = now_us();
  cache_.expire_waiting(now);
  if (worker_) check_coordinator_alive(now);
  control_->progress();
  throw_if_peer_lost();
  if (worked && timeline().marks_cycles()) timeline().mark("", "CYCLE", now_us());
  return worked;
}

bool Engine::take_requests() {
  // The queue, held_ and taken_ trade buffers rather than entries: each keeps
  // its capacity, and a batch taken while nothing is held moves no entry.
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    taken_.swap(queue_);
  }
  bool worked = !taken_.empty();
  if (held_.empty() && taken_.empty()) return worked;
  const int64_t now = now_us();
  if (!taken_.empty()) {
    if (held_.empty()) {
      held_since_us_ = now;
      held_.swap(taken_);
    } else {
      for (Entry& e : taken_) held_.push_back(std::move(e));
      taken_.clear();
    }
    last_arrival_us_ = now;
  }
  // Report now unless more requests are still streaming in (then they are
  // negotiated, and fused, together).
  if (stop_.load()) {
    for (Entry& e : held_) finish(e, COMMLIB_ERR_NOT_INIT, "commlib was shut down before this collective started");
    held_.clear();
  } else if (handles_.waiting() > 0 || now - last_arrival_us_ >= batch_gap_us_ ||
             now - held_since_us_ >= cycle_us_) {
    submit(held_);
    held_.clear();
    worked = true;
  }
  return worked;
}

bool Engine::poll_messages() {
  bool worked = false;
  int source;
  std::string msg;
  while (control_->poll(&source, &msg)) {
    on_message(source, msg);
    worked = true;
  }
  return worked;
}

bool Engine::coordinate() {
  const bool worked = coordinator_->take_responses(fusion_threshold_.load(), ready_);
  coordinator_->check_stalls(now_us());
  return worked;
}

// With the order log, the log says when each response runs; otherwise they
// run as they come.
bool Engine::run_ready() {
  if (cache_.ordered_by_log()) return cache_.run_log();
  bool worked = false;
  while (execute_next_ready()) worked = true;
  const std::string closing = worker_ ? worker_->take_closing() : std::string();
  if (!closing.empty()) fail_collectives(COMMLIB_ERR_NOT_INIT, closing);  // the coordinator's acknowledgement or departure
  return worked;
}

void Engine::submit(std::vector<Entry>& batch) {
  std::vector<Entry*> negotiate, completed;
  const int64_t now = now_us();  // (one clock read for the batch)
  for (Entry& e : batch) {
    std::string key = request_key(e.desc);
    Entry& p = pending_.emplace(std::move(key), std::move(e)).first->second;  // (nodes never move)
    if (p.desc.op_type == COMMLIB_OP_JOIN) ++joins_pending_;
    p.submitted_us = now;
    if (p.queued_us > 0 && timeline().on()) timeline().span(p.desc.name, "QUEUE", p.queued_us, p.submitted_us);
    bool completes = false;
    if (cache_.enabled() && cache_.try_arrive(p, now, &completes)) {
      if (timeline().on()) timeline().mark(p.desc.name, "CACHE_HIT", p.submitted_us);
      if (completes) completed.push_back(&p);
    } else {
      negotiate.push_back(&p);
    }
  }
  cache_.complete(completed, fusion_threshold_.load());
  if (!negotiate.empty()) report(negotiate);
}

void Engine::report(const std::vector<Entry*>& entries) {
  if (coordinator_) {
    const int64_t now = now_us();
    for (Entry* e : entries) coordinator_->add(0, e->desc, now);
    return;
  }
  worker_->report(entries);
}

Entry* Engine::find_pending(const std::string& key) {
  auto it = pending_.find(key);
  return it == pending_.end() ? nullptr : &it->second;
}

bool Engine::execute_next_ready() {
  if (ready_.empty()) return false;
  Response resp = std::move(ready_.front());
  ready_.pop_front();
  execute(resp);
  return true;
}

void Engine::renegotiate(Entry& e) {
  e.desc.waited_us = now_us() - e.cached_since_us;  // (rank 0's timeout counts from the arrival)
  report({&e});
}

void Engine::check_coordinator_alive(int64_t now) {
  // Rank 0 fails them at the timeout (checked each second); this is for when it
  // cannot. 8 s: with this check's own second and a request submitted just
  // before its peers became unreachable, the worker still fails within the
  // timeout + 10 s.
  constexpr int64_t kGraceUs = 8000000;
  if (timeout_us_ <= 0 || now - last_timeout_check_us_ < 1000000 || !ready_.empty()) return;
  last_timeout_check_us_ = now;
  for (const auto& [key, e] : pending_) {
    if (e.desc.op_type == COMMLIB_OP_JOIN || now - e.submitted_us < timeout_us_ + kGraceUs) continue;
    throw Error(COMMLIB_ERR_TIMED_OUT,
                std::string(op_type_name(e.desc.op_type)) + " '" + e.desc.name + "' has waited " +
                    std::to_string((now - e.submitted_us) / 1000000) +
                    " s and rank 0 (the coordinator) never answered, not even with a timeout "
                    "(COMMLIB_TIMEOUT): rank 0 is frozen, overloaded or unreachable");
  }
}

void Engine::drop(const std::string& key, int code, const std::string& message) {
  auto it = pending_.find(key);
  if (it == pending_.end()) return;
  finish(it->second, code, message);
  pending_.erase(it);
}

void Engine::on_message(int source, const std::string& msg) {
  Reader r(msg);
  const int kind = r.get<int32_t>();
  const bool known = coordinator_ ? coordinator_->on_message(source, kind, r)
                                  : worker_->on_message(kind, r, ready_, cache_.ordered_by_log(), stop_.load());
  if (!known) throw Error(COMMLIB_ERR_INTERNAL, "unexpected control message kind " + std::to_string(kind));
}

void Engine::execute(const Response& resp) {
  if (resp.kind == Response::kInvalidate || resp.kind == Response::kCacheOff) {
    cache_.execute_notice(resp);
    return;
  }
  if (resp.kind == Response::kError) {
    execute_error(resp);
    return;
  }
  if (resp.kind == Response::kTune) return apply_tune(resp);
  if (resp.op_type == COMMLIB_OP_JOIN) {
    execute_join(resp);
    return;
  }
  std::deque<Entry> joined;
  std::vector<Entry*> entries = take_entries(resp, joined);
  if (resp.op_type == COMMLIB_OP_ADD_PROCESS_SET || resp.op_type == COMMLIB_OP_REMOVE_PROCESS_SET) {
    execute_set_change(resp, *entries[0]);
    return;
  }
  executor_.check_member(resp.process_set);
  note_executed(resp, entries);  // (autotune measures here)
  if (resp.process_set != 0 && resp.op_type == COMMLIB_OP_BROADCAST) {  // root: job rank -> rank in the set
    std::lock_guard<std::mutex> lock(queue_mu_);
    const std::vector<int>& m = sets_.at(resp.process_set);
    for (Entry* e : entries) e->desc.root = int(std::find(m.begin(), m.end(), e->desc.root) - m.begin());
  }
  if (!entries.empty() && entries[0]->desc.device_type != COMMLIB_DEVICE_CPU) {
    launch_gpu(resp, entries);  // completes later, by event (poll_gpu)
    return;
  }
  std::string message;
  const int64_t started = timeline().on() ? now_us() : 0;
  int status;
  try {
    status = executor_.run(resp, entries, size_t(fusion_threshold_.load()), &message);
  } catch (const Error& e) {
    if (e.code() != COMMLIB_ERR_TIMED_OUT) throw;
    throw Error(e.code(), std::string(op_type_name(resp.op_type)) + " '" + resp.names.at(0) + "'" +
                              (resp.names.size() > 1 ? " (fused with others)" : "") + " " + e.what());
  }
  if (started > 0) trace_execution(resp, entries, started, now_us(), executor_.last_algorithm());
  cache_.after_run(resp, status == COMMLIB_OK);
  for (const std::string& key : resp.names) {
    auto it = pending_.find(key);
    if (it == pending_.end()) continue;  // a joined rank's stand-in
    const std::string& alone = it->second.error;
    if (status == COMMLIB_OK && !alone.empty()) {
      finish(it->second, COMMLIB_ERR_VALUE, alone);
    } else {
      finish(it->second, status, message);
    }
    pending_.erase(it);
  }
}

void Engine::execute_error(const Response& resp) {
  for (const std::string& key : resp.names) {
    auto it = pending_.find(key);
    if (it == pending_.end()) continue;  // never submitted here (rank left, not a member)
    cache_.end_arrival(it->second, false);
    finish(it->second, resp.error_code, resp.error);
    pending_.erase(it);
  }
}

std::vector<Entry*> Engine::take_entries(const Response& resp, std::deque<Entry>& joined) {
  std::vector<Entry*> entries;
  for (size_t i = 0; i < resp.names.size(); ++i) {
    const std::string& key = resp.names[i];
    auto it = pending_.find(key);
    if (it == pending_.end() && joins_pending_ > 0 && i < resp.descs.size()) {
      int set_rank = topo_.rank, set_size = topo_.size;
      if (resp.process_set != 0) {
        std::lock_guard<std::mutex> lock(queue_mu_);
        const std::vector<int>& m = sets_.at(resp.process_set);
        set_rank = int(std::find(m.begin(), m.end(), topo_.rank) - m.begin());
        set_size = int(m.size());
      }
      joined.push_back(joined_entry(resp.descs[i], set_rank, set_size));
      entries.push_back(&joined.back());
      continue;
    }
    if (it == pending_.end()) {
      throw Error(COMMLIB_ERR_INTERNAL, "coordinator answered for unknown tensor '" + std::string(key.c_str()) + "'");
    }
    entries.push_back(&it->second);
    cache_.end_arrival(it->second, true);
  }
  return entries;
}

// Every rank has joined: each gets the last one to join.
void Engine::execute_join(const Response& resp) {
  auto it = pending_.find(resp.names.at(0));
  if (it == pending_.end()) throw Error(COMMLIB_ERR_INTERNAL, "join completed without having been submitted here");
  it->second.handle->splits = resp.rows;
  --joins_pending_;
  finish(it->second, COMMLIB_OK, "");
  pending_.erase(it);
}

// Every rank runs these, in the coordinator's order: the new set's members
// get a communicator of their own.
void Engine::execute_set_change(const Response& resp, Entry& e) {
  if (resp.op_type == COMMLIB_OP_ADD_PROCESS_SET) {
    const int id = int(resp.rows.at(0));
    std::vector<int> members(e.desc.splits.begin(), e.desc.splits.end());
    executor_.add_set(id, members);
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      sets_[id] = members;
    }
    e.handle->rows = id;
  } else {
    const int id = e.desc.root;
    executor_.remove_set(id);
    std::lock_guard<std::mutex> lock(queue_mu_);
    sets_.erase(id);
  }
  const std::string key = request_key(e.desc);
  finish(e, COMMLIB_OK, "");
  pending_.erase(key);
}

}  // namespace commlib
