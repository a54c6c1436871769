#include "controller.h"

#include <map>
#include <sstream>
#include <tuple>

namespace commlib {
namespace {

// "rank 0, 2: [4, 4]; rank 1: [5]" from one value string per rank.
std::string by_rank(const std::vector<std::string>& values) {
  std::map<std::string, std::vector<int>> groups;
  std::vector<std::string> order;
  for (size_t r = 0; r < values.size(); ++r) {
    if (!groups.count(values[r])) order.push_back(values[r]);
    groups[values[r]].push_back(int(r));
  }
  std::ostringstream out;
  for (size_t i = 0; i < order.size(); ++i) {
    const auto& ranks = groups[order[i]];
    out << (i ? "; " : "") << (ranks.size() > 1 ? "ranks " : "rank ");
    for (size_t j = 0; j < ranks.size(); ++j) out << (j ? ", " : "") << ranks[j];
    out << ": " << order[i];
  }
  return out.str();
}

template <typename F>
bool differs(const std::vector<RequestDesc>& d, F field) {
  for (size_t r = 1; r < d.size(); ++r)
    if (field(d[r]) != field(d[0])) return true;
  return false;
}

std::string fmt_double(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

bool uses_reduce_op(int op_type) {
  return op_type == COMMLIB_OP_ALLREDUCE || op_type == COMMLIB_OP_REDUCESCATTER;
}

bool first_dim_may_differ(int op_type) {
  return op_type == COMMLIB_OP_ALLGATHER || op_type == COMMLIB_OP_ALLTOALL;
}

}  // namespace

Controller::Controller(int size, int64_t fusion_threshold_bytes)
    : size_(size), fusion_threshold_(fusion_threshold_bytes) {}

std::string Controller::validate(const std::vector<RequestDesc>& d, int* code) {
  *code = COMMLIB_ERR_MISMATCH;
  const std::string what = std::string("'") + d[0].name + "'";
  auto mismatch = [&](const char* field, auto to_str) {
    std::vector<std::string> vals;
    for (const auto& x : d) vals.push_back(to_str(x));
    return std::string("Mismatched ") + field + " for " + what + " across ranks: " + by_rank(vals);
  };
  if (differs(d, [](const RequestDesc& x) { return x.op_type; }))
    return mismatch("collective operation", [](const RequestDesc& x) { return std::string(op_type_name(x.op_type)); });
  const int op = d[0].op_type;
  const std::string kind = std::string(op_type_name(op)) + " " + what;
  auto fail = [&](const char* field, auto to_str) {
    std::vector<std::string> vals;
    for (const auto& x : d) vals.push_back(to_str(x));
    return std::string("Mismatched ") + field + " for " + kind + " across ranks: " + by_rank(vals);
  };
  if (op == COMMLIB_OP_BARRIER) return "";
  if (differs(d, [](const RequestDesc& x) { return x.dtype; }))
    return fail("dtype", [](const RequestDesc& x) { return std::string(dtype_name(x.dtype)); });
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
           d[0].name + "." + std::to_string(k) + "') for " + kind + " across ranks: " + by_rank(vals);
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
  const std::string name = desc.name;
  Pending& p = table_[name];
  if (p.have.empty()) {
    p.descs.resize(size_);
    p.have.assign(size_, false);
    p.first_seen_us = now_us;
  }
  if (p.have[rank]) {  // cannot happen: enqueue rejects names in flight
    return;
  }
  p.have[rank] = true;
  p.descs[rank] = std::move(desc);
  ++p.count;
  if (first_left_ >= 0) {  // nothing can complete once a rank has left
    fail(name, first_left_);
    table_.erase(name);
    return;
  }
  if (p.count == size_) complete_.push_back(name);
}

void Controller::fail(const std::string& name, int left_rank) {
  Response e;
  e.kind = Response::kError;
  e.error_code = COMMLIB_ERR_NOT_INIT;
  e.error = "rank " + std::to_string(left_rank) + " called shutdown() before '" + name +
            "' could complete";
  e.names.push_back(name);
  errors_.push_back(std::move(e));
}

void Controller::rank_left(int rank) {
  // The leaving rank executes everything the coordinator sent it before its
  // acknowledgement, and nothing after: every request still open (even one
  // complete but not yet answered, or one it has submitted) fails.
  if (first_left_ < 0) first_left_ = rank;
  for (const auto& entry : table_) fail(entry.first, rank);
  table_.clear();
  complete_.clear();
}

Response Controller::make_response(const std::string& name, Pending& p) {
  Response resp;
  resp.op_type = p.descs[0].op_type;
  resp.names.push_back(name);
  int code = 0;
  std::string err = validate(p.descs, &code);
  if (!err.empty()) {
    resp.kind = Response::kError;
    resp.error_code = code;
    resp.error = err;
    return resp;
  }
  if (resp.op_type == COMMLIB_OP_ALLGATHER) {
    for (const auto& d : p.descs) resp.rows.push_back(d.shape.empty() ? 1 : d.shape[0]);
  } else if (resp.op_type == COMMLIB_OP_ALLTOALL) {
    for (const auto& d : p.descs) resp.rows.insert(resp.rows.end(), d.splits.begin(), d.splits.end());
  }
  return resp;
}

std::vector<Response> Controller::take_ready() {
  std::vector<Response> out = std::move(errors_);
  errors_.clear();
  // Open fused allreduce per (dtype, op, prescale, postscale): index in out, bytes.
  std::map<std::tuple<int, int, double, double>, std::pair<size_t, int64_t>> open;
  for (const std::string& name : complete_) {
    auto it = table_.find(name);
    Pending& p = it->second;
    Response resp = make_response(name, p);
    const RequestDesc& d = p.descs[0];
    if (resp.kind == Response::kExecute && resp.op_type == COMMLIB_OP_ALLREDUCE &&
        d.group_size < 0) {  // a group is already one fused unit
      // Half dtypes are reduced in a float32 fusion buffer.
      const int64_t esize = is_half_dtype(d.dtype) ? 4 : int64_t(dtype_size(d.dtype));
      const int64_t bytes = num_elements(d.shape) * esize;
      auto key = std::make_tuple(d.dtype, d.reduce_op, d.prescale, d.postscale);
      auto o = open.find(key);
      if (o != open.end() && o->second.second + bytes <= fusion_threshold_) {
        out[o->second.first].names.push_back(name);
        o->second.second += bytes;
      } else {
        open[key] = {out.size(), bytes};
        out.push_back(std::move(resp));
      }
    } else {
      out.push_back(std::move(resp));
    }
    table_.erase(it);
  }
  complete_.clear();
  return out;
}

std::vector<std::string> Controller::stall_warnings(int64_t now_us, int64_t after_us) {
  std::vector<std::string> out;
  for (auto& [name, p] : table_) {
    if (p.warned || now_us - p.first_seen_us < after_us) continue;
    p.warned = true;
    std::string have, missing;
    for (int r = 0; r < size_; ++r) {
      std::string& s = p.have[r] ? have : missing;
      s += (s.empty() ? "" : ", ") + std::to_string(r);
    }
    out.push_back("'" + name + "' has waited " + std::to_string((now_us - p.first_seen_us) / 1000000) +
                  " s: submitted by ranks [" + have + "], still missing on ranks [" + missing +
                  "]. Check that every rank calls the same collectives with the same names.");
  }
  return out;
}

}  // namespace commlib
