// Reading the configuration at init so that every rank agrees on success.
#pragma once

#include <mpi.h>

#include "base/config.h"

namespace commlib {

// Config::from_env() on every rank of comm, agreed: if any rank's
// environment has a bad value, every rank throws Error(COMMLIB_ERR_VALUE)
// (that rank with its own message, the others with the lowest such rank's
// message and its number), so that no rank goes on to wait in a collective
// for a rank that gave up. Collective over comm: the first communication of
// init.
Config config_from_env_agreed(MPI_Comm comm);

}  // namespace commlib
