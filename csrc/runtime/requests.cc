// The callers' side of the engine: validating requests, queueing them under
// one handle, and the process-set calls (all on caller threads, under
// queue_mu_ where they touch what the background thread reads).
#include <algorithm>
#include <cmath>
#include <string>

#include "common.h"
#include "reduce.h"
#include "runtime/engine.h"
#include "runtime/progress.h"
#include "runtime/timeline.h"

namespace commlib {
namespace {

// members: the job ranks of the request's process set.
// A reducescatter's input in pieces: CPU only, no `input`, piece sizes that
// add up to the tensor's elements.
void validate_pieces(const commlib_request& q, int64_t n) {
  if (q.op_type != COMMLIB_OP_REDUCESCATTER || q.device_type != COMMLIB_DEVICE_CPU) {
    throw Error(COMMLIB_ERR_VALUE, "an input in pieces is supported by CPU reducescatter only");
  }
  if (q.npieces < 0 || !q.pieces || !q.piece_elements || q.input) {
    throw Error(COMMLIB_ERR_VALUE, "reducescatter pieces: needs npieces > 0, the pieces and their "
                                   "sizes, and no input buffer");
  }
  int64_t sum = 0;
  for (int i = 0; i < q.npieces; ++i) {
    if (q.piece_elements[i] < 0) throw Error(COMMLIB_ERR_VALUE, "reducescatter pieces must have non-negative sizes");
    sum += q.piece_elements[i];
  }
  if (sum != n) {
    throw Error(COMMLIB_ERR_VALUE, "reducescatter pieces hold " + std::to_string(sum) +
                                       " elements, the tensor's shape " + std::to_string(n));
  }
}

void validate_request(const commlib_request& q, const std::vector<int>& members) {
  if ((q.op_type < COMMLIB_OP_ALLREDUCE || q.op_type > COMMLIB_OP_BARRIER) && q.op_type != COMMLIB_OP_JOIN)
    throw Error(COMMLIB_ERR_VALUE, "unknown collective operation " + std::to_string(q.op_type));
  if (!q.name || !*q.name) throw Error(COMMLIB_ERR_VALUE, "a collective needs a non-empty name");
  if (q.op_type == COMMLIB_OP_JOIN && q.process_set != 0)
    throw Error(COMMLIB_ERR_VALUE, "join() runs over every rank of the job, not over a process set");
  if (q.op_type == COMMLIB_OP_BARRIER || q.op_type == COMMLIB_OP_JOIN) return;
  if (!is_valid_dtype(q.dtype))
    throw Error(COMMLIB_ERR_TYPE, "unsupported dtype code " + std::to_string(q.dtype));
  if (q.ndim < 0 || (q.ndim > 0 && !q.shape)) throw Error(COMMLIB_ERR_VALUE, "invalid shape");
  for (int i = 0; i < q.ndim; ++i)
    if (q.shape[i] < 0) throw Error(COMMLIB_ERR_VALUE, "negative dimension in shape");
  const char* what = op_type_name(q.op_type);
  if (q.op_type == COMMLIB_OP_ALLREDUCE || q.op_type == COMMLIB_OP_REDUCESCATTER) {
    if (q.reduce_op == COMMLIB_ADASUM && q.op_type != COMMLIB_OP_ALLREDUCE)
      throw Error(COMMLIB_ERR_VALUE, std::string(what) + " does not support op Adasum (allreduce only)");
    if (q.reduce_op == COMMLIB_ADASUM && !is_float_dtype(q.dtype)) {
      throw Error(COMMLIB_ERR_TYPE, std::string(what) + " with op Adasum needs a floating-point tensor "
                                        "(float16, bfloat16, float32, float64), got " + dtype_name(q.dtype));
    }
    if (!reduction_supported(q.dtype, q.reduce_op)) {
      throw Error(COMMLIB_ERR_TYPE, std::string(what) + " with op " + reduce_op_name(q.reduce_op) +
                                        " is not supported for dtype " + dtype_name(q.dtype));
    }
    // (a NaN would also never compare equal across ranks: a mismatch every time)
    if (!std::isfinite(q.prescale) || !std::isfinite(q.postscale)) {
      throw Error(COMMLIB_ERR_VALUE, std::string(what) + ": scale factors must be finite, got prescale " +
                                         std::to_string(q.prescale) + ", postscale " + std::to_string(q.postscale));
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
  if (q.npieces != 0) {
    validate_pieces(q, n);
  } else if (n > 0 && !q.input) {
    throw Error(COMMLIB_ERR_VALUE, "input buffer is NULL");
  }
  if (q.op_type == COMMLIB_OP_ALLGATHER && q.output && q.output_rows < 0) {
    throw Error(COMMLIB_ERR_VALUE, std::string(what) + ": an output needs its rows (output_rows >= 0)");
  }
  // (reducescatter: a rank may receive no rows, so its output may be NULL)
  const bool needs_output = q.op_type == COMMLIB_OP_ALLREDUCE || q.op_type == COMMLIB_OP_BROADCAST;
  if (needs_output && n > 0 && !q.output) throw Error(COMMLIB_ERR_VALUE, "output buffer is NULL");
}

// A reducescatter's explicit rows per rank (none: the even split).
std::vector<int64_t> reducescatter_splits(const commlib_request& q, int size) {
  if (q.nsplits == 0) return {};
  const std::string what = std::string("reducescatter '") + (q.name ? q.name : "") + "'";
  if (q.nsplits != size) {
    throw Error(COMMLIB_ERR_VALUE, what + ": splits must have one entry per rank (" + std::to_string(size) +
                                       "), got " + std::to_string(q.nsplits));
  }
  std::vector<int64_t> s(q.splits, q.splits + q.nsplits);
  int64_t sum = 0;
  for (int64_t x : s) {
    if (x < 0) throw Error(COMMLIB_ERR_VALUE, what + ": splits must be non-negative");
    sum += x;
  }
  if (sum != q.shape[0]) {
    throw Error(COMMLIB_ERR_VALUE, what + ": splits sum to " + std::to_string(sum) + " but dimension 0 of the "
                                       "tensor is " + std::to_string(q.shape[0]));
  }
  return s;
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
    } else if (e && !in_flight_.insert(request_key(e->desc)).second) {
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
  Entry e;
  try {
    e = make_entry(q);
  } catch (const Error& err) {
    if (err.code() == COMMLIB_ERR_VALUE || err.code() == COMMLIB_ERR_TYPE) abort_others(q, err.what());
    throw;
  }
  return push(&e);
}

// The other ranks would wait for this request until the timeout: its name
// goes to the coordinator as an abort, which fails theirs at once.
void Engine::abort_others(const commlib_request& q, const std::string& why) {
  if (!q.name || !*q.name || q.op_type < COMMLIB_OP_ALLREDUCE || q.op_type > COMMLIB_OP_BARRIER) return;
  Entry e;
  e.handle = std::make_shared<HandleState>();  // (nobody waits on it)
  e.desc.name = q.name;
  e.desc.op_type = COMMLIB_OP_ABORT;
  e.desc.dtype = COMMLIB_UINT8;
  e.desc.process_set = q.process_set;
  e.desc.note = "rank " + std::to_string(topo_.rank) + " could not submit " + op_type_name(q.op_type) + " '" +
                q.name + "': " + why;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    try {
      members_of(q.process_set);
    } catch (const Error&) {
      return;  // (not a set this rank is in: nobody waits for it here)
    }
    const std::string key = request_key(e.desc);
    if (stop_.load() || dead_code_ != 0 || coll_code_ != 0 || !in_flight_.insert(key).second) return;
    queue_.push_back(std::move(e));
    outstanding_.fetch_add(1);
  }
  wake_for(false);  // (outside queue_mu_, which it may take)
}

int64_t Engine::enqueue_group(const commlib_request& req) {
  if (!running_.load()) {
    throw Error(COMMLIB_ERR_NOT_INIT, "commlib is not initialized: call commlib.init() first");
  }
  const int n = req.nmembers;
  if (n < 0) throw Error(COMMLIB_ERR_VALUE, "negative group size");
  if (req.op_type != COMMLIB_OP_ALLREDUCE) throw Error(COMMLIB_ERR_VALUE, "only allreduces are submitted as a group");
  if (!req.name || !*req.name) throw Error(COMMLIB_ERR_VALUE, "a collective needs a non-empty name");
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
  return push(n > 0 ? &e : nullptr);
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

}  // namespace commlib
