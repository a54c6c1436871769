#include "engine.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>

#include <algorithm>

#include "common.h"
#include "liveness.h"
#include "progress.h"
#include "reduce.h"
#include "result_pool.h"
#include "runtime/config_agree.h"

namespace commlib {
namespace {

// How often the background thread looks whether the waiters still drive.
constexpr int64_t kYieldNapUs = 200;

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

// Whether a coordinator response goes to job rank r.
bool addressed_to(const Response& resp, int r) {
  return resp.to.empty() || std::find(resp.to.begin(), resp.to.end(), r) != resp.to.end();
}

// members: the job ranks of the request's process set.
void validate_request(const commlib_request& q, const std::vector<int>& members) {
  if (q.op_type < COMMLIB_OP_ALLREDUCE || q.op_type > COMMLIB_OP_BARRIER)
    throw Error(COMMLIB_ERR_VALUE, "unknown collective operation " + std::to_string(q.op_type));
  if (!q.name || !*q.name) throw Error(COMMLIB_ERR_VALUE, "a collective needs a non-empty name");
  if (q.device_type != COMMLIB_DEVICE_CPU)
    throw Error(COMMLIB_ERR_VALUE, "only host (CPU) buffers are supported by this build's collectives");
  if (q.op_type == COMMLIB_OP_BARRIER) return;
  if (!is_valid_dtype(q.dtype))
    throw Error(COMMLIB_ERR_TYPE, "unsupported dtype code " + std::to_string(q.dtype));
  if (q.ndim < 0 || (q.ndim > 0 && !q.shape)) throw Error(COMMLIB_ERR_VALUE, "invalid shape");
  for (int i = 0; i < q.ndim; ++i)
    if (q.shape[i] < 0) throw Error(COMMLIB_ERR_VALUE, "negative dimension in shape");
  const char* what = op_type_name(q.op_type);
  if (q.op_type == COMMLIB_OP_ALLREDUCE || q.op_type == COMMLIB_OP_REDUCESCATTER) {
    if (!reduction_supported(q.dtype, q.reduce_op)) {
      throw Error(COMMLIB_ERR_TYPE, std::string(what) + " with op " + reduce_op_name(q.reduce_op) +
                                        " is not supported for dtype " + dtype_name(q.dtype));
    }
  }
  if (q.op_type == COMMLIB_OP_BROADCAST &&
      std::find(members.begin(), members.end(), q.root) == members.end()) {
    if (q.process_set == 0) {
      throw Error(COMMLIB_ERR_VALUE, "broadcast root_rank " + std::to_string(q.root) +
                                         " is outside the job (size " + std::to_string(members.size()) + ")");
    }
    throw Error(COMMLIB_ERR_VALUE, "broadcast root_rank " + std::to_string(q.root) + " is not a member of process set " +
                                       std::to_string(q.process_set) + " " +
                                       ranks_str(members));
  }
  if ((q.op_type == COMMLIB_OP_ALLGATHER || q.op_type == COMMLIB_OP_ALLTOALL ||
       q.op_type == COMMLIB_OP_REDUCESCATTER) && q.ndim < 1) {
    throw Error(COMMLIB_ERR_VALUE, std::string(what) + " needs a tensor with at least one dimension");
  }
  int64_t n = 1;
  for (int i = 0; i < q.ndim; ++i) n *= q.shape[i];
  if (n > 0 && !q.input) throw Error(COMMLIB_ERR_VALUE, "input buffer is NULL");
  // (reducescatter: a rank may receive no rows, so its output may be NULL)
  const bool needs_output = q.op_type == COMMLIB_OP_ALLREDUCE || q.op_type == COMMLIB_OP_BROADCAST;
  if (needs_output && n > 0 && !q.output) throw Error(COMMLIB_ERR_VALUE, "output buffer is NULL");
}

// Rows sent to each rank (of the process set) by an alltoall: explicit
// splits or equal parts.
std::vector<int64_t> alltoall_splits(const commlib_request& q, int size) {
  const int64_t dim0 = q.shape[0];
  if (q.nsplits == 0) {
    if (dim0 % size != 0) {
      throw Error(COMMLIB_ERR_VALUE, "alltoall without splits needs dimension 0 (" + std::to_string(dim0) +
                                         ") divisible by the number of ranks (" + std::to_string(size) + ")");
    }
    return std::vector<int64_t>(size, dim0 / size);
  }
  if (q.nsplits != size) {
    throw Error(COMMLIB_ERR_VALUE, "alltoall splits must have one entry per rank (" + std::to_string(size) +
                                       "), got " + std::to_string(q.nsplits));
  }
  std::vector<int64_t> s(q.splits, q.splits + q.nsplits);
  int64_t sum = 0;
  for (int64_t x : s) {
    if (x < 0) throw Error(COMMLIB_ERR_VALUE, "alltoall splits must be non-negative");
    sum += x;
  }
  if (sum != dim0) {
    throw Error(COMMLIB_ERR_VALUE, "alltoall splits sum to " + std::to_string(sum) +
                                       " but dimension 0 of the tensor is " + std::to_string(dim0));
  }
  return s;
}

}  // namespace

Engine& Engine::get() {
  static Engine* engine = new Engine();  // never destroyed: outlives atexit order issues
  return *engine;
}

void Engine::init(MPI_Comm base) {
  if (running_.load()) return;
  // First: every rank reads its environment, and all fail together on a bad value.
  config_ = config_from_env_agreed(base);
  const Config& cfg = config_;
  fusion_threshold_.store(cfg.fusion_threshold);
  algo_ = parse_allreduce_algo(cfg.allreduce_algo);
  stall_warning_us_ = cfg.stall_check_time_s * 1000000;
  cycle_us_ = int64_t(cfg.cycle_time_ms * 1000);
  batch_gap_us_ = cfg.batch_gap_us;
  shm_collectives_ = cfg.shm_collectives == "always" ? kShmAlways
                     : cfg.shm_collectives == "never" ? kShmNever
                                                      : kShmAuto;
  set_spin_budget_us(cfg.spin_us);
  result_pool_set_limit(size_t(cfg.result_cache_bytes));

  MPI_Comm data, ctrl, local, cross;
  check_mpi(MPI_Comm_dup(base, &data), "MPI_Comm_dup");
  check_mpi(MPI_Comm_dup(base, &ctrl), "MPI_Comm_dup");
  Topology t;
  MPI_Comm_rank(data, &t.rank);
  MPI_Comm_size(data, &t.size);
  // COMMLIB_TEST_RANKS_PER_HOST=k pretends that every k consecutive ranks
  // share a host: it lets one machine test the multi-host (hierarchical) paths.
  const int64_t fake = cfg.test_ranks_per_host;
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
  const bool uniform = -extremes[0] == extremes[1];
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
  init_p2p(base, local, size_t(cfg.p2p_eager_bytes), size_t(cfg.p2p_split_bytes), cfg.p2p_single_copy);
  MPI_Comm_free(&local);
  if (shm_ && t.cross_size > 1) {
    cross_ = std::make_unique<MpiTransport>(cross);  // reduce within hosts, all-reduce across
  } else {
    MPI_Comm_free(&cross);
  }
  start_peer_monitor(exchange_peer_info(data, t.rank, t.size), shm_ ? &shm_->first_lost() : nullptr);

  transport_ = std::make_unique<MpiTransport>(data);
  control_ = std::make_unique<ControlChannel>(ctrl);
  controller_ = t.rank == 0 ? std::make_unique<Controller>(t.size, fusion_threshold_.load()) : nullptr;
  worker_left_.assign(t.size, false);
  closing_.clear();
  init_cache(t.size > 1 ? capacity : 0, log_mode);
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    dead_code_ = 0;
    dead_message_.clear();
    in_flight_.clear();
    sets_.clear();
    for (int r = 0; r < t.size; ++r) sets_[0].push_back(r);
    set_calls_ = 0;
  }
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
  stop_peer_monitor();
  if (broken()) {  // collective MPI calls could hang on a dead peer
    transport_->abandon();
    control_->abandon();
    if (cross_) cross_->abandon();
    for (auto& [id, t] : set_transports_) t->abandon();
    p2p_->abandon();
  }
  set_transports_.clear();
  init_cache(0, false);
  transport_.reset();
  control_.reset();
  controller_.reset();
  shm_.reset();
  cross_.reset();
  p2p_.reset();
}

