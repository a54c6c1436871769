// The recursive-doubling schedule of tree_schedule.h run over a Transport on
// whole buffers, with the combination of two partners' values left to the
// caller: the tree all-reduce (allreduce_tree.cc) reduces them with a
// reduction op, Adasum (allreduce_adasum.cc) combines them adaptively.
//
//  1. Fold-in. Among the first 2*rem ranks (n = p + rem, p the largest power
//     of two <= n), each even rank r sends its buffer to r+1 and drops out;
//     r+1 holds combine(x[r], x[r+1]).
//  2. Recursive doubling. For mask = 1, 2, 4, .. < p, virtual ranks v and
//     v^mask exchange their whole buffers and both combine them.
//  3. Fold-out. Each odd rank below 2*rem sends the result back to r-1.
//
// Partners always call combine(value of the lower block of ranks, value of
// the higher block), whichever of the two they are: every rank evaluates the
// same expression tree over x[0] .. x[n-1] in rank order, and the fold-out
// only copies, so the result is bitwise identical on all ranks.
//
// Completion handshake. With MPICH over UCX a send can stay incomplete at
// the sender until the receiver makes further MPI progress after its receive
// completed; a rank that left the collective and then stopped calling MPI
// (e.g. blocked in MPI_Finalize) would leave a partner waiting forever. Every
// pair of ranks that exchanged data here does so in both directions, so at
// the end, with all its own sends complete, each rank sends an empty message
// to each of its partners and waits for theirs (one batch, one latency hop;
// it cost about 2 us per call at 2 ranks here).
#pragma once

#include <cstddef>
#include <functional>

#include "backends/transport.h"

namespace commlib {

// Combines the lower block's value and the higher block's (bytes each) into
// one of the two buffers and returns that one; the other is then free.
using PairCombine = std::function<char*(char* lower, char* higher)>;

// buf (bytes long) holds this rank's value and receives the result.
void pairwise_tree(Transport& t, void* buf, size_t bytes, const PairCombine& combine);

}  // namespace commlib
