#include "backends/shm/shm.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>

#include "backends/mpi/mpi_transport.h"
#include "base/common.h"

namespace commlib {
namespace {

std::string g_job;   // COMMLIB_RUN_JOB: commlibrun's token for the job, or empty
int g_pause_ms = 0;  // COMMLIB_TEST_SHM_PAUSE_MS

// What local rank 0 tells the others: the name, or why it could not create it.
struct Created {
  int err = 0;  // errno of shm_open/ftruncate; 0: created
  char name[124] = {0};
};

// "/commlib.[<job>.]<128 random bits in hex>.<n>": no other user can guess
// it (and block it by creating it first), and commlibrun can find what its
// job left ("/commlib.<job>.*").
void new_segment_name(char* out, size_t size) {
  static int counter = 0;
  std::random_device rd;
  char token[33];
  for (int i = 0; i < 4; ++i) std::snprintf(token + 8 * i, 9, "%08x", unsigned(rd()));
  const std::string job = g_job.empty() ? std::string() : g_job + ".";
  std::snprintf(out, size, "/commlib.%s%s.%d", job.c_str(), token, counter++);
}

// Unlinks the name on the way out unless done already: a half-made segment
// must not outlive a failed init().
struct NameGuard {
  const char* name = nullptr;
  void unlink_now() {
    if (name) shm_unlink(name);
    name = nullptr;
  }
  ~NameGuard() { unlink_now(); }
};

struct FdGuard {
  int fd = -1;
  ~FdGuard() {
    if (fd >= 0) close(fd);
  }
};

}  // namespace

void set_segment_naming(const std::string& job_token, int pause_ms) {
  g_job = job_token;
  g_pause_ms = pause_ms;
}

void* map_host_segment(MPI_Comm local_comm, int local_rank, size_t bytes) {
  // Local rank 0 picks a fresh name and creates the segment (exclusively,
  // mode 0600); every rank opens it, the name is unlinked at once, then each
  // maps it: from then on nothing is left behind whoever dies.
  Created made;
  FdGuard fd;
  NameGuard guard;
  if (local_rank == 0) {
    new_segment_name(made.name, sizeof(made.name));
    fd.fd = shm_open(made.name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd.fd < 0) {
      made.err = errno;
    } else {
      guard.name = made.name;
      if (ftruncate(fd.fd, off_t(bytes)) != 0) made.err = errno;
    }
    if (g_pause_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(g_pause_ms));
  }
  check_mpi(MPI_Bcast(&made, sizeof(made), MPI_BYTE, 0, local_comm), "MPI_Bcast(shm name)");
  if (made.err) {
    throw Error(COMMLIB_ERR_INTERNAL, std::string("cannot create shared memory segment ") + made.name +
                                          " of " + std::to_string(bytes) + " bytes: " + std::strerror(made.err));
  }
  int err = 0;
  if (local_rank != 0) {
    fd.fd = shm_open(made.name, O_RDWR, 0600);
    if (fd.fd < 0) err = errno;
  }
  int opened = fd.fd >= 0 ? 1 : 0, all_opened = 0;
  check_mpi(MPI_Allreduce(&opened, &all_opened, 1, MPI_INT, MPI_MIN, local_comm), "MPI_Allreduce(shm open)");
  guard.unlink_now();  // every rank holds it open (or failed): the name has served
  if (!all_opened) {
    throw Error(COMMLIB_ERR_INTERNAL, std::string("cannot open shared memory segment ") + made.name +
                                          (err ? std::string(": ") + std::strerror(err) : std::string()));
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd.fd, 0);
  if (base == MAP_FAILED) err = errno;
  int mapped = base != MAP_FAILED ? 1 : 0, all_mapped = 0;
  check_mpi(MPI_Allreduce(&mapped, &all_mapped, 1, MPI_INT, MPI_MIN, local_comm), "MPI_Allreduce(shm)");
  if (!all_mapped) {
    if (base != MAP_FAILED) munmap(base, bytes);
    throw Error(COMMLIB_ERR_INTERNAL, std::string("cannot map shared memory segment of ") + std::to_string(bytes) +
                                          " bytes" + (err ? std::string(": ") + std::strerror(err) : std::string()));
  }
  return base;
}

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
