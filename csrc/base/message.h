// Negotiation messages and their binary encoding.
//
// A rank tells the coordinator which named requests it has (RequestDesc); the
// coordinator answers every rank with the same ordered list of Responses, and
// each rank executes them in that order.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "base/common.h"

namespace commlib {

struct RequestDesc {
  std::string name;
  int op_type = 0;
  int dtype = 0;
  int reduce_op = 0;
  int root = 0;
  double prescale = 1.0;
  double postscale = 1.0;
  std::vector<int64_t> shape;
  std::vector<int64_t> splits;  // alltoall: rows to each rank
  // A grouped allreduce negotiates as one request: group_size members, each
  // described as [dtype, ndim, dims...] in members. -1: a single tensor.
  int group_size = -1;
  std::vector<int64_t> members;
  int process_set = 0;  // 0: every rank of the job
  int device_type = 0;  // COMMLIB_DEVICE_*: every rank's buffers on the same kind of device
  // How long it waited at a response cache bit before being negotiated
  // (rank 0's timeout counts from the first submission). Not compared.
  int64_t waited_us = 0;
  std::string note;  // abort: why this rank could not submit the request
};

// Names are scoped by process set: the key that identifies a request on a
// rank and at the coordinator ("name", or "name" NUL "set id").
std::string request_key(const std::string& name, int process_set);
inline std::string request_key(const RequestDesc& d) { return request_key(d.name, d.process_set); }
// The same for a lookup: the name itself (no copy) for the global set's
// requests, else the key made in buf.
inline const std::string& key_of(const RequestDesc& d, std::string& buf) {
  if (d.process_set == 0) return d.name;
  buf = request_key(d);
  return buf;
}

// "float32 [4, 2]" for each member of a grouped request.
std::vector<std::string> describe_members(const RequestDesc& d);

struct Response {
  // kInvalidate / kCacheOff (response cache across hosts, negotiation/cache_protocol.cc):
  // rows holds the (bit, generation) words that no longer hold / {the rank that left}.
  // kTune (runtime/engine_tune.cc): every rank applies the settings in rows
  // ({fusion threshold, cycle us, tree max bytes, final}; -1: unchanged) here.
  enum Kind : int { kExecute = 0, kError = 1, kInvalidate = 2, kCacheOff = 3, kTune = 4 };
  int kind = kExecute;
  int op_type = 0;
  int error_code = 0;
  std::string error;
  int process_set = 0;             // where it runs (its members execute it)
  std::vector<std::string> names;  // request keys; several for a fused allreduce
  // allgather: rows of each rank; alltoall: size*size matrix, [src*size+dst]
  // (ranks of the process set, in its order); add_process_set: {id}.
  std::vector<int64_t> rows;
  // Response cache bits given to names[i] (-1: none; empty: none at all).
  std::vector<int64_t> bits;
  // While some ranks have joined: the request of each name (a joined rank
  // that never submitted one runs it with buffers of its own); else empty.
  std::vector<RequestDesc> descs;
  // Coordinator only, not sent: the ranks that receive it (empty: every rank).
  std::vector<int> to;
};

// Message kinds on the control channel.
// kMsgArrived: the ranks of a host all arrived at these cache bits ((bit,
// generation) words); kMsgExpire: a cached request waited too long there;
// kMsgTune: settings a worker asks rank 0 to apply everywhere (Response::kTune's rows);
// kMsgLeaving: rank 0 called shutdown() and goes on negotiating only for
// process sets without it (without the order log; Coordinator::leave).
enum MessageKind : int {
  kMsgRequests = 1, kMsgResponses = 2, kMsgShutdown = 3, kMsgArrived = 4, kMsgExpire = 5, kMsgTune = 6,
  kMsgLeaving = 7
};

// What a worker's collectives fail with once rank 0 has shut down
// (negotiation goes through it; point-to-point does not and goes on).
inline constexpr const char* kCoordinatorLeft =
    "rank 0 (the coordinator) called shutdown(); no further collectives of the whole job or of a process set "
    "containing rank 0 are possible (point-to-point between the other ranks still works, and so do "
    "collectives of process sets without rank 0 until one of their members shuts down)";

class Writer {
 public:
  template <typename T>
  void put(T v) {
    const char* p = reinterpret_cast<const char*>(&v);
    buf_.append(p, sizeof(T));
  }
  void put_string(const std::string& s) {
    put<uint32_t>(uint32_t(s.size()));
    buf_.append(s);
  }
  void put_vec(const std::vector<int64_t>& v) {
    put<uint32_t>(uint32_t(v.size()));
    buf_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int64_t));
  }
  std::string take() { return std::move(buf_); }

 private:
  std::string buf_;
};

class Reader {
 public:
  explicit Reader(std::string_view s) : s_(s) {}
  template <typename T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, s_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string get_string() {
    const uint32_t n = get<uint32_t>();
    need(n);
    std::string out(s_.substr(pos_, n));
    pos_ += n;
    return out;
  }
  std::vector<int64_t> get_vec() {
    const uint32_t n = get<uint32_t>();
    need(size_t(n) * sizeof(int64_t));
    std::vector<int64_t> v(n);
    std::memcpy(v.data(), s_.data() + pos_, n * sizeof(int64_t));
    pos_ += n * sizeof(int64_t);
    return v;
  }
  bool done() const { return pos_ >= s_.size(); }

 private:
  void need(size_t n) const {
    if (pos_ + n > s_.size()) throw Error(COMMLIB_ERR_INTERNAL, "truncated control message");
  }
  std::string_view s_;
  size_t pos_ = 0;
};

void encode(Writer& w, const RequestDesc& d);
RequestDesc decode_request(Reader& r);
void encode(Writer& w, const Response& resp);
Response decode_response(Reader& r);

}  // namespace commlib
