// Fusion planning: which negotiated requests run as one fused collective.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "base/message.h"

namespace commlib {

// A request that may join a fused group: a single-tensor allreduce (a
// grouped allreduce is already one fused unit) on any device; an allgather
// or a reducescatter on the host (csrc/exec/fused_gathers.cc runs those); a
// broadcast of CUDA buffers (one root per group: exec/gpu_ops.h), or of at
// most kHostBroadcastFusionBytes on the host (exec/operations.h
// run_broadcast_fused).
bool fusable(const RequestDesc& d);

// A fused broadcast on the host packs and unpacks each byte once more than a
// broadcast of its own (into the outputs directly); that pays for small
// tensors only, whose own negotiation and execution cost more: 128 of 4 KiB
// took 14-18 us each, alone.
constexpr int64_t kHostBroadcastFusionBytes = int64_t(64) << 10;

// The bytes a request adds to its fused group: the reduced bytes of an
// allreduce (half types count as float32 on the host, where they are reduced
// in it), a reducescatter's input, an allgather's gathered result (rows: the
// response's rows of every rank; empty: this request's own rows only).
int64_t fusion_bytes(const RequestDesc& d, const std::vector<int64_t>& rows);

// Allgathers and reducescatters fuse up to this many bytes per group (or the
// threshold, if lower): a fused allgather copies every result out of the
// fusion buffer, which costs more than the call it saves once tensors are
// large (ZeRO's parameter buckets gather in place, unfused).
constexpr int64_t kGatherFusionBytes = int64_t(4) << 20;

// Which requests run as one fused collective: fusable[i] requests of one
// collective, process set, device type, dtype, op and scale factors (an
// allgather's dtype, op and scale factors do not matter), up to
// threshold bytes per group (bytes[i], or fusion_bytes(d, {}) when bytes is
// null; kGatherFusionBytes for allgathers and reducescatters). Groups come in the order of their first member; a request that is
// not fusable is a group of its own. Any rank's plan is valid (each point of
// the order is planned by one rank: the coordinator, or the rank of a host
// that completed a cached batch), so they need not plan from the same bytes.
std::vector<std::vector<size_t>> plan_fusion(const std::vector<const RequestDesc*>& descs,
                                             const std::vector<bool>& fusable, int64_t threshold,
                                             const std::vector<int64_t>* bytes = nullptr);

// A fused allgather's response carries every member's rows, one block of
// set-size words per member in the order of its names: member i's block.
std::vector<int64_t> member_rows(const std::vector<int64_t>& rows, size_t members, size_t i);

}  // namespace commlib
