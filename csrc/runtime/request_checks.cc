#include "runtime/request_checks.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "base/common.h"
#include "base/reduce.h"

namespace commlib {
namespace {

// sum += x for sizes checked one by one against a total: false (sum left as
// it was) once the sizes pass `total` (x and sum non-negative), so a sum
// never wraps around (2**63 - 1 twice, plus 2, would add up to 0).
bool add_within(int64_t& sum, int64_t x, int64_t total) {
  if (x > total - sum) return false;
  sum += x;
  return true;
}


constexpr int kMaxDims = 64;

// A reducescatter's input in pieces: CPU only, no `input`, piece sizes that
// add up to the tensor's elements.
void validate_pieces(const commlib_request& q, int64_t n) {
  if (q.op_type != COMMLIB_OP_REDUCESCATTER || q.device_type != COMMLIB_DEVICE_CPU) {
    throw Error(COMMLIB_ERR_VALUE, "an input in pieces is supported by CPU reducescatter only");
  }
  if (q.npieces < 0 || !q.pieces || !q.piece_elements || q.input) {
    throw Error(COMMLIB_ERR_VALUE, "reducescatter pieces: needs npieces > 0, the pieces and their "
                                   "sizes, and no input buffer");
  }
  int64_t sum = 0;
  for (int i = 0; i < q.npieces; ++i) {
    if (q.piece_elements[i] < 0) throw Error(COMMLIB_ERR_VALUE, "reducescatter pieces must have non-negative sizes");
    if (!add_within(sum, q.piece_elements[i], n)) {
      throw Error(COMMLIB_ERR_VALUE, "reducescatter pieces hold more than the tensor's " + std::to_string(n) +
                                         " elements");
    }
  }
  if (sum != n) {
    throw Error(COMMLIB_ERR_VALUE, "reducescatter pieces hold " + std::to_string(sum) +
                                       " elements, the tensor's shape " + std::to_string(n));
  }
}

}  // namespace

void validate_request(const commlib_request& q, const std::vector<int>& members) {
  if ((q.op_type < COMMLIB_OP_ALLREDUCE || q.op_type > COMMLIB_OP_BARRIER) && q.op_type != COMMLIB_OP_JOIN)
    throw Error(COMMLIB_ERR_VALUE, "unknown collective operation " + std::to_string(q.op_type));
  if (!q.name || !*q.name) throw Error(COMMLIB_ERR_VALUE, "a collective needs a non-empty name");
  if (q.op_type == COMMLIB_OP_JOIN && q.process_set != 0)
    throw Error(COMMLIB_ERR_VALUE, "join() runs over every rank of the job, not over a process set");
  if (q.op_type == COMMLIB_OP_BARRIER || q.op_type == COMMLIB_OP_JOIN) return;
  if (!is_valid_dtype(q.dtype))
    throw Error(COMMLIB_ERR_TYPE, "unsupported dtype code " + std::to_string(q.dtype));
  if (q.ndim < 0 || (q.ndim > 0 && !q.shape)) throw Error(COMMLIB_ERR_VALUE, "invalid shape");
  for (int i = 0; i < q.ndim; ++i)
    if (q.shape[i] < 0) throw Error(COMMLIB_ERR_VALUE, "negative dimension in shape");
  const char* what = op_type_name(q.op_type);
  if (q.op_type == COMMLIB_OP_ALLREDUCE || q.op_type == COMMLIB_OP_REDUCESCATTER) {
    if (q.reduce_op == COMMLIB_ADASUM && q.op_type != COMMLIB_OP_ALLREDUCE)
      throw Error(COMMLIB_ERR_VALUE, std::string(what) + " does not support op Adasum (allreduce only)");
    if (q.reduce_op == COMMLIB_ADASUM && !is_float_dtype(q.dtype)) {
      throw Error(COMMLIB_ERR_TYPE, std::string(what) + " with op Adasum needs a floating-point tensor "
                                        "(float16, bfloat16, float32, float64), got " + dtype_name(q.dtype));
    }
    if (!reduction_supported(q.dtype, q.reduce_op)) {
      throw Error(COMMLIB_ERR_TYPE, std::string(what) + " with op " + reduce_op_name(q.reduce_op) +
                                        " is not supported for dtype " + dtype_name(q.dtype));
    }
    // (a NaN would also never compare equal across ranks: a mismatch every time)
    if (!std::isfinite(q.prescale) || !std::isfinite(q.postscale)) {
      throw Error(COMMLIB_ERR_VALUE, std::string(what) + ": scale factors must be finite, got prescale " +
                                         std::to_string(q.prescale) + ", postscale " + std::to_string(q.postscale));
    }
  }
  if (q.op_type == COMMLIB_OP_BROADCAST &&
      std::find(members.begin(), members.end(), q.root) == members.end()) {
    if (q.process_set == 0) {
      throw Error(COMMLIB_ERR_VALUE, "broadcast root_rank " + std::to_string(q.root) +
                                         " is outside the job (size " + std::to_string(members.size()) + ")");
    }
    throw Error(COMMLIB_ERR_VALUE, "broadcast root_rank " + std::to_string(q.root) + " is not a member of process set " +
                                       std::to_string(q.process_set) + " " +
                                       ranks_str(members));
  }
  if ((q.op_type == COMMLIB_OP_ALLGATHER || q.op_type == COMMLIB_OP_ALLTOALL ||
       q.op_type == COMMLIB_OP_REDUCESCATTER) && q.ndim < 1) {
    throw Error(COMMLIB_ERR_VALUE, std::string(what) + " needs a tensor with at least one dimension");
  }
  int64_t n = 1;
  for (int i = 0; i < q.ndim; ++i) n *= q.shape[i];
  if (q.npieces != 0) {
    validate_pieces(q, n);
  } else if (n > 0 && !q.input) {
    throw Error(COMMLIB_ERR_VALUE, "input buffer is NULL");
  }
  if (q.op_type == COMMLIB_OP_ALLGATHER && q.output && q.output_rows < 0) {
    throw Error(COMMLIB_ERR_VALUE, std::string(what) + ": an output needs its rows (output_rows >= 0)");
  }
  // (reducescatter: a rank may receive no rows, so its output may be NULL)
  const bool needs_output = q.op_type == COMMLIB_OP_ALLREDUCE || q.op_type == COMMLIB_OP_BROADCAST;
  if (needs_output && n > 0 && !q.output) throw Error(COMMLIB_ERR_VALUE, "output buffer is NULL");
}

// A reducescatter's explicit rows per rank (none: the even split).
std::vector<int64_t> reducescatter_splits(const commlib_request& q, int size) {
  if (q.nsplits == 0) return {};
  const std::string what = std::string("reducescatter '") + (q.name ? q.name : "") + "'";
  if (q.nsplits != size) {
    throw Error(COMMLIB_ERR_VALUE, what + ": splits must have one entry per rank (" + std::to_string(size) +
                                       "), got " + std::to_string(q.nsplits));
  }
  std::vector<int64_t> s(q.splits, q.splits + q.nsplits);
  int64_t sum = 0;
  for (int64_t x : s) {
    if (x < 0) throw Error(COMMLIB_ERR_VALUE, what + ": splits must be non-negative");
    if (!add_within(sum, x, q.shape[0])) {
      throw Error(COMMLIB_ERR_VALUE, what + ": splits sum to more than dimension 0 of the tensor (" +
                                         std::to_string(q.shape[0]) + ")");
    }
  }
  if (sum != q.shape[0]) {
    throw Error(COMMLIB_ERR_VALUE, what + ": splits sum to " + std::to_string(sum) + " but dimension 0 of the "
                                       "tensor is " + std::to_string(q.shape[0]));
  }
  return s;
}

// Rows sent to each rank (of the process set) by an alltoall: explicit
// splits or equal parts.
std::vector<int64_t> alltoall_splits(const commlib_request& q, int size) {
  const int64_t dim0 = q.shape[0];
  if (q.nsplits == 0) {
    if (dim0 % size != 0) {
      throw Error(COMMLIB_ERR_VALUE, "alltoall without splits needs dimension 0 (" + std::to_string(dim0) +
                                         ") divisible by the number of ranks (" + std::to_string(size) + ")");
    }
    return std::vector<int64_t>(size, dim0 / size);
  }
  if (q.nsplits != size) {
    throw Error(COMMLIB_ERR_VALUE, "alltoall splits must have one entry per rank (" + std::to_string(size) +
                                       "), got " + std::to_string(q.nsplits));
  }
  std::vector<int64_t> s(q.splits, q.splits + q.nsplits);
  int64_t sum = 0;
  for (int64_t x : s) {
    if (x < 0) throw Error(COMMLIB_ERR_VALUE, "alltoall splits must be non-negative");
    if (!add_within(sum, x, dim0)) {
      throw Error(COMMLIB_ERR_VALUE, "alltoall splits sum to more than dimension 0 of the tensor (" +
                                         std::to_string(dim0) + ")");
    }
  }
  if (sum != dim0) {
    throw Error(COMMLIB_ERR_VALUE, "alltoall splits sum to " + std::to_string(sum) +
                                       " but dimension 0 of the tensor is " + std::to_string(dim0));
  }
  return s;
}

void validate_p2p(const commlib_request& q, const std::vector<int>* members, int size) {
  const bool send = q.op_type == COMMLIB_OP_SEND;
  const char* what = send ? "send" : "recv";
  const char* peer = send ? "dst" : "src";
  const bool cuda = q.device_type == COMMLIB_DEVICE_CUDA;
  if (q.device_type != COMMLIB_DEVICE_CPU && !cuda)
    throw Error(COMMLIB_ERR_VALUE, std::string(what) + ": unknown device type " + std::to_string(q.device_type));
  if (cuda && !send && !(q.p2p_flags & COMMLIB_P2P_TAKES_DEVICE))
    throw Error(COMMLIB_ERR_VALUE, "recv into CUDA memory: set p2p_flags COMMLIB_P2P_TAKES_DEVICE");
  if (send && q.p2p_flags) throw Error(COMMLIB_ERR_VALUE, "send: p2p_flags are a recv's");
  if (q.peer < 0 || q.peer >= size) {
    throw Error(COMMLIB_ERR_VALUE, std::string(what) + ": " + peer + " " + std::to_string(q.peer) +
                                       " is outside the job (ranks 0.." + std::to_string(size - 1) + ")");
  }
  if (members && std::find(members->begin(), members->end(), q.peer) == members->end()) {
    throw Error(COMMLIB_ERR_VALUE, std::string(what) + ": " + peer + " " + std::to_string(q.peer) +
                                       " is not a member of process set " + std::to_string(q.process_set) + " " +
                                       ranks_str(*members));
  }
  if (q.tag < 0) throw Error(COMMLIB_ERR_VALUE, std::string(what) + ": tag must be >= 0, got " + std::to_string(q.tag));
  const bool has_buffer = send || q.output != nullptr || (q.dtype >= 0 && q.p2p_flags);
  if (!has_buffer) return;  // a recv that learns dtype and shape from the message
  if (!is_valid_dtype(q.dtype)) throw Error(COMMLIB_ERR_TYPE, "unsupported dtype code " + std::to_string(q.dtype));
  if (q.ndim < 0 || q.ndim > kMaxDims || (q.ndim > 0 && !q.shape))
    throw Error(COMMLIB_ERR_VALUE, std::string(what) + ": invalid shape (at most 64 dimensions)");
  int64_t n = 1;
  for (int i = 0; i < q.ndim; ++i) {
    if (q.shape[i] < 0) throw Error(COMMLIB_ERR_VALUE, "negative dimension in shape");
    n *= q.shape[i];
  }
  if (send && n > 0 && !q.input) throw Error(COMMLIB_ERR_VALUE, "send: data buffer is NULL");
}

void check_disjoint_outputs(const std::vector<Member>& members) {
  struct Span {
    uintptr_t lo, hi;
    size_t member;
  };
  std::vector<Span> spans;
  spans.reserve(members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    const size_t bytes = members[i].count * dtype_size(members[i].dtype);
    const uintptr_t lo = reinterpret_cast<uintptr_t>(members[i].output);
    if (bytes && lo) spans.push_back({lo, lo + bytes, i});
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.lo < b.lo; });
  // (sorted by start, two spans that overlap imply two neighbours that do)
  for (size_t k = 1; k < spans.size(); ++k) {
    if (spans[k].lo < spans[k - 1].hi) {
      const size_t a = std::min(spans[k - 1].member, spans[k].member), b = std::max(spans[k - 1].member, spans[k].member);
      throw Error(COMMLIB_ERR_VALUE, "grouped allreduce: the results of tensors " + std::to_string(a) + " and " +
                                         std::to_string(b) + " would share memory (one tensor given twice, or views "
                                         "that overlap); give each tensor once");
    }
  }
}

}  // namespace commlib
