// Point-to-point send/recv between two ranks, matched by (source, tag,
// process set) directly between them: nothing goes through rank 0.
//
// Protocol, on a communicator of its own (a duplicate of the job's):
// - Control messages between ranks of one host travel through shared-memory
//   lanes (lanes.h); between hosts through MPI under tag kCtlTag.
// - The sender posts one header (tag kCtlTag) carrying the user tag, the set,
//   dtype, shape and size. Small messages (<= the eager size) carry their
//   bytes inside the header; large ones carry the address of the sender's
//   buffer (rendezvous).
// - The receiver queues headers in arrival order per (source, tag, set); MPI
//   keeps one source's headers in order, so one pair and one tag stay FIFO.
// - When a header meets a posted receive: a wrong `out` fails both sides (an
//   error reply names the receiver's buffer); an eager message is copied out
//   and acknowledged; a large one is read straight from the sender's memory
//   with one copy (process_vm_readv, backends/shm/cma.h) on the same host and
//   acknowledged, or else the receiver posts an MPI receive under a fresh
//   data tag and sends "clear to send" with that tag. Once a direct read
//   from a peer has worked, messages of split_bytes and more whose sender
//   was waiting when it posted them (its header says so) are copied by both
//   ranks at once (split_copy.cc): the receiver reads the first half while
//   the sender writes the second into the receiver's buffer. A sender that
//   posted and went on computing (a pipeline's isend) is not asked: its
//   engine may be asleep, and waking it costs more than the half saves.
// - A send completes when the receiver has taken its data (acknowledgement,
//   or its MPI data send finished): like MPI_Ssend, so that a receiver's
//   error reaches the sender's handle.
// - A rank that shuts down tells every rank ("bye"); receives waiting for it
//   and sends not yet taken by it then fail instead of hanging.
// - A receive unmatched for COMMLIB_TIMEOUT fails. A send unmatched so long
//   withdraws its header ("withdraw"): the receiver drops a header that no
//   receive has taken and refuses the send with an error reply, or ignores
//   the withdrawal when a receive took it meanwhile (its reply completes the
//   send as usual), so a sender never fails while its buffer is being read.
// - Device (CUDA) messages (device_messages.cc): the header says the data is
//   in device memory and carries no bytes or address. A receive that takes
//   device messages (it names a device) receives one into its device `out`,
//   or into device memory the device links allocate: a "device clear to
//   send" goes back, and both ends move the data over a device link
//   (device_links.h), with no caller involved. Any other receive refuses a
//   device message (both sides fail, naming the reason). A host message into
//   a receive whose `out` is device memory lands in host memory the core
//   allocates (the caller copies it over).
//
// Only the thread that owns communication (the engine's cycle) calls post(),
// progress() and the rest; no locking inside.
#pragma once

#include <mpi.h>

#include <sys/types.h>

#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "backends/mpi/pending_sends.h"
#include "base/handles.h"
#include "base/message.h"
#include "p2p/device_links.h"
#include "p2p/lanes.h"

namespace commlib {

// One local send or receive as submitted.
struct P2PRequest {
  std::shared_ptr<HandleState> handle;
  bool is_send = true;
  int peer = 0;         // job rank
  int64_t tag = 0;
  int process_set = 0;
  int dtype = -1;       // receive: the dtype of `out` (-1: learn it from the message)
  std::vector<int64_t> shape;
  const void* data = nullptr;  // send
  void* out = nullptr;         // receive (null: the core allocates the result)
  int64_t posted_us = 0;
  bool warned = false;
  bool caller_waits = false;  // a blocking send: its caller waits in the engine from now on
  // Device (CUDA) buffers. A send: data is device memory of `device`. A
  // receive: device messages land on `device` (-1: refused), in `out` when
  // out_on_device, else in memory the device links allocate (owns_out).
  // Either is ready once `ready` (an event on the caller's stream) is reached.
  int device = -1;
  bool out_on_device = false;
  bool owns_out = false;
  std::shared_ptr<void> ready;
};

// "tag 3" or "tag 3, process set 2": where a message is, in error messages.
std::string tag_str(int64_t tag, int process_set);

class PointToPoint {
 public:
  // Completes a request's handle (the engine's bookkeeping included).
  using Completion = std::function<void(HandleState&, int status, const std::string& message)>;

  // comm: owned (a duplicate of the job's communicator). host_pids[r]: the pid
  // of job rank r when it shares this host (single-copy reads), else 0.
  // Messages of at most eager_bytes travel inside their header. lanes (may
  // be null): control messages to and from the ranks of this host travel
  // there instead of through MPI.
  PointToPoint(MPI_Comm comm, std::vector<pid_t> host_pids, size_t eager_bytes, size_t split_bytes,
               std::unique_ptr<P2PLanes> lanes, Completion done);
  ~PointToPoint();

