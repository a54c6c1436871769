// The engine's lifecycle (Engine, runtime/engine.h): init (configuration,
// topology, shared memory, point-to-point), start of the background loop,
// and the shutdown handshake.
#include "runtime/engine.h"

#include <sched.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include <algorithm>

#include "backends/mpi/session_stamp.h"
#include "backends/nccl/nccl_comm.h"
#include "backends/shm/cma.h"
#include "base/common.h"
#include "base/liveness.h"
#include "base/progress.h"
#include "base/reduce.h"
#include "base/result_pool.h"
#include "base/timeline.h"
#include "p2p/nccl_links.h"
#include "runtime/config_agree.h"
#include "runtime/trace_events.h"

namespace commlib {
namespace {

// How long a rank that lost contact with a peer waits at shutdown before its
// MPI_Abort ends the job (Engine::shutdown). The ranks beyond a cut may be
// waiting for rank 0's answer rather than for data: they give up the timeout
// + 4 s after their submission (check_coordinator_alive, checked each second),
// which came no later than this rank's wait began; 6 s covers that.
constexpr int64_t kLostContactLingerUs = 6000000;
// The same when the contact lost was rank 0's: every other worker waits on
// it by the same rule, and gives up within a second or two of this one.
constexpr int64_t kCoordinatorSilentLingerUs = 2000000;
// The same after a timeout of this rank's own (unsafe_to_finalize), on one
// host (the order log): the ranks that submitted the same request time out
// within the same second or so. Across hosts the ranks beyond a cut give up
// only the timeout + 4 s after their submission: this rank lingers as after
// a lost contact, lest its abort end the job before they raise.
constexpr int64_t kTimedOutLingerUs = 2000000;

// pid and host name of every rank, for the peer monitor.
std::vector<PeerInfo> exchange_peer_info(MPI_Comm comm, int rank, int size) {
  struct Raw {
    int pid;
    char host[256];
  } mine{};
  mine.pid = int(getpid());
  gethostname(mine.host, sizeof(mine.host) - 1);
  std::vector<Raw> all(size);
  check_mpi(MPI_Allgather(&mine, sizeof(Raw), MPI_BYTE, all.data(), sizeof(Raw), MPI_BYTE, comm),
            "MPI_Allgather(peer info)");
  std::vector<PeerInfo> local;
  for (int r = 0; r < size; ++r) {
    if (r != rank && std::strncmp(all[r].host, mine.host, sizeof(mine.host)) == 0) {
      local.push_back({r, pid_t(all[r].pid), all[r].host});
    }
  }
  return local;
}

// Where each job rank lives: its pid and its rank on this host (0 and -1 for
// ranks elsewhere).
struct HostRanks {
  std::vector<pid_t> pids;
  std::vector<int> local_of_job;
};

HostRanks host_ranks(MPI_Comm base, MPI_Comm local, int size) {
  int n = 0;
  MPI_Comm_size(local, &n);
  std::vector<int> pids(size_t(n), 0), local_ranks(size_t(n), 0), job_ranks(size_t(n), 0);
  int mine = int(getpid());
  check_mpi(MPI_Allgather(&mine, 1, MPI_INT, pids.data(), 1, MPI_INT, local), "MPI_Allgather(pids)");
  MPI_Group lg, bg;
  MPI_Comm_group(local, &lg);
  MPI_Comm_group(base, &bg);
  for (int i = 0; i < n; ++i) local_ranks[size_t(i)] = i;
  MPI_Group_translate_ranks(lg, n, local_ranks.data(), bg, job_ranks.data());
  MPI_Group_free(&lg);
  MPI_Group_free(&bg);
  HostRanks out;
  out.pids.assign(size_t(size), 0);
  out.local_of_job.assign(size_t(size), -1);
  for (int i = 0; i < n; ++i) {
    const int j = job_ranks[size_t(i)];
    if (j < 0 || j >= size) continue;
    out.pids[size_t(j)] = pid_t(pids[size_t(i)]);
    out.local_of_job[size_t(j)] = i;
  }
  return out;
}

// Whether every rank of this host can have a core of its own: the CPUs the
// host's ranks may run on (the union of their affinity masks) are at least
// as many as the ranks. (The real host's, also where COMMLIB_TEST_RANKS_PER_HOST
// pretends otherwise.)
bool core_per_rank(MPI_Comm base) {
  MPI_Comm host;
  check_mpi(MPI_Comm_split_type(base, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host), "MPI_Comm_split_type");
  int ranks = 1;
  MPI_Comm_size(host, &ranks);
  cpu_set_t mine, all;
  CPU_ZERO(&mine);
  if (sched_getaffinity(0, sizeof mine, &mine) != 0) CPU_ZERO(&mine);  // (unknown: counts as none)
  const int rc = MPI_Allreduce(&mine, &all, int(sizeof mine), MPI_UNSIGNED_CHAR, MPI_BOR, host);
  MPI_Comm_free(&host);
  check_mpi(rc, "MPI_Allreduce(CPUs of the host)");
  return CPU_COUNT(&all) >= ranks;
}

}  // namespace

Engine& Engine::get() {
  static Engine* engine = new Engine();  // never destroyed: outlives atexit order issues
  return *engine;
}

void Engine::init(MPI_Comm base) {
  if (running_.load()) return;
  read_config(base);
  const Config& cfg = config_;
  core_per_rank_ = core_per_rank(base);
  set_no_yield_us(core_per_rank_ ? kNoYieldUs : 0);
  std::string stale;
  take_deferred_error(&stale);  // (a failure of the previous session's CUDA work is not this one's)
  // A new session number, the same on every rank (session_stamp.h).
  uint32_t session = (g_session + 1) & 0xffffffu;
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, &session, 1, MPI_UINT32_T, MPI_MAX, base), "MPI_Allreduce(session)");
  g_session = session;
  MPI_Comm data, ctrl, local, cross;
  check_mpi(MPI_Comm_dup(base, &data), "MPI_Comm_dup");
  check_mpi(MPI_Comm_dup(base, &ctrl), "MPI_Comm_dup");
  bool uniform = false;
  Topology t = split_topology(base, data, &local, &cross, &uniform);
  // The response cache: on one host (with at most as many ranks as a log
  // entry has words) cached requests skip rank 0 through an order log in the
  // shared segment.
  int capacity = int(std::min<int64_t>(cfg.cache_capacity, OrderLog::kMaxBits - 1));
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, &capacity, 1, MPI_INT, MPI_MIN, base), "MPI_Allreduce(cache capacity)");
  // Elsewhere (several hosts, no shared segment) rank 0 keeps ordering, and
  // the cache only shrinks what it is sent.
  const bool use_shm = uniform && t.local_size > 1 && cfg.shm;
  const bool log_mode = capacity > 0 && use_shm && t.cross_size == 1 && t.size <= int(OrderLog::kMaxWords);
  if (use_shm) {
    shm_ = ShmSegment::create(local, size_t(cfg.shm_piece_bytes), 4,
                              size_t(cfg.shm_fusion_bytes),
                              capacity > 0 ? OrderLog::bytes_needed(t.local_size, capacity) : 0);
  }
  topo_ = t;
  init_p2p(base, local, size_t(cfg.p2p_eager_bytes), size_t(cfg.p2p_split_bytes), cfg.p2p_single_copy, cfg.shm);
  // (after init_p2p: every local rank allows direct reads before the probe)
  if (shm_ && cfg.p2p_single_copy) shm_->set_direct_read_pids(probe_direct_reads(local));
  MPI_Comm_free(&local);
  if (shm_ && t.cross_size > 1) {
    cross_ = std::make_unique<MpiTransport>(cross);  // reduce within hosts, all-reduce across
  } else {
    MPI_Comm_free(&cross);
  }
  start_peer_monitor(exchange_peer_info(data, t.rank, t.size), shm_ ? &shm_->first_lost() : nullptr);
  start_timeline_from_config();
  start(data, ctrl, t.size > 1 ? capacity : 0, log_mode);
}

