// Single-copy alltoall among the ranks of one host: every rank reads each of
// its blocks straight from the sending rank's input into its output
// (DirectReads), all ranks at once; it returns only when every rank has read
// what it needed, so the input may change afterwards. Each byte is copied
// once, by the rank that receives it. Where MPI's non-blocking alltoall moves
// large blocks in rounds driven by MPI_Test calls, this runs each rank's
// reads back to back.
#include <cstring>

#include "collectives/direct_reads.h"
#include "collectives/shm_collectives.h"

namespace commlib {

void alltoall_direct(ShmSegment& shm, const void* in, void* out, const std::vector<size_t>& matrix) {
  const int P = shm.size(), me = shm.rank();
  auto at = [&](int s, int d) { return matrix[size_t(s) * size_t(P) + size_t(d)]; };
  DirectReads reads(shm, in);
  char* dst = static_cast<char*>(out);
  size_t recv_off = 0;  // where the block of rank s starts in out
  for (int s = 0; s < P; ++s) {
    const size_t n = at(s, me);
    size_t send_off = 0;  // where rank s's block for me starts in its input
    for (int d = 0; d < me; ++d) send_off += at(s, d);
    if (s == me) {
      if (n > 0) std::memcpy(dst + recv_off, static_cast<const char*>(in) + send_off, n);
    } else {
      reads.read(s, send_off, dst + recv_off, n);
    }
    recv_off += n;
  }
  reads.finish(true, "alltoall");
}

}  // namespace commlib
