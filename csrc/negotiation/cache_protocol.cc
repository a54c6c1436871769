// The engine's side of the response cache (response_cache.h) and of the
// order log (transport/order_log.h): arriving at cached bits, running what
// the log orders, and ending assignments that no longer hold.
#include <cstdio>

#include "runtime/engine.h"
#include "runtime/progress.h"

namespace commlib {

void Engine::init_cache(int capacity, bool log_mode) {
  log_.reset();
  host_counts_.reset();
  counts_ = nullptr;
  hier_ = false;
  cache_.reset();
  cache_bits_.reset();
  unappended_.clear();
  live_.clear();
  completed_words_.clear();
  cache_notices_.clear();
  marker_left_ = 0;
  cache_off_ = false;
  log_done_ = false;
  leaving_ = false;
  for (auto& c : cache_counts_) c.store(0);
  if (capacity <= 0) return;
  cache_ = std::make_unique<ResponseCache>(capacity);
  int units = 0;
  if (log_mode) {
    log_ = std::make_unique<OrderLog>(shm_->extra(), topo_.local_rank, topo_.local_size, capacity);
    counts_ = log_.get();
  } else {
    // Across hosts: a host's ranks count their arrivals in its segment (if
    // it has one), and the last of them tells rank 0.
    hier_ = true;
    if (shm_) {
      host_counts_ = std::make_unique<OrderLog>(shm_->extra(), topo_.local_rank, topo_.local_size, capacity);
      counts_ = host_counts_.get();
    }
    units = counts_ ? topo_.cross_size : topo_.size;
  }
  if (topo_.rank == 0) cache_bits_ = std::make_unique<CacheBits>(capacity, units);
  // A cached request that waits this long goes to the coordinator after all,
  // whose stall warnings then name the ranks that never submitted it.
  cache_patience_us_ = std::max<int64_t>(stall_warning_us_ / 2, 1000000);
}

void Engine::cache_stats(int64_t out[4]) const {
  for (int i = 0; i < 4; ++i) out[i] = cache_counts_[i].load();
}

// Arrives at e's cache bit if the cache holds exactly this request; false when
// it must be negotiated by the coordinator instead.
bool Engine::try_cache(Entry& e, bool* completes) {
  const int op = e.desc.op_type;
  if (cache_off_ || e.desc.process_set != 0 || op == COMMLIB_OP_ADD_PROCESS_SET ||
      op == COMMLIB_OP_REMOVE_PROCESS_SET) {
    return false;
  }
  int bit = -1;
  uint32_t gen = 0;
  switch (cache_->find(e.desc, &bit, &gen)) {
    case ResponseCache::kMiss:
      cache_counts_[kMisses].fetch_add(1);
      return false;
    case ResponseCache::kChanged:
      // Ranks that arrived at the old request go to the coordinator too,
      // once they read this (end_assignment); across hosts, once rank 0,
      // receiving the changed request, tells them (execute_cache_notice).
      cache_counts_[kInvalidations].fetch_add(1);
      if (log_) append_entry(LogEntry{LogEntry::kInvalidate, {LogEntry::word(bit, gen)}});
      return false;
    case ResponseCache::kHit:
      break;
  }
  cache_counts_[kHits].fetch_add(1);
  e.cache_bit = bit;
  e.cache_gen = gen;
  e.cached_since_us = now_us();
  live_[bit] = request_key(e.desc);
  // (with the log, the host is the whole job)
  *completes = counts_ ? counts_->arrive(bit, gen, topo_.local_size) : true;
  return true;
}

// The requests this rank completed (it arrived last): one log entry, fused
// as the coordinator would fuse them.
void Engine::append_completed(const std::vector<Entry*>& entries) {
  std::vector<const RequestDesc*> descs;
  std::vector<bool> fusable;
  for (const Entry* e : entries) {
    descs.push_back(&e->desc);
    fusable.push_back(fusable_allreduce(e->desc));
  }
  LogEntry out{LogEntry::kCompleted, {}};
  for (const auto& group : plan_fusion(descs, fusable, fusion_threshold_.load())) {
    for (size_t k = 0; k < group.size(); ++k) {
      if (out.words.size() == OrderLog::kMaxWords) {
        append_entry(std::move(out));
        out = LogEntry{LogEntry::kCompleted, {}};
      }
      const Entry* e = entries[group[k]];
      out.words.push_back(LogEntry::word(e->cache_bit, e->cache_gen, k == 0 || out.words.empty()));
    }
  }
  append_entry(std::move(out));
}

void Engine::append_entry(LogEntry e) {
  flush_appends();
  if (!unappended_.empty() || !log_->append(e)) unappended_.push_back(std::move(e));
}

void Engine::flush_appends() {
  while (!unappended_.empty() && log_->append(unappended_.front())) unappended_.pop_front();
}

// Runs what the log orders next; true when it did anything. Coordinator
// responses run only where a marker places them (waiting, without blocking,
// for their message when the marker is read first).
bool Engine::run_log() {
  bool worked = false;
  flush_appends();
  for (;;) {
    while (marker_left_ > 0 && !ready_.empty()) {
      Response resp = std::move(ready_.front());
      ready_.pop_front();
      --marker_left_;
      execute(resp);
      worked = true;
    }
    if (marker_left_ > 0 || log_done_) break;
    LogEntry e;
    if (!log_->next(&e)) break;
    worked = true;
    switch (e.kind) {
      case LogEntry::kMarker:
        marker_left_ = int64_t(e.words.at(size_t(topo_.rank)));
        break;
      case LogEntry::kCompleted:
        run_completed(e);
        break;
      case LogEntry::kInvalidate:
        for (uint64_t w : e.words) end_assignment(LogEntry::bit_of(w), LogEntry::gen_of(w));
        break;
      case LogEntry::kLeft:
        on_left(int(e.words.at(0)));
        break;
      default:
        throw Error(COMMLIB_ERR_INTERNAL, "corrupt order log entry kind " + std::to_string(e.kind));
    }
  }
  return worked;
}

void Engine::run_completed(const LogEntry& e) {
  Response resp;
  auto flush = [&] {
    if (resp.names.empty()) return;
    execute(resp);  // (which ends the requests' arrivals)
    resp = Response();
  };
  for (uint64_t w : e.words) {
    if (LogEntry::starts_group(w)) flush();
    const int bit = LogEntry::bit_of(w);
    // An assignment that ended before this point: its arrivals went to the
    // coordinator instead, on every rank.
    const CachedResponse* c = cache_off_ ? nullptr : cache_->get(bit, LogEntry::gen_of(w));
    if (!c) continue;
    auto live = live_.find(bit);
    if (live == live_.end()) {
      throw Error(COMMLIB_ERR_INTERNAL, "cached request '" + std::string(c->key.c_str()) +
                                            "' completed without having been submitted here");
    }
    resp.op_type = c->op_type;
    resp.rows = c->rows;
    resp.names.push_back(live->second);
  }
  flush();
}

// (bit, gen) no longer holds: a rank submitted the request changed, or it
// waited too long. Arrivals go back, and the request to the coordinator.
void Engine::end_assignment(int bit, uint32_t gen) {
  if (!cache_->remove(bit, gen)) return;  // (invalidated twice)
  if (cache_bits_ && log_) cache_bits_->release(bit);  // (across hosts rank 0 released it already)
  retire_live(bit, gen);
}

void Engine::retire_live(int bit, uint32_t gen) {
  auto live = live_.find(bit);
  if (live == live_.end()) return;
  Entry& e = pending_.at(live->second);
  if (e.cache_gen != gen) return;
  if (counts_) counts_->retract(bit, gen);
  e.cache_bit = -1;
  live_.erase(live);
  report({&e});
}

// A coordinator response gave cache bits: every rank installs them here, at
// the same point of the order.
void Engine::install_bits(const Response& resp) {
  if (!cache_ || cache_off_) return;
  for (size_t i = 0; i < resp.names.size() && i < resp.bits.size(); ++i) {
    if (resp.bits[i] < 0) continue;
    const int bit = int(resp.bits[i]);
    const Entry& e = pending_.at(resp.names[i]);
    // Rows for this request only: a fused response has none.
    uint32_t evicted = 0;
    if (cache_->install(bit, resp.names[i], e.desc, resp.op_type, resp.rows, &evicted)) {
      retire_live(bit, evicted);
    }
  }
}

// A rank called shutdown() (an order log entry): the cache is over for
// everybody; requests that arrived at a bit will not complete.
void Engine::on_left(int rank) {
  stop_cache(rank);
  if (rank == topo_.rank) {
    log_done_ = true;
  } else if (rank == 0) {
    log_done_ = true;
    fail_everything(COMMLIB_ERR_NOT_INIT,
                    "rank 0 (the coordinator) called shutdown(); no further collectives are possible");
  }
}

void Engine::stop_cache(int rank) {
  cache_off_ = true;
  const std::string why = rank == topo_.rank ? std::string("commlib was shut down before this collective completed")
                                             : "rank " + std::to_string(rank) + " called shutdown() before ";
  for (auto& [bit, key] : live_) {
    auto it = pending_.find(key);
    if (it == pending_.end()) continue;
    finish(it->second, COMMLIB_ERR_NOT_INIT,
           rank == topo_.rank ? why : why + "'" + std::string(key.c_str()) + "' could complete");
    pending_.erase(it);
  }
  live_.clear();
}

void Engine::expire_waiting(int64_t now) {
  if (live_.empty() || now - last_expiry_check_us_ < 100000) return;
  last_expiry_check_us_ = now;
  for (const auto& [bit, key] : live_) {
    Entry& e = pending_.at(key);
    if (e.cache_expired || now - e.cached_since_us < cache_patience_us_) continue;
    e.cache_expired = true;
    const uint64_t w = LogEntry::word(bit, e.cache_gen);
    if (log_) {
      append_entry(LogEntry{LogEntry::kInvalidate, {w}});
    } else if (controller_) {
      coordinator_expire({w});
    } else {
      Writer msg;
      msg.put<int32_t>(kMsgExpire);
      msg.put_vec({int64_t(w)});
      control_->send(0, msg.take());
    }
  }
}

// ---- across hosts: rank 0 completes cached requests and orders them ----

// This rank was the last of its host (or counts alone) at these bits.
void Engine::send_arrivals(const std::vector<Entry*>& entries) {
  std::vector<uint64_t> words;
  for (const Entry* e : entries) words.push_back(LogEntry::word(e->cache_bit, e->cache_gen));
  if (controller_) {
    coordinator_arrived(words);
    return;
  }
  Writer w;
  w.put<int32_t>(kMsgArrived);
  w.put_vec(std::vector<int64_t>(words.begin(), words.end()));
  control_->send(0, w.take());
}

// A full request reaches rank 0. If its key holds a bit, the request changed
// on its rank (or its bit ended there): every rank must stop waiting at it.
void Engine::coordinator_add(int rank, RequestDesc desc, int64_t now) {
  if (hier_ && cache_bits_ && desc.process_set == 0) {
    uint32_t gen = 0;
    const int bit = cache_bits_->bit_of(request_key(desc), &gen);
    if (bit >= 0) coordinator_expire({LogEntry::word(bit, gen)});
  }
  controller_->add(rank, std::move(desc), now);
}

void Engine::coordinator_expire(const std::vector<uint64_t>& words) {
  if (!cache_bits_) return;
  Response notice;
  notice.kind = Response::kInvalidate;
  for (uint64_t w : words)
    if (cache_bits_->end(LogEntry::bit_of(w), LogEntry::gen_of(w))) notice.rows.push_back(int64_t(w));
  if (!notice.rows.empty()) cache_notices_.push_back(std::move(notice));
}

void Engine::coordinator_arrived(const std::vector<uint64_t>& words) {
  if (!cache_bits_) return;
  for (uint64_t w : words)
    if (cache_bits_->arrive(LogEntry::bit_of(w), LogEntry::gen_of(w))) completed_words_.push_back(w);
}

// No cached request completes once a rank has left; the ranks still
// waiting at a bit fail (execute_cache_notice).
void Engine::coordinator_rank_left(int rank) {
  if (!hier_ || !cache_bits_) return;
  cache_bits_.reset();
  completed_words_.clear();
  Response off;
  off.kind = Response::kCacheOff;
  off.rows = {rank};
  cache_notices_.push_back(std::move(off));
}

// Rank 0's responses of this cycle get the cache's: its notices first, then
// the cached requests now complete everywhere, fused as the coordinator fuses.
void Engine::add_cached_responses(std::vector<Response>& resps) {
  std::vector<Response> out = std::move(cache_notices_);
  cache_notices_.clear();
  std::vector<const CachedResponse*> done;
  for (uint64_t w : completed_words_) {
    const int bit = LogEntry::bit_of(w);
    const uint32_t gen = LogEntry::gen_of(w);
    if (!cache_bits_ || !cache_bits_->current(bit, gen)) continue;  // invalidated meanwhile
    // Rank 0 arrived too, so its own cache holds the assignment.
    const CachedResponse* c = cache_->get(bit, gen);
    if (!c) throw Error(COMMLIB_ERR_INTERNAL, "cache bit " + std::to_string(bit) + " complete but not cached on rank 0");
    done.push_back(c);
  }
  completed_words_.clear();
  std::vector<const RequestDesc*> descs;
  std::vector<bool> fusable;
  for (const CachedResponse* c : done) {
    descs.push_back(&c->desc);
    fusable.push_back(fusable_allreduce(c->desc));
  }
  for (const auto& group : plan_fusion(descs, fusable, fusion_threshold_.load())) {
    Response resp;
    resp.op_type = done[group[0]]->op_type;
    resp.rows = done[group[0]]->rows;
    for (size_t i : group) resp.names.push_back(done[i]->key);
    out.push_back(std::move(resp));
  }
  if (out.empty()) return;
  for (Response& r : resps) out.push_back(std::move(r));
  resps = std::move(out);
}

void Engine::execute_cache_notice(const Response& resp) {
  if (resp.kind == Response::kCacheOff) {
    stop_cache(int(resp.rows.at(0)));
    return;
  }
  for (int64_t w : resp.rows) {
    const int bit = LogEntry::bit_of(uint64_t(w));
    const uint32_t gen = LogEntry::gen_of(uint64_t(w));
    if (cache_->remove(bit, gen)) retire_live(bit, gen);
  }
}

}  // namespace commlib
