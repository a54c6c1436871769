// All-reduce algorithms, each in its own file, written against Transport.
// Which one runs is decided in exec/algorithm.h (across hosts:
// allreduce_across.h), and nowhere else.
#pragma once

#include <cstddef>
#include <vector>

#include "backends/transport.h"

namespace commlib {

// COMMLIB_ALLREDUCE_ALGO's choices (exec/algorithm.h parses and picks them).
enum class AllreduceAlgo { kAuto, kMpi, kShm, kRing, kTree };

// Every algorithm: in-place all-reduce of count elements (dtype is not a
// half type; op is not Average: the caller applies scale factors).

// The MPI library's own collective.
void allreduce_mpi(Transport& t, void* buf, size_t count, int dtype, int op);

// Bandwidth-optimal ring: chunked, pipelined reduce-scatter then allgather
// (allreduce_ring.cc). Every element is reduced on exactly one rank and then
// copied, so the result is bitwise identical on all ranks. The one rank that
// completes an element's reduction also multiplies it by scale (Average's
// 1/n, a postscale factor) in the same pass, so the allgather passes on
// final values and the caller has no scaling pass of its own to make.
void allreduce_ring(Transport& t, void* buf, size_t count, int dtype, int op, double scale = 1.0);

// Latency-optimal recursive doubling with the fold-in fix-up for rank counts
// that are not powers of two (allreduce_tree.cc). Partners always combine as
// (lower ranks' value) op (higher ranks' value), so every rank evaluates the
// same expression tree and the result is bitwise identical on all ranks.
void allreduce_tree(Transport& t, void* buf, size_t count, int dtype, int op);

// Adasum over t (allreduce_adasum.cc): buf holds tensors of counts[i]
// elements end to end (a fused buffer), each combined with its own
// coefficients; dtype float32 or float64 (the caller widens half types and
// applies scale factors).
void allreduce_adasum(Transport& t, void* buf, int dtype, const std::vector<size_t>& counts);

}  // namespace commlib
