// Single-copy broadcast among the ranks of one host: the root publishes
// where its buffer is (in its region of the shared segment) and every other
// rank reads the bytes straight from it into its own buffer
// (process_vm_readv), all at once; the root returns only when every rank has
// read, so its buffer may change afterwards. Each receiver copies each byte
// once and the root copies nothing, where broadcast_shm copies every byte
// twice (the root into its region, the receivers out of it).
#include <cerrno>
#include <cstring>
#include <string>

#include "backends/shm/cma.h"
#include "backends/shm/shm_block.h"
#include "base/common.h"
#include "collectives/shm_collectives.h"

namespace commlib {

void broadcast_direct(ShmSegment& shm, void* buf, size_t bytes, int root) {
  const std::vector<pid_t>& pids = shm.direct_read_pids();
  if (int(pids.size()) != shm.size()) throw Error(COMMLIB_ERR_INTERNAL, "broadcast_direct without direct reads");
  ShmBlock blk(shm);
  int failed_errno = 0;
  if (blk.rank() == root) {
    const uint64_t where = reinterpret_cast<uint64_t>(buf);
    std::memcpy(blk.mine(), &where, sizeof(where));
    blk.post();
  } else {
    blk.wait_posted(root);
    uint64_t addr = 0;
    std::memcpy(&addr, blk.region(root), sizeof(addr));
    if (!read_from_process(pids[size_t(root)], addr, buf, bytes)) failed_errno = errno;
  }
  blk.finish();
  if (blk.rank() == root) blk.wait_all_finished();  // (nobody reads the root's buffer any more)
  if (failed_errno) {
    throw Error(COMMLIB_ERR_INTERNAL, "broadcast: reading local rank " + std::to_string(root) +
                                          "'s buffer failed: " + std::strerror(failed_errno));
  }
}

}  // namespace commlib
