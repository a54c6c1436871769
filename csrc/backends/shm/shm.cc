#include "backends/shm/shm.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "backends/mpi/mpi_transport.h"
#include "common.h"

namespace commlib {

void* map_host_segment(MPI_Comm local_comm, int local_rank, size_t bytes) {
  // Local rank 0 picks a unique name and creates the segment.
  char name[64] = {0};
  int ok = 1;
  int fd = -1;
  static int counter = 0;
  if (local_rank == 0) {
    std::snprintf(name, sizeof(name), "/commlib.%d.%d", int(getpid()), counter++);
    fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 || ftruncate(fd, off_t(bytes)) != 0) ok = 0;
  }
  check_mpi(MPI_Bcast(name, sizeof(name), MPI_CHAR, 0, local_comm), "MPI_Bcast(shm name)");
  check_mpi(MPI_Bcast(&ok, 1, MPI_INT, 0, local_comm), "MPI_Bcast(shm status)");
  if (!ok) {
    if (fd >= 0) {
      close(fd);
      shm_unlink(name);
    }
    throw Error(COMMLIB_ERR_INTERNAL, std::string("cannot create shared memory segment ") + name +
                                          " of " + std::to_string(bytes) + " bytes: " + std::strerror(errno));
  }
  if (local_rank != 0) fd = shm_open(name, O_RDWR, 0600);
  void* base = MAP_FAILED;
  if (fd >= 0) {
    base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    close(fd);
  }
  int mapped = base != MAP_FAILED ? 1 : 0, all_mapped = 0;
  check_mpi(MPI_Allreduce(&mapped, &all_mapped, 1, MPI_INT, MPI_MIN, local_comm), "MPI_Allreduce(shm)");
  if (local_rank == 0) shm_unlink(name);  // every rank has it mapped (or failed)
  if (!all_mapped) {
    if (base != MAP_FAILED) munmap(base, bytes);
    throw Error(COMMLIB_ERR_INTERNAL, std::string("cannot map shared memory segment ") + name);
  }
  return base;
}

std::unique_ptr<ShmSegment> ShmSegment::create(MPI_Comm local_comm, size_t piece_bytes, int slots,
                                               size_t region_bytes, size_t extra_bytes) {
  std::unique_ptr<ShmSegment> seg(new ShmSegment());
  MPI_Comm_rank(local_comm, &seg->rank_);
  MPI_Comm_size(local_comm, &seg->size_);
  seg->piece_ = (piece_bytes + 63) & ~size_t(63);
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
