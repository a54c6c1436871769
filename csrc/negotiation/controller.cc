#include "negotiation/controller.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <tuple>

#include "negotiation/fusion.h"

namespace commlib {
namespace {

// "rank 0, 2: [4, 4]; rank 1: [5]" from one value string per rank
// (values[i] is job rank ranks[i]'s).
std::string by_rank(const std::vector<std::string>& values, const std::vector<int>& ranks) {
  std::map<std::string, std::vector<int>> groups;
  std::vector<std::string> order;
  for (size_t i = 0; i < values.size(); ++i) {
    if (!groups.count(values[i])) order.push_back(values[i]);
    groups[values[i]].push_back(ranks[i]);
  }
  // (no iostreams in the core: on a GPU machine a rank crashed formatting an
  // int into an ostringstream, with another C++ runtime in the process)
  std::string out;
  for (size_t i = 0; i < order.size(); ++i) {
    const auto& rs = groups[order[i]];
    out += std::string(i ? "; " : "") + (rs.size() > 1 ? "ranks " : "rank ");
    for (size_t j = 0; j < rs.size(); ++j) out += (j ? ", " : "") + std::to_string(rs[j]);
    out += ": " + order[i];
  }
  return out;
}

template <typename F>
bool differs(const std::vector<RequestDesc>& d, F field) {
  for (size_t r = 1; r < d.size(); ++r)
    if (field(d[r]) != field(d[0])) return true;
  return false;
}

std::string fmt_double(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

bool uses_reduce_op(int op_type) {
  return op_type == COMMLIB_OP_ALLREDUCE || op_type == COMMLIB_OP_REDUCESCATTER;
}

bool first_dim_may_differ(int op_type) {
  return op_type == COMMLIB_OP_ALLGATHER || op_type == COMMLIB_OP_ALLTOALL;
}

}  // namespace

Controller::Controller(int size, int64_t fusion_threshold_bytes)
    : size_(size), fusion_threshold_(fusion_threshold_bytes), left_(size_t(size), false), joined_(size_t(size), false) {
  for (int r = 0; r < size; ++r) sets_[0].push_back(r);
}

std::string Controller::validate(const std::vector<RequestDesc>& d, const std::vector<int>& ranks,
                                 int* code) {
  *code = COMMLIB_ERR_MISMATCH;
  const std::string what = std::string("'") + d[0].name + "'";
  auto mismatch = [&](const char* field, auto to_str) {
    std::vector<std::string> vals;
    for (const auto& x : d) vals.push_back(to_str(x));
    return std::string("Mismatched ") + field + " for " + what + " across ranks: " + by_rank(vals, ranks);
  };
  if (differs(d, [](const RequestDesc& x) { return x.op_type; }))
    return mismatch("collective operation", [](const RequestDesc& x) { return std::string(op_type_name(x.op_type)); });
  const int op = d[0].op_type;
  const std::string kind = std::string(op_type_name(op)) + " " + what;
  auto fail = [&](const char* field, auto to_str) {
    std::vector<std::string> vals;
    for (const auto& x : d) vals.push_back(to_str(x));
    return std::string("Mismatched ") + field + " for " + kind + " across ranks: " + by_rank(vals, ranks);
  };
  if (op == COMMLIB_OP_BARRIER || op == COMMLIB_OP_JOIN) return "";
  if (op == COMMLIB_OP_ADD_PROCESS_SET) {
    if (differs(d, [](const RequestDesc& x) { return x.splits; }))
      return fail("process set ranks", [](const RequestDesc& x) { return shape_str(x.splits); });
    return "";
  }
  if (op == COMMLIB_OP_REMOVE_PROCESS_SET) {
    if (differs(d, [](const RequestDesc& x) { return x.root; }))
      return fail("process set id", [](const RequestDesc& x) { return std::to_string(x.root); });
    return "";
  }
  if (differs(d, [](const RequestDesc& x) { return x.device_type; }))
    return fail("device", [](const RequestDesc& x) { return std::string(x.device_type ? "cuda" : "cpu"); });
  if (differs(d, [](const RequestDesc& x) { return x.dtype; }))
    return fail("dtype", [](const RequestDesc& x) { return std::string(dtype_name(x.dtype)); });
  if (op == COMMLIB_OP_REDUCESCATTER && differs(d, [](const RequestDesc& x) { return x.splits; }))
    return fail("splits", [](const RequestDesc& x) { return x.splits.empty() ? std::string("None") : shape_str(x.splits); });
  if (uses_reduce_op(op)) {
    if (differs(d, [](const RequestDesc& x) { return x.reduce_op; }))
      return fail("reduction op", [](const RequestDesc& x) { return std::string(reduce_op_name(x.reduce_op)); });
    if (differs(d, [](const RequestDesc& x) { return x.prescale; }))
      return fail("prescale_factor", [](const RequestDesc& x) { return fmt_double(x.prescale); });
    if (differs(d, [](const RequestDesc& x) { return x.postscale; }))
      return fail("postscale_factor", [](const RequestDesc& x) { return fmt_double(x.postscale); });
  }
  if (differs(d, [](const RequestDesc& x) { return x.group_size; }))
    return fail("number of grouped tensors", [](const RequestDesc& x) { return std::to_string(x.group_size); });
  if (d[0].group_size >= 0 && differs(d, [](const RequestDesc& x) { return x.members; })) {
    std::vector<std::vector<std::string>> m;
    for (const auto& x : d) m.push_back(describe_members(x));
    size_t k = 0;
    while (k < m[0].size()) {
      bool same = true;
      for (const auto& v : m) same &= v[k] == m[0][k];
      if (!same) break;
      ++k;
    }
    std::vector<std::string> vals;
    for (const auto& v : m) vals.push_back(v[k]);
    return std::string("Mismatched dtype/shape of grouped tensor ") + std::to_string(k) + " ('" +
           d[0].name + "." + std::to_string(k) + "') for " + kind + " across ranks: " + by_rank(vals, ranks);
  }
  if (op == COMMLIB_OP_BROADCAST && differs(d, [](const RequestDesc& x) { return x.root; }))
    return fail("root rank", [](const RequestDesc& x) { return std::to_string(x.root); });
  if (first_dim_may_differ(op)) {
    auto tail = [](const RequestDesc& x) {
      std::vector<int64_t> t(x.shape.begin() + (x.shape.empty() ? 0 : 1), x.shape.end());
      return std::to_string(x.shape.size()) + ":" + shape_str(t);
    };
    if (differs(d, tail))
      return fail("shape (dimensions after the first)", [](const RequestDesc& x) { return shape_str(x.shape); });
  } else if (differs(d, [](const RequestDesc& x) { return x.shape; })) {
    return fail("shape", [](const RequestDesc& x) { return shape_str(x.shape); });
  }
  return "";
}

void Controller::add(int rank, RequestDesc desc, int64_t now_us) {
  const std::string key = request_key(desc);
  const int ps = desc.process_set;
  auto set = sets_.find(ps);
  if (set == sets_.end()) {  // removed meanwhile (the caller checks membership)
    reject(key, ps, COMMLIB_ERR_VALUE, "process set " + std::to_string(ps) + " does not exist (removed?)");
    return;
  }
  const std::vector<int>& members = set->second;
  const auto at = std::find(members.begin(), members.end(), rank);
  if (at == members.end()) {
    reject(key, ps, COMMLIB_ERR_VALUE, "rank " + std::to_string(rank) + " is not a member of process set " +
                                           std::to_string(ps) + " " + ranks_str(members));
    return;
  }
  const size_t idx = size_t(at - members.begin());
  if (desc.op_type == COMMLIB_OP_ABORT) {
    abort_request(rank, desc, key, members);
    return;
  }
  if (std::string why; !aborted_.empty() && meet_abort(key, rank, &why)) {  // (its abort came first)
    reject(key, ps, COMMLIB_ERR_MISMATCH, why, {rank});
    return;
  }
  Pending& p = table_[key];
  if (p.have.empty()) {
    p.process_set = ps;
    p.ranks = members;
    p.descs.resize(members.size());
    p.have.assign(members.size(), false);
    p.first_seen_us = now_us;
  }
  p.first_seen_us = std::min(p.first_seen_us, now_us - desc.waited_us);
  if (p.have[idx]) {  // cannot happen: enqueue rejects names in flight
    return;
  }
  const bool join = desc.op_type == COMMLIB_OP_JOIN;
  p.have[idx] = true;
  p.descs[idx] = std::move(desc);
  ++p.count;
  if (const int gone = left_member(p.ranks); gone >= 0) {  // it cannot complete
    fail(key, gone);
    table_.erase(key);
    return;
  }
  if (join) on_join(rank);  // (what it completes runs before the join itself)
  if (complete_now(p)) queue(key, p);
}

void Controller::on_join(int rank) {
  if (!joined_[size_t(rank)]) ++joined_count_;
  joined_[size_t(rank)] = true;
  last_joined_ = rank;
  // An abort that waits for this rank is complete without it, as a request
  // submitted before the join is.
  for (auto it = aborted_.begin(); it != aborted_.end();) {
    std::deque<Aborted>& all = it->second;
    for (auto a = all.begin(); a != all.end();) {
      a->remaining.erase(std::remove(a->remaining.begin(), a->remaining.end(), rank), a->remaining.end());
      a = a->remaining.empty() ? all.erase(a) : a + 1;
    }
    it = all.empty() ? aborted_.erase(it) : std::next(it);
  }
  for (auto& [key, p] : table_)
    if (present(p).op_type != COMMLIB_OP_JOIN && complete_now(p)) queue(key, p);
}

bool Controller::complete_now(const Pending& p) const {
  if (p.queued || p.answered) return false;
  int n = p.count;
  if (present(p).op_type != COMMLIB_OP_JOIN)
    for (size_t i = 0; i < p.ranks.size(); ++i) n += !p.have[i] && joined_[size_t(p.ranks[i])] ? 1 : 0;
  return n == int(p.ranks.size());
}

void Controller::queue(const std::string& key, Pending& p) {
  p.queued = true;
  complete_.push_back(key);
}

const RequestDesc& Controller::present(const Pending& p) {
  return p.descs[size_t(std::find(p.have.begin(), p.have.end(), true) - p.have.begin())];
}

// Requests a joined rank cannot take part in.
std::string Controller::check_joined(const Pending& p) const {
  const RequestDesc& d = present(p);
  for (size_t i = 0; i < p.ranks.size(); ++i) {
    if (p.have[i]) continue;
    const std::string who = "rank " + std::to_string(p.ranks[i]) + " has called join()";
    if (d.op_type == COMMLIB_OP_BROADCAST && d.root == p.ranks[i])
      return who + ", so it cannot be the root of broadcast '" + d.name + "'";
    if (d.op_type == COMMLIB_OP_ADD_PROCESS_SET || d.op_type == COMMLIB_OP_REMOVE_PROCESS_SET)
      return who + "; process sets cannot change until every rank has joined";
  }
  return "";
}

std::string Controller::add_set(const std::vector<int64_t>& ranks, int64_t* id) {
  std::vector<int> members;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= size_ || (i > 0 && ranks[i] <= ranks[i - 1]))
      return "process set ranks " + shape_str(ranks) + " must be distinct ranks of the job (0.." +
             std::to_string(size_ - 1) + "), in ascending order";
    members.push_back(int(ranks[i]));
  }
  if (members.empty()) return "a process set needs at least one rank";
  for (const auto& [k, v] : sets_)
    if (v == members) return "a process set with ranks " + ranks_str(members) + " already exists (id " + std::to_string(k) + ")";
  *id = next_set_id_++;
  sets_[int(*id)] = members;
  return "";
}

