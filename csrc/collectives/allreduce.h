// All-reduce algorithms, each in its own file, written against Transport.
#pragma once

#include <cstddef>
#include <string>

#include "../transport/transport.h"

namespace commlib {

enum class AllreduceAlgo { kAuto, kMpi };

// COMMLIB_ALLREDUCE_ALGO: auto|mpi (ring and tree arrive with the fast
// collectives issue). Throws Error(COMMLIB_ERR_VALUE) for unknown names.
AllreduceAlgo parse_allreduce_algo(const std::string& name);

// In-place all-reduce of count elements (dtype is not a half type; op is
// not Average: the caller applies scale factors).
void allreduce(Transport& t, void* buf, size_t count, int dtype, int op, AllreduceAlgo algo);

// The MPI library's own collective.
void allreduce_mpi(Transport& t, void* buf, size_t count, int dtype, int op);

}  // namespace commlib
