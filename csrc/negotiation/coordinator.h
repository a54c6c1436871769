// Rank 0's side of negotiation: it feeds the Controller with every rank's
// requests (its own directly, the workers' from control messages), sends each
// worker, in order, the responses addressed to it, answers departures, and
// (with the order log) places a marker per batch of responses. The response
// cache's rank-0 state is the CacheProtocol's; this class only routes to it.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "backends/mpi/mpi_control.h"
#include "base/message.h"
#include "negotiation/cache_protocol.h"
#include "negotiation/controller.h"

namespace commlib {

class Coordinator {
 public:
  Coordinator(int size, int64_t fusion_threshold, int64_t stall_warning_us, ControlChannel& control,
              CacheProtocol& cache);

  // A full request of rank `rank` (the cache looks at it first).
  void add(int rank, RequestDesc desc, int64_t now);
  // A control message from a worker; false when its kind is not for rank 0.
  bool on_message(int source, int kind, Reader& r);
  // Responses ready now: sent to the workers, rank 0's own share appended to
  // mine (in order). True when there were any.
  bool take_responses(int64_t fusion_threshold, std::deque<Response>& mine);
  // A response for every rank that goes out after the next batch (kTune).
  void post(Response resp) { posted_.push_back(std::move(resp)); }
  // Prints the stall warnings and fails requests open longer than the
  // timeout (at most once a second).
  void check_stalls(int64_t now);
  void set_timeout(int64_t us) { timeout_us_ = us; }  // 0: none
  // Rank 0 leaves: whatever involves it fails, now and later. While process
  // sets without it are registered it goes on negotiating their collectives
  // until each of their members has left (awaited_left), and returns true;
  // without the order log, every worker still listening is then told now
  // (kMsgLeaving).
  bool leave();
  bool awaited_left() const;
  // Tells every worker still listening, and not told by leave(), that no
  // further collectives are possible.
  void send_shutdown_notice();
  // Ranks named missing by a timed-out request that have sent rank 0 nothing
  // since (cut off by a partition, or frozen) and have not left.
  std::vector<int> silent_since_timeout() const;

 private:
  void on_worker_left(int source);
  void send_responses(const std::vector<Response>& resps);

  int size_;
  int64_t stall_warning_us_;
  ControlChannel& control_;
  CacheProtocol& cache_;
  Controller controller_;
  std::vector<Response> posted_;
  std::vector<bool> worker_left_;
  std::vector<bool> awaited_;   // (leave)
  std::vector<bool> notified_;  // told of rank 0's departure by leave()
  std::vector<bool> silent_;  // (silent_since_timeout)
  int64_t last_stall_check_us_ = 0;
  int64_t timeout_us_ = 0;
};

// Whether a coordinator response goes to job rank r.
bool addressed_to(const Response& resp, int r);

}  // namespace commlib
