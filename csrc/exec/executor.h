// The executor: runs the data movement of one negotiated collective on this
// rank (CPU buffers), over the right communicator: the job's, or a process
// set's (which goes without the host's shared memory, whose ranks are the
// whole host's). It owns the process sets' communicators and the fusion
// buffers; which algorithm runs is exec/algorithm.h's choice.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends/mpi/mpi_transport.h"
#include "backends/shm/shm.h"
#include "base/fusion_buffer.h"
#include "base/message.h"
#include "base/timeline.h"
#include "exec/algorithm.h"
#include "exec/operations.h"

namespace commlib {

class Executor {
 public:
  // world: every rank; shm: this host's segment (or null); cross: the same
  // local rank on every host (or null). Not owned.
  void setup(MpiTransport* world, ShmSegment* shm, Transport* cross, AllreduceAlgo algo,
             int shm_collectives);

  // Throws Error(COMMLIB_ERR_INTERNAL) when this rank is not in the set.
  void check_member(int process_set) const;
  // The MPI transport of a process set (0: every rank); checks membership.
  Transport& transport_for(int process_set);
  // Runs resp over entries (in the response's order). Value and type errors
  // (found alike on every rank before any data moves) come back as a status
  // and *message; anything else throws.
  int run(const Response& resp, const std::vector<Entry*>& entries, size_t fusion_threshold,
          std::string* message);

  // The algorithms the last run() used (exec/algorithm.h), while the
  // timeline is on; "" otherwise.
  std::string last_algorithm() { return take_algorithms(); }

  // Process-set changes (every rank, in the coordinator's order).
  void add_set(int id, const std::vector<int>& members);
  void remove_set(int id) { sets_.erase(id); }
  // Collective MPI calls could hang on a dead peer: free nothing collectively.
  void abandon();
  void clear();  // drops the sets' communicators

 private:
  void dispatch(OpContext& ctx, const Response& resp, const std::vector<Entry*>& entries);

  MpiTransport* world_ = nullptr;
  ShmSegment* shm_ = nullptr;
  Transport* cross_ = nullptr;
  AllreduceAlgo algo_ = AllreduceAlgo::kAuto;
  int shm_collectives_ = kShmAuto;
  std::map<int, std::unique_ptr<MpiTransport>> sets_;  // sets this rank is in
  FusionBuffer fusion_, scratch_;
};

}  // namespace commlib
