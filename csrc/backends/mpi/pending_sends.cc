#include "backends/mpi/pending_sends.h"

#include "backends/mpi/mpi_transport.h"

namespace commlib {

void PendingSends::release() {
  static auto* orphans = new std::list<std::pair<MPI_Request, std::string>>();
  for (auto it = sends_.begin(); it != sends_.end();) {
    int flag = 0;
    MPI_Test(&it->first, &flag, MPI_STATUS_IGNORE);
    auto next = std::next(it);
    if (!flag) {
      MPI_Request_free(&it->first);
      orphans->splice(orphans->end(), sends_, it);
    }
    it = next;
  }
}

void PendingSends::send(std::string bytes, int peer, int tag, MPI_Comm comm, const char* what) {
  sends_.emplace_back(MPI_REQUEST_NULL, std::move(bytes));
  auto& s = sends_.back();
  check_mpi(MPI_Isend(s.second.data(), int(s.second.size()), MPI_BYTE, peer, tag, comm, &s.first), what);
}

void PendingSends::progress() {
  for (auto it = sends_.begin(); it != sends_.end();) {
    int flag = 0;
    check_mpi(MPI_Test(&it->first, &flag, MPI_STATUS_IGNORE), "MPI_Test(send)");
    it = flag ? sends_.erase(it) : std::next(it);
  }
}

}  // namespace commlib
