// The engine's execution (Engine, runtime/engine.h; on its thread): handing
// batched requests to the response cache or to negotiation, control messages,
// and running the responses in the order every rank runs them.
#include <algorithm>
#include <string>
#include <vector>

#include "base/activity.h"
#include "base/common.h"
#include "base/progress.h"
#include "base/timeline.h"
#include "runtime/engine.h"
#include "runtime/join.h"
#include "runtime/trace_events.h"

namespace commlib {

void Engine::submit(std::vector<Entry>& batch) {
  std::vector<Entry*> negotiate, completed;
  const int64_t now = now_us();  // (one clock read for the batch)
  for (Entry& e : batch) {
    Entry& p = add_pending(std::move(e));  // (nodes never move)
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

Entry& Engine::add_pending(Entry&& e) {
  std::string buf;
  const std::string& key = key_of(e.desc, buf);
  return pending_spare_.emplace(pending_, key, std::move(e)).first->second;
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

void Engine::renegotiate(Entry& e) {
  e.desc.waited_us = now_us() - e.cached_since_us;  // (rank 0's timeout counts from the arrival)
  report({&e});
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
  const Activity running(op_type_name(resp.op_type), &resp.names.at(0));  // (a hung job's report)
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
    pending_spare_.erase(pending_, it);
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
