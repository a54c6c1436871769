// The response-cache protocol (see cache_protocol.h).
#include "negotiation/cache_protocol.h"

#include <algorithm>

#include "base/progress.h"
#include "negotiation/fusion.h"

namespace commlib {

void CacheProtocol::reset(const Setup& s) {
  setup_ = s;
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
  read_on_ = false;
  leaving_ = false;
  paused_ = false;
  last_expiry_check_us_ = 0;
  for (auto& c : counts_stat_) c.store(0);
  // A cached request that waits this long goes to the coordinator after all,
  // whose stall warnings then name the ranks that never submitted it.
  patience_us_ = std::max<int64_t>(s.stall_warning_us / 2, 1000000);
  if (s.timeout_us > 0) patience_us_ = std::min(patience_us_, std::max<int64_t>(s.timeout_us / 2, 1000000));
  const int capacity = s.capacity;
  if (capacity <= 0) return;
  cache_ = std::make_unique<ResponseCache>(capacity);
  int units = 0;
  if (s.log_mode) {
    log_ = std::make_unique<OrderLog>(s.shm->extra(), s.local_rank, s.local_size, capacity);
    counts_ = log_.get();
  } else {
    // Across hosts: a host's ranks count their arrivals in its segment (if
    // it has one), and the last of them tells rank 0.
    hier_ = true;
    if (s.shm) {
      host_counts_ = std::make_unique<OrderLog>(s.shm->extra(), s.local_rank, s.local_size, capacity);
      counts_ = host_counts_.get();
    }
    units = counts_ ? s.cross_size : s.size;
  }
  if (s.rank == 0) cache_bits_ = std::make_unique<CacheBits>(capacity, units);
}

void CacheProtocol::abandon() {
  live_.clear();
  marker_left_ = 0;
  cache_off_ = true;
  log_done_ = true;
  read_on_ = false;
}

void CacheProtocol::stats(int64_t out[4]) const {
  for (int i = 0; i < 4; ++i) out[i] = counts_stat_[i].load();
}

// Arrives at e's cache bit if the cache holds exactly this request; false when
// it must be negotiated by the coordinator instead.
bool CacheProtocol::try_arrive(Entry& e, int64_t now, bool* completes) {
  const int op = e.desc.op_type;
  if (cache_off_ || e.desc.process_set != 0 || op == COMMLIB_OP_ADD_PROCESS_SET ||
      op == COMMLIB_OP_REMOVE_PROCESS_SET || op == COMMLIB_OP_JOIN) {
    return false;
  }
  int bit = -1;
  uint32_t gen = 0;
  switch (cache_->find(e.desc, &bit, &gen)) {
    case ResponseCache::kMiss:
      counts_stat_[kMisses].fetch_add(1);
      return false;
    case ResponseCache::kChanged:
      // Ranks that arrived at the old request go to the coordinator too,
      // once they read this (end_assignment); across hosts, once rank 0,
      // receiving the changed request, tells them (execute_notice).
      counts_stat_[kInvalidations].fetch_add(1);
      if (log_) append_entry(LogEntry{LogEntry::kInvalidate, {LogEntry::word(bit, gen)}});
      return false;
    case ResponseCache::kHit:
      break;
  }
  counts_stat_[kHits].fetch_add(1);
  e.cache_bit = bit;
  e.cache_gen = gen;
  e.cached_since_us = now;
  std::string buf;
  const std::string& key = key_of(e.desc, buf);
  auto live = live_spare_.emplace(live_, bit, key);
  if (!live.second) live.first->second = key;
  // (with the log, the host is the whole job)
  *completes = counts_ ? counts_->arrive(bit, gen, setup_.local_size) : true;
  return true;
}

void CacheProtocol::complete(const std::vector<Entry*>& entries, int64_t fusion_threshold) {
  if (entries.empty()) return;
  if (log_) {
    append_completed(entries, fusion_threshold);
  } else {
    send_arrivals(entries);
  }
}

// The requests this rank completed (it arrived last): one log entry, fused
// as the coordinator would fuse them.
void CacheProtocol::append_completed(const std::vector<Entry*>& entries, int64_t fusion_threshold) {
  std::vector<const RequestDesc*> descs;
  std::vector<bool> may_fuse;
  std::vector<int64_t> bytes;
  for (const Entry* e : entries) {
    descs.push_back(&e->desc);
    may_fuse.push_back(fusable(e->desc));
    const CachedResponse* c = cache_->get(e->cache_bit, e->cache_gen);
    bytes.push_back(fusion_bytes(e->desc, c ? c->rows : std::vector<int64_t>()));
  }
  LogEntry out{LogEntry::kCompleted, {}};
  for (const auto& group : plan_fusion(descs, may_fuse, fusion_threshold, &bytes)) {
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

void CacheProtocol::append_marker(std::vector<uint64_t> counts) {
  append_entry(LogEntry{LogEntry::kMarker, std::move(counts)});
}

void CacheProtocol::append_left(int rank) {
  append_entry(LogEntry{LogEntry::kLeft, {uint64_t(rank)}});
}

bool CacheProtocol::start_leaving() {
  if (leaving_) return false;
  leaving_ = true;
  return true;
}

void CacheProtocol::pause() {
  if (paused_) return;
  paused_ = true;
  if (!cache_bits_ || cache_off_) return;
  const std::vector<uint64_t> words = cache_bits_->assigned();
  if (!log_) {
    on_expire(words);
    return;
  }
  for (size_t i = 0; i < words.size(); i += OrderLog::kMaxWords) {
    const size_t end = std::min(words.size(), i + OrderLog::kMaxWords);
    append_entry(LogEntry{LogEntry::kInvalidate, std::vector<uint64_t>(words.begin() + long(i), words.begin() + long(end))});
  }
}

void CacheProtocol::append_entry(LogEntry e) {
  flush_appends();
  if (!unappended_.empty() || !log_->append(e)) unappended_.push_back(std::move(e));
}

void CacheProtocol::flush_appends() {
  while (!unappended_.empty() && log_->append(unappended_.front())) unappended_.pop_front();
}

// Runs what the log orders next; true when it did anything. Coordinator
// responses run only where a marker places them (waiting, without blocking,
// for their message when the marker is read first).
bool CacheProtocol::run_log() {
  bool worked = false;
  flush_appends();
  for (;;) {
    while (marker_left_ > 0 && host_.execute_next_ready()) {
      --marker_left_;
      worked = true;
    }
    if (marker_left_ > 0 || (log_done_ && !read_on_)) break;
    LogEntry e;
    if (!log_->next(&e)) break;
    worked = true;
    switch (e.kind) {
      case LogEntry::kMarker:
        marker_left_ = int64_t(e.words.at(size_t(setup_.rank)));
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

void CacheProtocol::run_completed(const LogEntry& e) {
  Response resp;
  resp.names.reserve(e.words.size());
  auto flush = [&] {
    if (resp.names.empty()) return;
    host_.execute(resp);  // (which ends the requests' arrivals)
    resp = Response();
    resp.names.reserve(e.words.size());
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
    if (resp.names.empty() || c->op_type == COMMLIB_OP_ALLGATHER) {  // (a fused allgather: every member's)
      resp.rows.insert(resp.rows.end(), c->rows.begin(), c->rows.end());
    }
    resp.names.push_back(live->second);
  }
  flush();
}

// (bit, gen) no longer holds: a rank submitted the request changed, or it
// waited too long. Arrivals go back, and the request to the coordinator.
void CacheProtocol::end_assignment(int bit, uint32_t gen) {
  if (!cache_->remove(bit, gen)) return;  // (invalidated twice)
  if (cache_bits_ && log_) cache_bits_->release(bit);  // (across hosts rank 0 released it already)
  retire_live(bit, gen);
}

void CacheProtocol::retire_live(int bit, uint32_t gen) {
  auto live = live_.find(bit);
  if (live == live_.end()) return;
  Entry* e = host_.find_pending(live->second);
  if (!e) throw Error(COMMLIB_ERR_INTERNAL, "cache bit " + std::to_string(bit) + " held by no pending request");
  if (e->cache_gen != gen) return;
  if (counts_) counts_->retract(bit, gen);
  e->cache_bit = -1;
  live_spare_.erase(live_, live);
  host_.renegotiate(*e);
}

// A coordinator response gave cache bits: every rank installs them here, at
// the same point of the order.
void CacheProtocol::after_run(const Response& resp, bool ok, const std::vector<RequestDesc>* ran) {
  if (resp.bits.empty()) return;
  if (!ok) {  // (failed alike everywhere: nobody installs them)
    if (cache_bits_)
      for (int64_t b : resp.bits)
        if (b >= 0) cache_bits_->release(int(b));
    return;
  }
  if (!cache_ || cache_off_) return;
  for (size_t i = 0; i < resp.names.size() && i < resp.bits.size(); ++i) {
    if (resp.bits[i] < 0) continue;
    const int bit = int(resp.bits[i]);
    const RequestDesc* d = nullptr;
    if (ran) {
      std::string buf;
      for (const RequestDesc& r : *ran)
        if (key_of(r, buf) == resp.names[i]) d = &r;
    } else if (const Entry* e = host_.find_pending(resp.names[i])) {
      d = &e->desc;
    }
    if (!d) throw Error(COMMLIB_ERR_INTERNAL, "cache bit given to unknown request '" + resp.names[i] + "'");
    // Rows for this request only (a fused allgather's response holds every member's, in order).
    uint32_t evicted = 0;
    const std::vector<int64_t> rows = resp.op_type == COMMLIB_OP_ALLGATHER
                                          ? member_rows(resp.rows, resp.names.size(), i) : resp.rows;
    if (cache_->install(bit, resp.names[i], *d, resp.op_type, rows, &evicted)) {
      retire_live(bit, evicted);
    }
  }
}

// A rank called shutdown() (an order log entry): the cache is over for
// everybody; requests that arrived at a bit will not complete.
// Rank 0's: collectives through it are over, but the ranks of process sets
// without it (and rank 0, which negotiates theirs) read on. A rank that
// reads no more leaves the log to the others.
void CacheProtocol::on_left(int rank) {
  stop_cache(rank);
  if (rank == setup_.rank) log_done_ = true;
  if (rank == 0) {
    const bool goes_on = host_.coordinator_left();
    if (setup_.rank == 0) {
      read_on_ = goes_on;
    } else {
      log_done_ = !goes_on;
    }
  }
  if (log_done_ && !read_on_) log_->detach();
}

void CacheProtocol::stop_reading() {
  read_on_ = false;
  if (log_) log_->detach();
}

void CacheProtocol::stop_cache(int rank) {
  cache_off_ = true;
  const std::string why = rank == setup_.rank ? std::string("commlib was shut down before this collective completed")
                                             : "rank " + std::to_string(rank) + " called shutdown() before ";
  std::unordered_map<int, std::string> live;
  live.swap(live_);
  for (auto& [bit, key] : live) {
    host_.drop(key, COMMLIB_ERR_NOT_INIT,
               rank == setup_.rank ? why : why + "'" + std::string(key.c_str()) + "' could complete");
  }
}

void CacheProtocol::expire_waiting(int64_t now) {
  if (!cache_ || live_.empty() || now - last_expiry_check_us_ < 100000) return;
  last_expiry_check_us_ = now;
  for (const auto& [bit, key] : live_) {
    Entry* e = host_.find_pending(key);
    if (!e) throw Error(COMMLIB_ERR_INTERNAL, "cache bit " + std::to_string(bit) + " held by no pending request");
    if (e->cache_expired || now - e->cached_since_us < patience_us_) continue;
    e->cache_expired = true;
    const uint64_t w = LogEntry::word(bit, e->cache_gen);
    if (log_) {
      append_entry(LogEntry{LogEntry::kInvalidate, {w}});
    } else if (setup_.rank == 0) {
      on_expire({w});
    } else {
      Writer msg;
      msg.put<int32_t>(kMsgExpire);
      msg.put_vec({int64_t(w)});
      host_.send_to_coordinator(msg.take());
    }
  }
}

void CacheProtocol::end_arrival(Entry& e, bool ran) {
  if (e.cache_bit < 0) return;
  live_spare_.erase(live_, e.cache_bit);
  if (!ran) return;
  e.cache_bit = -1;  // a cached request, complete everywhere: its arrival ends
  counts_stat_[kCachedRuns].fetch_add(1);
}

}  // namespace commlib
