// The coordinator's negotiation logic (runs on rank 0 only): collects each
// rank's named requests, validates that all ranks asked for the same thing,
// and turns requests that are ready everywhere into an ordered list of
// Responses, fusing small allreduces of one dtype/op/scale into one response.
//
// Pure logic, no MPI: the Coordinator (coordinator.h) feeds it requests and
// sends its responses.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/message.h"

namespace commlib {

class Controller {
 public:
  Controller(int size, int64_t fusion_threshold_bytes);

  // A request of a rank (a job rank; a member of the request's process set).
  void add(int rank, RequestDesc desc, int64_t now_us);
  // A rank called shutdown(): every request of a process set containing it
  // fails, now and later; the other sets' requests go on.
  void rank_left(int rank);
  // Responses for every request now complete, in a fixed order. Each one's
  // `to` lists the ranks that must receive it (the members of its process
  // set; every rank for errors and for process-set changes).
  std::vector<Response> take_ready();
  // Names waiting longer than after_us, each reported once, as messages.
  std::vector<std::string> stall_warnings(int64_t now_us, int64_t after_us);
  // Requests open longer than after_us (never a join) fail on the ranks that
  // submitted them, naming the ranks that did not (the next take_ready()).
  void time_out(int64_t now_us, int64_t after_us);
  // The ranks named missing by time_out() since the last call (repeats possible).
  std::vector<int> take_timed_out_missing() { return std::move(timed_out_missing_); }
  void set_fusion_threshold(int64_t bytes) { fusion_threshold_ = bytes; }
  // The registered process sets' members by id (0: every rank).
  const std::map<int, std::vector<int>>& sets() const { return sets_; }
  // Whether some rank has joined (join(), below) and not every rank yet.
  bool joining() const { return joined_count_ > 0; }

  // Empty when the requests agree; otherwise the error message (*code set).
  // descs[i] came from job rank ranks[i].
  static std::string validate(const std::vector<RequestDesc>& descs, const std::vector<int>& ranks,
                              int* code);

 private:
  struct Pending {
    int process_set = 0;
    std::vector<int> ranks;          // the set's members (job ranks)
    std::vector<RequestDesc> descs;  // indexed by position in ranks
    std::vector<bool> have;
    int count = 0;
    int64_t first_seen_us = 0;
    bool warned = false;
    bool answered = false;  // its response is made (take_ready), ahead of later ones
    bool queued = false;    // in complete_
  };
  // join: a rank that called join() takes part in every later request it
  // never submits (a phantom member: zeros to reductions, no rows to
  // gathers), so a request is complete once its other members submitted it.
  // When every rank has joined, the join completes (after everything open).
  void on_join(int rank);
  bool complete_now(const Pending& p) const;
  void queue(const std::string& key, Pending& p);
  // The first submitted description of p (a joined rank's slot is empty).
  static const RequestDesc& present(const Pending& p);
  std::string check_joined(const Pending& p) const;
  Response make_response(const std::string& key, Pending& p);
  // Registers or removes a process set (an error message, or empty).
  std::string add_set(const std::vector<int64_t>& ranks, int64_t* id);
  std::string remove_set(int id);
  void fail(const std::string& key, int left_rank);
  void reject(const std::string& key, int process_set, int code, const std::string& why,
              std::vector<int> to = {});
  // A rank could not submit key (abort): whoever submitted it fails now, and
  // whoever submits it later fails at once. Each rank's k-th call of a name
  // pairs with the others' k-th: an abort from a rank that an earlier abort
  // still waits for is that call's (the same bad call on several ranks), and
  // a second abort from one rank waits for the others' second calls.
  void abort_request(int rank, const RequestDesc& d, const std::string& key, const std::vector<int>& members);
  // Takes rank off key's oldest abort still waiting for it: true then, with
  // that abort's reason in *why (when given).
  bool meet_abort(const std::string& key, int rank, std::string* why);
  struct Aborted {
    std::string why;
    std::vector<int> remaining;  // members yet to submit it (and fail)
  };
  std::unordered_map<std::string, std::deque<Aborted>> aborted_;  // oldest first

  int size_;
  int64_t fusion_threshold_;
  std::vector<bool> left_;  // ranks that called shutdown()
  int left_member(const std::vector<int>& members) const {  // the first of them that left, or -1
    for (int r : members)
      if (left_[size_t(r)]) return r;
    return -1;
  }
  std::map<int, std::vector<int>> sets_;  // process sets by id (0: every rank)
  int next_set_id_ = 1;
  std::vector<bool> joined_;
  int joined_count_ = 0;
  int last_joined_ = -1;
  std::unordered_map<std::string, Pending> table_;  // by request key
  std::vector<std::string> complete_;  // names complete, in completion order
  std::vector<Response> errors_;       // immediate errors (rank left)
  std::vector<int> timed_out_missing_;  // (take_timed_out_missing)
};

}  // namespace commlib
