// A worker's side of negotiation (every rank but 0): requests go to the
// coordinator, its responses come back in the order every rank runs them,
// and shutdown is a handshake (the worker keeps running responses until the
// coordinator acknowledges its departure, or says goodbye itself).
#pragma once

#include <deque>
#include <string>
#include <vector>

#include "backends/mpi/mpi_control.h"
#include "base/entry.h"
#include "base/message.h"

namespace commlib {

class Worker {
 public:
  explicit Worker(ControlChannel& control) : control_(control) {}

  void report(const std::vector<Entry*>& entries);
  // A control message from rank 0; false when its kind is not for a worker.
  // Responses are appended to ready. by_log: departures come through the
  // order log instead; stopping: this rank is shutting down.
  bool on_message(int kind, Reader& r, std::deque<Response>& ready, bool by_log, bool stopping);
  // Tells the coordinator this rank is leaving.
  void send_leaving();
  // Rank 0 said goodbye (or acknowledged ours): the message to fail what is
  // left with, once the responses before it ran; empty otherwise. Taken once.
  std::string take_closing();
  // Rank 0 called shutdown() and negotiates on for process sets without it
  // (kMsgLeaving), to act on once the responses before it ran. Taken once.
  bool take_leaving();

 private:
  ControlChannel& control_;
  std::string closing_;
  bool leaving_ = false;
};

}  // namespace commlib
