#include "runtime/config_agree.h"

#include <algorithm>
#include <cstring>

#include "backends/mpi/mpi_transport.h"
#include "base/common.h"

namespace commlib {

// Every rank parses its own environment, then one all-reduce finds the
// lowest rank whose environment was bad (size: none) and that rank
// broadcasts its message. Two small collectives, called by every rank that
// calls init, so a bad value on some ranks only cannot leave the others
// waiting in a later collective of init for a rank that already gave up.
Config config_from_env_agreed(MPI_Comm comm) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  Config cfg;
  std::string error;
  try {
    cfg = Config::from_env();
  } catch (const Error& e) {
    error = e.what();
  }
  int bad = error.empty() ? size : rank;
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MIN, comm), "MPI_Allreduce(configuration)");
  if (bad == size) return cfg;
  char text[1024] = {};
  if (rank == bad) std::memcpy(text, error.data(), std::min(error.size(), sizeof(text) - 1));
  check_mpi(MPI_Bcast(text, int(sizeof(text)), MPI_CHAR, bad, comm), "MPI_Bcast(configuration)");
  if (!error.empty()) throw Error(COMMLIB_ERR_VALUE, error);
  throw Error(COMMLIB_ERR_VALUE, std::string(text) + " (in the environment of rank " + std::to_string(bad) + ")");
}

}  // namespace commlib
