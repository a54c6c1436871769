// The memory behind a host's shared segments (backends/shm/shm.h, p2p/lanes.h).
//
// Made without any name: local rank 0 creates it with memfd_create, and the
// other local ranks open it through /proc/<pid of local rank 0>/fd/<fd>, so
// nothing ever appears in /dev/shm, whoever is killed when. Where that fails
// on any local rank (no memfd_create, another PID namespace, a /proc that
// hides rank 0), every local rank falls back together to a named POSIX
// segment, "/commlib.[<job>.]<random>.<n>", unlinked as soon as every local
// rank has opened it.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <string>

namespace commlib {

// Creates (local rank 0) and maps (every rank of local_comm) a shared segment
// of `bytes` bytes; collective over local_comm. Throws Error when any rank
// fails. The caller munmaps it.
void* map_host_segment(MPI_Comm local_comm, int local_rank, size_t bytes);

// job_token: COMMLIB_RUN_JOB, set by commlibrun, part of the fallback's names
// so that it can remove what a killed job left ("/commlib.<random>.<n>" when
// empty). Testing only: pause_ms, local rank 0 waits that long between
// creating a segment and handing it on; named, this rank refuses the unnamed
// way (does not create, or does not open, it), so its host falls back.
void set_segment_options(const std::string& job_token, int pause_ms, bool named);

}  // namespace commlib
