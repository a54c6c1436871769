// Fusion planning: which negotiated requests run as one fused allreduce.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "message.h"

namespace commlib {

// Which requests run as one fused allreduce: single-tensor allreduces
// (fusable[i]) of one process set, device type, dtype, op and scale factors, up to
// threshold bytes per group (half types count as float32, the type they are
// reduced in). Groups come in the order of their first member; a request that
// is not fusable is a group of its own. Both the coordinator and the response
// cache plan with it, so a request fuses the same way on either path.
// A request that may join a fused group: a single-tensor allreduce (a
// grouped allreduce is already one fused unit).
inline bool fusable_allreduce(const RequestDesc& d) {
  return d.op_type == COMMLIB_OP_ALLREDUCE && d.group_size < 0;
}

std::vector<std::vector<size_t>> plan_fusion(const std::vector<const RequestDesc*>& descs,
                                             const std::vector<bool>& fusable, int64_t threshold);

}  // namespace commlib