int Engine::broken() {
  std::lock_guard<std::mutex> lock(queue_mu_);
  return (dead_code_ == COMMLIB_ERR_PEER_LOST || dead_code_ == COMMLIB_ERR_INTERNAL) ? dead_code_ : 0;
}

void Engine::set_fusion_threshold(int64_t bytes) {
  if (bytes < 0) throw Error(COMMLIB_ERR_VALUE, "fusion threshold must be >= 0");
  fusion_threshold_.store(bytes);
}

const std::vector<int>& Engine::members_of(int id) const {
  auto it = sets_.find(id);
  if (it == sets_.end()) {
    throw Error(COMMLIB_ERR_VALUE, "process set " + std::to_string(id) +
                                       " does not exist: register it with add_process_set() first");
  }
  if (std::find(it->second.begin(), it->second.end(), topo_.rank) == it->second.end()) {
    throw Error(COMMLIB_ERR_VALUE,
                "rank " + std::to_string(topo_.rank) + " is not a member of process set " + std::to_string(id) +
                    " " + ranks_str(it->second) +
                    "; only its members may call collectives on it");
  }
  return it->second;
}

Entry Engine::make_entry(const commlib_request& q) {
  std::vector<int> members;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    members = members_of(q.process_set);
  }
  validate_request(q, members);
  Entry e;
  e.desc.process_set = q.process_set;
  e.desc.name = q.name;
  e.desc.op_type = q.op_type;
  e.desc.dtype = q.op_type == COMMLIB_OP_BARRIER ? COMMLIB_UINT8 : q.dtype;
  e.desc.reduce_op = q.reduce_op;
  e.desc.root = q.root;
  e.desc.prescale = q.prescale;
  e.desc.postscale = q.postscale;
  e.desc.shape.assign(q.shape, q.shape + q.ndim);
  if (q.op_type == COMMLIB_OP_ALLTOALL) e.desc.splits = alltoall_splits(q, int(members.size()));
  e.input = q.input;
  e.output = q.output;
  return e;
}

