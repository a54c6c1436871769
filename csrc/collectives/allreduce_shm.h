// All-reduce among the ranks of one host through the shared-memory segment.
#pragma once

#include <cstddef>

#include "../transport/shm.h"

namespace commlib {

// In-place all-reduce of count elements of buf (dtype not a half type; op
// not Average). Every rank of the segment must call it with the same count.
void allreduce_shm(ShmSegment& shm, void* buf, size_t count, int dtype, int op);

}  // namespace commlib
