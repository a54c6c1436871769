// All-reduce algorithms, each in its own file, written against Transport.
#pragma once

#include <cstddef>
#include <string>

#include "../transport/shm.h"
#include "../transport/transport.h"

namespace commlib {

enum class AllreduceAlgo { kAuto, kMpi, kShm, kRing, kTree };

// COMMLIB_ALLREDUCE_ALGO: auto|shm|ring|tree|mpi. Throws
// Error(COMMLIB_ERR_VALUE) for unknown names.
AllreduceAlgo parse_allreduce_algo(const std::string& name);

// The algorithm kAuto picks over a Transport (no shared memory) for a
// message of `bytes` bytes on `ranks` ranks (never kAuto).
AllreduceAlgo choose_allreduce_algo(size_t bytes, int ranks);

// In-place all-reduce of count elements (dtype is not a half type; op is
// not Average: the caller applies scale factors). shm is this host's
// shared-memory segment (null if unusable); cross connects the ranks of the
// same local rank on every host (null on one host). kAuto uses the shared
// memory when there is a segment: within the host, and hierarchically across
// hosts (each local rank all-reduces its slice over cross with
// allreduce_across); without one, the ring or the tree over t.
void allreduce(Transport& t, ShmSegment* shm, Transport* cross, void* buf, size_t count,
               int dtype, int op, AllreduceAlgo algo);

// The ring or the tree over t, chosen by size (the inter-host step).
void allreduce_across(Transport& t, void* buf, size_t count, int dtype, int op);

// The MPI library's own collective.
void allreduce_mpi(Transport& t, void* buf, size_t count, int dtype, int op);

// Bandwidth-optimal ring: chunked, pipelined reduce-scatter then allgather
// (allreduce_ring.cc). Every element is reduced on exactly one rank and then
// copied, so the result is bitwise identical on all ranks.
void allreduce_ring(Transport& t, void* buf, size_t count, int dtype, int op);

// Latency-optimal recursive doubling with the fold-in fix-up for rank counts
// that are not powers of two (allreduce_tree.cc). Partners always combine as
// (lower ranks' value) op (higher ranks' value), so every rank evaluates the
// same expression tree and the result is bitwise identical on all ranks.
void allreduce_tree(Transport& t, void* buf, size_t count, int dtype, int op);

}  // namespace commlib