// Queues entries that share one new handle; nothing is queued on error.
int64_t Engine::push(std::vector<Entry>& entries) {
  auto [id, handle] = handles_.create();
  handle->remaining = int(entries.size());
  if (entries.empty()) handle->done.store(1);
  for (Entry& e : entries) e.handle = handle;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    std::string error;
    int code = 0;
    if (stop_.load()) {
      code = COMMLIB_ERR_NOT_INIT;
      error = "commlib is shutting down";
    } else if (dead_code_ != 0) {
      code = dead_code_;
      error = dead_message_;
    }
    std::unordered_set<std::string> keys;
    for (const Entry& e : entries) {
      if (code) break;
      const std::string key = request_key(e.desc);
      if (in_flight_.count(key) || !keys.insert(key).second) {
        code = COMMLIB_ERR_VALUE;
        error = "a collective named '" + e.desc.name +
                "' is already in flight on this rank; wait for it or use another name";
      }
    }
    if (code) {
      handles_.release(id);
      throw Error(code, error);
    }
    for (Entry& e : entries) {
      in_flight_.insert(request_key(e.desc));
      queue_.push_back(std::move(e));
    }
  }
  outstanding_.fetch_add(int64_t(entries.size()));
  if (bg_sleeping_.load()) queue_cv_.notify_one();
  return id;
}

int64_t Engine::enqueue(const commlib_request& q) {
  if (!running_.load()) {
    throw Error(COMMLIB_ERR_NOT_INIT, "commlib is not initialized: call commlib.init() first");
  }
  std::vector<Entry> one;
  one.push_back(make_entry(q));
  return push(one);
}

