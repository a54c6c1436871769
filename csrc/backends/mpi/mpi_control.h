// Small control messages (negotiation) over their own MPI communicator, so
// that they never match data-plane traffic. Sends are non-blocking; their
// buffers are kept until MPI reports them complete.
#pragma once

#include <mpi.h>

#include <string>

#include "backends/mpi/pending_sends.h"

namespace commlib {

class ControlChannel {
 public:
  explicit ControlChannel(MPI_Comm comm);  // takes ownership of comm
  ~ControlChannel();

  void send(int peer, std::string bytes);
  // Receives one waiting message from any rank; false when none is waiting.
  bool poll(int* source, std::string* out);
  // Frees the buffers of completed sends.
  void progress();
  // Releases the communicator without a collective call (after a lost peer).
  void abandon();

 private:
  MPI_Comm comm_;
  PendingSends sends_;
};

}  // namespace commlib
