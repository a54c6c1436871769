#include "p2p/cma.h"

#include <sys/prctl.h>
#include <sys/uio.h>

#include <cerrno>

namespace commlib {

void allow_direct_reads() {
#ifdef PR_SET_PTRACER
  prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
#endif
}

namespace {

// Moves bytes between local memory and address `remote` of `pid`, resuming
// after partial transfers.
template <typename Call>
bool cross_copy(Call call, char* local_buf, uint64_t remote, size_t bytes) {
  size_t done = 0;
  while (done < bytes) {
    iovec local{local_buf + done, bytes - done};
    iovec other{reinterpret_cast<void*>(remote + done), bytes - done};
    const ssize_t n = call(&local, &other);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (n == 0) {
      errno = EFAULT;
      return false;
    }
    done += size_t(n);
  }
  return true;
}

}  // namespace

bool read_from_process(pid_t pid, uint64_t remote, void* dst, size_t bytes) {
  return cross_copy([pid](iovec* local, iovec* other) { return process_vm_readv(pid, local, 1, other, 1, 0); },
                    static_cast<char*>(dst), remote, bytes);
}

bool write_to_process(pid_t pid, uint64_t remote, const void* src, size_t bytes) {
  return cross_copy([pid](iovec* local, iovec* other) { return process_vm_writev(pid, local, 1, other, 1, 0); },
                    static_cast<char*>(const_cast<void*>(src)), remote, bytes);
}

}  // namespace commlib
