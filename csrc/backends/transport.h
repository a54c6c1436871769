// The Transport interface: everything the collective algorithms need to move
// bytes between the ranks of one communicator.
//
// Point-to-point operations are posted as a batch and completed by wait(), so
// an algorithm can overlap its local reduction of one chunk with the transfer
// of the next. The native collectives expose what the underlying library
// already does well; they are the baseline the own algorithms must beat.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace commlib {

struct P2POp {
  enum Kind { kSend, kRecv } kind;
  int peer;
  void* buf;
  size_t bytes;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Posts the operations and returns a ticket for wait().
  virtual int start(const std::vector<P2POp>& ops) = 0;
  // Completes every operation of the ticket (throws on a lost peer).
  virtual void wait(int ticket) = 0;
  void exchange(const std::vector<P2POp>& ops) { wait(start(ops)); }

  // Native collectives (dtype/op are COMMLIB_* codes; half dtypes are widened
  // by the caller). in may equal out for in-place operation.
  virtual void allreduce(const void* in, void* out, size_t count, int dtype, int op) = 0;
  virtual void allgatherv(const void* in, void* out, const std::vector<size_t>& bytes) = 0;
  virtual void broadcast(void* buf, size_t bytes, int root) = 0;
  // widest: the most bytes any rank sends or receives in all (the same on every rank).
  virtual void alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                         const std::vector<size_t>& recv_bytes, size_t widest) = 0;
  // alltoallv with every block block_bytes long, for every pair of ranks.
  virtual void alltoall(const void* in, size_t block_bytes, void* out) = 0;
  virtual void reduce_scatter(const void* in, void* out, const std::vector<size_t>& counts,
                              int dtype, int op) = 0;
  // Whether a native collective whose largest buffer (on any rank) spans
  // `bytes` is one call of the underlying library; larger ones go in pieces.
  virtual bool in_one_call(size_t bytes) const = 0;
};

}  // namespace commlib
