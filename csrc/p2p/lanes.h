// Point-to-point control lanes between the ranks of one host.
//
// One byte ring per ordered pair of ranks in a shared segment: the sending
// rank appends records, the receiving rank takes them in order. A message
// costs one copy in and one copy out and no MPI call, which is most of a
// small message's latency on one host. Every control message between two
// ranks of one host travels here (headers, acknowledgements, clear-to-send,
// goodbyes), so one pair's messages keep the order they were sent in.
//
// Only the thread that owns communication (point_to_point.h) calls send(),
// peek(), pop() and flush(); each ring (byte_ring.h) has one producer and
// one consumer.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include "p2p/byte_ring.h"

namespace commlib {

class P2PLanes {
 public:
  // A rank's inbound rings share kInboundBytes (so the segment grows
  // linearly with the local ranks), each at least kMinRingBytes (from 9 local
  // ranks on: then 32 KiB per pair).
  static constexpr size_t kInboundBytes = size_t(256) << 10;
  static constexpr size_t kMinRingBytes = size_t(32) << 10;
  // The largest record a ring takes (a point-to-point header with 4 KiB of
  // data and 64 dimensions, or an error reply, is far below it); at most
  // half a ring, so that one always fits once the ring is empty.
  static constexpr size_t kMaxRecord = kMinRingBytes / 2;
  // Bytes of one ring at n local ranks.
  static size_t ring_bytes(int n);

  // Collective over local_comm. local_of_job[r]: job rank r's rank in
  // local_comm, or -1 when it lives on another host.
  P2PLanes(MPI_Comm local_comm, std::vector<int> local_of_job);
  ~P2PLanes();
  P2PLanes(const P2PLanes&) = delete;
  P2PLanes& operator=(const P2PLanes&) = delete;

  // Whether job rank r is reached through a lane (it shares this host).
  bool reaches(int r) const { return r >= 0 && r < int(local_of_job_.size()) && local_of_job_[size_t(r)] >= 0; }
  // Whether some other job rank lives on another host.
  bool has_remote() const { return has_remote_; }

  // Appends a message for job rank `to` (`head`, then n bytes at `extra`),
  // after every earlier one; held here while its ring is full (flush()
  // moves it on).
  void send(int to, std::string head, const void* extra = nullptr, size_t n = 0);
  // The next message from any lane (taking turns), in place in its ring:
  // valid until pop(), which must come before the next peek(). False when
  // there is none.
  bool peek(int* from, std::string_view* msg);
  void pop();
  // Writes held messages into rings that have room again.
  void flush();

 private:
  char* lane(int from_local, int to_local) const;  // its ring's memory
  ByteRing ring(int from_local, int to_local) const;
  size_t lane_bytes() const { return ByteRing::kHeaderBytes + ring_bytes_; }  // one ring and its counters

  std::vector<int> local_of_job_;
  std::vector<int> job_of_local_;
  int me_ = 0, n_ = 1;
  bool has_remote_ = false;
  void* base_ = nullptr;
  size_t bytes_ = 0;
  size_t ring_bytes_ = 0;
  std::vector<std::deque<std::string>> held_;  // per local rank
  size_t held_count_ = 0;
  int next_ = 0;  // the lane polled first next time
  int peeked_ = -1;  // the lane whose record peek() gave, and where it ends
  uint64_t peeked_end_ = 0;
};

}  // namespace commlib
