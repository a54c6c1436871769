#include "exec/algorithm.h"

#include <algorithm>
#include <cstring>

#include "base/common.h"
#include "base/reduce.h"
#include "base/timeline.h"
#include "collectives/allreduce.h"
#include "collectives/allreduce_across.h"
#include "collectives/allreduce_shm.h"

namespace commlib {

AllreduceAlgo parse_allreduce_algo(const std::string& name) {
  if (name.empty() || name == "auto") return AllreduceAlgo::kAuto;
  if (name == "mpi") return AllreduceAlgo::kMpi;
  if (name == "ring") return AllreduceAlgo::kRing;
  if (name == "tree") return AllreduceAlgo::kTree;
  if (name == "shm") return AllreduceAlgo::kShm;
  throw Error(COMMLIB_ERR_VALUE,
              "COMMLIB_ALLREDUCE_ALGO must be one of auto, shm, ring, tree, mpi; got '" + name + "'");
}

// Shared memory, when usable, beats every Transport path on one host: it
// moves each byte about twice per rank (the memory-traffic floor), while the
// ring and MPI copy through the MPI library's own buffers as well.
void allreduce(Transport& t, ShmSegment* shm, Transport* cross, void* buf, size_t count,
               int dtype, int op, AllreduceAlgo algo, double post, const void* in, int travel) {
  if (count == 0) return;
  if (in == buf) in = nullptr;
  const bool to_shm = t.size() > 1 && (algo == AllreduceAlgo::kShm || (algo == AllreduceAlgo::kAuto && shm));
  if (to_shm) {
    if (!shm) {
      throw Error(COMMLIB_ERR_VALUE,
                  "COMMLIB_ALLREDUCE_ALGO=shm needs the same number (> 1) of ranks on every host");
    }
    note_algorithm(cross ? "shm-hierarchical" : "shm");
    return allreduce_shm(*shm, cross, buf, count, dtype, op, post, in, travel);  // (scales as it reduces)
  }
  if (in) std::memcpy(buf, in, count * dtype_size(dtype));
  if (t.size() == 1) return scale_buffer(dtype, buf, count, post);
  switch (algo) {
    case AllreduceAlgo::kAuto: return allreduce_across(t, buf, count, dtype, op, post);
    case AllreduceAlgo::kRing:
      note_algorithm("ring");
      return allreduce_ring(t, buf, count, dtype, op, post);  // (scales as it reduces)
    case AllreduceAlgo::kTree: note_algorithm("tree"); allreduce_tree(t, buf, count, dtype, op); break;
    case AllreduceAlgo::kMpi: note_algorithm("mpi"); allreduce_mpi(t, buf, count, dtype, op); break;
    case AllreduceAlgo::kShm: break;  // (handled above)
  }
  scale_buffer(dtype, buf, count, post);
}

bool shm_allowed(const AlgoChoice& c) {
  return c.shm && (c.algo == AllreduceAlgo::kAuto || c.algo == AllreduceAlgo::kShm);
}

bool use_shm_collective(const AlgoChoice& c, int ranks, bool pays) {
  if (!shm_allowed(c) || c.cross || c.shm->size() != ranks) return false;
  return c.shm_collectives == kShmAlways || (c.shm_collectives == kShmAuto && pays);
}

bool reads_directly(const AlgoChoice& c, int ranks) {
  return use_shm_collective(c, ranks, true) && c.shm->region_bytes() > 0 && !c.shm->direct_read_pids().empty();
}

}  // namespace commlib
