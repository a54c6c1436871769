// Single-copy broadcast among the ranks of one host: every other rank reads
// the root's bytes straight from its buffer (DirectReads), all at once; the
// root returns only when every rank has read, so its buffer may change
// afterwards. Each receiver copies each byte once and the root copies
// nothing, where broadcast_shm copies every byte twice (the root into its
// region, the receivers out of it).
#include "collectives/direct_reads.h"
#include "collectives/shm_collectives.h"

namespace commlib {

void broadcast_direct(ShmSegment& shm, void* buf, size_t bytes, int root) {
  DirectReads reads(shm, buf);
  if (shm.rank() != root) reads.read(root, 0, buf, bytes);
  reads.finish(shm.rank() == root, "broadcast");
}

}  // namespace commlib
