// The engine: the singleton runtime. Caller threads enqueue requests and wait
// on handles; one background thread owns all communication: it reports local
// requests to the coordinator (rank 0), receives the coordinator's ordered
// responses, and executes them.
//
// The engine holds the queue, the batching, the pending requests and the
// lifecycle; the roles it runs are objects of their own: the Coordinator
// (rank 0) or the Worker (every other rank) for negotiation, the
// CacheProtocol for the response cache and order log, the Executor for the
// data movement. Its methods are in runtime/engine_*.cc, one file per role:
// lifecycle (init, start, shutdown), leaving (the shutdown handshake),
// scheduling (the loop, drive and wait, one cycle), requests (caller
// threads), execution (negotiated responses run), endings (finish and fail),
// gpu (CUDA requests) and tune (autotune).
//
// Negotiation is asynchronous and point-to-point: there is no per-cycle
// collective, so an idle rank costs nothing to the others and a request is
// negotiated as soon as the last rank submits it (no cycle-time latency).
#pragma once

#include <mpi.h>

#include <array>
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

#include "backends/mpi/mpi_control.h"
#include "backends/mpi/mpi_transport.h"
#include "backends/shm/shm.h"
#include "base/config.h"
#include "base/handles.h"
#include "base/node_pool.h"
#include "exec/executor.h"
#include "exec/gpu_executor.h"
#include "exec/gpu_route.h"
#include "exec/operations.h"
#include "negotiation/cache_protocol.h"
#include "negotiation/coordinator.h"
#include "negotiation/worker.h"
#include "p2p/point_to_point.h"
#include "runtime/autotune.h"

namespace commlib {

struct Topology {
  int rank = 0, size = 1;
  int local_rank = 0, local_size = 1;
  int cross_rank = 0, cross_size = 1;
};

class Engine : private CacheHost {
 public:
  static Engine& get();

  void init(MPI_Comm base);
  void shutdown();
  bool initialized() const { return running_.load(); }
  const Topology& topology() const { return topo_; }
  const Config& config() const { return config_; }
  int broken();  // COMMLIB_ERR_PEER_LOST/INTERNAL once communication is over
                 // (PEER_LOST too once contact with a peer is lost: lost_contact_)
  // broken(), or COMMLIB_ERR_TIMED_OUT when a request of this rank timed out
  // and no collective of the whole job completed since (timed_out_): the
  // ranks it waited for may be frozen, so MPI must be aborted, not finalized.
  int unsafe_to_finalize();

  // Validates and queues a request; returns the handle id.
  int64_t enqueue(const commlib_request& req);
  // Validates and queues req.nmembers allreduces negotiated and fused as
  // one unit (member i is named <req.name>.i); one handle.
  int64_t enqueue_group(const commlib_request& req);
  // Point-to-point send/recv (engine_requests.cc; see c_api.h): never negotiated.
  int64_t enqueue_p2p(const commlib_request& req);
  // The same, its handle not in the table yet (handles().adopt() puts it
  // there): a blocking send/recv that ends within its wait needs no id.
  // caller_waits: the caller waits for it right away.
  std::shared_ptr<HandleState> queue_p2p(const commlib_request& req, bool caller_waits);
  // A collective this rank could not submit: its name goes to the coordinator
  // as an abort, which fails the other members' calls of it at once.
  void abort_others(const commlib_request& q, const std::string& why);
  // Process sets (collective over every rank; see c_api.h).
  int64_t add_process_set(const int32_t* ranks, int n);
  int64_t remove_process_set(int id);
  HandleTable& handles() { return handles_; }
  // Waits for a handle; the waiting thread drives the engine meanwhile.
  // until_launched: also returns once a CUDA request was launched.
  bool wait(HandleState& h, double timeout_s, bool until_launched = false);
  // A CUDA request's synchronize on the caller's stream (runtime/engine_gpu.cc,
  // c_api.h commlib_wait_on_stream): waits until h completed or was launched;
  // launched and not complete, makes `stream` wait for its completion event
  // and detaches h (true in *on_stream). False on timeout.
  bool wait_on_stream(HandleState& h, void* stream, double timeout_s, bool* on_stream);
  // The failure of a detached handle not reported yet (0: none), taken once.
  int take_deferred_error(std::string* message);

