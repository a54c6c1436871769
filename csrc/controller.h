// The coordinator's negotiation logic (runs on rank 0 only): collects each
// rank's named requests, validates that all ranks asked for the same thing,
// and turns requests that are ready everywhere into an ordered list of
// Responses, fusing small allreduces of one dtype/op/scale into one response.
//
// Pure logic, no MPI: the engine feeds it messages and sends its responses.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "message.h"

namespace commlib {

class Controller {
 public:
  Controller(int size, int64_t fusion_threshold_bytes);

  void add(int rank, RequestDesc desc, int64_t now_us);
  // A rank called shutdown(): every open request fails, now and later.
  void rank_left(int rank);
  // Responses for every request now complete, in a fixed order.
  std::vector<Response> take_ready();
  // Names waiting longer than after_us, each reported once, as messages.
  std::vector<std::string> stall_warnings(int64_t now_us, int64_t after_us);
  void set_fusion_threshold(int64_t bytes) { fusion_threshold_ = bytes; }

  // Empty when the requests agree; otherwise the error message (*code set).
  static std::string validate(const std::vector<RequestDesc>& descs, int* code);

 private:
  struct Pending {
    std::vector<RequestDesc> descs;  // indexed by rank
    std::vector<bool> have;
    int count = 0;
    int64_t first_seen_us = 0;
    bool warned = false;
  };
  Response make_response(const std::string& name, Pending& p);
  void fail(const std::string& name, int left_rank);

  int size_;
  int64_t fusion_threshold_;
  int first_left_ = -1;  // a rank that called shutdown()
  std::unordered_map<std::string, Pending> table_;
  std::vector<std::string> complete_;  // names complete, in completion order
  std::vector<Response> errors_;       // immediate errors (rank left)
};

}  // namespace commlib
