// Point-to-point messages between device (CUDA) buffers: matching and the
// control messages stay PointToPoint's (point_to_point.h); the data moves
// through the device's own transport (NCCL: p2p/nccl_links.h).
//
// A link is one direction between this rank and a peer: this rank either
// sends on it or receives. Its transfers run in the order both ends queue
// them, which is the receiver's: a receive is queued when its "clear to send"
// goes out, and the sender queues the send when that message arrives
// (control messages between two ranks keep their order). The two directions
// are separate links so that two ranks sending to each other at once never
// wait behind each other's transfers. The receiver starts a link: the first
// "clear to send" on it carries the link's id, with which the sender joins.
//
// Only the engine's thread calls these (as PointToPoint's own methods).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace commlib {

struct P2PRequest;

class DeviceLinks {
 public:
  using Done = std::function<void(P2PRequest&, int status, const std::string& message)>;
  virtual ~DeviceLinks() = default;

  // Receiver: queues r's receive of nbytes from source into r.out (device
  // memory of r.device), or, when r.out is null, into device memory it
  // allocates (*allocated; the caller frees it, stream-ordered, once the
  // receive completed). Sets *id to the link's id when this starts a new link
  // (else leaves it empty). Returns "" when queued (r was moved from), else
  // why not (r untouched).
  virtual std::string receive(int source, P2PRequest& r, uint64_t nbytes, std::string* id, void** allocated) = 0;
  // A device message from this rank to itself: queues a copy of send's data
  // into recv.out (allocated as receive() does when null) that completes both.
  virtual std::string copy_local(P2PRequest& recv, P2PRequest& send, uint64_t nbytes, void** allocated) = 0;
  // Sender: queues r's send of nbytes from r.data to dest; a non-empty id
  // starts (or restarts) the link to dest. Returns as receive() does.
  virtual std::string send(int dest, const std::string& id, P2PRequest& r, uint64_t nbytes) = 0;
  // Starts what can start, completes (through done) what finished on the
  // device, fails what made no progress for the timeout; true when
  // something moved.
  virtual bool progress(int64_t now_us) = 0;
  virtual void fail_all(int code, const std::string& message) = 0;
  virtual size_t pending() const = 0;
};

}  // namespace commlib
