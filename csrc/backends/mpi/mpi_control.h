// Small control messages (negotiation) over their own MPI communicator, so
// that they never match data-plane traffic. Sends are non-blocking; their
// buffers are kept until MPI reports them complete. So are receives: a
// message above MPI's eager size completes only while its sender calls into
// MPI, and a blocking receive would stop this rank's engine (its timeouts,
// its liveness checks) until then, or forever if the sender froze.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "backends/mpi/pending_sends.h"

namespace commlib {

class ControlChannel {
 public:
  explicit ControlChannel(MPI_Comm comm);  // takes ownership of comm
  ~ControlChannel();

  void send(int peer, std::string bytes);
  // Receives one message from any rank; false when none has arrived whole.
  // Messages come out in the order they were matched (each sender's in the
  // order it sent them).
  bool poll(int* source, std::string* out);
  // Frees the buffers of completed sends and starts receiving the messages
  // that arrived (poll() hands them out), so that neither side's large
  // messages wait for this rank's next poll(): called while it waits.
  void progress();
  // Whether sends are still in flight (as of the last progress()).
  bool sending() const { return !sends_.empty(); }
  // Releases the communicator without a collective call (after a lost peer).
  void abandon();

 private:
  struct Incoming {
    MPI_Request request = MPI_REQUEST_NULL;
    int source = -1;
    std::string bytes;  // (MPI writes it: an Incoming never moves)
  };
  void match_arrivals();
  // A message MPI may still write into, once nobody waits for it.
  static void keep_forever(std::unique_ptr<Incoming> m);

  MPI_Comm comm_;
  PendingSends sends_;
  std::deque<std::unique_ptr<Incoming>> incoming_;  // matched, in order; the front one completes first
  int64_t last_match_us_ = 0;  // (progress()'s last look for arrivals)
};

}  // namespace commlib
