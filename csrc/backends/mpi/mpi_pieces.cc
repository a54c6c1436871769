// Collectives too large for one MPI call (its counts and displacements are
// int): allgather and alltoall become point-to-point exchanges, whose
// messages start() cuts into pieces of at most one call; reduce-scatter runs
// in windows. Every rank takes the same path: the caller decides from sizes
// that every rank knows (Transport::in_one_call).
#include <algorithm>
#include <cstring>
#include <memory>

#include "backends/mpi/mpi_transport.h"
#include "base/common.h"

namespace commlib {
namespace {

// The staging buffer of a reduce-scatter window: at most this many bytes
// (or one call, if smaller).
constexpr size_t kStageBytes = size_t(64) << 20;

}  // namespace

void MpiTransport::exchange_blocks(const std::vector<const char*>& from, const std::vector<size_t>& send,
                                   const std::vector<char*>& to, const std::vector<size_t>& recv) {
  std::vector<P2POp> ops;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    if (recv[r] > 0) ops.push_back({P2POp::kRecv, r, to[r], recv[r]});
    if (send[r] > 0) ops.push_back({P2POp::kSend, r, const_cast<char*>(from[r]), send[r]});
  }
  const int ticket = start(ops);
  if (from[rank_] != to[rank_] && send[rank_] > 0) std::memmove(to[rank_], from[rank_], send[rank_]);
  wait(ticket);
}

void MpiTransport::reduce_scatter_windows(const void* in, void* out, const std::vector<size_t>& counts,
                                          int dtype, int op) {
  const size_t esize = dtype_size(dtype), P = size_t(size_);
  std::vector<size_t> displ(P, 0);
  size_t largest = 0;
  for (size_t r = 0; r < P; ++r) {
    if (r > 0) displ[r] = displ[r - 1] + counts[r - 1];
    largest = std::max(largest, counts[r]);
  }
  // w elements of each rank's part per window: P of them fit the staging buffer.
  const size_t w = std::min(largest, std::max<size_t>(1, std::min(call_bytes_, kStageBytes) / esize / P));
  std::unique_ptr<char[]> stage(new char[P * w * esize]);
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  std::vector<int> c(P);
  for (size_t a = 0; a < largest; a += w) {
    size_t at = 0;
    for (size_t r = 0; r < P; ++r) {
      const size_t n = a < counts[r] ? std::min(w, counts[r] - a) : 0;
      if (n > 0) std::memcpy(stage.get() + at * esize, src + (displ[r] + a) * esize, n * esize);
      c[r] = int(n);
      at += n;
    }
    MPI_Request req;
    check_mpi(MPI_Ireduce_scatter(stage.get(), c[size_t(rank_)] ? dst + a * esize : dst, c.data(),
                                  mpi_datatype(dtype), mpi_op(dtype, op), comm_, &req),
              "MPI_Ireduce_scatter");
    complete(&req);
  }
}

}  // namespace commlib
