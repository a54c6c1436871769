// The engine: the singleton runtime. Caller threads enqueue requests and wait
// on handles; one background thread owns all communication: it reports local
// requests to the coordinator (rank 0), receives the coordinator's ordered
// responses, and executes them.
//
// Negotiation is asynchronous and point-to-point: there is no per-cycle
// collective, so an idle rank costs nothing to the others and a request is
// negotiated as soon as the last rank submits it (no cycle-time latency).
#pragma once

#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "controller.h"
#include "fusion.h"
#include "handles.h"
#include "operations.h"
#include "p2p/point_to_point.h"
#include "response_cache.h"
#include "runtime/config.h"
#include "transport/mpi_control.h"
#include "transport/mpi_transport.h"
#include "transport/order_log.h"
#include "transport/shm.h"

namespace commlib {

struct Topology {
  int rank = 0, size = 1;
  int local_rank = 0, local_size = 1;
  int cross_rank = 0, cross_size = 1;
};

class Engine {
 public:
  static Engine& get();

  void init(MPI_Comm base);
  void shutdown();
  bool initialized() const { return running_.load(); }
  const Topology& topology() const { return topo_; }
  const Config& config() const { return config_; }
  int broken();  // COMMLIB_ERR_PEER_LOST/INTERNAL once communication is over

  // Validates and queues a request; returns the handle id.
  int64_t enqueue(const commlib_request& req);
  // Validates and queues n allreduces negotiated and fused as one unit
  // (member i is named base.i); one handle.
  int64_t enqueue_allreduce_group(const char* base, int n, const int32_t* dtypes,
                                  const int32_t* ndims, const int64_t* shapes,
                                  void* const* inputs, void* const* outputs, int reduce_op,
                                  double prescale, double postscale, int process_set);
  // Point-to-point send/recv (engine_p2p.cc; see c_api.h): never negotiated.
  int64_t enqueue_p2p(const commlib_request& req);
  // Process sets (collective over every rank; see c_api.h).
  int64_t add_process_set(const int32_t* ranks, int n);
  int64_t remove_process_set(int id);
  HandleTable& handles() { return handles_; }
  // Waits for a handle; the waiting thread drives the engine meanwhile.
  bool wait(HandleState& h, double timeout_s);

  // Response cache counters (engine_cache.cc): hits, misses, invalidations,
  // cached requests executed; all zero when the cache is off.
  void cache_stats(int64_t out[4]) const;

  void set_fusion_threshold(int64_t bytes);
  int64_t fusion_threshold() const { return fusion_threshold_.load(); }

 private:
  Engine() = default;
  Entry make_entry(const commlib_request& q);
  // The members of process set id, checking that this rank is one of them.
  // Caller holds queue_mu_.
  const std::vector<int>& members_of(int id) const;
  int64_t push(std::vector<Entry>& entries);
  void loop();
  bool cycle();  // one pass of the background loop; true when it did work
  bool step();   // cycle() unless communication is over, errors failing handles
  bool drive();  // step() from a waiting thread, if no other thread is in one
  bool leave();  // shutdown handshake; true when the loop may end
  void submit(std::vector<Entry>& batch);
  void on_message(int source, const std::string& msg);
  void execute(const Response& resp);
  void execute_set_change(const Response& resp, Entry& e);
  void send_responses(const std::vector<Response>& resps);
  void finish(Entry& e, int status, const std::string& message);
  void fail_everything(int code, const std::string& message);
  void send_shutdown_notice();
  // Sends requests to the coordinator (rank 0's own go straight to its controller).
  void report(const std::vector<Entry*>& entries);

  // Point-to-point (engine_p2p.cc).
  void init_p2p(MPI_Comm base, MPI_Comm local, size_t eager_bytes, size_t split_bytes, bool single_copy);
  bool cycle_p2p();  // posts queued sends/receives, moves transfers on

