#include "cma.h"

#include <sys/prctl.h>
#include <sys/uio.h>

#include <cerrno>

namespace commlib {

void allow_direct_reads() {
#ifdef PR_SET_PTRACER
  prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
#endif
}

bool read_from_process(pid_t pid, uint64_t remote, void* dst, size_t bytes) {
  char* out = static_cast<char*>(dst);
  size_t done = 0;
  while (done < bytes) {
    iovec local{out + done, bytes - done};
    iovec from{reinterpret_cast<void*>(remote + done), bytes - done};
    const ssize_t n = process_vm_readv(pid, &local, 1, &from, 1, 0);
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

}  // namespace commlib
