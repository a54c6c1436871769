#include "exec/gpu_executor.h"

#include <algorithm>

#include "base/common.h"
#include "base/progress.h"
#include "base/timeline.h"
#include "exec/gpu_ops.h"
#include "exec/operations.h"

namespace commlib {

using gpu::check_cuda;

GpuExecutor::~GpuExecutor() {
  // (every launch left was failed and its communicator aborted by abandon())
  comms_.clear();
}

gpu::NcclComm& GpuExecutor::comm_for(int process_set, int device, Transport& t) {
  auto key = std::make_pair(process_set, device);
  auto it = comms_.find(key);
  if (it == comms_.end()) {
    const int64_t start = timeline().on() ? now_us() : 0;
    it = comms_.emplace(key, gpu::NcclComm::create(libs_, t, device, init_timeout_us_, init_warn_us_)).first;
    if (start > 0) {
      timeline().span("nccl_communicator.set" + std::to_string(process_set), "NCCL_INIT", start, now_us(),
                      "\"device\": " + std::to_string(device));
    }
  }
  return *it->second;
}

void GpuExecutor::enqueue_calls(gpu::NcclComm& c, const Response& resp, std::vector<Entry*>& entries) {
  switch (resp.op_type) {
    case COMMLIB_OP_ALLREDUCE: nccl_allreduce(c, entries); break;
    case COMMLIB_OP_BROADCAST: nccl_broadcast(c, entries); break;
    case COMMLIB_OP_ALLGATHER: nccl_allgather(c, *entries[0], resp.rows); break;
    case COMMLIB_OP_ALLTOALL: nccl_alltoall(c, *entries[0], resp.rows); break;
    case COMMLIB_OP_REDUCESCATTER: nccl_reducescatter(c, *entries[0]); break;
    default:
      throw Error(COMMLIB_ERR_INTERNAL, std::string("no NCCL executor for ") + op_type_name(resp.op_type));
  }
}

void GpuExecutor::stand_in_buffers(gpu::NcclComm& c, const Response& resp, Entry& e) {
  const RequestDesc& d = e.desc;
  if (d.group_size >= 0) {
    throw Error(COMMLIB_ERR_INTERNAL, "a joined rank cannot stand in for the grouped CUDA allreduce '" + d.name + "'");
  }
  const size_t esize = dtype_size(d.dtype), bytes = size_t(num_elements(d.shape)) * esize;
  const size_t row = row_bytes(d);
  const int size = c.size(), me = c.rank();
  size_t out = bytes;
  switch (d.op_type) {
    case COMMLIB_OP_ALLGATHER:
      e.output_rows = 0;
      for (int64_t r : resp.rows) e.output_rows += r;
      out = size_t(e.output_rows) * row;
      break;
    case COMMLIB_OP_ALLTOALL:
      e.output_rows = 0;
      for (int src = 0; src < size; ++src) e.output_rows += resp.rows.at(size_t(src) * size_t(size) + size_t(me));
      out = size_t(e.output_rows) * row;
      break;
    case COMMLIB_OP_REDUCESCATTER:
      out = size_t(reducescatter_rows(d, size, me)) * row;
      break;
    default:
      break;
  }
  e.input = c.zeros(bytes + 1);
  e.output = c.sink(out + 1);
  if (d.op_type == COMMLIB_OP_BROADCAST) e.input = e.output;  // (a joined rank is never the root)
}

std::shared_ptr<void> GpuExecutor::launch(const Response& resp, std::vector<Entry>& entries, Transport& t,
                         const std::vector<int>& members, int64_t now_us) {
  const int device = entries.at(0).device_id;
  for (const Entry& e : entries) {
    if (e.device_id != device) {
      throw Error(COMMLIB_ERR_INTERNAL, "fused CUDA tensors on devices " + std::to_string(device) + " and " +
                                            std::to_string(e.device_id));
    }
  }
  gpu::NcclComm& c = comm_for(resp.process_set, device, t);
  c.fusion_headroom = size_t(std::max<int64_t>(0, fusion_threshold_.load()));
  gpu::DeviceGuard on(libs_.cuda, device);
  // The communicator's stream starts once every input is ready on its caller's
  // stream; the wait took the event's state, so the event goes back to the pool.
  for (Entry& e : entries) {
    if (e.ready_event) {
      check_cuda(libs_.cuda, libs_.cuda.stream_wait_event(c.stream(), static_cast<gpu::cudaEvent>(e.ready_event), 0),
                 "cudaStreamWaitEvent");
      gpu::destroy_event(e.ready_event);
      e.ready_event = nullptr;
    }
  }
  std::vector<Entry*> ptrs;
  for (Entry& e : entries) {
    if (e.stand_in) stand_in_buffers(c, resp, e);
    ptrs.push_back(&e);
  }
  enqueue_calls(c, resp, ptrs);
  std::shared_ptr<void> done(gpu::record_event(libs_.cuda, device, c.stream()), gpu::destroy_event);
  std::string what = std::string(op_type_name(resp.op_type)) + " '" + entries[0].desc.name + "'" +
                     (entries.size() > 1 ? " (fused with " + std::to_string(entries.size() - 1) + " others)" : "") +
                     " on process set " + std::to_string(resp.process_set) + " " + ranks_str(members) +
                     ", CUDA device " + std::to_string(device);
  // (launched now: a communicator created for it is not part of its execution or of its stall)
  inflight_.push_back(Launch{std::move(entries), &c, done, std::max(now_us, commlib::now_us()), std::move(what),
                             members, resp.op_type, resp.process_set});
  entries.clear();
  return done;
}

namespace {

std::vector<int> other_ranks(const std::vector<int>& members, int me) {
  std::vector<int> others;
  for (int r : members)
    if (r != me) others.push_back(r);
  return others;
}

}  // namespace

std::string GpuExecutor::timeout_message(const Launch& l, int64_t timeout_us) const {
  const std::vector<int> others = other_ranks(l.members, l.members.at(size_t(l.comm->rank())));
  return l.what + ": no progress on the GPU for " + std::to_string(timeout_us / 1000000) +
         " s (COMMLIB_TIMEOUT); every rank submitted it, so one of ranks " + ranks_str(others) +
         " stopped inside it (frozen, killed or cut off; NCCL cannot tell which); its NCCL communicator "
         "was aborted (ncclCommAbort)";
}

std::string GpuExecutor::peer_timeout_message(const Launch& l, int64_t timeout_us, int64_t stalled_us,
                                              const std::string& nccl_error) const {
  const std::vector<int> others = other_ranks(l.members, l.members.at(size_t(l.comm->rank())));
  return l.what + ": no progress on the GPU for " + std::to_string(stalled_us / 1000000) +
         " s, then another rank aborted the communicator (NCCL: " + nccl_error + "), most likely as its " +
         std::to_string(timeout_us / 1000000) + " s COMMLIB_TIMEOUT ran out a little sooner; every rank "
         "submitted it, so one of ranks " + ranks_str(others) + " stopped inside it (frozen, killed or cut off); "
         "the NCCL communicator was aborted here too (ncclCommAbort)";
}

void GpuExecutor::fail_comm(gpu::NcclComm* c, int status, const std::string& message, std::vector<Done>& out) {
  c->abort();
  for (auto it = inflight_.begin(); it != inflight_.end();) {
    if (it->comm != c) {
      ++it;
      continue;
    }
    out.push_back(Done{std::move(it->entries), status, message});
    it = inflight_.erase(it);
  }
  for (auto it = comms_.begin(); it != comms_.end(); ++it) {
    if (it->second.get() == c) {
      comms_.erase(it);
      break;
    }
  }
}

std::vector<GpuExecutor::Done> GpuExecutor::poll(int64_t now_us, int64_t timeout_us) {
  std::vector<Done> out;
  for (size_t i = 0; i < inflight_.size();) {
    Launch& l = inflight_[i];
    const gpu::cudaError q = libs_.cuda.event_query(static_cast<gpu::cudaEvent>(l.done.get()));
    if (q == gpu::kCudaSuccess) {
      l.comm->last_progress_us = now_us;
      out.push_back(Done{std::move(l.entries), COMMLIB_OK, "", l.op_type, l.process_set, l.launched_us});
      inflight_.erase(inflight_.begin() + long(i));
      continue;
    }
    const gpu::ncclResult async = l.comm->async_error();
    const int64_t stalled = now_us - std::max(l.launched_us, l.comm->last_progress_us);
    std::string why;
    int status = COMMLIB_ERR_INTERNAL;
    if (q != gpu::kCudaErrorNotReady) {
      why = l.what + ": CUDA error " + std::to_string(q) + " (" + libs_.cuda.get_error_string(q) + ")";
    } else if (timeout_us > 0 && stalled > timeout_us) {  // (before an async error: it says more)
      why = timeout_message(l, timeout_us);
      status = COMMLIB_ERR_TIMED_OUT;
    } else if (async == gpu::kNcclRemoteError && timeout_us > 0 && stalled >= timeout_us / 2) {
      // A peer aborted the communicator while this had long made no
      // progress: most likely its own timeout ran out a little sooner.
      why = peer_timeout_message(l, timeout_us, stalled, l.comm->error_text(async));
      status = COMMLIB_ERR_TIMED_OUT;
    } else if (async != gpu::kNcclSuccess && async != gpu::kNcclInProgress) {
      why = l.what + ": NCCL error " + std::to_string(async) + " (" + l.comm->error_text(async) + ")";
    } else {
      ++i;
      continue;
    }
    fail_comm(l.comm, status, why, out);  // (removes l and the rest of its communicator's)
    i = 0;
  }
  return out;
}

std::vector<GpuExecutor::Done> GpuExecutor::abandon(int status, const std::string& message) {
  std::vector<Done> out;
  while (!inflight_.empty()) fail_comm(inflight_.front().comm, status, message, out);
  return out;
}

}  // namespace commlib