std::string Controller::remove_set(int id) {
  if (id == 0) return "the global process set (id 0) cannot be removed";
  if (!sets_.count(id)) return "process set " + std::to_string(id) + " does not exist";
  // Every rank gets the same answer: removal waits for no collective.
  for (const auto& [key, p] : table_) {
    // (one answered earlier in this batch runs before the removal: not pending)
    if (p.process_set != id || p.answered) continue;
    std::string have;
    for (size_t i = 0; i < p.ranks.size(); ++i)
      if (p.have[i]) have += (have.empty() ? "" : ", ") + std::to_string(p.ranks[i]);
    return "cannot remove process set " + std::to_string(id) + " while '" + std::string(key.c_str()) +
           "' is pending on it (submitted by ranks [" + have + "]); synchronize it first";
  }
  sets_.erase(id);
  return "";
}

Response Controller::make_response(const std::string& key, Pending& p) {
  Response resp;
  resp.op_type = present(p).op_type;
  resp.process_set = p.process_set;
  resp.names.push_back(key);
  int code = COMMLIB_ERR_VALUE;
  std::string err = check_joined(p);
  if (err.empty() && p.count == int(p.ranks.size())) {
    err = validate(p.descs, p.ranks, &code);
  } else if (err.empty()) {  // some members joined: among the ranks that submitted it
    std::vector<RequestDesc> descs;
    std::vector<int> ranks;
    for (size_t i = 0; i < p.ranks.size(); ++i)
      if (p.have[i]) {
        descs.push_back(p.descs[i]);
        ranks.push_back(p.ranks[i]);
      }
    err = validate(descs, ranks, &code);
  }
  if (err.empty() && resp.op_type == COMMLIB_OP_ADD_PROCESS_SET) {
    int64_t id = 0;
    err = add_set(p.descs[0].splits, &id);
    code = COMMLIB_ERR_VALUE;
    resp.rows = {id};
  } else if (err.empty() && resp.op_type == COMMLIB_OP_REMOVE_PROCESS_SET) {
    err = remove_set(p.descs[0].root);
    code = COMMLIB_ERR_VALUE;
  }
  if (!err.empty()) {
    resp.kind = Response::kError;
    resp.error_code = code;
    resp.error = err;
    return resp;
  }
  // (a joined rank sends no rows)
  for (size_t i = 0; i < p.ranks.size(); ++i) {
    const RequestDesc& d = p.descs[i];
    if (resp.op_type == COMMLIB_OP_ALLGATHER) {
      resp.rows.push_back(!p.have[i] ? 0 : d.shape.empty() ? 1 : d.shape[0]);
    } else if (resp.op_type == COMMLIB_OP_ALLTOALL) {
      if (p.have[i]) {
        resp.rows.insert(resp.rows.end(), d.splits.begin(), d.splits.end());
      } else {
        resp.rows.insert(resp.rows.end(), p.ranks.size(), 0);
      }
    }
  }
  if (resp.op_type == COMMLIB_OP_JOIN) {  // every rank has joined: the join is over
    resp.rows = {last_joined_};
    joined_.assign(size_t(size_), false);
    joined_count_ = 0;
    last_joined_ = -1;
  }
  resp.to = p.ranks;
  return resp;
}

