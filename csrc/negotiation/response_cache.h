// The response cache: requests whose negotiation would repeat an earlier one
// exactly skip the coordinator.
//
// The coordinator gives a cache bit to a request it has negotiated before (a
// second sighting: names generated once, like "allreduce.noname.17", never
// take a bit). Every rank installs the bit when it executes that response,
// at the same point of the execution order, so the caches of all ranks stay
// identical. Later, a rank whose request matches its cached description
// exactly just arrives at the bit (order_log.h); when the last rank arrives,
// the request is ready everywhere and runs without any message to rank 0.
// Equal descriptions on every rank imply the same validation outcome and the
// same response (allgather rows included), which is why the cached response
// can be reused.
//
// A request that changed (another shape, dtype, op...) invalidates its bit:
// every rank that had arrived takes its arrival back and sends its request to
// the coordinator, which validates afresh (and reports mismatches as usual).
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "base/message.h"

namespace commlib {

struct CachedResponse {
  bool valid = false;
  uint32_t gen = 0;  // counts the bit's assignments
  std::string key;
  RequestDesc desc;  // this rank's request when the bit was assigned
  int op_type = 0;
  std::vector<int64_t> rows;  // the response's rows (allgather, alltoall)
};

// Every rank: the installed bits.
class ResponseCache {
 public:
  explicit ResponseCache(int capacity) : slots_(size_t(capacity)) {}
  enum Lookup { kMiss, kHit, kChanged };
  // kHit: d equals the cached request; kChanged: its key is cached with
  // another description. *bit / *gen: the key's bit.
  Lookup find(const RequestDesc& d, int* bit, uint32_t* gen) const;
  // Assigns bit to key; true (and *evicted_gen) if it held another request.
  bool install(int bit, const std::string& key, const RequestDesc& d, int op_type,
               const std::vector<int64_t>& rows, uint32_t* evicted_gen);
  // Ends (bit, gen); false if that assignment was already gone.
  bool remove(int bit, uint32_t gen);
  // The response of (bit, gen), or null when that assignment is gone.
  const CachedResponse* get(int bit, uint32_t gen) const;
  int capacity() const { return int(slots_.size()); }

 private:
  std::vector<CachedResponse> slots_;
  std::unordered_map<std::string, int> by_key_;
};

// The coordinator: which bits are free, which requests have been seen, and
// (across hosts) which hosts have arrived at each bit.
class CacheBits {
 public:
  // units: the number of arrivals that complete a bit (hosts, or ranks).
  CacheBits(int capacity, int units);
  // Sets resp.bits (one per name, -1 for none) for an executed response of
  // the global process set.
  void assign(Response& resp);
  // A bit whose assignment ended (invalidated) can be given again.
  void release(int bit);
  // The bit assigned to key, or -1; *gen: its generation.
  int bit_of(const std::string& key, uint32_t* gen) const;
  // Ends (bit, gen) if it is the current assignment (true), freeing the bit.
  bool end(int bit, uint32_t gen);
  bool current(int bit, uint32_t gen) const;
  // Every current assignment, as (bit, generation) words (order_log.h).
  std::vector<uint64_t> assigned() const;
  // A host (or rank) arrived at (bit, gen); true when it was the last one.
  // Arrivals for an assignment that has ended are ignored.
  bool arrive(int bit, uint32_t gen);

 private:
  struct Assigned {
    std::string key;  // empty: free
    uint32_t gen = 0;  // the generation every rank's ResponseCache gives it
    int arrivals = 0;
  };
  std::set<int> free_;
  std::vector<Assigned> bits_;
  std::unordered_map<std::string, int> by_key_;
  std::unordered_set<std::string> seen_;
  size_t max_seen_;
  int units_;
};

bool operator==(const RequestDesc& a, const RequestDesc& b);

}  // namespace commlib
