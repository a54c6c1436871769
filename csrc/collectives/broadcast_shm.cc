// Shared-memory broadcast: per window, the root copies its bytes into its
// region and posts; every other rank waits for the post and copies them out.
// Two region slots let the root fill window w+1 while others read window w
// (kShmWindowBytes).
#include <algorithm>
#include <cstring>

#include "backends/shm/shm_block.h"
#include "collectives/shm_collectives.h"

namespace commlib {

void broadcast_shm(ShmSegment& shm, void* buf, size_t bytes, int root) {
  char* data = static_cast<char*>(buf);
  for (size_t off = 0; off < bytes;) {
    ShmBlock blk(shm);
    const size_t len = std::min(std::min(blk.capacity(), kShmWindowBytes), bytes - off);
    if (blk.rank() == root) {
      std::memcpy(blk.mine(), data + off, len);
      blk.post();
    } else {
      blk.wait_posted(root);
      std::memcpy(data + off, blk.region(root), len);
    }
    blk.finish();
    off += len;
  }
}

}  // namespace commlib
