// The one place that picks an algorithm: which all-reduce runs (and the
// inter-host step of the hierarchical one), and whether broadcast, allgather
// and reducescatter go through the host's shared memory. The algorithms
// themselves are in collectives/, one per file.
#pragma once

#include <cstddef>
#include <string>

#include "backends/shm/shm.h"
#include "backends/transport.h"

namespace commlib {

enum class AllreduceAlgo { kAuto, kMpi, kShm, kRing, kTree };

// COMMLIB_ALLREDUCE_ALGO: auto|shm|ring|tree|mpi. Throws
// Error(COMMLIB_ERR_VALUE) for unknown names.
AllreduceAlgo parse_allreduce_algo(const std::string& name);

// The algorithm kAuto picks over a Transport (no shared memory) for a
// message of `bytes` bytes on `ranks` ranks (never kAuto).
AllreduceAlgo choose_allreduce_algo(size_t bytes, int ranks);

// The size from which kAuto runs the ring rather than the tree (up to 4
// ranks; scaled up beyond, see algorithm.cc). Autotune sets it, on every rank
// at the same point of the order (runtime/engine_tune.cc); init restores the
// default.
constexpr size_t kTreeMaxBytes = size_t(16) << 10;
void set_tree_max_bytes(size_t bytes);
size_t tree_max_bytes();

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

// The ring or the tree over t, chosen by size (the inter-host step); the
// result multiplied by post. travel (a half type, with dtype float32): the
// values are rounded to it, all-reduced as such and widened back (-1: they
// travel as dtype).
void allreduce_across(Transport& t, void* buf, size_t count, int dtype, int op, double post = 1.0,
                      int travel = -1);

// What ran, for the timeline (runtime/timeline.h): the code that picks an
// algorithm notes its name ("ring", "shm", "hierarchical", "mpi", ...) while
// the timeline is on; the executor takes the names noted during a response
// (joined by '+', each once).
void note_algorithm(const char* name);
std::string take_algorithms();

// Where broadcast/allgather/alltoall/reducescatter go through shared memory.
enum { kShmAuto = 0, kShmAlways = 1, kShmNever = 2 };

// Measured here (MPICH 5 wheel, against the MPI path of the same build):
// - broadcast through shared memory: 1.3-2.4x MPI's time from 16 KiB to
//   1 MiB at 2 and 3 ranks, where the MPI path took 0.6-0.84x; even from
//   4 MiB on (0.94-1.32x against 0.84-1.38x); so auto always uses it;
// - allgather through shared memory: 0.56-1.37x (2 ranks) and 0.74-1.73x
//   (3 ranks) up to a 4 MiB result, where the MPI path took 0.27-0.86x.
//   Retaken once the MPI path called MPI_Iallgather for equal contributions
//   (Iallgatherv is slower): 2 ranks, 1 MiB result 96 us through shared
//   memory against 92, 4 MiB 535 against 467; 3 ranks, 1 MiB 337 against
//   400, 4 MiB equal; so auto uses it up to kShmAllgatherMaxBytes of result;
// - alltoall through shared memory, against MPI_Ialltoall (the MPI path for
//   equal splits; Ialltoallv takes twice as long at 1 MiB): 2 ranks, 8.6 /
//   9.9 / 14.3 us at 4 / 16 / 64 KiB a rank where the MPI path took 10.1 /
//   13.4 / 15.8, but 25 against 17 at 256 KiB and 118 against 77 at 1 MiB
//   (MPICH moves big blocks with a single copy); 3 ranks alike (64 KiB 45
//   against 69 us, 256 KiB 108 against 85); so auto uses it up to
//   kShmAlltoallMaxBytes sent by a rank (the largest block times the ranks,
//   which every rank can tell from the matrix);
// - reducescatter through shared memory beats MPI's non-blocking one at every
//   size (64 KiB-256 MiB: 1.0-9x the MPI_Reduce_scatter time, where the MPI
//   path took 0.15-0.9x), so auto uses it.
// COMMLIB_SHM_COLLECTIVES=always forces all four (tests use it), =never
// disables them.
constexpr size_t kShmAllgatherMaxBytes = size_t(2) << 20;
constexpr size_t kShmAlltoallMaxBytes = size_t(128) << 10;

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

}  // namespace commlib
