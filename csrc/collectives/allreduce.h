// All-reduce algorithms, each in its own file, written against Transport.
#pragma once

#include <cstddef>
#include <string>

#include "../transport/shm.h"
#include "../transport/transport.h"

namespace commlib {

enum class AllreduceAlgo { kAuto, kMpi, kShm };

// COMMLIB_ALLREDUCE_ALGO: auto|mpi|shm. Throws Error(COMMLIB_ERR_VALUE) for
// unknown names.
AllreduceAlgo parse_allreduce_algo(const std::string& name);

// In-place all-reduce of count elements (dtype is not a half type; op is
// not Average: the caller applies scale factors). shm is this host's
// shared-memory segment (null if unusable); cross connects the ranks of the
// same local rank on every host (null on one host): then the shared-memory
// algorithms reduce within the host, all-reduce each slice across hosts, and
// share the result within the host.
void allreduce(Transport& t, ShmSegment* shm, Transport* cross, void* buf, size_t count,
               int dtype, int op, AllreduceAlgo algo);

// The MPI library's own collective.
void allreduce_mpi(Transport& t, void* buf, size_t count, int dtype, int op);

}  // namespace commlib
