// All-reduce algorithms, each in its own file, written against Transport.
#pragma once

#include <cstddef>
#include <string>

#include "../transport/transport.h"

namespace commlib {

enum class AllreduceAlgo { kAuto, kMpi, kRing, kTree };

// COMMLIB_ALLREDUCE_ALGO: auto|ring|tree|mpi. Throws Error(COMMLIB_ERR_VALUE)
// for unknown names.
AllreduceAlgo parse_allreduce_algo(const std::string& name);

// The algorithm kAuto picks for a message of `bytes` bytes on `ranks` ranks
// (never kAuto). Exposed so the choice can be tested and logged.
AllreduceAlgo choose_allreduce_algo(size_t bytes, int ranks);

// In-place all-reduce of count elements (dtype is not a half type; op is
// not Average: the caller applies scale factors).
void allreduce(Transport& t, void* buf, size_t count, int dtype, int op, AllreduceAlgo algo);

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
