// One window of an Adasum allreduce: the tensors packed end to end into the
// fusion buffer (half types widened to float32 there, the prescale factor
// applied as they are packed), combined by allreduce_adasum with each
// tensor's own coefficients, and copied out with the postscale factor (half
// types rounded back once). Adasum never takes the shared segment or MPI's
// own collective: neither can combine adaptively.
#include <cstring>
#include <vector>

#include "base/common.h"
#include "base/half.h"
#include "base/reduce.h"
#include "base/timeline.h"
#include "collectives/allreduce.h"
#include "exec/operations.h"

namespace commlib {

void reduce_window_adasum(OpContext& ctx, const Member* first, const Member* last, int dtype,
                          double pre, double post) {
  note_algorithm("adasum");
  const bool half = is_half_dtype(dtype);
  const int work = half ? COMMLIB_FLOAT32 : dtype;
  const size_t esize = dtype_size(work);
  std::vector<size_t> counts;
  size_t total = 0;
  for (const Member* m = first; m != last; ++m) {
    counts.push_back(m->count);
    total += m->count;
  }
  if (total == 0) return;
  char* buf = ctx.fusion.get(total * esize);
  size_t off = 0;
  for (const Member* m = first; m != last; off += m->count * esize, ++m) {
    if (m->count == 0) continue;
    if (half) {
      half_to_float(dtype, m->input, reinterpret_cast<float*>(buf + off), m->count, pre);
    } else {
      std::memcpy(buf + off, m->input, m->count * esize);
    }
  }
  if (!half) scale_buffer(work, buf, total, pre);
  allreduce_adasum(ctx.transport, buf, work, counts);
  if (!half) scale_buffer(work, buf, total, post);
  off = 0;
  for (const Member* m = first; m != last; off += m->count * esize, ++m) {
    if (m->count == 0) continue;
    if (half) {
      float_to_half(dtype, reinterpret_cast<const float*>(buf + off), m->output, m->count, post);
    } else {
      std::memcpy(m->output, buf + off, m->count * esize);
    }
  }
}

}  // namespace commlib
