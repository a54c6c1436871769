// The callers' side of the engine (Engine, runtime/engine.h): collectives and
// point-to-point requests checked (runtime/request_checks.h) and queued under
// one handle, and the process-set calls (all on caller threads, under
// queue_mu_ where they touch what the background thread reads).
#include <algorithm>
#include <string>

#include "base/common.h"
#include "base/progress.h"
#include "base/reduce.h"
#include "base/timeline.h"
#include "runtime/engine.h"
#include "runtime/request_checks.h"

namespace commlib {
namespace {

// Whether process set id contains rank 0 (its members are in ascending order).
bool has_rank0(const std::map<int, std::vector<int>>& sets, int id) {
  auto it = sets.find(id);
  return it != sets.end() && !it->second.empty() && it->second[0] == 0;
}

}  // namespace

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
  Entry e;
  {
    // (checked under the lock: the members are read in place, not copied)
    std::lock_guard<std::mutex> lock(queue_mu_);
    const std::vector<int>& members = members_of(q.process_set);
    validate_request(q, members);
    if (q.op_type == COMMLIB_OP_ALLTOALL) e.desc.splits = alltoall_splits(q, int(members.size()));
    if (q.op_type == COMMLIB_OP_REDUCESCATTER) e.desc.splits = reducescatter_splits(q, int(members.size()));
  }
  e.desc.process_set = q.process_set;
  e.desc.name = q.name;
  e.desc.op_type = q.op_type;
  const bool no_data = q.op_type == COMMLIB_OP_BARRIER || q.op_type == COMMLIB_OP_JOIN;
  e.desc.dtype = no_data ? COMMLIB_UINT8 : q.dtype;
  e.desc.reduce_op = q.reduce_op;
  e.desc.root = q.root;
  e.desc.prescale = q.prescale;
  e.desc.postscale = q.postscale;
  e.desc.shape.assign(q.shape, q.shape + q.ndim);
  e.input = q.input;
  e.output = q.output;
  if (q.op_type == COMMLIB_OP_ALLGATHER && q.output) e.output_rows = q.output_rows;
  for (int i = 0; i < q.npieces; ++i) e.pieces.push_back({q.pieces[i], size_t(q.piece_elements[i])});
  if (q.op_type == COMMLIB_OP_JOIN) {
    // (join moves no data: a CUDA device names where this rank stands in for CUDA collectives)
    if (q.device_type == COMMLIB_DEVICE_CUDA && q.device_id >= 0) join_device_.store(q.device_id);
    e.desc.device_type = COMMLIB_DEVICE_CPU;
    return e;
  }
  if (q.device_type != COMMLIB_DEVICE_CPU) prepare_gpu_entry(q, e);
  return e;
}

// Adds d's key to the names in flight (under queue_mu_, in a node kept from
// an earlier request when there is one); false when it is there already.
bool Engine::enter_in_flight(const RequestDesc& d) {
  std::string buf;
  return in_flight_spare_.insert(in_flight_, key_of(d, buf)).second;
}

// Queues e under a new handle (e null: nothing to queue, the handle is
// complete at once); nothing is queued on error.
int64_t Engine::push(Entry* e) {
  auto [id, handle] = handles_.create();
  handle->remaining = e ? 1 : 0;
  if (!e) handle->done.store(1);
  if (e) e->handle = handle;
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
    } else if (coll_code_ != 0) {
      code = coll_code_;
      error = coll_message_;
    } else if (e && rank0_left_ && has_rank0(sets_, e->desc.process_set)) {
      code = COMMLIB_ERR_NOT_INIT;
      error = kCoordinatorLeft;
    } else if (e && !enter_in_flight(e->desc)) {
      code = COMMLIB_ERR_VALUE;
      error = "a collective named '" + e->desc.name +
              "' is already in flight on this rank; wait for it or use another name";
    }
    if (code) {
      handles_.release(id);
      throw Error(code, error);
    }
    if (e) {
      e->queued_us = timeline().on() ? now_us() : 0;
      queue_.push_back(std::move(*e));
      queued_.store(true);
    }
  }
  if (e) outstanding_.fetch_add(1);
  wake_for(false);
  return id;
}

int64_t Engine::enqueue(const commlib_request& q) {
  if (!running_.load()) {
    throw Error(COMMLIB_ERR_NOT_INIT, "commlib is not initialized: call commlib.init() first");
  }
  Entry e = checked(q, &Engine::make_entry);
  return push(&e);
}

Entry Engine::checked(const commlib_request& q, Entry (Engine::*make)(const commlib_request&)) {
  try {
    return (this->*make)(q);
  } catch (const Error& err) {
    if (err.code() == COMMLIB_ERR_VALUE || err.code() == COMMLIB_ERR_TYPE) abort_others(q, err.what());
    throw;
  }
}

