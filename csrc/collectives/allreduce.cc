#include "allreduce.h"

#include "../common.h"
#include "allreduce_shm.h"

namespace commlib {

AllreduceAlgo parse_allreduce_algo(const std::string& name) {
  if (name.empty() || name == "auto") return AllreduceAlgo::kAuto;
  if (name == "mpi") return AllreduceAlgo::kMpi;
  if (name == "shm") return AllreduceAlgo::kShm;
  throw Error(COMMLIB_ERR_VALUE, "COMMLIB_ALLREDUCE_ALGO must be one of auto, mpi, shm; got '" + name + "'");
}

void allreduce(Transport& t, ShmSegment* shm, Transport* cross, void* buf, size_t count,
               int dtype, int op, AllreduceAlgo algo) {
  if (t.size() == 1 || count == 0) return;
  switch (algo) {
    case AllreduceAlgo::kAuto:
      // Shared memory moves each byte about twice per rank, the memory-traffic
      // floor; MPI's own path copies more. Across hosts it is hierarchical.
      if (shm) return allreduce_shm(*shm, cross, buf, count, dtype, op);
      return allreduce_mpi(t, buf, count, dtype, op);
    case AllreduceAlgo::kShm:
      if (!shm) throw Error(COMMLIB_ERR_VALUE, "COMMLIB_ALLREDUCE_ALGO=shm needs the same number (> 1) of ranks on every host");
      return allreduce_shm(*shm, cross, buf, count, dtype, op);
    case AllreduceAlgo::kMpi:
      return allreduce_mpi(t, buf, count, dtype, op);
  }
}

}  // namespace commlib
