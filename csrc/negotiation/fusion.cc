#include "negotiation/fusion.h"

#include <cstdint>
#include <map>
#include <tuple>

#include "common.h"

namespace commlib {

std::vector<std::vector<size_t>> plan_fusion(const std::vector<const RequestDesc*>& descs,
                                             const std::vector<bool>& fusable, int64_t threshold) {
  std::vector<std::vector<size_t>> groups;
  // Open group per (set, device, dtype, op, prescale, postscale): its index, its bytes.
  std::map<std::tuple<int, int, int, int, double, double>, std::pair<size_t, int64_t>> open;
  for (size_t i = 0; i < descs.size(); ++i) {
    const RequestDesc& d = *descs[i];
    if (!fusable[i]) {
      groups.push_back({i});
      continue;
    }
    // (half types are widened on the host only; NCCL reduces them natively)
    const bool widened = is_half_dtype(d.dtype) && d.device_type == COMMLIB_DEVICE_CPU;
    const int64_t esize = widened ? 4 : int64_t(dtype_size(d.dtype));
    const int64_t bytes = num_elements(d.shape) * esize;
    const auto key = std::make_tuple(d.process_set, d.device_type, d.dtype, d.reduce_op, d.prescale, d.postscale);
    auto o = open.find(key);
    if (o != open.end() && o->second.second + bytes <= threshold) {
      groups[o->second.first].push_back(i);
      o->second.second += bytes;
    } else {
      open[key] = {groups.size(), bytes};
      groups.push_back({i});
    }
  }
  return groups;
}

}  // namespace commlib