// The other ranks would wait for this request until the timeout: its name
// goes to the coordinator as an abort, which fails theirs at once. An abort
// is a notice, not a request: nothing waits for an answer to it, so the name
// is free again on this rank at once (the coordinator pairs this rank's next
// request of that name with the others' next ones).
void Engine::abort_others(const commlib_request& q, const std::string& why) {
  if (!q.name || !*q.name || q.op_type < COMMLIB_OP_ALLREDUCE || q.op_type > COMMLIB_OP_BARRIER) return;
  RequestDesc d;
  d.name = q.name;
  d.op_type = COMMLIB_OP_ABORT;
  d.dtype = COMMLIB_UINT8;
  d.process_set = q.process_set;
  d.note = "rank " + std::to_string(topo_.rank) + " could not submit " + op_type_name(q.op_type) + " '" + q.name +
           "': " + why;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    try {
      members_of(q.process_set);
    } catch (const Error&) {
      return;  // (not a set this rank is in: nobody waits for it here)
    }
    // (a request of that name in flight here: this call was refused for that
    // alone, and the one in flight pairs with the others')
    if (stop_.load() || dead_code_ != 0 || coll_code_ != 0 || (rank0_left_ && has_rank0(sets_, q.process_set)) ||
        in_flight_.count(request_key(d)) > 0) {
      return;
    }
    aborts_.push_back(std::move(d));
    queued_.store(true);
  }
  wake_for(false);  // (outside queue_mu_, which it may take)
}

void Engine::send_aborts(std::vector<RequestDesc>& aborts) {
  std::vector<Entry> notices(aborts.size());
  std::vector<Entry*> report_them;
  const int64_t now = now_us();
  for (size_t i = 0; i < aborts.size(); ++i) {
    Entry& e = notices[i];
    e.desc = std::move(aborts[i]);
    bool completes = false;
    // (a name the response cache holds: its bit ends on every rank, so
    // ranks waiting at it go to the coordinator, which fails them)
    if (cache_.enabled() && cache_.try_arrive(e, now, &completes)) {
      throw Error(COMMLIB_ERR_INTERNAL, "an abort of '" + e.desc.name + "' was found in the response cache");
    }
    report_them.push_back(&e);
  }
  report(report_them);
}

int64_t Engine::enqueue_group(const commlib_request& req) {
  if (!running_.load()) {
    throw Error(COMMLIB_ERR_NOT_INIT, "commlib is not initialized: call commlib.init() first");
  }
  if (req.nmembers < 0) throw Error(COMMLIB_ERR_VALUE, "negative group size");
  if (req.op_type != COMMLIB_OP_ALLREDUCE) throw Error(COMMLIB_ERR_VALUE, "only allreduces are submitted as a group");
  if (!req.name || !*req.name) throw Error(COMMLIB_ERR_VALUE, "a collective needs a non-empty name");
  Entry e = checked(req, &Engine::make_group_entry);
  return push(req.nmembers > 0 ? &e : nullptr);
}

Entry Engine::make_group_entry(const commlib_request& req) {
  const int n = req.nmembers;
  std::vector<int> members;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    members = members_of(req.process_set);
  }
  Entry e;
  RequestDesc& d = e.desc;
  d.name = req.name;
  d.process_set = req.process_set;
  d.op_type = COMMLIB_OP_ALLREDUCE;
  d.dtype = n > 0 ? req.member_dtypes[0] : COMMLIB_FLOAT32;
  d.reduce_op = req.reduce_op;
  d.prescale = req.prescale;
  d.postscale = req.postscale;
  d.group_size = n;
  commlib_request q = req;  // (member i: the group's request with its own tensor)
  q.nmembers = 0;
  for (int i = 0; i < n; ++i) {
    q.dtype = req.member_dtypes[i];
    q.ndim = req.member_ndims[i];
    q.input = req.member_inputs[i];
    q.output = req.member_outputs[i];
    validate_request(q, members);
    d.members.push_back(q.dtype);
    d.members.push_back(q.ndim);
    d.members.insert(d.members.end(), q.shape, q.shape + q.ndim);
    int64_t count = 1;
    for (int k = 0; k < q.ndim; ++k) count *= q.shape[k];
    e.members.push_back({q.dtype, size_t(count), req.member_inputs[i], req.member_outputs[i]});
    q.shape += q.ndim;
  }
  check_disjoint_outputs(e.members);
  return e;
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
  return push(&e);
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
  return push(&e);
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
    p2p_queued_.store(true);
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

}  // namespace commlib