int64_t Engine::enqueue_allreduce_group(const char* base, int n, const int32_t* dtypes,
                                        const int32_t* ndims, const int64_t* shapes,
                                        void* const* inputs, void* const* outputs, int reduce_op,
                                        double prescale, double postscale, int process_set) {
  if (!running_.load()) {
    throw Error(COMMLIB_ERR_NOT_INIT, "commlib is not initialized: call commlib.init() first");
  }
  if (n < 0) throw Error(COMMLIB_ERR_VALUE, "negative group size");
  if (!base || !*base) throw Error(COMMLIB_ERR_VALUE, "a collective needs a non-empty name");
  std::vector<int> members;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    members = members_of(process_set);
  }
  Entry e;
  RequestDesc& d = e.desc;
  d.name = base;
  d.process_set = process_set;
  d.op_type = COMMLIB_OP_ALLREDUCE;
  d.dtype = n > 0 ? dtypes[0] : COMMLIB_FLOAT32;
  d.reduce_op = reduce_op;
  d.prescale = prescale;
  d.postscale = postscale;
  d.group_size = n;
  const int64_t* shape = shapes;
  for (int i = 0; i < n; ++i) {
    commlib_request q{};
    q.op_type = COMMLIB_OP_ALLREDUCE;
    q.name = base;
    q.dtype = dtypes[i];
    q.ndim = ndims[i];
    q.shape = shape;
    q.input = inputs[i];
    q.output = outputs[i];
    q.reduce_op = reduce_op;
    q.process_set = process_set;
    validate_request(q, members);
    d.members.push_back(dtypes[i]);
    d.members.push_back(ndims[i]);
    d.members.insert(d.members.end(), shape, shape + ndims[i]);
    int64_t count = 1;
    for (int k = 0; k < ndims[i]; ++k) count *= shape[k];
    e.members.push_back({dtypes[i], size_t(count), inputs[i], outputs[i]});
    shape += ndims[i];
  }
  std::vector<Entry> one;
  if (n > 0) one.push_back(std::move(e));
  return push(one);
}

int64_t Engine::add_process_set(const int32_t* ranks, int n) {
  if (!running_.load()) {
    throw Error(COMMLIB_ERR_NOT_INIT, "commlib is not initialized: call commlib.init() first");
  }
  if (n < 1) throw Error(COMMLIB_ERR_VALUE, "a process set needs at least one rank");
  Entry e;
  for (int i = 0; i < n; ++i) {
    if (ranks[i] < 0 || ranks[i] >= topo_.size || (i > 0 && ranks[i] <= ranks[i - 1])) {
      throw Error(COMMLIB_ERR_VALUE, "process set ranks must be distinct ranks of the job (0.." +
                                         std::to_string(topo_.size - 1) + ") in ascending order");
    }
    e.desc.splits.push_back(ranks[i]);
  }
  e.desc.op_type = COMMLIB_OP_ADD_PROCESS_SET;
  e.desc.dtype = COMMLIB_UINT8;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    e.desc.name = "process_set.add." + std::to_string(set_calls_++);
  }
  std::vector<Entry> one;
  one.push_back(std::move(e));
  return push(one);
}

int64_t Engine::remove_process_set(int id) {
  if (!running_.load()) {
    throw Error(COMMLIB_ERR_NOT_INIT, "commlib is not initialized: call commlib.init() first");
  }
  if (id == 0) throw Error(COMMLIB_ERR_VALUE, "the global process set (id 0) cannot be removed");
  Entry e;
  e.desc.op_type = COMMLIB_OP_REMOVE_PROCESS_SET;
  e.desc.dtype = COMMLIB_UINT8;
  e.desc.root = id;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (!sets_.count(id)) throw Error(COMMLIB_ERR_VALUE, "process set " + std::to_string(id) + " does not exist");
    // (Collectives still pending on the set make the removal fail on every
    // rank alike: the coordinator checks, see Controller::remove_set.)
    e.desc.name = "process_set.remove." + std::to_string(set_calls_++);
  }
  std::vector<Entry> one;
  one.push_back(std::move(e));
  return push(one);
}

// Called while stop_ is set: true when the loop may end. The coordinator ends
// at once (it has executed everything it sent). A worker first tells the
// coordinator and keeps executing responses until the coordinator's
// acknowledgement: it must run every collective the others run.
bool Engine::leave() {
  if (broken()) return true;
  const int64_t now = now_us();
  if (controller_) {
    if (!log_) return true;
    // With the order log, rank 0 runs everything placed before its
    // departure (cached collectives other ranks may already run with it).
    if (!leaving_) {
      leaving_ = true;
      leave_deadline_us_ = now + 30000000;
      controller_->rank_left(0);  // anything still open fails
      append_entry(LogEntry{LogEntry::kLeft, {0}});
    }
    return log_done_ || now > leave_deadline_us_;
  }
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (dead_code_ != 0) return true;  // acknowledged, or the coordinator left
  }
  if (log_done_) return true;  // the coordinator's record of it has been read
  if (leave_deadline_us_ == 0) {
    leave_deadline_us_ = now + 30000000;
    Writer w;
    w.put<int32_t>(kMsgShutdown);
    control_->send(0, w.take());
  }
  return now > leave_deadline_us_;
}

