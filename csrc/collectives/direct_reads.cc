#include "collectives/direct_reads.h"

#include <cerrno>
#include <cstring>
#include <string>

#include "backends/shm/cma.h"
#include "base/common.h"

namespace commlib {

DirectReads::DirectReads(ShmSegment& shm, const void* mine) : shm_(shm), blk_(shm) {
  if (int(shm.direct_read_pids().size()) != shm.size()) {
    throw Error(COMMLIB_ERR_INTERNAL, "a single-copy collective without direct reads");
  }
  const uint64_t where = reinterpret_cast<uint64_t>(mine);
  std::memcpy(blk_.mine(), &where, sizeof(where));
  blk_.post();
}

void DirectReads::read(int s, size_t off, void* dst, size_t n) {
  if (n == 0 || failed_from_ >= 0) return;
  blk_.wait_posted(s);
  uint64_t addr = 0;
  std::memcpy(&addr, blk_.region(s), sizeof(addr));
  if (!read_from_process(shm_.direct_read_pids()[size_t(s)], addr + off, dst, n)) {
    failed_errno_ = errno;
    failed_from_ = s;
  }
}

void DirectReads::finish(bool wait_readers, const char* what) {
  blk_.finish();
  if (wait_readers) blk_.wait_all_finished();  // (nobody reads this rank's buffer any more)
  if (failed_from_ >= 0) {
    throw Error(COMMLIB_ERR_INTERNAL, std::string(what) + ": reading local rank " + std::to_string(failed_from_) +
                                          "'s buffer failed: " + std::strerror(failed_errno_));
  }
}

}  // namespace commlib
