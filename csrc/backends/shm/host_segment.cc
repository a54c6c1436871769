#include "backends/shm/host_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>

#include "backends/mpi/mpi_transport.h"
#include "base/common.h"

namespace commlib {
namespace {

std::string g_job;     // COMMLIB_RUN_JOB: commlibrun's token for the job, or empty
int g_pause_ms = 0;    // COMMLIB_TEST_SHM_PAUSE_MS
bool g_named = false;  // COMMLIB_TEST_SHM_NAMED

void test_pause() {
  if (g_pause_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(g_pause_ms));
}

struct FdGuard {
  int fd = -1;
  void close_now() {
    if (fd >= 0) close(fd);
    fd = -1;
  }
  ~FdGuard() { close_now(); }
};

// What local rank 0 tells the others about the unnamed segment.
struct Unnamed {
  int err = 0;  // errno of memfd_create/ftruncate, -1: not tried; 0: made
  int pid = 0, fd = -1;
  uint64_t dev = 0, ino = 0;  // the file the others must find at /proc/<pid>/fd/<fd>
};

bool same_file(int fd, uint64_t dev, uint64_t ino) {
  struct stat st;
  return fstat(fd, &st) == 0 && uint64_t(st.st_dev) == dev && uint64_t(st.st_ino) == ino;
}

// Sets fd.fd to the unnamed segment on every local rank and returns true, or
// returns false on every local rank (fd.fd is -1) when any one could not.
bool open_unnamed(MPI_Comm local_comm, int local_rank, size_t bytes, FdGuard& fd) {
  Unnamed made;
  if (local_rank == 0) {
    made.err = -1;
    if (!g_named) {
      fd.fd = memfd_create("commlib", MFD_CLOEXEC);
      made.err = fd.fd < 0 ? errno : 0;
      struct stat st;
      if (!made.err && (fchmod(fd.fd, 0600) != 0 || ftruncate(fd.fd, off_t(bytes)) != 0 || fstat(fd.fd, &st) != 0))
        made.err = errno;
      if (!made.err) {
        made.pid = int(getpid());
        made.fd = fd.fd;
        made.dev = uint64_t(st.st_dev);
        made.ino = uint64_t(st.st_ino);
      }
      test_pause();
    }
  }
  check_mpi(MPI_Bcast(&made, sizeof(made), MPI_BYTE, 0, local_comm), "MPI_Bcast(shm fd)");
  if (local_rank != 0 && made.err == 0 && !g_named) {
    char path[64];
    std::snprintf(path, sizeof(path), "/proc/%d/fd/%d", made.pid, made.fd);
    fd.fd = open(path, O_RDWR | O_CLOEXEC);
    // (another PID namespace would name another process's file: check it is the one)
    if (fd.fd >= 0 && !same_file(fd.fd, made.dev, made.ino)) fd.close_now();
  }
  int ok = made.err == 0 && fd.fd >= 0 ? 1 : 0, all_ok = 0;
  check_mpi(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, local_comm), "MPI_Allreduce(shm fd)");
  if (!all_ok) fd.close_now();
  return all_ok != 0;
}

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

// What local rank 0 tells the others about the named segment.
struct Named {
  int err = 0;  // errno of shm_open/ftruncate; 0: created
  char name[124] = {0};
};

// The fallback: local rank 0 creates the segment under a fresh name
// (exclusively, mode 0600), every rank opens it, then the name is unlinked.
void open_named(MPI_Comm local_comm, int local_rank, size_t bytes, FdGuard& fd) {
  Named made;
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
    test_pause();
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
}

}  // namespace

void set_segment_options(const std::string& job_token, int pause_ms, bool named) {
  g_job = job_token;
  g_pause_ms = pause_ms;
  g_named = named;
}

void* map_host_segment(MPI_Comm local_comm, int local_rank, size_t bytes) {
  FdGuard fd;
  if (!open_unnamed(local_comm, local_rank, bytes, fd)) open_named(local_comm, local_rank, bytes, fd);
  int err = 0;
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

}  // namespace commlib
