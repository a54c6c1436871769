// A persistent shared-memory segment for the ranks of one host.
//
// Created once at init (without a name in /dev/shm: backends/shm/host_segment.h)
// and kept for the life of the job: its pages are touched once up front, because a page fault
// costs ~2 us per 4 KiB here. Ranks synchronise through monotonically
// increasing counters, each on its own cache line, never through barriers.
//
// Layout: header (first_lost) | posted[P] | reduced[P] | consumed[P] | stage[P][K][P][C] |
// result[K][P][C] | region[P][2][F] | extra; P local ranks, K slots in flight, C bytes
// per piece, F bytes per fusion region (a fusion buffer living in the segment).
// A block (P pieces) holds 4 x COMMLIB_SHM_PIECE_BYTES whatever P (piece_for),
// so that the stage grows linearly with P, as everything else does.
#pragma once

#include <mpi.h>
#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "backends/shm/host_segment.h"

namespace commlib {

struct alignas(64) ShmCounter {
  std::atomic<uint64_t> value;
  char pad[64 - sizeof(std::atomic<uint64_t>)];
};

class ShmSegment {
 public:
  // Collective over local_comm (the ranks of this host).
  static std::unique_ptr<ShmSegment> create(MPI_Comm local_comm, size_t piece_bytes, int slots,
                                            size_t region_bytes, size_t extra_bytes = 0);
  ~ShmSegment();
  // Bytes of a piece at `ranks` local ranks: a 64-byte multiple near
  // 4 * piece_bytes / ranks, at least 64.
  static size_t piece_for(size_t piece_bytes, int ranks);

  int rank() const { return rank_; }
  int size() const { return size_; }
  size_t piece_bytes() const { return piece_; }
  int slots() const { return slots_; }

  // 1 + the first rank of the host found dead, 0 while all live (liveness.h).
  std::atomic<int32_t>& first_lost() { return *reinterpret_cast<std::atomic<int32_t>*>(base_); }
  ShmCounter& posted(int r) { return counters_[r]; }
  ShmCounter& reduced(int r) { return counters_[size_ + r]; }
  ShmCounter& consumed(int r) { return counters_[2 * size_ + r]; }
  // Piece `piece` of slot `slot` written by rank `from`.
  char* stage(int from, int slot, int piece) {
    return stage_ + ((size_t(from) * slots_ + slot) * size_ + piece) * piece_;
  }
  // Reduced piece `piece` of slot `slot`.
  char* result(int slot, int piece) { return result_ + (size_t(slot) * size_ + piece) * piece_; }
  // Rank r's fusion region, slot 0 or 1.
  char* region(int r, int slot) { return region_ + (size_t(r) * 2 + slot) * region_bytes_; }
  size_t region_bytes() const { return region_bytes_; }
  // The pids of the host's ranks by local rank when each may read the
  // others' memory directly (cma.h probe_direct_reads; the same on every
  // rank), else empty.
  const std::vector<pid_t>& direct_read_pids() const { return direct_read_pids_; }
  void set_direct_read_pids(std::vector<pid_t> pids) { direct_read_pids_ = std::move(pids); }
  // extra_bytes zeroed bytes for other shared structures (the order log).
  char* extra() { return extra_; }

  // Blocks this rank has processed so far; identical on every local rank
  // because all of them execute the same sequence of collectives.
  uint64_t next_block = 0;

 private:
  ShmSegment() = default;
  int rank_ = 0, size_ = 1, slots_ = 0;
  size_t piece_ = 0, bytes_ = 0, region_bytes_ = 0;
  void* base_ = nullptr;
  ShmCounter* counters_ = nullptr;
  char* stage_ = nullptr;
  char* result_ = nullptr;
  char* region_ = nullptr;
  char* extra_ = nullptr;
  std::vector<pid_t> direct_read_pids_;
};

}  // namespace commlib
