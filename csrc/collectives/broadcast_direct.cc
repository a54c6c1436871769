// Single-copy broadcast among the ranks of one host: every other rank reads
// the root's bytes straight from its buffer (DirectReads), all at once; the
// root returns only when every rank has read, so its buffer may change
// afterwards. Each receiver copies each byte once and the root copies
// nothing, where broadcast_shm copies every byte twice (the root into its
// region, the receivers out of it).
#include "collectives/direct_reads.h"
#include "collectives/shm_collectives.h"

namespace commlib {

// 2 ranks: the receiver reads the first half straight from the root's buffer
// while the root writes the second half straight into the receiver's, so each
// copies half the bytes, at once (as a large point-to-point message between
// two waiting ranks is copied, p2p/split_copy.cc).
void broadcast_split(ShmSegment& shm, void* buf, size_t bytes, int root) {
  DirectReads io(shm, buf);
  const size_t half = bytes / 2 / 4096 * 4096;  // (page-aligned halves)
  char* const data = static_cast<char*>(buf);
  if (shm.rank() == root) {
    io.write(1 - root, half, data + half, bytes - half);
  } else {
    io.read(root, 0, data, half);
  }
  io.finish(true, "broadcast");
}

void broadcast_direct(ShmSegment& shm, void* buf, size_t bytes, int root) {
  DirectReads reads(shm, buf);
  if (shm.rank() != root) reads.read(root, 0, buf, bytes);
  reads.finish(shm.rank() == root, "broadcast");
}

}  // namespace commlib
