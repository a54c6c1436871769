#include "negotiation/fusion.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <tuple>

#include "base/common.h"

namespace commlib {

bool fusable(const RequestDesc& d) {
  switch (d.op_type) {
    case COMMLIB_OP_ALLREDUCE: return d.group_size < 0;
    case COMMLIB_OP_ALLGATHER:
    case COMMLIB_OP_REDUCESCATTER: return d.device_type == COMMLIB_DEVICE_CPU;
    case COMMLIB_OP_BROADCAST:  // (through a device buffer; on the host through the fusion buffer)
      return d.device_type == COMMLIB_DEVICE_CUDA ||
             num_elements(d.shape) * int64_t(dtype_size(d.dtype)) <= kHostBroadcastFusionBytes;
    default: return false;
  }
}

int64_t fusion_bytes(const RequestDesc& d, const std::vector<int64_t>& rows) {
  // (half types are widened on the host only; NCCL reduces them natively)
  const bool widened = d.op_type != COMMLIB_OP_ALLGATHER && is_half_dtype(d.dtype) &&
                       d.device_type == COMMLIB_DEVICE_CPU;
  const int64_t esize = widened ? 4 : int64_t(dtype_size(d.dtype));
  if (d.op_type != COMMLIB_OP_ALLGATHER || rows.empty()) return num_elements(d.shape) * esize;
  int64_t row = esize, total = 0;
  for (size_t i = 1; i < d.shape.size(); ++i) row *= d.shape[i];
  for (int64_t r : rows) total += r;
  return total * row;
}

std::vector<std::vector<size_t>> plan_fusion(const std::vector<const RequestDesc*>& descs,
                                             const std::vector<bool>& fusable, int64_t threshold,
                                             const std::vector<int64_t>* bytes) {
  std::vector<std::vector<size_t>> groups;
  // Open group per (collective, set, device, dtype, op, prescale, postscale): its index, its bytes.
  using Key = std::tuple<int, int, int, int, int, double, double>;
  std::map<Key, std::pair<size_t, int64_t>> open;
  for (size_t i = 0; i < descs.size(); ++i) {
    const RequestDesc& d = *descs[i];
    if (!fusable[i]) {
      groups.push_back({i});
      continue;
    }
    const int64_t b = bytes ? bytes->at(i) : fusion_bytes(d, {});
    // (allgathers and broadcasts move bytes: any dtypes fuse; broadcasts of one root)
    const bool gather = d.op_type == COMMLIB_OP_ALLGATHER, bytes_only = gather || d.op_type == COMMLIB_OP_BROADCAST;
    const Key key{d.op_type, d.process_set, d.device_type, bytes_only ? -1 : d.dtype,
                  d.op_type == COMMLIB_OP_BROADCAST ? d.root : (gather ? 0 : d.reduce_op),
                  bytes_only ? 1.0 : d.prescale, bytes_only ? 1.0 : d.postscale};
    const int64_t limit = d.op_type == COMMLIB_OP_ALLREDUCE || d.op_type == COMMLIB_OP_BROADCAST
                              ? threshold
                              : std::min(threshold, kGatherFusionBytes);
    auto o = open.find(key);
    if (o != open.end() && o->second.second + b <= limit) {
      groups[o->second.first].push_back(i);
      o->second.second += b;
    } else {
      open[key] = {groups.size(), b};
      groups.push_back({i});
    }
  }
  return groups;
}

std::vector<int64_t> member_rows(const std::vector<int64_t>& rows, size_t members, size_t i) {
  if (members <= 1) return rows;
  const size_t per = rows.size() / members;
  return std::vector<int64_t>(rows.begin() + std::ptrdiff_t(i * per), rows.begin() + std::ptrdiff_t((i + 1) * per));
}

}  // namespace commlib
