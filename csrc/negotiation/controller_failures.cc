// The controller's failure paths: a rank's abort of a call it could not
// submit, a rank that left (shutdown), requests that timed out, and stall
// warnings. Each turns into error responses for the ranks that need them.
#include <algorithm>

#include "negotiation/controller.h"

namespace commlib {

void Controller::abort_request(int rank, const RequestDesc& d, const std::string& key,
                               const std::vector<int>& members) {
  if (meet_abort(key, rank, nullptr)) return;  // (failed already: another rank's abort)
  auto it = table_.find(key);
  if (it != table_.end() && (it->second.queued || it->second.answered)) return;  // (complete without it: joined)
  std::vector<int> submitted, remaining;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i] == rank || joined_[size_t(members[i])]) continue;  // (a joined rank never submits it)
    (it != table_.end() && it->second.have[i] ? submitted : remaining).push_back(members[i]);
  }
  if (it != table_.end()) table_.erase(it);
  // (only those whose request is here: an answer to any other rank could
  // meet a later request of the same name there)
  if (!submitted.empty()) reject(key, d.process_set, COMMLIB_ERR_MISMATCH, d.note, std::move(submitted));
  if (!remaining.empty()) aborted_[key].push_back(Aborted{d.note, std::move(remaining)});
}

bool Controller::meet_abort(const std::string& key, int rank, std::string* why) {
  auto it = aborted_.find(key);
  if (it == aborted_.end()) return false;
  std::deque<Aborted>& all = it->second;
  for (auto a = all.begin(); a != all.end(); ++a) {
    auto at = std::find(a->remaining.begin(), a->remaining.end(), rank);
    if (at == a->remaining.end()) continue;
    a->remaining.erase(at);
    if (why) *why = a->why;
    if (a->remaining.empty()) all.erase(a);
    if (all.empty()) aborted_.erase(it);
    return true;
  }
  return false;
}

void Controller::reject(const std::string& key, int process_set, int code, const std::string& why,
                        std::vector<int> to) {
  Response e;
  e.to = std::move(to);
  e.kind = Response::kError;
  e.process_set = process_set;
  e.error_code = code;
  e.error = why;
  e.names.push_back(key);
  errors_.push_back(std::move(e));
}

void Controller::fail(const std::string& key, int left_rank) {
  reject(key, 0, COMMLIB_ERR_NOT_INIT,
         "rank " + std::to_string(left_rank) + " called shutdown() before '" +
             std::string(key.c_str()) + "' could complete");
}

void Controller::rank_left(int rank) {
  // The leaving rank executes everything the coordinator sent it before its
  // acknowledgement, and nothing after: every request of its sets still open
  // (even one complete but not yet answered, or one it has submitted) fails.
  left_[size_t(rank)] = true;
  for (auto it = table_.begin(); it != table_.end();) {
    const std::vector<int>& m = it->second.ranks;
    if (std::find(m.begin(), m.end(), rank) == m.end()) {
      ++it;
      continue;
    }
    fail(it->first, rank);
    complete_.erase(std::remove(complete_.begin(), complete_.end(), it->first), complete_.end());
    it = table_.erase(it);
  }
}

void Controller::time_out(int64_t now_us, int64_t after_us) {
  for (auto it = table_.begin(); it != table_.end();) {
    Pending& p = it->second;
    const RequestDesc& d = present(p);
    if (p.queued || p.answered || d.op_type == COMMLIB_OP_JOIN || now_us - p.first_seen_us < after_us) {
      ++it;
      continue;
    }
    std::string have, missing;
    Response e;
    for (size_t i = 0; i < p.ranks.size(); ++i) {
      std::string& s = p.have[i] ? have : missing;
      s += (s.empty() ? "" : ", ") + std::to_string(p.ranks[i]);
      (p.have[i] ? e.to : timed_out_missing_).push_back(p.ranks[i]);
    }
    e.kind = Response::kError;
    e.process_set = p.process_set;
    e.error_code = COMMLIB_ERR_TIMED_OUT;
    e.error = std::string(op_type_name(d.op_type)) + " '" + d.name + "'" +
              (p.process_set ? " on process set " + std::to_string(p.process_set) : std::string()) +
              " timed out after " + std::to_string(after_us / 1000000) + " s (COMMLIB_TIMEOUT): submitted by ranks [" +
              have + "], never by ranks [" + missing + "] (did they fail, freeze, or call other collectives?)";
    e.names.push_back(it->first);
    errors_.push_back(std::move(e));
    it = table_.erase(it);
  }
}

std::vector<std::string> Controller::stall_warnings(int64_t now_us, int64_t after_us) {
  std::vector<std::string> out;
  for (auto& [name, p] : table_) {
    if (p.warned || now_us - p.first_seen_us < after_us) continue;
    p.warned = true;
    std::string have, missing;
    for (size_t i = 0; i < p.ranks.size(); ++i) {
      std::string& s = p.have[i] ? have : missing;
      s += (s.empty() ? "" : ", ") + std::to_string(p.ranks[i]);
    }
    const std::string where = p.process_set ? " (process set " + std::to_string(p.process_set) + ")" : "";
    out.push_back("'" + std::string(name.c_str()) + "'" + where + " has waited " + std::to_string((now_us - p.first_seen_us) / 1000000) +
                  " s: submitted by ranks [" + have + "], still missing on ranks [" + missing +
                  "]. Check that every rank calls the same collectives with the same names.");
  }
  return out;
}

}  // namespace commlib
