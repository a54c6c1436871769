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

uint64_t DirectReads::buffer_of(int r) {
  blk_.wait_posted(r);
  uint64_t addr = 0;
  std::memcpy(&addr, blk_.region(r), sizeof(addr));
  return addr;
}

void DirectReads::read(int s, size_t off, void* dst, size_t n) {
  if (n == 0 || failed_from_ >= 0) return;
  if (!read_from_process(shm_.direct_read_pids()[size_t(s)], buffer_of(s) + off, dst, n)) failed(s, false);
}

void DirectReads::failed(int peer, bool writing) {
  failed_errno_ = errno;
  failed_from_ = peer;
  failed_write_ = writing;
}

// A rank's region in the block: its buffer's address, then whether one of
// its writes into another rank's buffer failed.
constexpr size_t kWriteFailedAt = sizeof(uint64_t);

void DirectReads::write(int d, size_t off, const void* src, size_t n) {
  if (n == 0 || failed_from_ >= 0) return;
  if (!write_to_process(shm_.direct_read_pids()[size_t(d)], buffer_of(d) + off, src, n)) failed(d, true);
}

void DirectReads::finish(bool wait_readers, const char* what) {
  const uint32_t wrote_badly = failed_write_ ? 1 : 0;
  std::memcpy(blk_.mine() + kWriteFailedAt, &wrote_badly, sizeof(wrote_badly));
  blk_.finish();
  if (failed_from_ >= 0) {
    if (wait_readers) blk_.wait_all_finished();
    throw Error(COMMLIB_ERR_INTERNAL, std::string(what) + (failed_write_ ? ": writing to" : ": reading") +
                                          " local rank " + std::to_string(failed_from_) + "'s buffer failed: " +
                                          std::strerror(failed_errno_));
  }
  if (!wait_readers) return;
  blk_.wait_all_finished();  // (nobody reads or writes this rank's buffer any more)
  for (int r = 0; r < shm_.size(); ++r) {
    uint32_t bad = 0;
    std::memcpy(&bad, blk_.region(r) + kWriteFailedAt, sizeof(bad));
    if (r != shm_.rank() && bad) {
      throw Error(COMMLIB_ERR_INTERNAL, std::string(what) + ": local rank " + std::to_string(r) +
                                            " could not write its part into this rank's buffer");
    }
  }
}

}  // namespace commlib