bool Engine::step() {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (dead_code_ == COMMLIB_ERR_PEER_LOST || dead_code_ == COMMLIB_ERR_INTERNAL) {
      return false;  // nothing can be sent any more: just idle until shutdown
    }
  }
  try {
    return cycle();
  } catch (const Error& e) {
    fail_everything(e.code(), e.what());
    return true;
  }
}

bool Engine::drive() {
  if (stop_.load() || !running_.load()) return false;  // the leave handshake is the loop's
  std::unique_lock<std::mutex> lock(cycle_mu_, std::try_to_lock);
  return lock.owns_lock() && step();
}

bool Engine::wait(HandleState& h, double timeout_s) {
  // When the last driver stops with requests still open (its own, if it
  // goes to sleep; or asynchronous ones), the background thread takes over.
  return handles_.wait(h, timeout_s, [this] { return drive(); }, [this] {
    if (handles_.driving() == 0 && bg_yields_.load() && outstanding_.load() > 0) {
      { std::lock_guard<std::mutex> lock(queue_mu_); }  // it is inside wait_for, or will see driving() == 0
      queue_cv_.notify_one();
    }
  });
}

void Engine::loop() {
  leave_deadline_us_ = 0;
  int64_t idle_since = now_us();
  int64_t nap = 20;
  for (;;) {
    if (handles_.driving() > 0 && !stop_.load()) {
      // A waiting thread drives the engine: stay off the cores it needs.
      // The last driver to leave with requests open wakes us (Engine::wait);
      // a thread that enqueues does not (it most likely waits, and drives,
      // next, and a futex wake would cost it more), so asynchronous requests
      // enqueued after the drivers left are picked up at the next look.
      std::unique_lock<std::mutex> lock(queue_mu_);
      bg_yields_.store(true);
      if (handles_.driving() > 0) queue_cv_.wait_for(lock, std::chrono::microseconds(kYieldNapUs));
      bg_yields_.store(false);
      idle_since = now_us();
      continue;
    }
    bool worked;
    {
      std::lock_guard<std::mutex> lock(cycle_mu_);
      worked = step();
    }
    if (stop_.load() && leave()) break;
    if (worked) {
      idle_since = now_us();
      nap = 20;
      continue;
    }
    if (now_us() - idle_since < spin_budget_us()) {
      sched_yield();
      continue;
    }
    std::unique_lock<std::mutex> lock(queue_mu_);
    bg_sleeping_.store(true);
    if (queue_.empty() && p2p_queue_.empty() && !stop_.load())
      queue_cv_.wait_for(lock, std::chrono::microseconds(nap));
    bg_sleeping_.store(false);
    if (nap < kMaxNapUs) nap *= 2;
  }
  try {
    if (!broken()) p2p_->say_goodbye();
    if (controller_) send_shutdown_notice();  // workers said goodbye in leave()
  } catch (const Error&) {
    // The job is going away; a notice that cannot be sent changes nothing.
  }
  fail_everything(COMMLIB_ERR_NOT_INIT, "commlib was shut down before this collective completed");
}

