// The engine's side of point-to-point: validating and queueing send/recv
// requests from caller threads, and running them in the engine's cycle
// (p2p/point_to_point.h does the matching and the transfers).
#include <unistd.h>

#include <algorithm>

#include "backends/nccl/nccl_comm.h"
#include "backends/nccl/nccl_links.h"
#include "common.h"
#include "runtime/engine.h"
#include "runtime/progress.h"

namespace commlib {
namespace {

constexpr int kMaxDims = 64;

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

// members: the process set's ranks (null: the global set, every job rank).
void validate_p2p(const commlib_request& q, const std::vector<int>* members, int size) {
  const bool send = q.op_type == COMMLIB_OP_SEND;
  const char* what = send ? "send" : "recv";
  const char* peer = send ? "dst" : "src";
  const bool cuda = q.device_type == COMMLIB_DEVICE_CUDA;
  if (q.device_type != COMMLIB_DEVICE_CPU && !cuda)
    throw Error(COMMLIB_ERR_VALUE, std::string(what) + ": unknown device type " + std::to_string(q.device_type));
  if (cuda && !send && !(q.p2p_flags & COMMLIB_P2P_TAKES_DEVICE))
    throw Error(COMMLIB_ERR_VALUE, "recv into CUDA memory: set p2p_flags COMMLIB_P2P_TAKES_DEVICE");
  if (send && q.p2p_flags) throw Error(COMMLIB_ERR_VALUE, "send: p2p_flags are a recv's");
  if (q.peer < 0 || q.peer >= size) {
    throw Error(COMMLIB_ERR_VALUE, std::string(what) + ": " + peer + " " + std::to_string(q.peer) +
                                       " is outside the job (ranks 0.." + std::to_string(size - 1) + ")");
  }
  if (members && std::find(members->begin(), members->end(), q.peer) == members->end()) {
    throw Error(COMMLIB_ERR_VALUE, std::string(what) + ": " + peer + " " + std::to_string(q.peer) +
                                       " is not a member of process set " + std::to_string(q.process_set) + " " +
                                       ranks_str(*members));
  }
  if (q.tag < 0) throw Error(COMMLIB_ERR_VALUE, std::string(what) + ": tag must be >= 0, got " + std::to_string(q.tag));
  const bool has_buffer = send || q.output != nullptr || (q.dtype >= 0 && q.p2p_flags);
  if (!has_buffer) return;  // a recv that learns dtype and shape from the message
  if (!is_valid_dtype(q.dtype)) throw Error(COMMLIB_ERR_TYPE, "unsupported dtype code " + std::to_string(q.dtype));
  if (q.ndim < 0 || q.ndim > kMaxDims || (q.ndim > 0 && !q.shape))
    throw Error(COMMLIB_ERR_VALUE, std::string(what) + ": invalid shape (at most 64 dimensions)");
  int64_t n = 1;
  for (int i = 0; i < q.ndim; ++i) {
    if (q.shape[i] < 0) throw Error(COMMLIB_ERR_VALUE, "negative dimension in shape");
    n *= q.shape[i];
  }
  if (send && n > 0 && !q.input) throw Error(COMMLIB_ERR_VALUE, "send: data buffer is NULL");
}

}  // namespace

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

int64_t Engine::enqueue_p2p(const commlib_request& q) { return handles_.adopt(queue_p2p(q, false)); }

std::shared_ptr<HandleState> Engine::queue_p2p(const commlib_request& q, bool caller_waits) {
  if (!running_.load()) {
    throw Error(COMMLIB_ERR_NOT_INIT, "commlib is not initialized: call commlib.init() first");
  }
  if (q.op_type != COMMLIB_OP_SEND && q.op_type != COMMLIB_OP_RECV)
    throw Error(COMMLIB_ERR_VALUE, "not a point-to-point operation: " + std::to_string(q.op_type));
  std::vector<int> members;
  if (q.process_set != 0) {
    std::lock_guard<std::mutex> lock(queue_mu_);
    members = members_of(q.process_set);
  }
  validate_p2p(q, q.process_set != 0 ? &members : nullptr, topo_.size);
  P2PRequest r;
  r.is_send = q.op_type == COMMLIB_OP_SEND;
  r.peer = q.peer;
  r.tag = q.tag;
  r.process_set = q.process_set;
  if (r.is_send || q.output || (q.dtype >= 0 && q.p2p_flags)) {
    r.dtype = q.dtype;
    r.shape.assign(q.shape, q.shape + q.ndim);
  }
  r.data = q.input;
  r.out = q.output;
  r.caller_waits = caller_waits;
  if (q.device_type == COMMLIB_DEVICE_CUDA || (q.p2p_flags & COMMLIB_P2P_TAKES_DEVICE)) prepare_device_p2p(q, r);
  auto handle = std::make_shared<HandleState>();
  r.handle = handle;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    int code = stop_.load() ? COMMLIB_ERR_NOT_INIT : dead_code_;
    if (code) throw Error(code, stop_.load() ? std::string("commlib is shutting down") : dead_message_);
    p2p_queue_.push_back(std::move(r));
    p2p_outstanding_.fetch_add(1);  // (before outstanding_: drive() compares the two)
  }
  outstanding_.fetch_add(1);
  if (!caller_waits) start_p2p();
  wake_for(caller_waits);
  return handle;
}

// A send from CUDA memory, or a receive that takes device messages (into
// CUDA memory, or memory the core allocates on the device): the transfer runs
// through NCCL once the caller's stream has reached this point.
void Engine::prepare_device_p2p(const commlib_request& q, P2PRequest& r) {
  const char* what = r.is_send ? "send" : "recv";
  if (gpu_backend_ == GpuBackend::kHost) {
    throw Error(COMMLIB_ERR_VALUE, std::string(what) + " of CUDA memory: COMMLIB_GPU_BACKEND=host (the frontend "
                                                       "stages CUDA tensors through host memory)");
  }
  const gpu::GpuLibs* libs = gpu_libs(true);
  const std::string why = gpu::unusable_reason(*libs);
  if (!why.empty()) {
    throw Error(COMMLIB_ERR_VALUE, std::string(what) + " of CUDA memory needs NCCL and the CUDA runtime: " + why);
  }
  r.device = q.device_id;
  r.out_on_device = !r.is_send && q.device_type == COMMLIB_DEVICE_CUDA;
  r.ready = std::shared_ptr<void>(gpu::record_event(libs->cuda, q.device_id, q.stream), gpu::destroy_event);
}

void Engine::start_p2p() {
  // An isend's header (or an irecv's match) goes out from the caller's
  // thread when no other thread is in the engine: the background thread,
  // asleep on a core that computes, can take a scheduler slice (ms) to run.
  if (stop_.load() || !running_.load()) return;  // (the leave handshake is the loop's)
  std::unique_lock<std::mutex> lock(cycle_mu_, std::try_to_lock);
  if (lock.owns_lock()) step(false);
}

bool Engine::cycle_p2p() {
  std::vector<P2PRequest>& batch = p2p_batch_;  // (swapped with the queue: both keep their capacity)
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    batch.swap(p2p_queue_);
  }
  const bool waiting = handles_.driving() > 0;  // (a split copy needs a sender that answers)
  for (P2PRequest& r : batch) {
    const bool sender_waits = waiting || r.caller_waits;
    p2p_->post(std::move(r), sender_waits);
  }
  const bool posted = !batch.empty();
  batch.clear();
  bool worked = p2p_->progress() || posted;
  p2p_->check_stalls(now_us(), stall_warning_us_, timeout_us_);
  return worked;
}

}  // namespace commlib
