// One block (backends/shm/shm_block.h) of single-copy reads among the ranks
// of one host: each rank publishes where its buffer is in its region of the
// shared segment, and ranks copy what they need straight out of each other's
// buffers (process_vm_readv, backends/shm/cma.h). The single-copy broadcast,
// allgather and alltoall are built on it (broadcast_direct.cc, ...).
#pragma once

#include <cstddef>
#include <cstdint>

#include "backends/shm/shm_block.h"

namespace commlib {

class DirectReads {
 public:
  // Claims the block and publishes `mine` (this rank's buffer) to the others.
  // Needs shm.direct_read_pids(): throws Error otherwise.
  DirectReads(ShmSegment& shm, const void* mine);

  // Copies n bytes at offset off of rank s's buffer into dst, once s has
  // published it. A failed read is remembered (and thrown by finish).
  void read(int s, size_t off, void* dst, size_t n);
  // Copies n bytes from src to offset off of rank d's buffer (process_vm_writev),
  // once d has published it. d learns of a failed write in its finish().
  void write(int d, size_t off, const void* src, size_t n);

  // Ends the block; with wait_readers, returns only when every rank has done
  // its reads and writes (this rank's buffer may change afterwards, and holds
  // what others wrote). Throws Error, naming `what`, if a read or write of
  // this rank failed, or (wait_readers) another's write into its buffer.
  void finish(bool wait_readers, const char* what);

 private:
  uint64_t buffer_of(int r);             // rank r's buffer, once published
  void failed(int peer, bool writing);  // (errno: why)

  ShmSegment& shm_;
  ShmBlock blk_;
  int failed_from_ = -1;
  int failed_errno_ = 0;
  bool failed_write_ = false;
};

}  // namespace commlib
