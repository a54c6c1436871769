#include "p2p/point_to_point.h"

#include <algorithm>
#include <cstring>

#include "backends/mpi/kept_comms.h"
#include "backends/mpi/mpi_transport.h"
#include "backends/mpi/session_stamp.h"
#include "base/common.h"
#include "base/message.h"
#include "base/progress.h"
#include "base/timeline.h"
#include "backends/shm/cma.h"
#include "p2p/wire.h"

namespace commlib {
namespace {

constexpr int kFirstDataTag = 2;  // rendezvous data over MPI: a fresh tag per transfer
constexpr size_t kPiece = size_t(1) << 30;  // MPI counts are int
constexpr size_t kSameHostEager = 4096;

std::string describe(int dtype, const std::vector<int64_t>& shape) {
  return std::string(dtype_name(dtype)) + " " + shape_str(shape);
}

// Posts MPI sends or receives of `bytes` bytes in pieces under one tag (MPI
// keeps one tag's messages between two ranks in order).
std::vector<MPI_Request> post_pieces(bool send, char* buf, uint64_t bytes, int peer, int tag,
                                     MPI_Comm comm) {
  std::vector<MPI_Request> reqs;
  uint64_t done = 0;
  do {
    const int n = int(std::min<uint64_t>(bytes - done, kPiece));
    MPI_Request r;
    if (send) {
      check_mpi(MPI_Isend(buf + done, n, MPI_BYTE, peer, tag, comm, &r), "MPI_Isend(p2p data)");
    } else {
      check_mpi(MPI_Irecv(buf + done, n, MPI_BYTE, peer, tag, comm, &r), "MPI_Irecv(p2p data)");
    }
    reqs.push_back(r);
    done += uint64_t(n);
  } while (done < bytes);
  return reqs;
}

bool all_done(std::vector<MPI_Request>& reqs) {
  int flag = 0;
  check_mpi(MPI_Testall(int(reqs.size()), reqs.data(), &flag, MPI_STATUSES_IGNORE), "MPI_Testall(p2p)");
  return flag != 0;
}

}  // namespace

std::string tag_str(int64_t tag, int process_set) {
  std::string s = "tag " + std::to_string(tag);
  if (process_set != 0) s += ", process set " + std::to_string(process_set);
  return s;
}

PointToPoint::PointToPoint(MPI_Comm comm, std::vector<pid_t> host_pids, size_t eager_bytes,
                           size_t split_bytes, std::unique_ptr<P2PLanes> lanes, Completion done)
    : comm_(comm), host_pids_(std::move(host_pids)), split_bytes_(split_bytes), eager_(eager_bytes),
      done_(std::move(done)), lanes_(std::move(lanes)) {
  poll_mpi_ = !lanes_ || lanes_->has_remote();
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  void* ub = nullptr;
  int found = 0;
  MPI_Comm_get_attr(comm_, MPI_TAG_UB, &ub, &found);
  if (found && ub) tag_span_ = std::max(1, *static_cast<int*>(ub) - kFirstDataTag);
  direct_ok_.assign(size_t(size_), true);
  proven_.assign(size_t(size_), false);
  departed_.assign(size_t(size_), false);
  allow_direct_reads();
}

PointToPoint::~PointToPoint() {
  ctl_sends_.release();  // (before the communicator goes)
  keep_comm(comm_);  // (goodbyes may still arrive: kept_comms.h)
}

void PointToPoint::abandon() {
  ctl_sends_.abandon();
  comm_ = MPI_COMM_NULL;
}

size_t PointToPoint::pending() const {
  size_t n = outgoing_.size() + transfers_.size() + splits_.size() + (links_ ? links_->pending() : 0);
  for (const auto& [key, q] : posted_) n += q.size();
  return n;
}

namespace {

// The timeline's record of a send or receive, from its posting to its end
// (one row per direction, peer and tag).
void trace_p2p(const P2PRequest& r, int status) {
  const HandleState& h = *r.handle;
  const int dtype = r.dtype >= 0 ? r.dtype : h.dtype;
  const std::vector<int64_t>& shape = r.dtype >= 0 ? r.shape : h.shape;
  std::string args = "\"peer\": " + std::to_string(r.peer) + ", \"tag\": " + std::to_string(r.tag) +
                     ", \"process_set\": " + std::to_string(r.process_set) + ", \"status\": " + std::to_string(status);
  if (dtype >= 0) args += ", \"bytes\": " + std::to_string(num_elements(shape) * int64_t(dtype_size(dtype)));
  const std::string row = std::string(r.is_send ? "send to " : "recv from ") + std::to_string(r.peer) +
                          " tag " + std::to_string(r.tag);
  timeline().span(row, r.is_send ? "SEND" : "RECV", r.posted_us, now_us(), args);
}

}  // namespace

void PointToPoint::complete(P2PRequest& r, int status, const std::string& message) {
  if (timeline().on()) trace_p2p(r, status);
  done_(*r.handle, status, message);
}

void PointToPoint::send_ctl(int peer, std::string bytes, const void* extra, size_t n) {
  if (peer == rank_) {  // (a message to this rank itself: no lane, and MPI may not be polled)
    if (n) bytes.append(static_cast<const char*>(extra), n);
    to_self_.push_back(std::move(bytes));
    return;
  }
  if (lanes_ && lanes_->reaches(peer)) {
    lanes_->send(peer, std::move(bytes), extra, n);  // (a fresh segment each session: no stamp)
    return;
  }
  if (n) bytes.append(static_cast<const char*>(extra), n);
  stamp_session(bytes);
  ctl_sends_.send(std::move(bytes), peer, kCtlTag, comm_, "MPI_Isend(p2p control)");
}

void PointToPoint::post(P2PRequest r, bool sender_waits) {
  r.posted_us = now_us();
  if (departed_[size_t(r.peer)]) {
    complete(r, COMMLIB_ERR_NOT_INIT, "rank " + std::to_string(r.peer) + " has called shutdown(); no " +
                                          (r.is_send ? "send to" : "recv from") + " it is possible");
    return;
  }
  if (!r.is_send) {
    const Key key{r.peer, r.process_set, r.tag};
    posted_[key].push_back(std::move(r));
    match(key);
    return;
  }
  const uint64_t seq = next_seq_++;
  const uint64_t nbytes = uint64_t(num_elements(r.shape)) * dtype_size(r.dtype);
  // On one host a single-copy read beats carrying the bytes through MPI
  // from a few KiB on (measured: 64 KiB round trip 25 us against 47 us).
  const bool on_device = r.device >= 0;
  const bool eager = !on_device && nbytes <= (host_pids_[size_t(r.peer)] ? std::min(eager_, kSameHostEager) : eager_);
  Writer w;
  w.put<int32_t>(kHeader);
  w.put<int32_t>(r.process_set);
  w.put<int64_t>(r.tag);
  w.put<uint64_t>(seq);
  w.put<int32_t>(r.dtype);
  w.put_vec(r.shape);
  w.put<uint64_t>(nbytes);
  w.put<uint64_t>(eager || on_device ? 0 : reinterpret_cast<uint64_t>(r.data));
  w.put<int32_t>(sender_waits ? 1 : 0);
  w.put<int32_t>(on_device ? 1 : 0);
  send_ctl(r.peer, w.take(), eager ? r.data : nullptr, eager ? size_t(nbytes) : 0);
  const int peer = r.peer;
  Outgoing& o = outgoing_[{peer, seq}];
  o.req = std::move(r);
  o.nbytes = nbytes;
}

bool PointToPoint::poll_ctl() {
  if (!to_self_.empty()) {
    const std::string msg = std::move(to_self_.front());
    to_self_.pop_front();
    dispatch(rank_, msg);
    return true;
  }
  int source = 0;
  std::string_view view;
  if (lanes_ && lanes_->peek(&source, &view)) {
    struct Pop {
      P2PLanes& lanes;
      ~Pop() { lanes.pop(); }
    } pop{*lanes_};
    dispatch(source, view);
    return true;
  }
  if (!poll_mpi_) return false;
  int flag = 0;
  MPI_Message m;
  MPI_Status st;
  check_mpi(MPI_Improbe(MPI_ANY_SOURCE, kCtlTag, comm_, &flag, &m, &st), "MPI_Improbe(p2p)");
  if (!flag) return false;
  int count = 0;
  MPI_Get_count(&st, MPI_BYTE, &count);
  std::string msg(size_t(count), '\0');
  check_mpi(MPI_Mrecv(msg.data(), count, MPI_BYTE, &m, MPI_STATUS_IGNORE), "MPI_Mrecv(p2p)");
  if (!unstamp_session(msg)) return true;  // left over from an earlier session
  dispatch(st.MPI_SOURCE, msg);
  return true;
}

void PointToPoint::dispatch(int source, std::string_view msg) {
  int32_t kind = 0;
  if (msg.size() >= sizeof(kind)) std::memcpy(&kind, msg.data(), sizeof(kind));
  switch (kind) {
    case kHeader: on_header(source, msg); break;
    case kAck: case kClearToSend: on_reply(source, msg); break;
    case kBye: on_bye(source); break;
    case kWithdraw: on_withdraw(source, msg); break;
    case kDeviceClear: on_device_clear(source, msg); break;
    case kSplit: case kWritten: {
      Reader rd(msg);
      rd.get<int32_t>();
      if (kind == kSplit) {
        on_split_request(source, rd);
      } else {
        on_written(source, rd);
      }
      break;
    }
    default: throw Error(COMMLIB_ERR_INTERNAL, "unknown point-to-point message kind " + std::to_string(kind));
  }
}

bool PointToPoint::progress() {
  bool worked = false;
  while (poll_ctl()) worked = true;
  worked |= test_data();
  if (links_) worked |= links_->progress(now_us());
  progress_sends();
  return worked;
}

bool PointToPoint::test_data() {
  bool worked = false;
  for (auto it = transfers_.begin(); it != transfers_.end();) {
    if (!all_done(it->data)) {
      ++it;
      continue;
    }
    complete(it->req, COMMLIB_OK, "");
    it = transfers_.erase(it);
    worked = true;
  }
  for (auto it = outgoing_.begin(); it != outgoing_.end();) {
    if (it->second.data.empty() || !all_done(it->second.data)) {
      ++it;
      continue;
    }
    complete(it->second.req, COMMLIB_OK, "");
    it = outgoing_.erase(it);
    worked = true;
  }
  return worked;
}

void PointToPoint::on_header(int source, std::string_view msg) {
  Reader rd(msg);
  rd.get<int32_t>();
  Incoming in;
  in.source = source;
  const int set = rd.get<int32_t>();
  const int64_t tag = rd.get<int64_t>();
  in.seq = rd.get<uint64_t>();
  in.dtype = rd.get<int32_t>();
  in.shape = rd.get_vec();
  in.nbytes = rd.get<uint64_t>();
  in.addr = rd.get<uint64_t>();
  in.sender_waits = rd.get<int32_t>() != 0;
  in.on_device = rd.get<int32_t>() != 0;
  const Key key{source, set, tag};
  if (in.on_device) {  // (no bytes with it)
    arrived_[key].push_back(std::move(in));
    return match(key);
  }
  if (in.addr == 0 && msg.size() < in.nbytes) throw Error(COMMLIB_ERR_INTERNAL, "truncated point-to-point message");
  const char* bytes = in.addr == 0 ? msg.data() + (msg.size() - size_t(in.nbytes)) : nullptr;
  auto p = posted_.find(key);
  if (bytes && p != posted_.end() && arrived_.find(key) == arrived_.end()) {
    // Its receive waits already: straight from the message into the buffer.
    in.view = bytes;
    P2PRequest r = std::move(p->second.front());
    p->second.pop_front();
    if (p->second.empty()) posted_.erase(p);
    deliver(r, in);
    return;
  }
  if (bytes) in.payload.assign(bytes, size_t(in.nbytes));
  arrived_[key].push_back(std::move(in));
  match(key);
}

void PointToPoint::match(const Key& key) {
  auto a = arrived_.find(key);
  auto p = posted_.find(key);
  if (a == arrived_.end() || p == posted_.end()) return;
  while (!a->second.empty() && !p->second.empty()) {
    P2PRequest r = std::move(p->second.front());
    p->second.pop_front();
    Incoming in = std::move(a->second.front());
    a->second.pop_front();
    deliver(r, in);
  }
  if (a->second.empty()) arrived_.erase(a);
  if (p->second.empty()) posted_.erase(p);
}

void PointToPoint::send_ack(int peer, uint64_t seq, int status, const std::string& message) {
  Writer ack;
  ack.put<int32_t>(kAck);
  ack.put<uint64_t>(seq);
  ack.put<int32_t>(status);
  ack.put_string(message);
  send_ctl(peer, ack.take());
}

void PointToPoint::deliver(P2PRequest& r, Incoming& in) {
  if (r.dtype >= 0 && (r.dtype != in.dtype || num_elements(r.shape) != num_elements(in.shape))) {
    const std::string where = tag_str(r.tag, r.process_set);
    const std::string msg = describe(in.dtype, in.shape), out = describe(r.dtype, r.shape);
    send_ack(in.source, in.seq, COMMLIB_ERR_VALUE,
             "send to rank " + std::to_string(rank_) + " (" + where + ") failed: the receiver's out is " + out +
                 " but the message is " + msg);
    complete(r, COMMLIB_ERR_VALUE, "recv from rank " + std::to_string(in.source) + " (" + where +
                                       "): the message is " + msg + " but out is " + out +
                                       "; pass an out of the sender's dtype and size, or none");
    return;
  }
  if (in.on_device) return deliver_device(r, in);
  char* dst = r.out_on_device ? nullptr : static_cast<char*>(r.out);  // (a host message: host memory)
  if (!dst) dst = r.handle->alloc_result(size_t(in.nbytes));
  r.handle->dtype = in.dtype;
  r.handle->shape = std::move(in.shape);  // (what follows needs only its size)
  if (in.addr != 0) {
    const size_t src = size_t(in.source);
    if (proven_[src] && in.sender_waits && in.nbytes >= std::max<uint64_t>(split_bytes_, 1 << 16)) {
      start_split(r, in, dst);
      return;
    }
    if (!read_direct(r, in, dst)) {
      start_transfer(r, in, dst);
      return;
    }
  } else if (in.nbytes > 0) {
    std::memcpy(dst, in.view ? in.view : in.payload.data(), size_t(in.nbytes));
  }
  send_ack(in.source, in.seq, COMMLIB_OK, "");
  complete(r, COMMLIB_OK, "");
}

// One copy straight from the sender's buffer, when it lives on this host.
bool PointToPoint::read_direct(P2PRequest& r, const Incoming& in, char* dst) {
  const size_t src = size_t(in.source);
  if (host_pids_[src] == 0 || !direct_ok_[src]) return false;
  (void)r;
  if (read_from_process(host_pids_[src], in.addr, dst, size_t(in.nbytes))) {
    proven_[src] = true;
    return true;
  }
  direct_ok_[src] = false;  // (not permitted here: MPI from now on)
  return false;
}

void PointToPoint::start_transfer(P2PRequest& r, const Incoming& in, char* dst) {
  const int tag = kFirstDataTag + int(next_data_tag_++ % uint32_t(tag_span_));
  Transfer t;
  t.data = post_pieces(false, dst, in.nbytes, in.source, tag, comm_);
  t.req = std::move(r);
  transfers_.push_back(std::move(t));
  Writer w;
  w.put<int32_t>(kClearToSend);
  w.put<uint64_t>(in.seq);
  w.put<int32_t>(tag);
  send_ctl(in.source, w.take());
}

void PointToPoint::on_reply(int source, std::string_view msg) {
  Reader rd(msg);
  const int32_t kind = rd.get<int32_t>();
  const uint64_t seq = rd.get<uint64_t>();
  auto it = outgoing_.find({source, seq});
  if (it == outgoing_.end()) return;  // failed here meanwhile (shutdown)
  Outgoing& o = it->second;
  if (kind == kClearToSend) {
    const int tag = rd.get<int32_t>();
    o.data = post_pieces(true, static_cast<char*>(const_cast<void*>(o.req.data)), o.nbytes, source, tag, comm_);
    return;
  }
  const int status = rd.get<int32_t>();
  const std::string message = rd.get_string();
  complete(o.req, status, message);
  outgoing_.erase(it);
}

}  // namespace commlib
