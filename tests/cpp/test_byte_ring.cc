// The byte ring of one host's point-to-point lanes (csrc/p2p/byte_ring.h):
// records come out whole and in order across many wraps, a full ring
// refuses a record and takes it once the consumer made room, and a producer
// and a consumer on two threads agree on every byte.
//
// csrc: (header-only)
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "p2p/byte_ring.h"

using commlib::ByteRing;

namespace {

struct Memory {
  std::vector<uint64_t> words;  // (8-byte aligned; the header lines need only that here)
  explicit Memory(size_t capacity) : words((ByteRing::kHeaderBytes + capacity) / 8, 0) {}
  char* data() { return reinterpret_cast<char*>(words.data()); }
};

// Record k: a 16-byte head naming k, then k % 300 payload bytes derived from k.
std::string head_of(uint64_t k) { return "record#" + std::to_string(100000000 + k); }
std::string payload_of(uint64_t k) {
  std::string p(size_t(k % 300), '\0');
  for (size_t i = 0; i < p.size(); ++i) p[i] = char((k * 31 + i) & 0xff);
  return p;
}

bool take(ByteRing& ring, std::string* got) {
  std::string_view msg;
  uint64_t end = 0;
  if (!ring.peek(&msg, &end)) return false;
  got->assign(msg);
  ring.pop(end);
  return true;
}

}  // namespace

TEST_CASE("records come back whole and in order across many wraps") {
  Memory mem(1024);
  ByteRing ring(mem.data(), 1024);
  std::string got;
  CHECK(!take(ring, &got));
  uint64_t next_in = 0, next_out = 0;
  std::mt19937 rng(7);
  while (next_out < 5000) {
    // Write a random number of records, as many as fit, then read a random number.
    for (int i = int(rng() % 6); i > 0; --i) {
      const std::string p = payload_of(next_in);
      if (!ring.write(head_of(next_in), p.data(), p.size())) break;
      ++next_in;
    }
    for (int i = int(rng() % 6); i > 0 && take(ring, &got); --i) {
      CHECK_EQ(got, head_of(next_out) + payload_of(next_out));
      ++next_out;
    }
  }
  CHECK(next_in >= next_out);
}

TEST_CASE("a full ring refuses a record whole and takes it after the consumer made room") {
  Memory mem(256);
  ByteRing ring(mem.data(), 256);
  const std::string big(100, 'x');  // a 112-byte record: two fit, a third does not
  CHECK(ring.write(big, nullptr, 0));
  CHECK(ring.write(big, nullptr, 0));
  CHECK(!ring.write(big, nullptr, 0));
  std::string got;
  CHECK(take(ring, &got));
  CHECK_EQ(got, big);
  // 112 bytes free at the start, 32 at the end: the record wraps to the start.
  CHECK(ring.write(std::string(100, 'y'), nullptr, 0));
  CHECK(take(ring, &got));
  CHECK_EQ(got, big);
  CHECK(take(ring, &got));
  CHECK_EQ(got, std::string(100, 'y'));
  CHECK(!take(ring, &got));
  CHECK_EQ(ByteRing::record_bytes(0), size_t(8));
  CHECK_EQ(ByteRing::record_bytes(9), size_t(24));
}

TEST_CASE("a producer and a consumer thread agree on every byte") {
  Memory mem(4096);
  ByteRing ring(mem.data(), 4096);
  constexpr uint64_t kRecords = 200000;
  std::thread producer([&] {
    for (uint64_t k = 0; k < kRecords; ++k) {
      const std::string h = head_of(k), p = payload_of(k);
      while (!ring.write(h, p.data(), p.size())) std::this_thread::yield();
    }
  });
  uint64_t bad = 0;
  std::string got;
  for (uint64_t k = 0; k < kRecords; ++k) {
    while (!take(ring, &got)) std::this_thread::yield();
    if (got != head_of(k) + payload_of(k)) ++bad;
  }
  producer.join();
  CHECK_EQ(bad, uint64_t(0));
  CHECK(!take(ring, &got));
}

CHECK_MAIN()
