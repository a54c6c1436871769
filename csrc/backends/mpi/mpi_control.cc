#include "backends/mpi/mpi_control.h"

#include "backends/mpi/kept_comms.h"
#include "backends/mpi/mpi_transport.h"
#include "backends/mpi/session_stamp.h"
#include "base/common.h"
#include "base/progress.h"

namespace commlib {
namespace {
constexpr int kTag = 7;
}

ControlChannel::ControlChannel(MPI_Comm comm) : comm_(comm) {
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
}

void ControlChannel::keep_forever(std::unique_ptr<Incoming> m) {
  static auto* orphans = new std::deque<std::unique_ptr<Incoming>>();  // (never freed)
  orphans->push_back(std::move(m));
}

ControlChannel::~ControlChannel() {
  sends_.release();  // (before the communicator goes)
  if (comm_ == MPI_COMM_NULL) return;
  // A message still arriving (nobody waits for it any more): its request is
  // freed and its buffer kept, since MPI may still write it.
  for (auto& m : incoming_) {
    int flag = 0;
    MPI_Test(&m->request, &flag, MPI_STATUS_IGNORE);
    if (flag) continue;
    MPI_Request_free(&m->request);
    keep_forever(std::move(m));
  }
  incoming_.clear();
  keep_comm(comm_);  // (goodbyes may still arrive: kept_comms.h)
}

void ControlChannel::abandon() {
  sends_.abandon();
  // (MPI is never called again: the buffers of messages still arriving stay)
  for (auto& m : incoming_) keep_forever(std::move(m));
  incoming_.clear();
  comm_ = MPI_COMM_NULL;
}

void ControlChannel::send(int peer, std::string bytes) {
  stamp_session(bytes);
  sends_.send(std::move(bytes), peer, kTag, comm_, "MPI_Isend(control)");
}

void ControlChannel::match_arrivals() {
  for (;;) {
    int flag = 0;
    MPI_Message message;
    MPI_Status st;
    check_mpi(MPI_Improbe(MPI_ANY_SOURCE, kTag, comm_, &flag, &message, &st), "MPI_Improbe");
    if (!flag) return;
    int count = 0;
    MPI_Get_count(&st, MPI_BYTE, &count);
    incoming_.push_back(std::make_unique<Incoming>());
    Incoming& m = *incoming_.back();
    m.source = st.MPI_SOURCE;
    m.bytes.resize(size_t(count));
    check_mpi(MPI_Imrecv(m.bytes.data(), count, MPI_BYTE, &message, &m.request), "MPI_Imrecv(control)");
  }
}

bool ControlChannel::poll(int* source, std::string* out) {
  match_arrivals();
  while (!incoming_.empty()) {
    Incoming& m = *incoming_.front();
    int flag = 0;
    check_mpi(MPI_Test(&m.request, &flag, MPI_STATUS_IGNORE), "MPI_Test(control)");
    if (!flag) return false;  // (the ones behind it wait: each sender's order holds)
    *source = m.source;
    out->swap(m.bytes);
    incoming_.pop_front();
    if (unstamp_session(*out)) return true;  // (else: left over from an earlier session)
  }
  return false;
}

void ControlChannel::progress() {
  sends_.progress();
  // (a sender whose message is above the eager size finishes once it is
  // received; now and then: waits call this as they spin)
  constexpr int64_t kMatchEveryUs = 100;
  const int64_t now = now_us();
  if (now - last_match_us_ < kMatchEveryUs) return;
  last_match_us_ = now;
  match_arrivals();
}

}  // namespace commlib
