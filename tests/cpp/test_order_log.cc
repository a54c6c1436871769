// The order log (csrc/negotiation/order_log.h) with several simulated ranks,
// each an OrderLog over the same memory (as the ranks of one host share it):
// arrival counting per (bit, generation), retraction, word encoding, and the
// ring of entries every rank reads in one order.
//
// csrc: negotiation/order_log.cc
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "base/common.h"
#include "check.h"
#include "negotiation/order_log.h"

using commlib::LogEntry;
using commlib::OrderLog;

namespace {

// Zeroed, 64-byte aligned memory shared by `ranks` logs.
struct Host {
  std::vector<char> raw;
  std::vector<std::unique_ptr<OrderLog>> logs;
  Host(int ranks, int bits) {
    raw.assign(OrderLog::bytes_needed(ranks, bits) + 64, 0);
    const uintptr_t p = reinterpret_cast<uintptr_t>(raw.data());
    char* mem = reinterpret_cast<char*>((p + 63) & ~uintptr_t(63));
    for (int r = 0; r < ranks; ++r) logs.emplace_back(new OrderLog(mem, r, ranks, bits));
  }
  OrderLog& operator[](int r) { return *logs[size_t(r)]; }
};

LogEntry entry(uint32_t kind, std::vector<uint64_t> words) {
  LogEntry e;
  e.kind = kind;
  e.words = std::move(words);
  return e;
}

}  // namespace

TEST_CASE("order log: words carry bit, generation and the group-start flag") {
  const uint64_t w = LogEntry::word(513, 7, true);
  CHECK_EQ(LogEntry::bit_of(w), 513);
  CHECK_EQ(LogEntry::gen_of(w), uint32_t(7));
  CHECK(LogEntry::starts_group(w));
  const uint64_t v = LogEntry::word(OrderLog::kMaxBits - 1, 0xffffffffu, false);
  CHECK_EQ(LogEntry::bit_of(v), OrderLog::kMaxBits - 1);
  CHECK_EQ(LogEntry::gen_of(v), uint32_t(0xffffffffu));
  CHECK(!LogEntry::starts_group(v));
  // The flag and the bit do not overlap.
  CHECK(LogEntry::word(0, 0, true) != LogEntry::word(0, 0, false));
  CHECK_EQ(LogEntry::bit_of(LogEntry::word(0, 0, true)), 0);
}

TEST_CASE("order log: the last of the ranks to arrive completes a bit, once per round") {
  Host host(3, 8);
  for (int round = 0; round < 3; ++round) {
    CHECK(!host[0].arrive(5, 1, 3));
    CHECK(!host[2].arrive(5, 1, 3));
    CHECK(host[1].arrive(5, 1, 3));  // the third arrival, whoever it is
  }
  // Bits count separately.
  CHECK(!host[0].arrive(1, 1, 2));
  CHECK(!host[0].arrive(2, 1, 2));
  CHECK(host[1].arrive(2, 1, 2));
  CHECK(host[1].arrive(1, 1, 2));
}

TEST_CASE("order log: arrivals of an older generation do not count for a newer one") {
  Host host(3, 4);
  CHECK(!host[0].arrive(0, 1, 3));
  CHECK(!host[1].arrive(0, 1, 3));
  // The bit was reassigned (generation 2): old arrivals are dropped.
  CHECK(!host[2].arrive(0, 2, 3));
  CHECK(!host[0].arrive(0, 2, 3));
  CHECK(host[1].arrive(0, 2, 3));
  // An arrival for the older assignment, once a newer one exists, never completes.
  CHECK(!host[0].arrive(0, 1, 1));
}

TEST_CASE("order log: generations compare with wrap-around") {
  Host host(2, 2);
  CHECK(!host[0].arrive(0, 0xffffffffu, 2));
  CHECK(!host[1].arrive(0, 0, 2));  // generation 0 follows 0xffffffff: a fresh count
  CHECK(!host[0].arrive(0, 0xffffffffu, 1));  // older: ignored even with need 1
  CHECK(host[0].arrive(0, 0, 2));
}

TEST_CASE("order log: a retracted arrival no longer counts") {
  Host host(3, 4);
  CHECK(!host[0].arrive(3, 4, 3));
  CHECK(!host[1].arrive(3, 4, 3));
  host[1].retract(3, 4);
  CHECK(!host[1].arrive(3, 4, 3));  // back to two
  CHECK(host[2].arrive(3, 4, 3));
  // Retracting a completed or superseded round changes nothing.
  host[0].retract(3, 4);
  host[0].retract(3, 3);
  CHECK(!host[0].arrive(3, 4, 3));
  CHECK(!host[1].arrive(3, 4, 3));
  CHECK(host[2].arrive(3, 4, 3));
}