  // sender_waits: a thread of this rank is waiting in the engine right now
  // (or req.caller_waits: a blocking send), so it will answer a split request
  // at once.
  void post(P2PRequest req, bool sender_waits);
  // Moves everything forward that can move without blocking; true when it did work.
  bool progress();
  // Only the control messages this rank sends (see progress.h's wait hook).
  void progress_sends() {
    ctl_sends_.progress();
    if (lanes_) lanes_->flush();
  }
  // Warns (stderr) once about each request unmatched for longer than limit_us;
  // fails receives unmatched for longer than timeout_us (> 0), and withdraws
  // sends so (their receivers refuse them, see the protocol above).
  void check_stalls(int64_t now_us, int64_t limit_us, int64_t timeout_us);
  // Fails every pending request (communication is over).
  void fail_all(int code, const std::string& message);
  // Tells every other rank that this one stops (shutdown).
  void say_goodbye();
  void abandon();  // after a lost peer: never touch the communicator again
  size_t pending() const;
  // Makes the device links on the first device transfer (may throw Error).
  void set_device_links(std::function<std::unique_ptr<DeviceLinks>(DeviceLinks::Done)> make) {
    make_links_ = std::move(make);
  }

 private:
  struct Incoming {  // a header that arrived and waits for its receive
    int source;
    uint64_t seq;
    int dtype;
    std::vector<int64_t> shape;
    uint64_t nbytes;
    uint64_t addr;        // rendezvous: the sender's buffer
    bool sender_waits = false;  // the sender was waiting in its engine when it posted
    bool on_device = false;     // the data is in the sender's device memory
    std::string payload;  // eager: the bytes, when they wait for their receive
    const char* view = nullptr;  // eager, delivered at once: the bytes in place
  };
  struct Outgoing {  // a send waiting for its receiver
    P2PRequest req;
    uint64_t nbytes = 0;
    std::vector<MPI_Request> data;  // rendezvous over MPI, after "clear to send"
    bool withdrawn = false;         // timed out: "withdraw" sent, the reply awaited
  };
  struct Split {  // a receive copied by both sides (split_copy.cc)
    P2PRequest req;
    int source;
    uint64_t seq, addr, half, nbytes;
    char* dst;
    int status = 0;  // first failure of either half
    std::string error;
  };
  struct Transfer {  // a receive whose data arrives through MPI
    P2PRequest req;
    std::vector<MPI_Request> data;
  };
  using Key = std::tuple<int, int, int64_t>;  // (source, process set, tag)

  // bytes, then n bytes at extra (a message's data) to `peer`.
  void send_ctl(int peer, std::string bytes, const void* extra = nullptr, size_t n = 0);
  bool poll_ctl();
  void dispatch(int source, std::string_view msg);
  void on_header(int source, std::string_view msg);
  void on_reply(int source, std::string_view msg);
  void on_bye(int source);
  void on_withdraw(int source, std::string_view msg);  // (p2p_endings.cc)
  void match(const Key& key);
  void deliver(P2PRequest& r, Incoming& in);
  bool read_direct(P2PRequest& r, const Incoming& in, char* dst);
  void start_transfer(P2PRequest& r, const Incoming& in, char* dst);
  void start_split(P2PRequest& r, const Incoming& in, char* dst);
  void on_split_request(int source, Reader& rd);  // sender: write the second half
  void on_written(int source, Reader& rd);        // receiver: the sender's half is there
  void send_ack(int peer, uint64_t seq, int status, const std::string& message);
  // device_messages.cc
  void deliver_device(P2PRequest& r, Incoming& in);
  void deliver_to_self(P2PRequest& r, Incoming& in);
  void on_device_clear(int source, std::string_view msg);
  DeviceLinks* links();
  bool test_data();
  void complete(P2PRequest& r, int status, const std::string& message);

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  int tag_span_ = 32000;
  std::vector<pid_t> host_pids_;
  std::vector<bool> direct_ok_;  // single-copy reads still believed to work, per source
  std::vector<bool> proven_;     // a single-copy read from this source has worked
  size_t split_bytes_ = 0;
  std::vector<bool> departed_;   // ranks that said bye
  size_t eager_ = 0;
  Completion done_;
  uint64_t next_seq_ = 1;
  uint32_t next_data_tag_ = 0;
  std::map<Key, std::deque<Incoming>> arrived_;
  void time_out_receives(int64_t now, int64_t timeout_us);
  void withdraw_sends(int64_t now, int64_t timeout_us);
  std::map<Key, std::deque<P2PRequest>> posted_;
  std::map<std::pair<int, uint64_t>, Outgoing> outgoing_;  // (peer, seq)
  std::list<Transfer> transfers_;
  std::list<Split> splits_;
  PendingSends ctl_sends_;
  std::unique_ptr<P2PLanes> lanes_;
  std::deque<std::string> to_self_;  // control messages this rank sent itself
  bool poll_mpi_ = true;  // some peer's control messages come through MPI
  int64_t last_stall_check_us_ = 0;
  std::function<std::unique_ptr<DeviceLinks>(DeviceLinks::Done)> make_links_;
  std::unique_ptr<DeviceLinks> links_;
};

}  // namespace commlib
