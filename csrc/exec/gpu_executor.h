// The NCCL executor: runs negotiated collectives whose buffers are on a CUDA
// device. Nothing blocks: launch() makes the communicator's own
// high-priority stream wait on each request's ready event (recorded on the
// caller's stream when it was enqueued), enqueues the NCCL calls and records
// a completion event; poll(), called by the engine's thread every cycle,
// hands back the launches whose event completed, failed, or made no progress
// for COMMLIB_TIMEOUT (their communicator is then aborted with
// ncclCommAbort, which ends every operation in flight on it).
//
// One communicator per (process set, device), created by the first
// collective that needs it (backends/nccl/nccl_comm.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/nccl/nccl_comm.h"
#include "base/entry.h"
#include "base/message.h"

namespace commlib {

class GpuExecutor {
 public:
  // init_timeout_us: how long a communicator's creation may take (COMMLIB_TIMEOUT; 0: no limit);
  // fusion_threshold: the engine's COMMLIB_FUSION_THRESHOLD, the size of a
  // communicator's fusion buffer (allocated once, at the first fused launch).
  // init_warn_us: a creation waiting that long warns (COMMLIB_STALL_CHECK_TIME; 0: never).
  GpuExecutor(const gpu::GpuLibs& libs, int64_t init_timeout_us, const std::atomic<int64_t>& fusion_threshold,
              int64_t init_warn_us = 0)
      : libs_(libs), init_timeout_us_(init_timeout_us), init_warn_us_(init_warn_us),
        fusion_threshold_(fusion_threshold) {}
  ~GpuExecutor();  // destroys the communicators (abandon() first if any op is in flight)

  // Enqueues resp (every entry on one device) over the communicator of its
  // process set, whose MPI transport t creates it if needed; members: the
  // set's job ranks (for messages). Returns the launch's completion event
  // (destroyed with its last reference). Throws Error on failure (nothing of
  // it is then in flight, and entries are left to the caller).
  std::shared_ptr<void> launch(const Response& resp, std::vector<Entry>& entries, Transport& t, const std::vector<int>& members,
              int64_t now_us);

  struct Done {
    std::vector<Entry> entries;
    int status;  // COMMLIB_OK, COMMLIB_ERR_INTERNAL, COMMLIB_ERR_TIMED_OUT
    std::string message;
    int op_type = 0, process_set = 0;  // (for the timeline)
    int64_t launched_us = 0;
  };
  // Launches that ended (in launch order per communicator). timeout_us: 0
  // for none.
  std::vector<Done> poll(int64_t now_us, int64_t timeout_us);
  // Aborts the communicators of everything in flight and hands it back failed.
  std::vector<Done> abandon(int status, const std::string& message);
  bool busy() const { return !inflight_.empty(); }
  size_t in_flight() const { return inflight_.size(); }

 private:
  struct Launch {
    std::vector<Entry> entries;
    gpu::NcclComm* comm;
    std::shared_ptr<void> done;  // the completion event
    int64_t launched_us;
    std::string what;  // "allreduce 'x' on process set 0 (ranks [0, 1])"
    std::vector<int> members;
    int op_type, process_set;
  };
  gpu::NcclComm& comm_for(int process_set, int device, Transport& t);
  void enqueue_calls(gpu::NcclComm& c, const Response& resp, std::vector<Entry*>& entries);
  // A joined rank's stand-in: zeros in, results into the sink, the rows it receives.
  void stand_in_buffers(gpu::NcclComm& c, const Response& resp, Entry& e);
  // Fails every launch on c (aborted) into out, and forgets c.
  void fail_comm(gpu::NcclComm* c, int status, const std::string& message, std::vector<Done>& out);
  std::string timeout_message(const Launch& l, int64_t timeout_us) const;
  std::string peer_timeout_message(const Launch& l, int64_t timeout_us, int64_t stalled_us,
                                   const std::string& nccl_error) const;

  const gpu::GpuLibs& libs_;
  int64_t init_timeout_us_ = 0;
  int64_t init_warn_us_ = 0;
  const std::atomic<int64_t>& fusion_threshold_;
  std::map<std::pair<int, int>, std::unique_ptr<gpu::NcclComm>> comms_;  // (set, device)
  std::deque<Launch> inflight_;
};

}  // namespace commlib