// COMMLIB_TIMELINE: a file this rank cannot create costs a warning, not the
// job (failing init on one rank would leave the others waiting in theirs).
void Engine::start_timeline_from_config() {
  if (config_.timeline.empty()) return;
  try {
    timeline().start(config_.timeline, topo_.rank, config_.timeline_mark_cycles);
  } catch (const Error& e) {
    std::fprintf(stderr, "commlib (rank %d): WARNING: COMMLIB_TIMELINE: %s; no timeline is written\n",
                 topo_.rank, e.what());
  }
}

void Engine::read_config(MPI_Comm base) {
  // First: every rank reads its environment, and all fail together on a bad value.
  config_ = config_from_env_agreed(base);
  const Config& cfg = config_;
  fusion_threshold_.store(cfg.fusion_threshold);
  algo_ = parse_allreduce_algo(cfg.allreduce_algo);
  gpu_backend_ = parse_gpu_backend(cfg.gpu_backend);
  stall_warning_us_ = cfg.stall_check_time_s * 1000000;
  timeout_us_ = cfg.timeout_s * 1000000;
  set_stuck_timeout_us(timeout_us_);
  last_timeout_check_us_ = 0;
  cycle_us_ = int64_t(cfg.cycle_time_ms * 1000);
  batch_gap_us_ = cfg.batch_gap_us;
  gpu_bucket_bytes_ = cfg.gpu_bucket_bytes;
  shm_collectives_ = cfg.shm_collectives == "always" ? kShmAlways
                     : cfg.shm_collectives == "never" ? kShmNever
                                                      : kShmAuto;
  set_spin_budget_us(cfg.spin_us);
  set_segment_options(cfg.run_job, int(cfg.test_shm_pause_ms), cfg.test_shm_named);
  set_bg_spin_budget_us(cfg.bg_spin_us);
  result_pool_set_limit(size_t(cfg.result_cache_bytes));
}

