#include "runtime/join.h"

#include <memory>

#include "base/common.h"
#include "exec/operations.h"

namespace commlib {
namespace {

constexpr size_t kAlign = 64;

size_t aligned(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

}  // namespace

Entry joined_entry(const RequestDesc& d, int set_rank, int set_size) {
  Entry e;
  e.handle = std::make_shared<HandleState>();  // (nobody waits on it)
  e.desc = d;
  e.stand_in = true;
  if (d.op_type == COMMLIB_OP_ALLGATHER || d.op_type == COMMLIB_OP_ALLTOALL) {
    if (!e.desc.shape.empty()) e.desc.shape[0] = 0;  // sends no rows
    e.desc.splits.assign(size_t(set_size), 0);
  }
  if (d.device_type != COMMLIB_DEVICE_CPU) return e;
  const size_t esize = dtype_size(d.dtype);
  size_t row_elems = 1;
  for (size_t i = 1; i < d.shape.size(); ++i) row_elems *= size_t(d.shape[i]);
  const size_t n = size_t(num_elements(d.shape));
  switch (d.op_type) {
    case COMMLIB_OP_ALLREDUCE:
      if (d.group_size >= 0) {
        std::vector<std::pair<int, size_t>> parts;  // (dtype, count) per member
        size_t total = 0;
        for (size_t i = 0; i + 1 < d.members.size();) {
          const int dtype = int(d.members[i]);
          const size_t ndim = size_t(d.members[i + 1]);
          size_t count = 1;
          for (size_t k = 0; k < ndim; ++k) count *= size_t(d.members[i + 2 + k]);
          parts.emplace_back(dtype, count);
          total += aligned(count * dtype_size(dtype));
          i += 2 + ndim;
        }
        e.scratch.assign(total + 1, 0);
        size_t off = 0;
        for (const auto& [dtype, count] : parts) {
          e.members.push_back({dtype, count, e.scratch.data() + off, e.scratch.data() + off});
          off += aligned(count * dtype_size(dtype));
        }
      } else {
        e.scratch.assign(n * esize + 1, 0);
      }
      break;
    case COMMLIB_OP_BROADCAST:
      e.scratch.assign(n * esize + 1, 0);
      break;
    case COMMLIB_OP_REDUCESCATTER: {
      const size_t mine = size_t(reducescatter_rows(d, set_size, set_rank)) * row_elems * esize;
      e.scratch.assign(aligned(n * esize) + mine + 1, 0);
      e.output = e.scratch.data() + aligned(n * esize);
      break;
    }
    case COMMLIB_OP_ALLGATHER:
    case COMMLIB_OP_ALLTOALL:
      e.scratch.assign(1, 0);
      break;
    default:  // barrier: nothing moves
      break;
  }
  if (!e.scratch.empty()) {
    e.input = e.scratch.data();
    // (an allgather's result is the core's own: it sends no rows, so it has no out)
    if (!e.output && d.op_type != COMMLIB_OP_ALLGATHER) e.output = e.scratch.data();
  }
  return e;
}

}  // namespace commlib
