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
// post multiplies the result (Average's 1/N, a postscale): each rank scales
// the piece it reduces, as it reduces it, instead of a pass over the buffer.
// in (not null): the input, read where buf would have been and left
// unchanged; buf is then only written, the result (no copy of in into buf
// first: the piece a rank reduces is copied block by block, while in cache).
void allreduce_shm(ShmSegment& shm, Transport* cross, void* buf, size_t count, int dtype, int op,
                   double post = 1.0, const void* in = nullptr, int travel = -1);

}  // namespace commlib
