// The one place that picks an algorithm: which all-reduce runs (the
// inter-host step of the hierarchical one, ring or tree by size, is
// collectives/allreduce_across.h), and whether broadcast, allgather
// and reducescatter go through the host's shared memory. The algorithms
// themselves are in collectives/, one per file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "backends/shm/shm.h"
#include "backends/transport.h"
#include "collectives/allreduce.h"

namespace commlib {

// COMMLIB_ALLREDUCE_ALGO: auto|shm|ring|tree|mpi. Throws
// Error(COMMLIB_ERR_VALUE) for unknown names.
AllreduceAlgo parse_allreduce_algo(const std::string& name);

// In-place all-reduce of count elements (dtype is not a half type; op is
// not Average: the caller applies scale factors). shm is this host's
// shared-memory segment (null if unusable); cross connects the ranks of the
// same local rank on every host (null on one host). kAuto uses the shared
// memory when there is a segment: within the host, and hierarchically across
// hosts (each local rank all-reduces its slice over cross with
// allreduce_across); without one, the ring or the tree over t.
// post multiplies the result (Average's 1/N, a postscale); the shared-memory
// algorithm and the ring apply it as they reduce, the others in a pass after.
// in (not null, not buf): the input, left unchanged, and buf the output (it
// must not overlap in); the shared-memory algorithm reads it where it would
// have read buf, the others start from a copy of it in buf.
// travel (float16 or bfloat16, with dtype float32: buf holds values of that
// half type widened): the hierarchical algorithm's inter-host step rounds them
// to it and moves half the bytes (allreduce_across).
void allreduce(Transport& t, ShmSegment* shm, Transport* cross, void* buf, size_t count,
               int dtype, int op, AllreduceAlgo algo, double post = 1.0,
               const void* in = nullptr, int travel = -1);

// Where broadcast/allgather/alltoall/reducescatter go through shared memory.
enum { kShmAuto = 0, kShmAlways = 1, kShmNever = 2 };

// Measured here (MPICH 5 wheel, against the MPI path of the same build):
// - broadcast through shared memory: 1.3-2.4x MPI's time from 16 KiB to
//   1 MiB at 2 and 3 ranks, where the MPI path took 0.6-0.84x; even from
//   4 MiB on (0.94-1.32x against 0.84-1.38x); so auto always uses it;
// - allgather and alltoall through shared memory (in kShmWindowBytes
//   windows, collectives/shm_collectives.h) beat the MPI path: small ones
//   (alltoall, 2 ranks, 8.6 / 9.9 / 14.3 us at 4 / 16 / 64 KiB a rank
//   against 10.1 / 13.4 / 15.8; allgather 0.56-1.37x MPI's time up to a
//   4 MiB result where the MPI path took 0.27-0.86x) and large ones (since
//   the windows, 2026-12-02: 3 ranks, allgather 4 MiB result 0.51-0.63
//   against 1.49-1.57 ms); and they beat the single-copy paths (allgather_direct.cc,
//   alltoall_direct.cc; process_vm_readv copies at a third to a half of
//   memcpy's speed here, two ranks reading at once) up to 16 MiB
//   (alternating jobs, 2 ranks: allgather 4 MiB result 160-260 against
//   340-360 us, 8 MiB 0.53-0.65 against 1.46-1.61 ms, alltoall 4 MiB a rank
//   200-280 against 210-420 us; 3 ranks: allgather 16 MiB 3.4 against
//   7.1-10.5 ms, 64 MiB 15.3-19.1 against 19.8-26.0, alltoall 4 MiB 0.94-1.04
//   against 2.07-2.33 ms; calls lined up by a barrier, as a training step's
//   are; back to back, as commlib.bench runs them, the two are within noise
//   of each other at 2 and 3 ranks). From 16 MiB alltoall's two tie (2 ranks, 16 MiB
//   2.3-2.8 against 1.6-3.0 ms; 64 MiB 9.0-10.5 against 8.9-10.9; 3 ranks
//   64 MiB 20.6-21.6 against 18.9-29.8), and so does allgather from 64 MiB at
//   2 ranks (64 MiB 8.8-9.7 against 6.4-8.7 ms, 128 MiB 16.4-18.5 against
//   14.1-18.6): there the single copy, which moves each byte once, is used
//   (kShmAlltoallMaxBytes sent by a rank, the largest block times the ranks,
//   which every rank can tell from the matrix; direct_allgather_bytes of
//   result). A later VM (2026-12-02, 2 ranks) turned the alltoall round:
//   the single copy beat the regions from 64 KiB sent by a rank, interleaved
//   in one job (us, two jobs: 64 KiB 12-15 against 12-31, 256 KiB 24-25
//   against 25-74, 1 MiB 66-70 against 77-289, 4 MiB 145-294 against
//   436-1145; MPI 14-23, 19-25, 62-78, 173-328) and in commlib.bench (256 KiB
//   to 16 MiB 0.71-0.94x MPI's time against 0.16-0.42x), so at 2 ranks
//   alltoall reads directly from direct_alltoall_bytes;
// - reducescatter through shared memory beats MPI's non-blocking one at every
//   size (64 KiB-256 MiB: 1.0-9x the MPI_Reduce_scatter time, where the MPI
//   path took 0.15-0.9x), so auto uses it.
// - broadcast with one copy (broadcast_direct.cc: every rank reads the
//   root's buffer itself) against two (through the root's region, pipelined
//   in pieces: the root fills one while the others empty the last, cache
//   hot): the region wins at 3 ranks (on 2 cores) up to 16 MiB (4 MiB
//   0.27-0.35 against 0.61-0.66 ms, 16 MiB 1.8-1.9 against 2.2-2.7), alike
//   at 64 MiB (7.9-8.3 against 7.3-8.2 ms). At 2 ranks the one copy is split
//   between the two (broadcast_split: the receiver reads half of the root's
//   buffer while the root writes the other half into the receiver's), which
//   beats the region from 64 KiB on and MPI from 256 KiB (2026-12-02, the
//   three interleaved in one job, two jobs, us: 64 KiB 9-11 against 15-38
//   and MPI 10-11, 256 KiB 17-21 against 32-133 and 26-30, 1 MiB 53-61
//   against 114-506 and 85-114, 4 MiB 132-179 against 482-1977 and 289-293,
//   16 MiB 0.59-0.71 against 2.0-6.8 and 1.0-1.2 ms, 64 MiB 2.9-3.5 against
//   27-32 and 5.6-6.2 ms; the region's times swing with the VM's state, the
//   split's much less). So auto reads directly from direct_broadcast_bytes(ranks),
//   where the kernel lets ranks read each other;
// COMMLIB_SHM_COLLECTIVES=always forces all four (tests use it), =never
// disables them.
constexpr size_t kShmAlltoallMaxBytes = size_t(16) << 20;
constexpr size_t direct_broadcast_bytes(int ranks) { return ranks == 2 ? size_t(64) << 10 : size_t(64) << 20; }
constexpr size_t direct_alltoall_bytes(int ranks) {
  return ranks == 2 ? size_t(64) << 10 : kShmAlltoallMaxBytes + 1;
}
constexpr size_t direct_allgather_bytes(int ranks) { return ranks == 2 ? size_t(64) << 20 : SIZE_MAX; }

// What the choice depends on, for one collective.
struct AlgoChoice {
  AllreduceAlgo algo;
  ShmSegment* shm;       // this host's ranks; null if alone or hosts differ in size
  Transport* cross;      // same local rank across hosts; null on one host
  int shm_collectives;   // kShmAuto / kShmAlways / kShmNever (COMMLIB_SHM_COLLECTIVES)
};

// Whether all-reduces may use the shared segment (fused windows included).
bool shm_allowed(const AlgoChoice& c);

// Whether a broadcast/allgather/reducescatter over `ranks` ranks goes through
// shared memory: the whole job must be this host's shared-memory group (then
// local rank equals rank), and it must pay (`pays`, per the table above).
bool use_shm_collective(const AlgoChoice& c, int ranks, bool pays);

// Whether the single-copy collectives (collectives/direct_reads.h) may run:
// those of the shared segment, with regions, and reads between its ranks
// that the kernel allows (COMMLIB_P2P_SINGLE_COPY).
bool reads_directly(const AlgoChoice& c, int ranks);

}  // namespace commlib
