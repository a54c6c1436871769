#include "runtime/trace_events.h"

#include "base/common.h"
#include "base/timeline.h"

namespace commlib {
namespace {

// Fused names listed in an execution's args (the count is always given).
constexpr size_t kMaxFusedNames = 16;

}  // namespace

void trace_execution(const Response& resp, const std::vector<Entry*>& entries, int64_t started_us,
                     int64_t ended_us, const std::string& algorithm) {
  Timeline& t = timeline();
  int64_t total = 0;
  std::string fused = "[";
  for (size_t i = 0; i < entries.size(); ++i) {
    total += entry_bytes(*entries[i]);
    if (i < kMaxFusedNames) fused += (i ? ", " : "") + json_string(entries[i]->desc.name);
  }
  fused += "]";
  const std::string shared = ", \"algorithm\": " + json_string(algorithm) + ", \"process_set\": " +
                             std::to_string(resp.process_set) + ", \"fused_count\": " +
                             std::to_string(entries.size()) + ", \"fused_bytes\": " + std::to_string(total) +
                             ", \"fused_with\": " + fused;
  for (const Entry* e : entries) {
    const bool stand_in = e->submitted_us == 0;  // a joined rank's (runtime/join.h)
    if (!stand_in) {
      t.span(e->desc.name, "NEGOTIATE", e->submitted_us, started_us,
             std::string("\"cache_hit\": ") + (e->cached_since_us > 0 ? "true" : "false"));
    }
    t.span(e->desc.name, op_type_name(resp.op_type), started_us, ended_us,
           "\"bytes\": " + std::to_string(entry_bytes(*e)) + shared +
               (stand_in ? ", \"joined_stand_in\": true" : ""));
  }
}

void trace_failure(const Entry& e, int status, const std::string& message, int64_t now_us) {
  timeline().mark(e.desc.name, "ERROR", now_us,
                  "\"status\": " + std::to_string(status) + ", \"message\": " + json_string(message));
}

}  // namespace commlib
