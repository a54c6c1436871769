// Single-copy alltoall among the ranks of one host: every rank publishes
// where its input is (in its region of the shared segment) and then reads
// each of its blocks straight from the sending rank's input into its output
// (process_vm_readv), all ranks at once; it returns only when every rank
// has read what it needed, so the input may change afterwards. Each byte is
// copied once, by the rank that receives it. Where MPI's non-blocking
// alltoall moves large blocks in rounds driven by MPI_Test calls, this runs
// each rank's reads back to back.
#include <cerrno>
#include <cstring>
#include <string>

#include "backends/shm/cma.h"
#include "backends/shm/shm_block.h"
#include "base/common.h"
#include "collectives/shm_collectives.h"

namespace commlib {

void alltoall_direct(ShmSegment& shm, const void* in, void* out, const std::vector<size_t>& matrix) {
  const int P = shm.size(), me = shm.rank();
  const std::vector<pid_t>& pids = shm.direct_read_pids();
  if (int(pids.size()) != P) throw Error(COMMLIB_ERR_INTERNAL, "alltoall_direct without direct reads");
  auto at = [&](int s, int d) { return matrix[size_t(s) * size_t(P) + size_t(d)]; };
  ShmBlock blk(shm);
  const uint64_t where = reinterpret_cast<uint64_t>(in);
  std::memcpy(blk.mine(), &where, sizeof(where));
  blk.post();
  char* dst = static_cast<char*>(out);
  size_t recv_off = 0;  // where the block of rank s starts in out
  int failed_errno = 0, failed_from = -1;
  for (int s = 0; s < P; ++s) {
    const size_t n = at(s, me);
    size_t send_off = 0;  // where rank s's block for me starts in its input
    for (int d = 0; d < me; ++d) send_off += at(s, d);
    if (s == me) {
      if (n > 0) std::memcpy(dst + recv_off, static_cast<const char*>(in) + send_off, n);
    } else if (n > 0) {
      blk.wait_posted(s);
      uint64_t addr = 0;
      std::memcpy(&addr, blk.region(s), sizeof(addr));
      if (failed_from < 0 && !read_from_process(pids[size_t(s)], addr + send_off, dst + recv_off, n)) {
        failed_errno = errno;
        failed_from = s;
      }
    }
    recv_off += n;
  }
  blk.finish();
  blk.wait_all_finished();  // (nobody reads this rank's input any more)
  if (failed_from >= 0) {
    throw Error(COMMLIB_ERR_INTERNAL, "alltoall: reading local rank " + std::to_string(failed_from) +
                                          "'s input failed: " + std::strerror(failed_errno));
  }
}

}  // namespace commlib
