// PointToPoint's device (CUDA) messages: a receive that takes one, the
// device "clear to send" and the hand-over to the device links
// (point_to_point.h).
#include "base/common.h"
#include "base/message.h"
#include "p2p/point_to_point.h"
#include "p2p/wire.h"

namespace commlib {

DeviceLinks* PointToPoint::links() {
  if (!links_) {
    if (!make_links_) throw Error(COMMLIB_ERR_INTERNAL, "no device links for point-to-point");
    links_ = make_links_([this](P2PRequest& r, int status, const std::string& message) {
      complete(r, status, message);
    });
  }
  return links_.get();
}

// A device message met a receive (whose dtype and size, if it has them,
// match): receive it over the device link from its sender.
void PointToPoint::deliver_device(P2PRequest& r, Incoming& in) {
  const std::string w = tag_str(r.tag, r.process_set);
  if (r.device < 0) {
    send_ack(in.source, in.seq, COMMLIB_ERR_VALUE,
             "send to rank " + std::to_string(rank_) + " (" + w + ") failed: the message is in GPU memory, "
             "and rank " + std::to_string(rank_) + "'s receive can only take host memory");
    complete(r, COMMLIB_ERR_VALUE,
             "recv from rank " + std::to_string(in.source) + " (" + w + "): the message is in GPU memory (a CUDA "
             "tensor sent through NCCL), which this receive cannot take: receive it with commlib.torch in a process "
             "that can use NCCL, or set COMMLIB_GPU_BACKEND=host on the sender (staged through host memory)");
    return;
  }
  r.handle->dtype = in.dtype;
  r.handle->shape = in.shape;
  if (in.nbytes == 0) {
    send_ack(in.source, in.seq, COMMLIB_OK, "");
    return complete(r, COMMLIB_OK, "");
  }
  if (!r.out_on_device) r.out = nullptr;  // (the link allocates device memory for it)
  if (in.source == rank_) return deliver_to_self(r, in);
  HandleState& h = *r.handle;
  std::string id, why;
  void* allocated = nullptr;
  try {
    why = links()->receive(in.source, r, in.nbytes, &id, &allocated);
  } catch (const Error& e) {
    why = e.what();
  }
  if (!why.empty()) {
    send_ack(in.source, in.seq, COMMLIB_ERR_VALUE, "send to rank " + std::to_string(rank_) + " (" + w +
                                                       ") failed: its receiver could not take it: " + why);
    return complete(r, COMMLIB_ERR_VALUE, "recv from rank " + std::to_string(in.source) + " (" + w + "): " + why);
  }
  h.device_result = allocated;
  Writer msg;
  msg.put<int32_t>(kDeviceClear);
  msg.put<uint64_t>(in.seq);
  msg.put_string(id);
  send_ctl(in.source, msg.take());
}

// A device message from this rank to itself: one copy on the device (an NCCL
// communicator cannot have two ranks on one device), completing both ends.
void PointToPoint::deliver_to_self(P2PRequest& r, Incoming& in) {
  auto it = outgoing_.find({rank_, in.seq});
  if (it == outgoing_.end()) return complete(r, COMMLIB_ERR_INTERNAL, "recv from this rank: its send is gone");
  HandleState& h = *r.handle;
  void* allocated = nullptr;
  std::string why;
  try {
    why = links()->copy_local(r, it->second.req, in.nbytes, &allocated);
  } catch (const Error& e) {
    why = e.what();
  }
  if (why.empty()) {
    h.device_result = allocated;
  } else {
    const std::string w = tag_str(r.tag, r.process_set);
    complete(it->second.req, COMMLIB_ERR_VALUE, "send to this rank itself (" + w + "): " + why);
    complete(r, COMMLIB_ERR_VALUE, "recv from this rank itself (" + w + "): " + why);
  }
  outgoing_.erase(it);
}

// Sender: the receiver queued its end of a device message; queue ours.
void PointToPoint::on_device_clear(int source, std::string_view msg) {
  Reader rd(msg);
  rd.get<int32_t>();
  const uint64_t seq = rd.get<uint64_t>();
  const std::string id = rd.get_string();
  auto it = outgoing_.find({source, seq});
  if (it == outgoing_.end()) return;  // failed here meanwhile (shutdown)
  std::string why;
  try {
    why = links()->send(source, id, it->second.req, it->second.nbytes);
  } catch (const Error& e) {
    why = e.what();
  }
  if (!why.empty()) complete(it->second.req, COMMLIB_ERR_INTERNAL, why);
  outgoing_.erase(it);
}

}  // namespace commlib