  // Response cache counters (negotiation/cache_protocol.h): hits, misses,
  // invalidations, cached requests executed; all zero when the cache is off.
  void cache_stats(int64_t out[4]) const { cache_.stats(out); }
  // One line on where this rank's engine is (c_api.h commlib_engine_state):
  // its open, held and launched requests, and a cycle that has run for long
  // with the steps it is in (base/activity.h). Reads only atomics and the
  // activity board: it answers while a cycle is stuck.
  std::string describe_state() const;

  // rank 0 of the process set makes an NCCL unique id and every member gets
  // its bytes over MPI (runtime/engine_gpu.cc). Collective over the set's
  // members, run by the caller with the engine's communication lock held:
  // no collective of the set may be in flight (diagnostics and tests).
  void nccl_unique_id(int process_set, uint8_t out[128]);
  // commlib_device_release: copies a received device message out of the
  // core's device memory (dst null: no copy) and frees it, on stream.
  void release_device_result(void* src, void* dst, size_t bytes, int device, void* stream);

  // Asks rank 0 to change the fusion threshold on every rank at one point of
  // the order (runtime/engine_tune.cc); before init, sets it here.
  void set_fusion_threshold(int64_t bytes);
  int64_t fusion_threshold() const { return fusion_threshold_.load(); }
  // The settings applied since init, 5 words each: collectives run before,
  // fusion threshold, cycle us, tree max bytes, who (0 a call, 1 an autotune
  // trial, 2 autotune's final choice). Copies at most max_rows; returns how many.
  int64_t tune_history(int64_t* out, int64_t max_rows);