TEST_CASE("order log: every rank reads every entry, in append order") {
  Host host(3, 4);
  CHECK(host[0].append(entry(LogEntry::kCompleted, {LogEntry::word(1, 1, true)})));
  CHECK(host[2].append(entry(LogEntry::kInvalidate, {LogEntry::word(2, 3), LogEntry::word(3, 1)})));
  CHECK(host[1].append(entry(LogEntry::kLeft, {2})));
  for (int r = 0; r < 3; ++r) {
    LogEntry e;
    CHECK(host[r].next(&e));
    CHECK_EQ(e.kind, uint32_t(LogEntry::kCompleted));
    CHECK_EQ(e.words, std::vector<uint64_t>{LogEntry::word(1, 1, true)});
    CHECK(host[r].next(&e));
    CHECK_EQ(e.kind, uint32_t(LogEntry::kInvalidate));
    CHECK_EQ(e.words, (std::vector<uint64_t>{LogEntry::word(2, 3), LogEntry::word(3, 1)}));
    CHECK(host[r].next(&e));
    CHECK_EQ(e.kind, uint32_t(LogEntry::kLeft));
    CHECK(!host[r].next(&e));  // nothing more published
  }
}

TEST_CASE("order log: a full ring refuses appends until the slowest reader moves on") {
  Host host(2, 1);
  for (size_t i = 0; i < OrderLog::kSlots; ++i) CHECK(host[0].append(entry(LogEntry::kMarker, {i})));
  LogEntry e;
  for (size_t i = 0; i < OrderLog::kSlots; ++i) CHECK(host[0].next(&e));
  // Rank 0 has read everything, rank 1 nothing: the oldest slot is still needed.
  CHECK(!host[0].append(entry(LogEntry::kMarker, {999})));
  CHECK(host[1].next(&e));
  CHECK_EQ(e.words, std::vector<uint64_t>{0});
  CHECK(host[1].append(entry(LogEntry::kMarker, {999})));
  CHECK(!host[0].append(entry(LogEntry::kMarker, {1000})));
  // Rank 1 reads the rest in order, then the new entry.
  bool in_order = true;
  for (uint64_t i = 1; i < OrderLog::kSlots; ++i) in_order &= host[1].next(&e) && e.words[0] == i;
  CHECK(in_order);
  CHECK(host[1].next(&e));
  CHECK_EQ(e.words, std::vector<uint64_t>{999});
  CHECK(host[0].next(&e));
  CHECK_EQ(e.words, std::vector<uint64_t>{999});
}

TEST_CASE("order log: a rank that detached (it left) no longer holds writers back") {
  Host host(3, 1);
  LogEntry e;
  host[2].detach();
  bool appended = true;
  for (size_t i = 0; i < 3 * OrderLog::kSlots; ++i) {
    appended &= host[0].append(entry(LogEntry::kMarker, {i}));
    appended &= host[0].next(&e) && host[1].next(&e) && e.words[0] == i;
  }
  CHECK(appended);
}

TEST_CASE("order log: entries hold up to kMaxWords words, longer ones are refused") {
  Host host(1, 1);
  std::vector<uint64_t> words(OrderLog::kMaxWords);
  for (size_t i = 0; i < words.size(); ++i) words[i] = i * 3 + 1;
  CHECK(host[0].append(entry(LogEntry::kCompleted, words)));
  LogEntry e;
  CHECK(host[0].next(&e));
  CHECK_EQ(e.words, words);
  words.push_back(0);
  CHECK_THROWS(commlib::Error, host[0].append(entry(LogEntry::kCompleted, words)));
}

TEST_CASE("order log: concurrent writers, every reader sees one order") {
  constexpr int kRanks = 3, kPerRank = 400;
  Host host(kRanks, 1);
  std::vector<std::vector<uint64_t>> seen(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      int written = 0;
      LogEntry e;
      // Interleave appends and reads; a full ring is drained before retrying.
      while (written < kPerRank || seen[size_t(r)].size() < size_t(kRanks * kPerRank)) {
        if (written < kPerRank && host[r].append(entry(LogEntry::kMarker, {uint64_t(r) << 32 | uint64_t(written)})))
          ++written;
        while (host[r].next(&e)) seen[size_t(r)].push_back(e.words[0]);
        std::this_thread::yield();
      }
    });
  }
  for (auto& t : threads) t.join();
  bool same = true, per_writer_order = true;
  for (int r = 1; r < kRanks; ++r) same &= seen[size_t(r)] == seen[0];
  std::vector<uint64_t> next(kRanks, 0);
  for (uint64_t w : seen[0]) {
    const size_t writer = size_t(w >> 32);
    per_writer_order &= writer < size_t(kRanks) && (w & 0xffffffffu) == next[writer]++;
  }
  CHECK_EQ(seen[0].size(), size_t(kRanks * kPerRank));
  CHECK(same);
  CHECK(per_writer_order);
}

CHECK_MAIN()
