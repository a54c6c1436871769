// Result buffers of allgather/alltoall, handed to the caller without a copy.
//
// Large buffers come from mmap (glibc's threshold is at most 32 MiB) and go
// back to the kernel when freed, so every large call would fault its result
// in afresh: ~2 us per 4 KiB page here, 33 ms for 64 MiB, five times the
// collective itself. Freed large buffers are therefore kept (already
// touched) and reused for a later result of a similar size, up to
// COMMLIB_RESULT_CACHE_BYTES in total (default 512 MiB; 0 disables).
#pragma once

#include <cstddef>

namespace commlib {

// A buffer of at least `bytes` bytes (never null; throws std::bad_alloc).
char* result_alloc(size_t bytes);
// Releases a buffer from result_alloc (null is ignored).
void result_free(void* p);
// The most bytes kept (COMMLIB_RESULT_CACHE_BYTES, set at init); buffers
// over it are released as they are freed.
void result_pool_set_limit(size_t bytes);

}  // namespace commlib
