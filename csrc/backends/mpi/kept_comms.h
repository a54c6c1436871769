// Communicators that end a session with messages nobody will receive are
// kept, never freed.
//
// The control channel's and point-to-point's communicators do: a worker's
// goodbye to rank 0, a point-to-point goodbye, a departure notice sent late
// are not waited for. Open MPI matches each sender's messages on a
// communicator by sequence number and gives a freed communicator's context
// id to the next duplicate, so such a message arrived on the next session's
// communicator under its old sequence number, and the new message of that
// number was then never matched: the first collectives after shutdown() and
// init() hung (3 ranks, Open MPI 4.1; MPICH delivered the stale message
// plainly, and the session stamp, session_stamp.h, dropped it). A kept
// communicator keeps its context id and its stale messages. Two are kept per
// session.
#pragma once

#include <mpi.h>

#include <vector>

namespace commlib {

inline void keep_comm(MPI_Comm comm) {
  if (comm == MPI_COMM_NULL) return;
  static auto* kept = new std::vector<MPI_Comm>();  // (never freed: outlives MPI_Finalize's callers)
  kept->push_back(comm);
}

}  // namespace commlib