bool Engine::cycle() {
  std::vector<Entry> batch;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    batch.swap(queue_);
  }
  bool worked = !batch.empty();
  if (!held_.empty() || !batch.empty()) {
    const int64_t now = now_us();
    if (!batch.empty()) {
      if (held_.empty()) held_since_us_ = now;
      last_arrival_us_ = now;
      for (Entry& e : batch) held_.push_back(std::move(e));
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
  }

  worked |= cycle_p2p();
  int source;
  std::string msg;
  while (control_->poll(&source, &msg)) {
    on_message(source, msg);
    worked = true;
  }
  if (controller_) {
    controller_->set_fusion_threshold(fusion_threshold_.load());
    std::vector<Response> resps = controller_->take_ready();
    if (hier_) add_cached_responses(resps);
    if (!resps.empty()) {
      if (cache_bits_ && !cache_off_)
        for (Response& r : resps) cache_bits_->assign(r);
      send_responses(resps);
      // With the order log, a marker says where every rank runs its share.
      std::vector<uint64_t> counts(log_ ? size_t(topo_.size) : 0, 0);
      for (Response& r : resps) {
        for (size_t k = 0; k < counts.size(); ++k)
          counts[k] += addressed_to(r, int(k)) && (k == 0 || !worker_left_[k]) ? 1 : 0;
        if (addressed_to(r, 0)) ready_.push_back(std::move(r));
      }
      if (log_) append_entry(LogEntry{LogEntry::kMarker, std::move(counts)});
      worked = true;
    }
    const int64_t now = now_us();
    if (now - last_stall_check_us_ > 1000000) {
      last_stall_check_us_ = now;
      for (const std::string& w : controller_->stall_warnings(now, stall_warning_us_)) {
        std::fprintf(stderr, "commlib (rank 0): WARNING: %s\n", w.c_str());
      }
    }
  }
  if (log_) {
    worked |= run_log();
  } else {
    while (!ready_.empty()) {
      Response resp = std::move(ready_.front());
      ready_.pop_front();
      execute(resp);
      worked = true;
    }
    if (!closing_.empty()) {  // the coordinator's acknowledgement or departure
      fail_everything(COMMLIB_ERR_NOT_INIT, closing_);
      closing_.clear();
    }
  }
  if (cache_) expire_waiting(now_us());
  control_->progress();
  throw_if_peer_lost();
  return worked;
}

// Coordinator: each worker gets, in order, the responses addressed to it.
void Engine::send_responses(const std::vector<Response>& resps) {
  std::string common;  // the message of workers that get every response
  for (int r = 1; r < topo_.size; ++r) {
    if (worker_left_[r]) continue;
    std::vector<const Response*> mine;
    for (const Response& x : resps)
      if (addressed_to(x, r)) mine.push_back(&x);
    if (mine.empty()) continue;
    const bool all = mine.size() == resps.size();
    if (all && !common.empty()) {
      control_->send(r, common);
      continue;
    }
    Writer w;
    w.put<int32_t>(kMsgResponses);
    w.put<uint32_t>(uint32_t(mine.size()));
    for (const Response* x : mine) encode(w, *x);
    std::string bytes = w.take();
    if (all) common = bytes;
    control_->send(r, std::move(bytes));
  }
}

void Engine::submit(std::vector<Entry>& batch) {
  std::vector<Entry*> negotiate, completed;
  for (Entry& e : batch) {
    std::string key = request_key(e.desc);
    Entry& p = pending_.emplace(std::move(key), std::move(e)).first->second;  // (nodes never move)
    bool completes = false;
    if (cache_ && try_cache(p, &completes)) {
      if (completes) completed.push_back(&p);
    } else {
      negotiate.push_back(&p);
    }
  }
  if (!completed.empty()) {
    if (log_) {
      append_completed(completed);
    } else {
      send_arrivals(completed);
    }
  }
  if (!negotiate.empty()) report(negotiate);
}

void Engine::report(const std::vector<Entry*>& entries) {
  const int64_t now = now_us();
  if (controller_) {
    for (Entry* e : entries) coordinator_add(0, e->desc, now);
    return;
  }
  Writer w;
  w.put<int32_t>(kMsgRequests);
  w.put<uint32_t>(uint32_t(entries.size()));
  for (Entry* e : entries) encode(w, e->desc);
  control_->send(0, w.take());
}