 private:
  Engine() = default;
  // init(), in steps.
  void read_config(MPI_Comm base);  // config_ (every rank agrees), and what follows from it
  // Splits base into this host's ranks (local) and the same local rank on
  // every host (cross); *uniform: every host has as many ranks.
  Topology split_topology(MPI_Comm base, MPI_Comm data, MPI_Comm* local, MPI_Comm* cross, bool* uniform);
  void start_timeline_from_config();  // COMMLIB_TIMELINE (base/timeline.h)
  // Transports, the negotiation role, the executor, the cache; then the thread.
  void start(MPI_Comm data, MPI_Comm ctrl, int cache_capacity, bool log_mode);
  Entry make_entry(const commlib_request& q);
  Entry make_group_entry(const commlib_request& req);  // (validated)
  // make(q); when its checks refuse q, the other ranks are told at once.
  Entry checked(const commlib_request& q, Entry (Engine::*make)(const commlib_request&));
  // The members of process set id, checking that this rank is one of them.
  // Caller holds queue_mu_.
  const std::vector<int>& members_of(int id) const;
  int64_t push(Entry* e);  // (engine_requests.cc)
  bool enter_in_flight(const RequestDesc& d);  // under queue_mu_
  void loop();
  bool cycle();  // one pass of the background loop; true when it did work
  // cycle() (or, full=false, only its point-to-point part) unless
  // communication is over, errors failing handles.
  bool step(bool full = true);
  bool drive();  // step() from a waiting thread, if no other thread is in one
  // After a request was queued: wakes the background thread when it must
  // take the request up (see the definition).
  void wake_for(bool caller_waits);
  // Wakes the background thread from its nap beside driving waiters (the
  // caller saw no driver left); takes queue_mu_.
  void wake_yielding();
  void prepare_device_p2p(const commlib_request& q, P2PRequest& r);
  void start_p2p();  // one point-to-point step from a caller that does not wait
  bool leave();  // shutdown handshake; true when the loop may end (engine_leaving.cc)
  bool coordinator_leaves(int64_t now);  // leave() on rank 0
  // cycle(), in steps; each true when it did work.
  bool take_requests();  // batching: hold new requests, submit them when due
  bool poll_messages();
  bool coordinate();     // rank 0: responses ready now go out
  bool run_ready();      // responses, in the order every rank runs them
  void submit(std::vector<Entry>& batch);
  Entry& add_pending(Entry&& e);  // into pending_, under its key
  void on_message(int source, const std::string& msg);
  void execute(const Response& resp) override;
  // execute(), in steps.
  void execute_error(const Response& resp);
  // Ends cached arrivals; a joined rank's stand-ins for requests it never
  // submitted go to joined.
  std::vector<Entry*> take_entries(const Response& resp, std::deque<Entry>& joined);
  void execute_join(const Response& resp);
  void send_aborts(std::vector<RequestDesc>& aborts);  // (the thread that owns communication)
  void execute_set_change(const Response& resp, Entry& e);
  void finish(Entry& e, int status, const std::string& message);
  // A request's end as evidence: a timeout sets timed_out_, a collective of
  // the whole job that completed clears it (every rank took part).
  void note_ending(int status, bool whole_job);
  void fail_everything(int code, const std::string& message) override;
  // Rank 0 is gone (or acknowledged this rank's departure): collectives fail
  // and are refused from now on; point-to-point, which never goes through
  // rank 0, goes on.
  void fail_collectives(int code, const std::string& message);
  // Rank 0 called shutdown() (its departure read from the order log, or its
  // kMsgLeaving run): true when this rank goes on with collectives of process
  // sets without rank 0 (on rank 0: negotiating them); else fail_collectives.
  bool coordinator_left() override;
  void fail_pending(int code, const std::string& message);  // both: the collectives in hand
  void send_shutdown_notice();
  // Sends requests to the coordinator (rank 0's own go straight to it).
  void report(const std::vector<Entry*>& entries);

  // CacheHost: what the cache protocol needs from the engine.
  Entry* find_pending(const std::string& key) override;
  bool execute_next_ready() override;
  void renegotiate(Entry& e) override;
  void drop(const std::string& key, int code, const std::string& message) override;
  void send_to_coordinator(std::string bytes) override { control_->send(0, std::move(bytes)); }

  // Settings changed at one point of the order (runtime/engine_tune.cc).
  void start_autotune();
  bool forward_tune_requests();
  void note_executed(const Response& resp, const std::vector<Entry*>& entries);
  void apply_tune(const Response& resp);
  std::unique_ptr<Autotuner> tuner_;  // rank 0 with COMMLIB_AUTOTUNE=1, until init again
  int64_t executed_ = 0;              // collective responses run since init
  std::vector<int64_t> tune_requests_;  // set_fusion_threshold's (under queue_mu_)
  // Whether tune_requests_ has some (set and cleared under queue_mu_): a
  // cycle takes queue_mu_ for them only then. Taken on every cycle, the lock
  // made threads submitting a burst of requests sleep on it and be woken (a
  // futex call each way) while the background thread spun.
  std::atomic<bool> tune_queued_{false};
  std::mutex tune_mu_;
  std::vector<std::array<int64_t, 5>> tune_history_;

  // CUDA requests (runtime/engine_gpu.cc): the route check and ready event
  // at enqueue, the launch of a negotiated response, polling the launches.
  void prepare_gpu_entry(const commlib_request& q, Entry& e);
  void launch_gpu(const Response& resp, const std::vector<Entry*>& entries);
  void flush_control_sends();
  void prepare_stand_ins(std::vector<Entry>& taken);
  const gpu::GpuLibs* gpu_libs(bool load);
  bool poll_gpu();
  void trace_gpu_execution(GpuExecutor::Done& d);
  // Waits for the CUDA collectives in flight to end (at most COMMLIB_TIMEOUT,
  // or 10 s without one): every rank launched them, so an orderly shutdown
  // lets them finish rather than abort them mid-flight.
  void drain_gpu();
  void abandon_gpu(int code, const std::string& message);

