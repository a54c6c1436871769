#include "backends/mpi/mpi_control.h"

#include "backends/mpi/mpi_transport.h"
#include "backends/mpi/session_stamp.h"
#include "base/common.h"

namespace commlib {
namespace {
constexpr int kTag = 7;
}

ControlChannel::ControlChannel(MPI_Comm comm) : comm_(comm) {
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
}

ControlChannel::~ControlChannel() {
  sends_.release();  // (before the communicator goes)
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void ControlChannel::abandon() {
  sends_.abandon();
  comm_ = MPI_COMM_NULL;
}

void ControlChannel::send(int peer, std::string bytes) {
  stamp_session(bytes);
  sends_.send(std::move(bytes), peer, kTag, comm_, "MPI_Isend(control)");
}

bool ControlChannel::poll(int* source, std::string* out) {
  for (;;) {
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
    if (unstamp_session(*out)) return true;  // (else: left over from an earlier session)
  }
}

void ControlChannel::progress() { sends_.progress(); }

}  // namespace commlib
