// The order log: one sequence of decisions, in shared memory, that every rank
// of the host executes in the same order. It is what lets the response cache
// skip the coordinator without breaking the rule that all ranks run their
// collectives in one order.
//
// Three things live in the log's memory (a region of the host's ShmSegment):
//  - arrival counters, one per cache bit: a rank that submits a cached request
//    adds itself to the counter of the request's bit; the rank that brings it
//    to the number of ranks resets it and appends a "completed" entry. A
//    counter carries the generation of its bit, so arrivals meant for an older
//    assignment of the bit never count towards a newer one.
//  - a ring of entries, appended by any rank (a slot is reserved with a
//    compare-and-swap on the tail and published by its sequence number), read
//    by every rank in order;
//  - each rank's read position, so that a writer never overwrites an entry
//    someone has yet to read (append() then fails and the writer retries later:
//    it must never block, because the slow reader may be waiting for the writer
//    inside a collective).
//
// No locks, no barriers: a rank that is not in the log costs the others
// nothing, and a reader only polls.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backends/shm/shm.h"

namespace commlib {

struct LogEntry {
  enum Kind : uint32_t {
    kMarker = 1,      // the next words[r] coordinator responses of rank r run here
    kCompleted = 2,   // cached requests ready on every rank: word() per request
    kInvalidate = 3,  // cache bits no longer valid: word() per bit
    kLeft = 4,        // words[0]: a rank that called shutdown()
  };
  uint32_t kind = 0;
  std::vector<uint64_t> words;

  // A (bit, generation) word; `starts` marks the first request of a fused group.
  static uint64_t word(int bit, uint32_t gen, bool starts = false) {
    return uint64_t(uint32_t(bit)) | (starts ? kGroupStart : 0) | (uint64_t(gen) << 32);
  }
  static int bit_of(uint64_t w) { return int(w & 0xffff); }
  static uint32_t gen_of(uint64_t w) { return uint32_t(w >> 32); }
  static bool starts_group(uint64_t w) { return (w & kGroupStart) != 0; }
  static constexpr uint64_t kGroupStart = uint64_t(1) << 16;
};

class OrderLog {
 public:
  // 510 words an entry: a step of up to 510 cached requests completes as one
  // entry, and so runs as one fused collective (at 1 KiB, 128 ran as two).
  static constexpr size_t kSlotBytes = 4096;
  static constexpr size_t kSlots = 256;
  static constexpr size_t kMaxWords = (kSlotBytes - 16) / 8;  // per entry
  static constexpr int kMaxBits = 1 << 16;

  // Bytes of shared memory for `ranks` ranks and `bits` cache bits.
  static size_t bytes_needed(int ranks, int bits);
  // mem: bytes_needed() zeroed bytes shared by the host's ranks.
  OrderLog(char* mem, int rank, int ranks, int bits);

  // This rank submitted the cached request of (bit, gen); true when it was the
  // last of `need` ranks (the counter is then reset for the next round).
  bool arrive(int bit, uint32_t gen, int need);
  // Takes back an arrival that has not completed (its bit was invalidated).
  void retract(int bit, uint32_t gen);
  // Appends an entry (at most kMaxWords words); false when the ring is full.
  bool append(const LogEntry& e);
  // The next entry in the log, if published; it is consumed.
  bool next(LogEntry* e);
  // This rank reads no more (it left): writers no longer wait for it.
  void detach();

 private:
  struct Slot {
    std::atomic<uint64_t> seq;  // index + 1 once published
    uint32_t kind;
    uint32_t n;
    uint64_t words[kMaxWords];
  };
  static_assert(sizeof(Slot) == kSlotBytes, "slot layout");
  uint64_t min_consumed() const;

  int rank_, ranks_;
  ShmCounter* tail_;
  ShmCounter* consumed_;           // [ranks]
  std::atomic<uint64_t>* counts_;  // [bits]: generation << 32 | arrivals
  Slot* slots_;                    // [kSlots]
  uint64_t next_ = 0;              // this rank's read position
};

}  // namespace commlib
