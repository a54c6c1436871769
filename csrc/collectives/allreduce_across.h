// The inter-host step of the hierarchical all-reduce: the ring or the tree
// over a Transport, chosen by message size and rank count. The shared-memory
// all-reduces call it for their slice across hosts; exec/algorithm.h for
// COMMLIB_ALLREDUCE_ALGO=auto without shared memory.
#pragma once

#include <cstddef>

#include "backends/transport.h"
#include "collectives/allreduce.h"

namespace commlib {

// The algorithm kAuto picks over a Transport (no shared memory) for a
// message of `bytes` bytes on `ranks` ranks (never kAuto).
AllreduceAlgo choose_allreduce_algo(size_t bytes, int ranks);

// The size from which kAuto runs the ring rather than the tree (up to 4
// ranks; scaled up beyond, see allreduce_across.cc). Autotune sets it, on
// every rank at the same point of the order (runtime/engine_tune.cc); init
// restores the default.
constexpr size_t kTreeMaxBytes = size_t(16) << 10;
void set_tree_max_bytes(size_t bytes);
size_t tree_max_bytes();

// The ring or the tree over t, chosen by size (the inter-host step); the
// result multiplied by post. travel (a half type, with dtype float32): the
// values are rounded to it, all-reduced as such and widened back (-1: they
// travel as dtype).
void allreduce_across(Transport& t, void* buf, size_t count, int dtype, int op, double post = 1.0,
                      int travel = -1);

}  // namespace commlib