std::vector<Response> Controller::take_ready() {
  std::vector<Response> out = std::move(errors_);
  errors_.clear();
  std::vector<Response> resps;
  std::vector<const RequestDesc*> descs;
  std::vector<bool> may_fuse;
  std::vector<int64_t> bytes;
  // While ranks have joined, every response says what it runs (a joined rank
  // runs it with buffers of its own).
  const bool with_descs = joined_count_ > 0;
  for (const std::string& key : complete_) {  // (table_ stays intact until the plan is made)
    Pending& p = table_.at(key);
    resps.push_back(make_response(key, p));
    p.answered = true;
    descs.push_back(&present(p));
    if (with_descs && resps.back().kind == Response::kExecute) resps.back().descs = {present(p)};
    may_fuse.push_back(resps.back().kind == Response::kExecute && fusable(present(p)));
    bytes.push_back(fusion_bytes(present(p), resps.back().rows));
  }
  for (const auto& group : plan_fusion(descs, may_fuse, fusion_threshold_, &bytes)) {
    Response& first = resps[group[0]];
    for (size_t k = 1; k < group.size(); ++k) {
      const Response& other = resps[group[k]];
      first.names.push_back(other.names[0]);
      if (first.op_type == COMMLIB_OP_ALLGATHER) first.rows.insert(first.rows.end(), other.rows.begin(), other.rows.end());
      if (with_descs) first.descs.push_back(other.descs.at(0));
    }
    out.push_back(std::move(first));
  }
  for (const std::string& key : complete_) table_.erase(key);
  complete_.clear();
  return out;
}

}  // namespace commlib
