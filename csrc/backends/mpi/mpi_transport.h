// Transport over an MPI communicator (spans machines). Every MPI call is
// non-blocking and completed by polling (progress.h), so that a dead peer is
// noticed and reported instead of blocking forever.
#pragma once

#include <mpi.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends/transport.h"

namespace commlib {

class MpiTransport : public Transport {
 public:
  explicit MpiTransport(MPI_Comm comm);  // takes ownership of comm
  ~MpiTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  MPI_Comm comm() const { return comm_; }

  int start(const std::vector<P2POp>& ops) override;
  void wait(int ticket) override;

  void allreduce(const void* in, void* out, size_t count, int dtype, int op) override;
  void allgatherv(const void* in, void* out, const std::vector<size_t>& bytes) override;
  void broadcast(void* buf, size_t bytes, int root) override;
  void alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                 const std::vector<size_t>& recv_bytes, size_t widest) override;
  void alltoall(const void* in, size_t block_bytes, void* out) override;
  void reduce_scatter(const void* in, void* out, const std::vector<size_t>& counts, int dtype,
                      int op) override;
  bool in_one_call(size_t bytes) const override { return bytes <= call_bytes_; }

  // Releases the communicator without a collective call (after a lost peer).
  void abandon();

  // Collective over this communicator: a transport over the given ranks (in
  // ascending order), or null on a rank that is not one of them. Waits for
  // every rank first without blocking, so that a dead peer raises instead.
  std::unique_ptr<MpiTransport> subset(const std::vector<int>& ranks);
  // At init: the communicator whose ranks timeout messages name (the job's),
  // and the most bytes one MPI call moves (COMMLIB_TEST_MPI_CALL_BYTES; MPI's
  // counts are int, so larger transfers go in pieces).
  static void set_job(MPI_Comm job, size_t call_bytes);

 private:
  void complete(MPI_Request* req);
  // Beyond one call (mpi_pieces.cc): every rank sends send[d] bytes from
  // from[d] to each rank d and receives recv[s] bytes into to[s] from each
  // rank s, point to point (start() cuts the messages into pieces).
  void exchange_blocks(const std::vector<const char*>& from, const std::vector<size_t>& send,
                       const std::vector<char*>& to, const std::vector<size_t>& recv);
  // reduce_scatter in windows: each call reduces the next elements of every
  // rank's part, copied together into a staging buffer of at most one call
  // (and 64 MiB).
  void reduce_scatter_windows(const void* in, void* out, const std::vector<size_t>& counts, int dtype,
                              int op);

  static inline size_t call_bytes_ = size_t(1) << 30;

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  int next_ticket_ = 0;
  std::map<int, std::vector<MPI_Request>> pending_;
  std::map<int, std::vector<int>> peers_;  // by ticket: the peer of each request
  // "rank(s) [..]": the job ranks of the peers whose requests are still open.
  std::string open_peers(std::vector<MPI_Request>& reqs, const std::vector<int>& peers) const;
  // "rank(s) [..]": these ranks of this communicator as ranks of the job.
  std::string job_ranks(const std::vector<int>& ranks) const;
};

// Throws Error(COMMLIB_ERR_INTERNAL) with MPI's message when rc != MPI_SUCCESS.
void check_mpi(int rc, const char* what);
MPI_Datatype mpi_datatype(int dtype);
MPI_Op mpi_op(int dtype, int op);  // (bool: logical or/and)

}  // namespace commlib