Topology Engine::split_topology(MPI_Comm base, MPI_Comm data, MPI_Comm* local_out, MPI_Comm* cross_out,
                                bool* uniform) {
  MPI_Comm local, cross;
  Topology t;
  MPI_Comm_rank(data, &t.rank);
  MPI_Comm_size(data, &t.size);
  // COMMLIB_TEST_RANKS_PER_HOST=k pretends that every k consecutive ranks
  // share a host: it lets one machine test the multi-host (hierarchical) paths.
  const int64_t fake = config_.test_ranks_per_host;
  if (fake > 0) {
    check_mpi(MPI_Comm_split(base, int(t.rank / fake), t.rank, &local), "MPI_Comm_split");
  } else {
    check_mpi(MPI_Comm_split_type(base, MPI_COMM_TYPE_SHARED, t.rank, MPI_INFO_NULL, &local),
              "MPI_Comm_split_type");
  }
  MPI_Comm_rank(local, &t.local_rank);
  MPI_Comm_size(local, &t.local_size);
  check_mpi(MPI_Comm_split(base, t.local_rank, t.rank, &cross), "MPI_Comm_split");
  MPI_Comm_rank(cross, &t.cross_rank);
  MPI_Comm_size(cross, &t.cross_size);
  // Hierarchical paths need the same number of ranks on every host (each
  // local rank owns the same slice of a buffer on every host).
  int sizes[2] = {-t.local_size, t.local_size}, extremes[2];
  check_mpi(MPI_Allreduce(sizes, extremes, 2, MPI_INT, MPI_MAX, base), "MPI_Allreduce(topology)");
  *uniform = -extremes[0] == extremes[1];
  *local_out = local;
  *cross_out = cross;
  return t;
}

void Engine::start(MPI_Comm data, MPI_Comm ctrl, int cache_capacity, bool log_mode) {
  const Topology& t = topo_;
  transport_ = std::make_unique<MpiTransport>(data);
  MpiTransport::set_job(data, size_t(config_.test_mpi_call_bytes));
  control_ = std::make_unique<ControlChannel>(ctrl);
  executor_.setup(transport_.get(), shm_.get(), cross_.get(), algo_, shm_collectives_);
  CacheProtocol::Setup cs;
  cs.capacity = cache_capacity;
  cs.log_mode = log_mode;
  cs.shm = shm_.get();
  cs.rank = t.rank;
  cs.size = t.size;
  cs.local_rank = t.local_rank;
  cs.local_size = t.local_size;
  cs.cross_size = t.cross_size;
  cs.stall_warning_us = stall_warning_us_;
  cs.timeout_us = timeout_us_;
  cache_.reset(cs);
  coordinator_.reset();
  worker_.reset();
  if (t.rank == 0) {
    coordinator_ = std::make_unique<Coordinator>(t.size, fusion_threshold_.load(), stall_warning_us_, *control_, cache_);
    coordinator_->set_timeout(timeout_us_);
  } else {
    worker_ = std::make_unique<Worker>(*control_);
  }
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    dead_code_ = 0;
    comm_over_.store(false);
    coll_code_ = 0;
    lost_contact_.store(false);
    coordinator_silent_.store(false);
    timed_out_.store(false);
    dead_message_.clear();
    coll_message_.clear();
    rank0_left_ = false;
    in_flight_.clear();
    sets_.clear();
    for (int r = 0; r < t.size; ++r) sets_[0].push_back(r);
    set_calls_ = 0;
  }
  g_drivers = &handles_.driving_count();
  g_wait_hook_arg = this;
  g_wait_hook = [](void* engine) {
    Engine& e = *static_cast<Engine*>(engine);
    e.control_->progress();
    e.p2p_->progress_sends();
  };
  start_autotune();
  lingering_ = false;
  stop_.store(false);
  running_.store(true);
  thread_ = std::thread(&Engine::loop, this);
}

