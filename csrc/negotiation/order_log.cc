#include "negotiation/order_log.h"

#include <algorithm>

#include "base/common.h"

namespace commlib {
namespace {

size_t round64(size_t n) { return (n + 63) & ~size_t(63); }

// a is newer than b (generations wrap around).
bool newer(uint32_t a, uint32_t b) { return int32_t(a - b) > 0; }

}  // namespace

size_t OrderLog::bytes_needed(int ranks, int bits) {
  return sizeof(ShmCounter) * (1 + size_t(ranks)) + round64(sizeof(uint64_t) * size_t(bits)) +
         kSlots * kSlotBytes;
}

OrderLog::OrderLog(char* mem, int rank, int ranks, int bits) : rank_(rank), ranks_(ranks) {
  tail_ = reinterpret_cast<ShmCounter*>(mem);
  consumed_ = tail_ + 1;
  counts_ = reinterpret_cast<std::atomic<uint64_t>*>(consumed_ + ranks);
  slots_ = reinterpret_cast<Slot*>(reinterpret_cast<char*>(counts_) + round64(sizeof(uint64_t) * size_t(bits)));
}

bool OrderLog::arrive(int bit, uint32_t gen, int need) {
  std::atomic<uint64_t>& c = counts_[bit];
  uint64_t cur = c.load(std::memory_order_acquire);
  for (;;) {
    const uint32_t cgen = uint32_t(cur >> 32);
    uint32_t n = uint32_t(cur);
    // A newer assignment of the bit exists: this rank has yet to read the
    // entry that ended its own, and will resubmit through the coordinator then.
    if (newer(cgen, gen)) return false;
    if (cgen != gen) n = 0;  // arrivals for an older assignment no longer count
    const bool last = int(n + 1) >= need;
    const uint64_t next = (uint64_t(gen) << 32) | (last ? 0 : n + 1);
    if (c.compare_exchange_weak(cur, next, std::memory_order_acq_rel)) return last;
  }
}

void OrderLog::retract(int bit, uint32_t gen) {
  std::atomic<uint64_t>& c = counts_[bit];
  uint64_t cur = c.load(std::memory_order_acquire);
  for (;;) {
    if (uint32_t(cur >> 32) != gen || uint32_t(cur) == 0) return;  // already consumed or superseded
    if (c.compare_exchange_weak(cur, cur - 1, std::memory_order_acq_rel)) return;
  }
}

uint64_t OrderLog::min_consumed() const {
  uint64_t m = consumed_[0].value.load(std::memory_order_acquire);
  for (int r = 1; r < ranks_; ++r) m = std::min(m, consumed_[r].value.load(std::memory_order_acquire));
  return m;
}

bool OrderLog::append(const LogEntry& e) {
  if (e.words.size() > kMaxWords) throw Error(COMMLIB_ERR_INTERNAL, "order log entry too long");
  uint64_t t = tail_->value.load(std::memory_order_acquire);
  for (;;) {
    if (t >= kSlots && min_consumed() <= t - kSlots) return false;  // its slot is still unread
    if (tail_->value.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel)) break;
  }
  Slot& s = slots_[t % kSlots];
  s.kind = e.kind;
  s.n = uint32_t(e.words.size());
  std::copy(e.words.begin(), e.words.end(), s.words);
  s.seq.store(t + 1, std::memory_order_release);
  return true;
}

bool OrderLog::next(LogEntry* e) {
  Slot& s = slots_[next_ % kSlots];
  if (s.seq.load(std::memory_order_acquire) != next_ + 1) return false;
  e->kind = s.kind;
  e->words.assign(s.words, s.words + s.n);
  ++next_;
  consumed_[rank_].value.store(next_, std::memory_order_release);
  return true;
}

void OrderLog::detach() { consumed_[rank_].value.store(UINT64_MAX, std::memory_order_release); }

}  // namespace commlib
