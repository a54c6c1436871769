#include "p2p/lanes.h"

#include <sys/mman.h>

#include <cstring>

#include "backends/mpi/mpi_transport.h"
#include "backends/shm/host_segment.h"
#include "base/common.h"

namespace commlib {
size_t P2PLanes::ring_bytes(int n) {
  const size_t share = (kInboundBytes / size_t(n > 1 ? n - 1 : 1)) & ~size_t(63);
  return share > kMinRingBytes ? share : kMinRingBytes;
}

P2PLanes::P2PLanes(MPI_Comm local_comm, std::vector<int> local_of_job) : local_of_job_(std::move(local_of_job)) {
  MPI_Comm_rank(local_comm, &me_);
  MPI_Comm_size(local_comm, &n_);
  job_of_local_.assign(size_t(n_), -1);
  for (size_t r = 0; r < local_of_job_.size(); ++r) {
    const int l = local_of_job_[r];
    if (l < 0) {
      has_remote_ = true;
    } else if (l < n_) {
      job_of_local_[size_t(l)] = int(r);
    }
  }
  if (me_ < n_) local_of_job_[size_t(job_of_local_[size_t(me_)])] = -1;  // no lane to itself
  held_.resize(size_t(n_));
  ring_bytes_ = ring_bytes(n_);
  bytes_ = size_t(n_) * size_t(n_ - 1) * lane_bytes();  // (none from a rank to itself)
  base_ = map_host_segment(local_comm, me_, bytes_);
  for (int to = 0; to < n_; ++to) {  // the rings this rank writes: touched once, up front
    if (to != me_) std::memset(lane(me_, to), 0, lane_bytes());
  }
  check_mpi(MPI_Barrier(local_comm), "MPI_Barrier(p2p lanes)");
}

P2PLanes::~P2PLanes() {
  if (base_) munmap(base_, bytes_);
}

char* P2PLanes::lane(int from_local, int to_local) const {
  const int to = to_local < from_local ? to_local : to_local - 1;  // (from_local's lanes skip itself)
  return static_cast<char*>(base_) + (size_t(from_local) * size_t(n_ - 1) + size_t(to)) * lane_bytes();
}

ByteRing P2PLanes::ring(int from_local, int to_local) const {
  return ByteRing(lane(from_local, to_local), ring_bytes_);
}

void P2PLanes::pop() {
  if (peeked_ < 0) return;
  ring(peeked_, me_).pop(peeked_end_);
  peeked_ = -1;
}

void P2PLanes::send(int to, std::string head, const void* extra, size_t n) {
  if (head.size() + n > kMaxRecord) {
    throw Error(COMMLIB_ERR_INTERNAL, "point-to-point control message of " + std::to_string(head.size() + n) +
                                          " bytes is larger than a lane takes (" + std::to_string(kMaxRecord) + ")");
  }
  const int l = local_of_job_[size_t(to)];
  std::deque<std::string>& held = held_[size_t(l)];
  if (held.empty() && ring(me_, l).write(head, extra, n)) return;
  if (n) head.append(static_cast<const char*>(extra), n);
  held.push_back(std::move(head));
  ++held_count_;
}

void P2PLanes::flush() {
  if (held_count_ == 0) return;
  for (int l = 0; l < n_; ++l) {
    std::deque<std::string>& held = held_[size_t(l)];
    while (!held.empty() && ring(me_, l).write(held.front(), nullptr, 0)) {
      held.pop_front();
      --held_count_;
    }
  }
}

bool P2PLanes::peek(int* from, std::string_view* msg) {
  for (int i = 0; i < n_; ++i) {
    const int l = (next_ + i) % n_;
    if (l == me_ || !ring(l, me_).peek(msg, &peeked_end_)) continue;
    peeked_ = l;
    next_ = (l + 1) % n_;
    *from = job_of_local_[size_t(l)];
    return true;
  }
  return false;
}

}  // namespace commlib
