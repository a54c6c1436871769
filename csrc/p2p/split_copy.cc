// Large messages between two ranks of one host, copied by both at once: the
// receiver reads the first half from the sender's buffer while the sender
// writes the second half into the receiver's (two cores copy, instead of
// one). Used once a single-copy read from that sender has worked; a sender
// that cannot write leaves its half to the receiver.
#include <algorithm>

#include "base/common.h"
#include "backends/shm/cma.h"
#include "p2p/point_to_point.h"
#include "p2p/wire.h"

namespace commlib {
namespace {
constexpr uint64_t kAlign = 4096;  // halves split at a page boundary
}

void PointToPoint::start_split(P2PRequest& r, const Incoming& in, char* dst) {
  Split s;
  s.source = in.source;
  s.seq = in.seq;
  s.addr = in.addr;
  s.nbytes = in.nbytes;
  s.half = std::max<uint64_t>(kAlign, in.nbytes / 2 / kAlign * kAlign);
  s.dst = dst;
  Writer w;
  w.put<int32_t>(kSplit);
  w.put<uint64_t>(in.seq);
  w.put<uint64_t>(reinterpret_cast<uint64_t>(dst));
  w.put<uint64_t>(s.half);
  send_ctl(in.source, w.take());
  if (!read_from_process(host_pids_[size_t(in.source)], in.addr, dst, size_t(s.half))) {
    s.status = COMMLIB_ERR_INTERNAL;
    s.error = "recv from rank " + std::to_string(in.source) + ": reading the sender's buffer failed";
  }
  s.req = std::move(r);
  splits_.push_back(std::move(s));
}

void PointToPoint::on_split_request(int source, Reader& rd) {
  const uint64_t seq = rd.get<uint64_t>();
  const uint64_t addr = rd.get<uint64_t>();
  const uint64_t half = rd.get<uint64_t>();
  auto it = outgoing_.find({source, seq});
  if (it == outgoing_.end()) return;  // failed here meanwhile (shutdown)
  const Outgoing& o = it->second;
  const char* src = static_cast<const char*>(o.req.data) + half;
  const bool ok = host_pids_[size_t(source)] != 0 &&
                  write_to_process(host_pids_[size_t(source)], addr + half, src, size_t(o.nbytes - half));
  Writer w;
  w.put<int32_t>(kWritten);
  w.put<uint64_t>(seq);
  w.put<int32_t>(ok ? 1 : 0);
  send_ctl(source, w.take());
}

void PointToPoint::on_written(int source, Reader& rd) {
  const uint64_t seq = rd.get<uint64_t>();
  const bool ok = rd.get<int32_t>() != 0;
  auto it = std::find_if(splits_.begin(), splits_.end(),
                         [&](const Split& s) { return s.source == source && s.seq == seq; });
  if (it == splits_.end()) return;
  Split& s = *it;
  if (!ok && s.status == COMMLIB_OK &&
      !read_from_process(host_pids_[size_t(source)], s.addr + s.half, s.dst + s.half, size_t(s.nbytes - s.half))) {
    s.status = COMMLIB_ERR_INTERNAL;
    s.error = "recv from rank " + std::to_string(source) + ": reading the sender's buffer failed";
  }
  send_ack(source, seq, s.status, s.status ? s.error : std::string());
  complete(s.req, s.status, s.error);
  splits_.erase(it);
}

}  // namespace commlib
