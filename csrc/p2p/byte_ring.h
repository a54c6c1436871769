// A byte ring with one producer and one consumer, in memory both can see
// (a shared segment between two processes): variable-sized records, in
// order. The producer owns `head` (bytes written), the consumer `tail`
// (bytes taken); each sits on its own cache line. A record is a 4-byte
// length, 4 bytes of padding and its bytes, padded to 8; one that does not
// fit before the end of the ring is preceded by a wrap mark and starts over
// at the beginning, so a record is always contiguous.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace commlib {

class ByteRing {
 public:
  static constexpr size_t kHeaderBytes = 128;  // head and tail, a cache line each

  // `mem`: kHeaderBytes + capacity zeroed bytes, 64-byte aligned;
  // capacity a multiple of 8.
  ByteRing(char* mem, size_t capacity)
      : head_(reinterpret_cast<std::atomic<uint64_t>*>(mem)),
        tail_(reinterpret_cast<std::atomic<uint64_t>*>(mem + 64)),
        data_(mem + kHeaderBytes),
        cap_(capacity) {}

  static size_t record_bytes(size_t len) { return 8 + ((len + 7) & ~size_t(7)); }
  size_t capacity() const { return cap_; }

  // Producer: appends `head` then n bytes at `extra` as one record; false
  // (nothing written) when the ring lacks room for it now.
  bool write(std::string_view head, const void* extra, size_t n) {
    const size_t len = head.size() + n;
    const size_t need = record_bytes(len);
    uint64_t at = head_->load(std::memory_order_relaxed);
    const uint64_t tail = tail_->load(std::memory_order_acquire);
    const size_t pos = size_t(at % cap_);
    const size_t skip = cap_ - pos < need ? cap_ - pos : 0;  // (a multiple of 8)
    if (cap_ - size_t(at - tail) < skip + need) return false;
    if (skip) {
      std::memcpy(data_ + pos, &kWrap, sizeof(kWrap));
      at += skip;
    }
    char* p = data_ + size_t(at % cap_);
    const uint32_t n32 = uint32_t(len);
    std::memcpy(p, &n32, sizeof(n32));
    std::memcpy(p + 8, head.data(), head.size());
    if (n) std::memcpy(p + 8 + head.size(), extra, n);
    head_->store(at + need, std::memory_order_release);
    return true;
  }

  // Consumer: the oldest record in place (false when there is none); it
  // stays valid until pop(end), end being what peek() returned in *end.
  bool peek(std::string_view* msg, uint64_t* end) const {
    uint64_t tail = tail_->load(std::memory_order_relaxed);
    if (tail == head_->load(std::memory_order_acquire)) return false;
    uint32_t len = 0;
    std::memcpy(&len, data_ + size_t(tail % cap_), sizeof(len));
    if (len == kWrap) {
      tail += cap_ - size_t(tail % cap_);
      std::memcpy(&len, data_, sizeof(len));
    }
    *msg = std::string_view(data_ + size_t(tail % cap_) + 8, len);
    *end = tail + record_bytes(len);
    return true;
  }
  void pop(uint64_t end) { tail_->store(end, std::memory_order_release); }

 private:
  static constexpr uint32_t kWrap = 0xffffffffu;  // "the rest is empty: go on at the start"
  std::atomic<uint64_t>* head_;
  std::atomic<uint64_t>* tail_;
  char* data_;
  size_t cap_;
};

}  // namespace commlib
