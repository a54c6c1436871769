#include "mpi_control.h"

#include "../common.h"
#include "mpi_transport.h"

namespace commlib {
namespace {
constexpr int kTag = 7;
}

ControlChannel::ControlChannel(MPI_Comm comm) : comm_(comm) {
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
}

ControlChannel::~ControlChannel() {
  // Sends still in flight at shutdown go to ranks that stopped listening.
  // They are released, not cancelled (MPI_Cancel of a send crashed inside
  // MPICH's UCX layer), and their list nodes (bytes included, even short
  // strings stored inline) are kept for good: MPI may still read them. A few
  // small messages per shutdown at most.
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
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void ControlChannel::abandon() {
  sends_.clear();
  comm_ = MPI_COMM_NULL;
}

void ControlChannel::send(int peer, std::string bytes) {
  sends_.emplace_back(MPI_REQUEST_NULL, std::move(bytes));
  auto& s = sends_.back();
  check_mpi(MPI_Isend(s.second.data(), int(s.second.size()), MPI_BYTE, peer, kTag, comm_, &s.first),
            "MPI_Isend(control)");
}

bool ControlChannel::poll(int* source, std::string* out) {
  int flag = 0;
  MPI_Status st;
  check_mpi(MPI_Iprobe(MPI_ANY_SOURCE, kTag, comm_, &flag, &st), "MPI_Iprobe");
  if (!flag) return false;
  int count = 0;
  MPI_Get_count(&st, MPI_BYTE, &count);
  out->resize(size_t(count));
  check_mpi(MPI_Recv(out->data(), count, MPI_BYTE, st.MPI_SOURCE, kTag, comm_, MPI_STATUS_IGNORE),
            "MPI_Recv(control)");
  *source = st.MPI_SOURCE;
  return true;
}

void ControlChannel::progress() {
  for (auto it = sends_.begin(); it != sends_.end();) {
    int flag = 0;
    check_mpi(MPI_Test(&it->first, &flag, MPI_STATUS_IGNORE), "MPI_Test(control)");
    it = flag ? sends_.erase(it) : std::next(it);
  }
}

}  // namespace commlib