  // A detached CUDA handle completed: released, its failure kept for the next wait.
  void settle_detached(HandleState& h);
  std::mutex deferred_mu_;
  std::atomic<bool> has_deferred_{false};
  int deferred_code_ = 0;
  std::string deferred_message_;

  // Point-to-point (set up in engine_lifecycle.cc, queued in engine_requests.cc,
  // run in engine_scheduling.cc).
  // lanes: control messages between ranks of this host through shared memory.
  void init_p2p(MPI_Comm base, MPI_Comm local, size_t eager_bytes, size_t split_bytes, bool single_copy,
                bool lanes);
  bool cycle_p2p();  // posts queued sends/receives, moves transfers on

  Topology topo_;
  HandleTable handles_;
  std::atomic<bool> running_{false};
  std::atomic<bool> stop_{false};
  Config config_;  // read from the environment at init (base/config.h)
  std::atomic<int64_t> fusion_threshold_{Config::defaults().fusion_threshold};
  AllreduceAlgo algo_ = AllreduceAlgo::kAuto;
  int64_t stall_warning_us_ = 60000000;
  int64_t timeout_us_ = 0;  // COMMLIB_TIMEOUT (0: none)
  int64_t last_timeout_check_us_ = 0;
  // A worker: a request open far past the timeout means rank 0 is not
  // answering (frozen or unreachable): everything fails.
  void check_coordinator_alive(int64_t now);
  // Rank 0 leaving: false while ranks named missing by a timeout stay silent,
  // for at most COMMLIB_TIMEOUT + 10 s; then they are lost.
  bool coordinator_may_leave(int64_t now);
  bool lingering_ = false;  // rank 0 left and negotiates on for process sets without it
  // Set when a peer proved unreachable (rank 0 never answered a worker, or a
  // rank named missing by a timeout never spoke again before rank 0 left):
  // MPICH's MPI_Finalize would wait for it forever, so broken() turns true
  // and commlib.shutdown() has MPI aborted at exit instead.
  std::atomic<bool> lost_contact_{false};
  bool core_per_rank_ = false;  // every rank of this host can have a core (init; progress.h's no_yield_us)
  std::atomic<bool> coordinator_silent_{false};  // (the lost contact was rank 0's: every worker waits on it)
  std::atomic<bool> timed_out_{false};  // (unsafe_to_finalize)
  // Batching: new requests are held while more keep arriving (gaps shorter
  // than batch_gap_us_), at most cycle_us_, and never while a thread waits.
  int64_t cycle_us_ = 1000;
  int64_t batch_gap_us_ = 20;
  // CUDA requests are held as DDP's buckets are filled: until
  // gpu_bucket_bytes_ of them wait, none arrived for the cycle time (or the
  // batch gap, if longer), a thread waits, or at most kGpuHoldCapUs (or the
  // cycle time, if longer). Their device work queues behind the compute that
  // produced them anyway; each NCCL launch costs a round across the ranks.
  int64_t gpu_bucket_bytes_ = 25 << 20;
  int64_t held_gpu_bytes_ = 0;
  bool held_cpu_ = false;  // some held request is a CPU one (the CPU rule applies)
  bool release_held(int64_t now) const;
  int shm_collectives_ = kShmAuto;