void Engine::on_message(int source, const std::string& msg) {
  Reader r(msg);
  const int kind = r.get<int32_t>();
  if (kind == kMsgRequests && controller_) {
    const uint32_t n = r.get<uint32_t>();
    const int64_t now = now_us();
    for (uint32_t i = 0; i < n; ++i) coordinator_add(source, decode_request(r), now);
  } else if ((kind == kMsgArrived || kind == kMsgExpire) && controller_) {
    const std::vector<int64_t> words = r.get_vec();
    const std::vector<uint64_t> w(words.begin(), words.end());
    if (kind == kMsgArrived) {
      coordinator_arrived(w);
    } else {
      coordinator_expire(w);
    }
  } else if (kind == kMsgResponses && !controller_) {
    const uint32_t n = r.get<uint32_t>();
    for (uint32_t i = 0; i < n; ++i) ready_.push_back(decode_response(r));
  } else if (kind == kMsgShutdown) {
    if (controller_) {
      // Acknowledge: every response sent to the leaving rank precedes this
      // (and, with the order log, every marker precedes its departure's entry).
      worker_left_[source] = true;
      controller_->rank_left(source);
      coordinator_rank_left(source);
      if (log_) {
        append_entry(LogEntry{LogEntry::kLeft, {uint64_t(source)}});  // (the log is its acknowledgement)
      } else {
        Writer w;
        w.put<int32_t>(kMsgShutdown);
        control_->send(source, w.take());
      }
    } else if (log_) {
      // The order log carries departures, in their place in the order (on_left).
    } else {
      // Responses that came before it (perhaps in this very poll) run
      // first: the coordinator ran them, so every rank must (cycle).
      closing_ = stop_.load() ? "commlib was shut down before this collective completed"
                              : "rank 0 (the coordinator) called shutdown(); no further collectives are possible";
    }
  } else {
    throw Error(COMMLIB_ERR_INTERNAL, "unexpected control message kind " + std::to_string(kind));
  }
}

void Engine::execute(const Response& resp) {
  if (resp.kind == Response::kInvalidate || resp.kind == Response::kCacheOff) {
    execute_cache_notice(resp);
    return;
  }
  if (resp.kind == Response::kError) {
    for (const std::string& key : resp.names) {
      auto it = pending_.find(key);
      if (it == pending_.end()) continue;  // never submitted here (rank left, not a member)
      if (it->second.cache_bit >= 0) live_.erase(it->second.cache_bit);
      finish(it->second, resp.error_code, resp.error);
      pending_.erase(it);
    }
    return;
  }
  std::vector<Entry*> entries;
  for (const std::string& key : resp.names) {
    auto it = pending_.find(key);
    if (it == pending_.end()) {
      throw Error(COMMLIB_ERR_INTERNAL, "coordinator answered for unknown tensor '" + std::string(key.c_str()) + "'");
    }
    entries.push_back(&it->second);
    if (it->second.cache_bit >= 0) {  // a cached request, complete everywhere: its arrival ends
      live_.erase(it->second.cache_bit);
      it->second.cache_bit = -1;
      cache_counts_[kCachedRuns].fetch_add(1);
    }
  }
  if (resp.op_type == COMMLIB_OP_ADD_PROCESS_SET || resp.op_type == COMMLIB_OP_REMOVE_PROCESS_SET) {
    execute_set_change(resp, *entries[0]);
    return;
  }
  // A process set runs over its own communicator, without the host's shared
  // memory (whose ranks are the whole host's).
  Transport* transport = transport_.get();
  ShmSegment* shm = shm_.get();
  Transport* cross = cross_.get();
  if (resp.process_set != 0) {
    auto t = set_transports_.find(resp.process_set);
    if (t == set_transports_.end()) {
      throw Error(COMMLIB_ERR_INTERNAL, "asked to run on process set " + std::to_string(resp.process_set) +
                                            ", which this rank is not in");
    }
    transport = t->second.get();
    shm = nullptr;
    cross = nullptr;
    if (resp.op_type == COMMLIB_OP_BROADCAST) {  // root: job rank -> rank in the set
      int& root = entries[0]->desc.root;
      std::lock_guard<std::mutex> lock(queue_mu_);
      const std::vector<int>& m = sets_.at(resp.process_set);
      root = int(std::find(m.begin(), m.end(), root) - m.begin());
    }
  }
  OpContext ctx{*transport, fusion_, scratch_, algo_, size_t(fusion_threshold_.load()), shm,
                cross, shm_collectives_};
  int status = COMMLIB_OK;
  std::string message;
  try {
    switch (resp.op_type) {
      case COMMLIB_OP_ALLREDUCE: run_allreduce(ctx, entries); break;
      case COMMLIB_OP_ALLGATHER: run_allgather(ctx, *entries[0], resp.rows); break;
      case COMMLIB_OP_BROADCAST: run_broadcast(ctx, *entries[0]); break;
      case COMMLIB_OP_ALLTOALL: run_alltoall(ctx, *entries[0], resp.rows); break;
      case COMMLIB_OP_REDUCESCATTER: run_reducescatter(ctx, *entries[0]); break;
      case COMMLIB_OP_BARRIER: break;  // negotiation itself synchronised every rank
    }
  } catch (const Error& e) {
    // Value/type problems are detected identically on every rank before any
    // data moves; anything else leaves the job in an unknown state.
    if (e.code() != COMMLIB_ERR_VALUE && e.code() != COMMLIB_ERR_TYPE) throw;
    status = e.code();
    message = e.what();
  }
  if (!resp.bits.empty()) {
    if (status == COMMLIB_OK) {
      install_bits(resp);
    } else if (cache_bits_) {  // (failed alike everywhere: nobody installs them)
      for (int64_t b : resp.bits)
        if (b >= 0) cache_bits_->release(int(b));
    }
  }
  for (const std::string& key : resp.names) {
    auto it = pending_.find(key);
    finish(it->second, status, message);
    pending_.erase(it);
  }
}

