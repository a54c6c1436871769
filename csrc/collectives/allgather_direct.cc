// Single-copy allgather among the ranks of one host: every rank reads every
// other rank's contribution straight from its input into its output
// (DirectReads), all ranks at once, starting after itself so that ranks read
// different sources first; it returns only when every rank has read what it
// needed, so the input may change afterwards. Each byte is copied once by
// each rank that receives it, where allgather_shm copies it into the
// sender's region first.
#include <cstring>

#include "collectives/direct_reads.h"
#include "collectives/shm_collectives.h"

namespace commlib {

void allgather_direct(ShmSegment& shm, const void* in, void* out, const std::vector<size_t>& bytes) {
  const int P = shm.size(), me = shm.rank();
  std::vector<size_t> displ(P, 0);
  for (int r = 1; r < P; ++r) displ[r] = displ[r - 1] + bytes[r - 1];
  char* dst = static_cast<char*>(out);
  DirectReads reads(shm, in);
  if (dst + displ[me] != in) std::memcpy(dst + displ[me], in, bytes[me]);
  for (int k = 1; k < P; ++k) {
    const int s = (me + k) % P;
    reads.read(s, 0, dst + displ[s], bytes[s]);
  }
  reads.finish(true, "allgather");
}

}  // namespace commlib