  // Shared with caller threads (guarded by queue_mu_).
  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::vector<Entry> queue_;
  std::vector<RequestDesc> aborts_;  // abort_others' notices, sent as they are taken (never pending)
  std::vector<P2PRequest> p2p_queue_;
  std::vector<P2PRequest> p2p_batch_;  // cycle_p2p's, under cycle_mu_
  std::unordered_set<std::string> in_flight_;  // request keys (base/message.h)
  NodePool<std::unordered_set<std::string>> in_flight_spare_;  // (nothing to reset)
  std::map<int, std::vector<int>> sets_;        // process sets' members by id
  int64_t set_calls_ = 0;                       // add/remove calls (their names)
  int dead_code_ = 0;            // non-zero: the engine can no longer communicate
  std::string dead_message_;
  int coll_code_ = 0;            // non-zero: no more collectives (fail_collectives)
  std::string coll_message_;
  bool rank0_left_ = false;      // collectives of sets containing rank 0 are refused (coordinator_left)
  // Whether queue_ (p2p_queue_) may hold requests: set after each push and
  // cleared when it is taken, both under queue_mu_, so that a cycle with
  // nothing new takes no lock the submitting threads need.
  std::atomic<bool> queued_{false};
  std::atomic<bool> p2p_queued_{false};
  std::atomic<bool> comm_over_{false};  // dead_code_ is PEER_LOST or INTERNAL (step() reads it unlocked)
  std::atomic<bool> bg_sleeping_{false};
  std::atomic<bool> bg_yields_{false};    // napping while a waiter drives
  std::atomic<int64_t> outstanding_{0};   // requests queued and not finished
  std::atomic<int64_t> p2p_outstanding_{0};  // of which point-to-point
  // For describe_state: when the running cycle started (0: none runs), the
  // requests held for batching, the CUDA launches not yet complete.
  std::atomic<int64_t> cycle_since_us_{0};
  std::atomic<int64_t> held_count_{0};
  std::atomic<int64_t> gpu_launches_{0};
  int64_t last_full_cycle_us_ = 0;  // a driving waiter's last whole cycle (cycle_mu_)
  int64_t last_p2p_cycle_us_ = 0;   // cycle()'s last point-to-point part (cycle_mu_)

  // Held by whichever thread runs step(): the background thread, or a
  // caller thread that drives progress while it waits for a handle.
  std::mutex cycle_mu_;

  // Background thread (or a driving waiter holding cycle_mu_) only.
  std::thread thread_;
  std::unique_ptr<MpiTransport> transport_;
  std::unique_ptr<ControlChannel> control_;
  std::unique_ptr<Coordinator> coordinator_;  // rank 0 only
  std::unique_ptr<Worker> worker_;            // every other rank
  std::unique_ptr<ShmSegment> shm_;         // ranks of this host (if more than one)
  std::unique_ptr<MpiTransport> cross_;     // same local rank on every host (if several)
  std::unique_ptr<PointToPoint> p2p_;
  Executor executor_;  // runs collectives; owns the process sets' communicators
  GpuBackend gpu_backend_ = GpuBackend::kAuto;   // COMMLIB_GPU_BACKEND
  std::atomic<int> gpu_device_{-1};              // the one CUDA device of this process's requests
  std::atomic<int> join_device_{-1};             // the CUDA device join() named (stand-ins run there)
  std::unique_ptr<GpuExecutor> gpu_;             // created by the first CUDA launch
  using Pending = std::unordered_map<std::string, Entry>;
  Pending pending_;
  NodePool<Pending> pending_spare_{[](Pending::node_type& n) { n.mapped() = Entry(); }};
  int joins_pending_ = 0;  // this rank's join() requests submitted and not complete
  std::vector<Entry> held_;  // taken from the queue, not yet reported
  std::vector<Entry> taken_;  // take_requests' empty buffer, swapped with the queue's
  int64_t held_since_us_ = 0, last_arrival_us_ = 0;
  int64_t leave_deadline_us_ = 0;
  int64_t silent_deadline_us_ = 0;  // (coordinator_may_leave)
  std::deque<Response> ready_;

  // The response cache and its order log. With the log, coordinator
  // responses too run where rank 0's markers put them, and nowhere else.
  CacheProtocol cache_{*this};
};

}  // namespace commlib
