#include "allreduce.h"

#include "../common.h"

namespace commlib {

AllreduceAlgo parse_allreduce_algo(const std::string& name) {
  if (name.empty() || name == "auto") return AllreduceAlgo::kAuto;
  if (name == "mpi") return AllreduceAlgo::kMpi;
  throw Error(COMMLIB_ERR_VALUE, "COMMLIB_ALLREDUCE_ALGO must be one of auto, mpi; got '" + name + "'");
}

void allreduce(Transport& t, void* buf, size_t count, int dtype, int op, AllreduceAlgo algo) {
  if (t.size() == 1 || count == 0) return;
  switch (algo) {
    case AllreduceAlgo::kAuto:
    case AllreduceAlgo::kMpi:
      return allreduce_mpi(t, buf, count, dtype, op);
  }
}

}  // namespace commlib
