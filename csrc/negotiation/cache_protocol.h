// The response-cache protocol (response_cache.h) with its order log
// (order_log.h), as one object with one state and one reset: arriving at
// cached bits, completing them (through the log on one host, through rank 0
// across hosts), running what the log orders, and ending assignments that no
// longer hold. Rank 0's side of it (which bits are assigned, which hosts have
// arrived) lives here too. The protocol's steps across hosts are in
// cache_across_hosts.cc, the rest in cache_protocol.cc.
//
// It runs on the thread that owns communication, and reaches the rest of the
// engine only through CacheHost.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/shm/shm.h"
#include "base/entry.h"
#include "base/message.h"
#include "base/node_pool.h"
#include "negotiation/order_log.h"
#include "negotiation/response_cache.h"

namespace commlib {

// What the protocol needs from the engine that runs it.
class CacheHost {
 public:
  virtual ~CacheHost() = default;
  // A request submitted here and not finished, or null.
  virtual Entry* find_pending(const std::string& key) = 0;
  // Runs a response (a cached one, or a coordinator's, in the log's order).
  virtual void execute(const Response& resp) = 0;
  // Runs the next coordinator response received; false when none is there.
  virtual bool execute_next_ready() = 0;
  // Sends a request to the coordinator after all (its bit ended).
  virtual void renegotiate(Entry& e) = 0;
  // Finishes a pending request with an error and forgets it.
  virtual void drop(const std::string& key, int code, const std::string& message) = 0;
  virtual void fail_everything(int code, const std::string& message) = 0;
  // Rank 0's departure was read from the log: true when this rank goes on
  // (collectives of process sets without rank 0, which rank 0 still
  // negotiates; on rank 0, that negotiation), reading the log.
  virtual bool coordinator_left() = 0;
  // A control message to rank 0 (never called on rank 0).
  virtual void send_to_coordinator(std::string bytes) = 0;
};

class CacheProtocol {
 public:
  struct Setup {
    int capacity = 0;       // cache bits; 0: no cache
    bool log_mode = false;  // one host: the order log in shm's extra region
    ShmSegment* shm = nullptr;
    int rank = 0, size = 1, local_rank = 0, local_size = 1, cross_size = 1;
    int64_t stall_warning_us = 60000000;
    int64_t timeout_us = 0;  // COMMLIB_TIMEOUT (0: none)
  };

  explicit CacheProtocol(CacheHost& host) : host_(host) {}

  // The one reset: every piece of state back to its start, for setup (and,
  // with capacity 0, the cache off).
  void reset(const Setup& s);
  // Communication is over (the engine failed): nothing more goes through the
  // cache, and nothing is waiting at a bit any more.
  void abandon();

  bool enabled() const { return cache_ != nullptr; }
  // On one host: the order log orders every collective (coordinator
  // responses run where rank 0's markers put them).
  bool ordered_by_log() const { return log_ != nullptr; }
  // This rank's departure (or rank 0's, unless it goes on) has been read from the log.
  bool log_done() const { return log_done_; }
  // Entries that found the ring full, still to be appended.
  bool appends_pending() const { return !unappended_.empty(); }
  // Rank 0, its departure read, stops reading the log (its negotiation is over).
  void stop_reading();
  // hits, misses, invalidations, cached requests executed.
  void stats(int64_t out[4]) const;

  // ---- every rank ----
  // Arrives at e's cache bit if the cache holds exactly this request (true;
  // *completes when this rank was the last); false when it must be
  // negotiated by the coordinator instead. now: the time of its submission.
  bool try_arrive(Entry& e, int64_t now, bool* completes);
  // Requests this rank completed: one log entry, or word to rank 0.
  void complete(const std::vector<Entry*>& entries, int64_t fusion_threshold);
  // Runs what the log orders next; true when it did anything.
  bool run_log();
  // Cached requests that waited too long go to the coordinator after all.
  void expire_waiting(int64_t now);
  // e ran (or failed) through a response: its arrival, if any, ends.
  void end_arrival(Entry& e, bool ran);
  // After a response ran everywhere alike: install its bits (or, when it
  // failed, give them back). ran: the requests that ran, where they are no
  // longer pending (a CUDA launch takes them out first); else they are looked
  // up among the pending ones.
  void after_run(const Response& resp, bool ok, const std::vector<RequestDesc>* ran = nullptr);
  // An invalidation or cache-off notice from rank 0 (across hosts).
  void execute_notice(const Response& resp);

  // ---- rank 0 ----
  // A full request arrives at the coordinator (before Controller::add).
  void on_full_request(const RequestDesc& desc);
  void on_arrived(const std::vector<uint64_t>& words);
  void on_expire(const std::vector<uint64_t>& words);
  // A worker called shutdown().
  void on_rank_left(int rank);
  // This cycle's responses: cache notices and completed cached requests
  // first (across hosts), then bits for the new responses.
  void prepare_responses(std::vector<Response>& resps, int64_t fusion_threshold);
  // With the log: where every rank runs its share of a batch of responses;
  // a rank's departure.
  void append_marker(std::vector<uint64_t> counts);
  void append_left(int rank);
  // Rank 0's own departure: true the first time.
  bool start_leaving();
  // A rank joined (join()): until every rank has, nothing is cached (a
  // joined rank never arrives at a bit), so every assignment ends (in the
  // log's order, or by notices) and none is given. resume(): the join is over.
  void pause();
  void resume() { paused_ = false; }

 private:
  void append_entry(LogEntry e);
  void flush_appends();  // entries that found the ring full, in order
  void append_completed(const std::vector<Entry*>& entries, int64_t fusion_threshold);
  void send_arrivals(const std::vector<Entry*>& entries);
  void run_completed(const LogEntry& e);
  void end_assignment(int bit, uint32_t gen);
  void retire_live(int bit, uint32_t gen);
  void on_left(int rank);
  void stop_cache(int rank);
  void add_cached_responses(std::vector<Response>& resps, int64_t fusion_threshold);

  CacheHost& host_;
  Setup setup_;
  std::unique_ptr<OrderLog> log_;
  std::unique_ptr<OrderLog> host_counts_;  // across hosts: this host's arrival counters
  OrderLog* counts_ = nullptr;             // log_ or host_counts_ (null: every rank counts alone)
  bool hier_ = false;                      // the cache across hosts (rank 0 orders)
  std::vector<uint64_t> completed_words_;  // rank 0, across hosts: bits complete this cycle
  std::vector<Response> cache_notices_;    // rank 0, across hosts: invalidations, cache off
  std::unique_ptr<ResponseCache> cache_;
  std::unique_ptr<CacheBits> cache_bits_;   // rank 0
  std::deque<LogEntry> unappended_;         // the ring was full: appended later, in order
  std::unordered_map<int, std::string> live_;  // bit -> key of a request arrived at it
  NodePool<std::unordered_map<int, std::string>> live_spare_;  // (the key's buffer stays)
  int64_t marker_left_ = 0;  // coordinator responses to run before the next entry
  bool cache_off_ = false;   // a rank has left: nothing more through the cache
  bool log_done_ = false;    // this rank's departure (or rank 0's) has been read
  bool read_on_ = false;     // rank 0: reads on after its own departure (coordinator_left)
  bool leaving_ = false;     // rank 0: its departure is in the log
  bool paused_ = false;      // rank 0: a join is under way (pause())
  int64_t patience_us_ = 0;
  int64_t last_expiry_check_us_ = 0;
  enum Count { kHits = 0, kMisses = 1, kInvalidations = 2, kCachedRuns = 3 };
  std::atomic<int64_t> counts_stat_[4] = {};
};

}  // namespace commlib
