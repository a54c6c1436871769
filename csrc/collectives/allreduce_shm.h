// All-reduce among the ranks of one host through the shared-memory segment.
#pragma once

#include <cstddef>

#include "backends/shm/shm.h"
#include "backends/transport.h"

namespace commlib {

// In-place all-reduce of count elements of buf (dtype not a half type; op
// not Average). Every rank of the segment must call it with the same count.
// With cross (ranks of this local rank on the other hosts), each reduced
// piece is also all-reduced across hosts before it is shared.
void allreduce_shm(ShmSegment& shm, Transport* cross, void* buf, size_t count, int dtype, int op);

}  // namespace commlib