// Every rank runs these, in the coordinator's order: the new set's members
// get a communicator of their own.
void Engine::execute_set_change(const Response& resp, Entry& e) {
  if (resp.op_type == COMMLIB_OP_ADD_PROCESS_SET) {
    const int id = int(resp.rows.at(0));
    std::vector<int> members(e.desc.splits.begin(), e.desc.splits.end());
    std::unique_ptr<MpiTransport> t = transport_->subset(members);
    if (t) set_transports_[id] = std::move(t);
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      sets_[id] = members;
    }
    e.handle->rows = id;
  } else {
    const int id = e.desc.root;
    set_transports_.erase(id);
    std::lock_guard<std::mutex> lock(queue_mu_);
    sets_.erase(id);
  }
  const std::string key = request_key(e.desc);
  finish(e, COMMLIB_OK, "");
  pending_.erase(key);
}

void Engine::finish(Entry& e, int status, const std::string& message) {
  outstanding_.fetch_sub(1);
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    in_flight_.erase(request_key(e.desc));
  }
  handles_.complete(*e.handle, status, message);
}

void Engine::fail_everything(int code, const std::string& message) {
  std::vector<Entry> queued;
  std::vector<P2PRequest> p2p_queued;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    p2p_queued.swap(p2p_queue_);
    // With the order log, a rank that dropped its requests cannot stay in
    // step with the others: every failure ends its communication.
    if (dead_code_ == 0 && (log_ || (code != COMMLIB_ERR_VALUE && code != COMMLIB_ERR_TYPE))) {
      dead_code_ = code;
      dead_message_ = message;
      if (code == COMMLIB_ERR_PEER_LOST || code == COMMLIB_ERR_INTERNAL) {
        std::fprintf(stderr, "commlib (rank %d): ERROR: %s\n", topo_.rank, message.c_str());
      }
    }
    queued.swap(queue_);
  }
  for (Entry& e : queued) finish(e, code, message);
  for (P2PRequest& r : p2p_queued) {
    outstanding_.fetch_sub(1);
    handles_.complete(*r.handle, code, message);
  }
  if (p2p_) p2p_->fail_all(code, message);
  for (Entry& e : held_) finish(e, code, message);
  held_.clear();
  for (auto& [name, e] : pending_) finish(e, code, message);
  pending_.clear();
  ready_.clear();
  live_.clear();
  marker_left_ = 0;
  cache_off_ = true;
  log_done_ = true;
}

// Coordinator only: tells every worker still listening that no further
// collectives are possible.
void Engine::send_shutdown_notice() {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (dead_code_ != 0) return;
  }
  if (log_) return;  // its departure is in the order log
  Writer w;
  w.put<int32_t>(kMsgShutdown);
  const std::string bytes = w.take();
  for (int r = 1; r < topo_.size; ++r)
    if (!worker_left_[r]) control_->send(r, bytes);
  control_->progress();
}

}  // namespace commlib
