// A local request: what a caller asked for, from the queue to its handle's
// completion (negotiated, cached, executed or failed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/common.h"
#include "base/handles.h"
#include "base/message.h"
#include "base/pieces.h"

namespace commlib {

// One tensor of an allreduce.
struct Member {
  int dtype;
  size_t count;
  const void* input;
  void* output;
};

// One local request waiting for (or under) execution.
struct Entry {
  std::shared_ptr<HandleState> handle;
  RequestDesc desc;
  const void* input = nullptr;
  void* output = nullptr;
  std::vector<Member> members;  // a grouped allreduce (desc.group_size >= 0)
  std::vector<Piece> pieces;    // a reducescatter's input in pieces (input is then NULL)
  // Arrived at this response cache bit and generation (-1: negotiated by rank 0).
  int cache_bit = -1;
  uint32_t cache_gen = 0;
  int64_t cached_since_us = 0;
  int64_t queued_us = 0;     // enqueued by the caller (only while the timeline is on)
  int64_t submitted_us = 0;  // handed to the cache or to negotiation
  bool cache_expired = false;  // waited too long; its bit's invalidation is in the log
  std::vector<char> scratch;   // a joined rank's stand-in buffers (join.h)
  // CUDA requests (desc.device_type): the device, and an event recorded on
  // the caller's stream at enqueue (the inputs are ready once it completes).
  // Allgather (also on CPU, with an output) and CUDA alltoall: the rows the
  // caller allocated in output.
  int device_id = 0;
  void* ready_event = nullptr;
  int64_t output_rows = -1;
  // A joined rank's stand-in for a request it never submitted (runtime/join.h):
  // nobody waits on it; a CUDA one gets its buffers from the NCCL executor.
  bool stand_in = false;
  // This request alone failed on this rank, after it took part in its
  // collective (an allgather's out of the wrong size): COMMLIB_ERR_VALUE.
  std::string error;
};

// The bytes of a request's tensor (of all its members, grouped).
inline int64_t entry_bytes(const Entry& e) {
  if (e.desc.group_size < 0) return num_elements(e.desc.shape) * int64_t(dtype_size(e.desc.dtype));
  int64_t n = 0;
  for (const Member& m : e.members) n += int64_t(m.count * dtype_size(m.dtype));
  return n;
}

}  // namespace commlib