  // The response cache and order log (engine_cache.cc; see response_cache.h).
  void init_cache(int capacity, bool log_mode);
  bool try_cache(Entry& e, bool* completes);
  void append_completed(const std::vector<Entry*>& entries);
  void append_entry(LogEntry e);
  void flush_appends();  // entries that found the ring full, in order
  bool run_log();
  void run_completed(const LogEntry& e);
  void end_assignment(int bit, uint32_t gen);
  void retire_live(int bit, uint32_t gen);
  void install_bits(const Response& resp);
  void on_left(int rank);
  void stop_cache(int rank);
  void expire_waiting(int64_t now);
  // Across hosts (no order log): rank 0 orders cached requests too.
  void send_arrivals(const std::vector<Entry*>& entries);
  void coordinator_add(int rank, RequestDesc desc, int64_t now);
  void coordinator_arrived(const std::vector<uint64_t>& words);
  void coordinator_expire(const std::vector<uint64_t>& words);
  void coordinator_rank_left(int rank);
  void add_cached_responses(std::vector<Response>& resps);
  void execute_cache_notice(const Response& resp);

  Topology topo_;
  HandleTable handles_;
  std::atomic<bool> running_{false};
  std::atomic<bool> stop_{false};
  Config config_;  // read from the environment at init (runtime/config.h)
  std::atomic<int64_t> fusion_threshold_{Config::defaults().fusion_threshold};
  AllreduceAlgo algo_ = AllreduceAlgo::kAuto;
  int64_t stall_warning_us_ = 60000000;
  // Batching: new requests are held while more keep arriving (gaps shorter
  // than batch_gap_us_), at most cycle_us_, and never while a thread waits.
  int64_t cycle_us_ = 1000;
  int64_t batch_gap_us_ = 20;
  int shm_collectives_ = kShmAuto;

  // Shared with caller threads (guarded by queue_mu_).
  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::vector<Entry> queue_;
  std::vector<P2PRequest> p2p_queue_;
  std::unordered_set<std::string> in_flight_;  // request keys (message.h)
  std::map<int, std::vector<int>> sets_;        // process sets' members by id
  int64_t set_calls_ = 0;                       // add/remove calls (their names)
  int dead_code_ = 0;            // non-zero: the engine can no longer communicate
  std::string dead_message_;
  std::atomic<bool> bg_sleeping_{false};
  std::atomic<bool> bg_yields_{false};    // napping while a waiter drives
  std::atomic<int64_t> outstanding_{0};   // requests queued and not finished

  // Held by whichever thread runs step(): the background thread, or a
  // caller thread that drives progress while it waits for a handle.
  std::mutex cycle_mu_;

  // Background thread (or a driving waiter holding cycle_mu_) only.
  std::thread thread_;
  std::unique_ptr<MpiTransport> transport_;
  std::unique_ptr<ControlChannel> control_;
  std::unique_ptr<Controller> controller_;  // rank 0 only
  std::unique_ptr<ShmSegment> shm_;         // ranks of this host (if more than one)
  std::unique_ptr<MpiTransport> cross_;     // same local rank on every host (if several)
  std::unique_ptr<PointToPoint> p2p_;
  std::map<int, std::unique_ptr<MpiTransport>> set_transports_;  // sets this rank is in
  std::unordered_map<std::string, Entry> pending_;
  std::vector<Entry> held_;  // taken from the queue, not yet reported
  int64_t held_since_us_ = 0, last_arrival_us_ = 0;
  int64_t leave_deadline_us_ = 0;
  std::deque<Response> ready_;
  std::string closing_;  // worker: rank 0 said goodbye; fail what is left once ready_ ran
  std::vector<bool> worker_left_;
  FusionBuffer fusion_, scratch_;
  int64_t last_stall_check_us_ = 0;

  // Response cache (one host only: its order lives in the shared segment).
  // With the log, coordinator responses too run where rank 0's markers put
  // them, and nowhere else.
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
  int64_t marker_left_ = 0;  // coordinator responses to run before the next entry
  bool cache_off_ = false;   // a rank has left: nothing more through the cache
  bool log_done_ = false;    // this rank's departure (or rank 0's) has been read
  bool leaving_ = false;     // rank 0: its departure is in the log
  int64_t cache_patience_us_ = 0;
  int64_t last_expiry_check_us_ = 0;
  enum CacheCount { kHits = 0, kMisses = 1, kInvalidations = 2, kCachedRuns = 3 };
  std::atomic<int64_t> cache_counts_[4] = {};
};

}  // namespace commlib
