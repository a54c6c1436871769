// Non-blocking sends of small owned messages: their bytes are kept until MPI
// reports each send complete.
#pragma once

#include <mpi.h>

#include <list>
#include <string>
#include <utility>

namespace commlib {

class PendingSends {
 public:
  PendingSends() = default;
  PendingSends(const PendingSends&) = delete;
  PendingSends& operator=(const PendingSends&) = delete;
  // Sends still in flight at destruction go to ranks that stopped listening.
  // They are released, not cancelled (MPI_Cancel of a send crashed inside
  // MPICH's UCX layer), and their list nodes (bytes included, even short
  // strings stored inline) are kept for good: MPI may still read them. A few
  // small messages per shutdown at most.
  // release() does that; the destructor calls it.
  ~PendingSends() { release(); }
  void release();

  void send(std::string bytes, int peer, int tag, MPI_Comm comm, const char* what);
  void progress();  // forgets completed sends
  bool empty() const { return sends_.empty(); }
  void abandon() { sends_.clear(); }  // after a lost peer: MPI is never called again

 private:
  std::list<std::pair<MPI_Request, std::string>> sends_;
};

}  // namespace commlib