void Engine::shutdown() {
  if (!running_.load()) return;
  stop_.store(true);
  queue_cv_.notify_all();
  thread_.join();
  running_.store(false);
  timeline().stop();
  stop_peer_monitor();
  if (lost_contact_.load()) {
    // The ranks it could not reach time out too: they get to raise their own
    // errors before this rank's MPI_Abort ends the job.
    nap_us(coordinator_silent_.load() ? kCoordinatorSilentLingerUs : kLostContactLingerUs);
  } else if (!broken() && timed_out_.load()) {
    std::fprintf(stderr, "commlib (rank %d): ERROR: a request of this rank timed out (COMMLIB_TIMEOUT) and no "
                 "collective of the whole job completed since: the ranks it waited for may be frozen, and "
                 "MPI_Finalize would wait for them forever; MPI is aborted at exit\n", topo_.rank);
    nap_us(cache_.ordered_by_log() ? kTimedOutLingerUs : kLostContactLingerUs);
  }
  if (broken()) {  // collective MPI calls could hang on a dead peer
    transport_->abandon();
    control_->abandon();
    if (cross_) cross_->abandon();
    executor_.abandon();
    p2p_->abandon();
  }
  g_wait_hook = nullptr;
  g_drivers = nullptr;
  gpu_.reset();  // (launches in flight were failed and aborted by the loop's end)
  gpu_device_.store(-1);
  join_device_.store(-1);
  executor_.clear();
  cache_.reset(CacheProtocol::Setup{});
  coordinator_.reset();
  worker_.reset();
  transport_.reset();
  control_.reset();
  shm_.reset();
  cross_.reset();
  p2p_.reset();
}

void Engine::init_p2p(MPI_Comm base, MPI_Comm local, size_t eager_bytes, size_t split_bytes,
                      bool single_copy, bool lanes) {
  HostRanks host = host_ranks(base, local, topo_.size);
  std::vector<pid_t> pids = std::move(host.pids);
  if (!single_copy) std::fill(pids.begin(), pids.end(), pid_t(0));
  std::unique_ptr<P2PLanes> shm_lanes;
  if (lanes && topo_.local_size > 1) shm_lanes = std::make_unique<P2PLanes>(local, std::move(host.local_of_job));
  MPI_Comm comm;
  check_mpi(MPI_Comm_dup(base, &comm), "MPI_Comm_dup(p2p)");
  p2p_ = std::make_unique<PointToPoint>(comm, std::move(pids), eager_bytes, split_bytes, std::move(shm_lanes),
                                        [this](HandleState& h, int status, const std::string& message) {
                                          p2p_outstanding_.fetch_sub(1);
                                          outstanding_.fetch_sub(1);
                                          note_ending(status, false);
                                          handles_.complete(h, status, message);
                                        });
  p2p_->set_device_links([this](DeviceLinks::Done done) {
    const gpu::GpuLibs* libs = gpu_libs(true);
    const std::string why = gpu::unusable_reason(*libs);
    if (!why.empty()) throw Error(COMMLIB_ERR_VALUE, "point-to-point on CUDA buffers needs NCCL: " + why);
    return gpu::make_nccl_links(*libs, timeout_us_, std::move(done));
  });
}

}  // namespace commlib
