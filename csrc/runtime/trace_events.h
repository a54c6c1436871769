// What the engine records in the timeline (base/timeline.h) when a
// negotiated response has run on this rank.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/entry.h"
#include "base/message.h"

namespace commlib {

// For each entry of resp: its negotiation (from its submission, with whether
// it came through the response cache) and its execution from started_us to
// ended_us (operation, algorithm, bytes, the tensors fused with it).
void trace_execution(const Response& resp, const std::vector<Entry*>& entries, int64_t started_us,
                     int64_t ended_us, const std::string& algorithm);

// A request that failed, with the message (one that succeeded completed at
// the end of its execution span).
void trace_failure(const Entry& e, int status, const std::string& message, int64_t now_us);

}  // namespace commlib
