#include "backends/shm/shm.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>

#include "backends/mpi/mpi_transport.h"
#include "backends/shm/host_segment.h"

namespace commlib {

size_t ShmSegment::piece_for(size_t piece_bytes, int ranks) {
  const size_t block = 4 * ((piece_bytes + 63) & ~size_t(63));  // a rank's share of one slot
  return std::max<size_t>(64, (block / size_t(std::max(ranks, 1))) & ~size_t(63));
}

std::unique_ptr<ShmSegment> ShmSegment::create(MPI_Comm local_comm, size_t piece_bytes, int slots,
                                               size_t region_bytes, size_t extra_bytes) {
  std::unique_ptr<ShmSegment> seg(new ShmSegment());
  MPI_Comm_rank(local_comm, &seg->rank_);
  MPI_Comm_size(local_comm, &seg->size_);
  seg->piece_ = piece_for(piece_bytes, seg->size_);
  seg->slots_ = slots;
  const size_t P = size_t(seg->size_), K = size_t(slots);
  const size_t counters = 3 * P * sizeof(ShmCounter);
  const size_t stage = P * K * P * seg->piece_;
  const size_t result = K * P * seg->piece_;
  seg->region_bytes_ = (region_bytes + 63) & ~size_t(63);
  const size_t regions = P * 2 * seg->region_bytes_;
  extra_bytes = (extra_bytes + 63) & ~size_t(63);
  seg->bytes_ = 4096 + counters + stage + result + regions + extra_bytes;
  void* base = map_host_segment(local_comm, seg->rank_, seg->bytes_);
  seg->base_ = base;
  char* p = static_cast<char*>(base) + 4096;
  seg->counters_ = reinterpret_cast<ShmCounter*>(p);
  seg->stage_ = p + counters;
  seg->result_ = seg->stage_ + stage;
  seg->region_ = seg->result_ + result;
  seg->extra_ = seg->region_ + regions;
  // Touch the pages this rank writes (MAP_POPULATE maps them; writing once
  // also avoids copy-on-first-write costs inside the timed path).
  std::memset(seg->stage(seg->rank_, 0, 0), 0, K * P * seg->piece_);
  std::memset(seg->region(seg->rank_, 0), 0, 2 * seg->region_bytes_);
  if (seg->rank_ == 0) std::memset(seg->result_, 0, result);
  if (seg->rank_ == 0) std::memset(seg->extra_, 0, extra_bytes);
  check_mpi(MPI_Barrier(local_comm), "MPI_Barrier(shm)");
  return seg;
}

ShmSegment::~ShmSegment() {
  if (base_) munmap(base_, bytes_);
}

}  // namespace commlib
