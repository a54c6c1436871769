#include "p2p/nccl_links.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>

#include "backends/nccl/nccl_comm.h"
#include "base/common.h"
#include "base/progress.h"
#include "p2p/point_to_point.h"

namespace commlib {
namespace gpu {
namespace {

struct Queued {
  P2PRequest req;
  uint64_t nbytes = 0;
  std::unique_ptr<P2PRequest> partner;  // a local copy's send (req is its receive)
};

struct Flight {
  P2PRequest req;
  std::unique_ptr<P2PRequest> partner;
  cudaEvent finished = nullptr;
  int64_t launched_us = 0;
};

struct Link {
  bool local = false;  // copies within this process (messages to itself): no communicator
  int peer = 0;
  bool sends = false;  // this rank is the link's rank 0 (sender)
  int device = -1;
  cudaStream stream = nullptr;
  ncclComm comm = nullptr;
  std::shared_ptr<InitCall> init;  // while the communicator is being created
  int64_t started_us = 0;
  int64_t progress_us = 0;  // the last completion (or the creation)
  std::deque<Queued> queued;
  std::deque<Flight> flights;
};

std::string what_of(const P2PRequest& r) {
  return std::string(r.is_send ? "send to" : "recv from") + " rank " + std::to_string(r.peer) + " (" +
         tag_str(r.tag, r.process_set) + ", CUDA buffers through NCCL)";
}

class NcclLinks final : public DeviceLinks {
 public:
  NcclLinks(const GpuLibs& libs, int64_t timeout_us, Done done)
      : libs_(libs), timeout_us_(timeout_us), done_(std::move(done)) {}
  ~NcclLinks() override {
    for (auto& [key, l] : links_) close(*l, l->flights.empty() && l->queued.empty() && !l->init);
  }

  std::string receive(int source, P2PRequest& r, uint64_t nbytes, std::string* id, void** allocated) override {
    Link* l = find(source, false);
    try {
      if (!l) {
        NcclUniqueId u;
        std::memset(&u, 0, sizeof(u));
        check_nccl(libs_.nccl, libs_.nccl.get_unique_id(&u), "ncclGetUniqueId");
        l = open(source, false, r.device, u);
        id->assign(u.internal, sizeof(u.internal));
      }
      if (l->device != r.device) return device_clash(*l, r);
      if (!r.out) allocate(*l, r, nbytes, allocated);
    } catch (const Error& e) {
      return e.what();
    }
    l->queued.push_back(Queued{std::move(r), nbytes, nullptr});
    return "";
  }

  std::string copy_local(P2PRequest& recv, P2PRequest& send, uint64_t nbytes, void** allocated) override {
    const int key = -1 - recv.device;  // (one local link per device)
    Link* l = find(key, false);
    try {
      if (!l) {
        auto made = std::make_unique<Link>();
        made->local = true;
        made->peer = key;
        made->device = recv.device;
        made->stream = priority_stream(libs_.cuda, recv.device);
        l = made.get();
        links_[{key, false}] = std::move(made);
      }
      if (!recv.out) allocate(*l, recv, nbytes, allocated);
    } catch (const Error& e) {
      return e.what();
    }
    l->queued.push_back(Queued{std::move(recv), nbytes, std::make_unique<P2PRequest>(std::move(send))});
    return "";
  }

  std::string send(int dest, const std::string& id, P2PRequest& r, uint64_t nbytes) override {
    Link* l = find(dest, true);
    if (!id.empty()) {
      if (l) {  // (the receiver lost its end: this one cannot finish either)
        fail(*l, COMMLIB_ERR_INTERNAL, "rank " + std::to_string(dest) + " restarted its NCCL link with this rank "
                                        "(its end had failed) before this transfer finished");
        links_.erase({dest, true});
      }
      NcclUniqueId u;
      std::memcpy(u.internal, id.data(), std::min(id.size(), sizeof(u.internal)));
      try {
        l = open(dest, true, r.device, u);
      } catch (const Error& e) {
        return e.what();
      }
    }
    if (!l) return "rank " + std::to_string(dest) + " cleared a send over an NCCL link this rank no longer has";
    if (l->device != r.device) return device_clash(*l, r);
    l->queued.push_back(Queued{std::move(r), nbytes, nullptr});
    return "";
  }

  bool progress(int64_t now) override {
    bool moved = false;
    for (auto it = links_.begin(); it != links_.end();) {
      if (step(*it->second, now, &moved)) {
        ++it;
      } else {
        it = links_.erase(it);
        moved = true;
      }
    }
    return moved;
  }

  void fail_all(int code, const std::string& message) override {
    for (auto& [key, l] : links_) fail(*l, code, message);
    links_.clear();
  }

  size_t pending() const override {
    size_t n = 0;
    for (const auto& [key, l] : links_) n += l->queued.size() + l->flights.size();
    return n;
  }

 private:
  using Key = std::pair<int, bool>;  // (peer, this rank sends)

  Link* find(int peer, bool sends) {
    auto it = links_.find({peer, sends});
    return it == links_.end() ? nullptr : it->second.get();
  }

  std::string device_clash(const Link& l, const P2PRequest& r) const {
    return what_of(r) + ": its buffer is on CUDA device " + std::to_string(r.device) + ", but this rank's link " +
           "with rank " + std::to_string(l.peer) + " runs on device " + std::to_string(l.device) +
           " (point-to-point between two ranks uses one device per rank)";
  }

  // Device memory for r's message, from the stream-ordered allocator on l's stream.
  void allocate(Link& l, P2PRequest& r, uint64_t nbytes, void** allocated) {
    DeviceGuard on(libs_.cuda, l.device);
    const cudaError rc = libs_.cuda.malloc_async ? libs_.cuda.malloc_async(&r.out, nbytes, l.stream)
                                                 : libs_.cuda.malloc(&r.out, nbytes);
    check_cuda(libs_.cuda, rc, "allocating " + std::to_string(nbytes) + " bytes of device memory for a message");
    r.owns_out = true;
    *allocated = r.out;
  }

  Link* open(int peer, bool sends, int device, const NcclUniqueId& id) {
    auto l = std::make_unique<Link>();
    l->peer = peer;
    l->sends = sends;
    l->device = device;
    l->stream = priority_stream(libs_.cuda, device);
    l->init = start_comm_init(libs_, id, sends ? 0 : 1, 2, device);
    l->started_us = now_us();
    Link* raw = l.get();
    links_[{peer, sends}] = std::move(l);
    return raw;
  }

  // False when the link failed (its requests are completed; erase it).
  bool step(Link& l, int64_t now, bool* moved) {
    if (l.init && !created(l, now, moved)) return false;
    if (l.init) return true;
    try {
      while (!l.queued.empty()) {
        launch(l, l.queued.front(), now);
        l.queued.pop_front();
        *moved = true;
      }
      while (!l.flights.empty()) {
        const cudaError rc = libs_.cuda.event_query(l.flights.front().finished);
        if (rc == kCudaErrorNotReady) break;
        check_cuda(libs_.cuda, rc, "cudaEventQuery (point-to-point)");
        Flight f = std::move(l.flights.front());
        l.flights.pop_front();
        destroy_event(f.finished);
        l.progress_us = now;
        *moved = true;
        done_(f.req, COMMLIB_OK, "");
        if (f.partner) done_(*f.partner, COMMLIB_OK, "");
      }
    } catch (const Error& e) {
      fail(l, COMMLIB_ERR_INTERNAL, e.what());
      return false;
    }
    if (l.flights.empty() || l.local) return true;
    ncclResult err = kNcclSuccess;
    const ncclResult rc = libs_.nccl.comm_get_async_error(l.comm, &err);
    if (rc != kNcclSuccess || (err != kNcclSuccess && err != kNcclInProgress)) {
      const ncclResult code = rc != kNcclSuccess ? rc : err;
      fail(l, COMMLIB_ERR_INTERNAL, std::string("NCCL reported an error on the link with rank ") +
                                         std::to_string(l.peer) + ": " + libs_.nccl.get_error_string(code));
      return false;
    }
    const int64_t since = std::max(l.progress_us, l.flights.front().launched_us);
    if (timeout_us_ > 0 && now - since > timeout_us_) {
      fail(l, COMMLIB_ERR_TIMED_OUT, "made no progress for " + std::to_string(timeout_us_ / 1000000) +
                                         " s (COMMLIB_TIMEOUT): rank " + std::to_string(l.peer) +
                                         " stopped taking part; the NCCL link with it was aborted");
      return false;
    }
    return true;
  }

  // The link's communicator: false when its creation failed or timed out.
  bool created(Link& l, int64_t now, bool* moved) {
    if (!l.init->done.load(std::memory_order_acquire)) {
      if (timeout_us_ <= 0 || now - l.started_us <= timeout_us_) return true;
      l.init.reset();  // (its helper thread is left behind: nothing can interrupt it)
      fail(l, COMMLIB_ERR_TIMED_OUT, "the NCCL link with rank " + std::to_string(l.peer) +
                                         " was not created within " + std::to_string(timeout_us_ / 1000000) +
                                         " s (COMMLIB_TIMEOUT): rank " + std::to_string(l.peer) +
                                         " froze or died, or NCCL cannot reach it");
      return false;
    }
    const ncclResult rc = l.init->rc;
    l.comm = l.init->comm;
    l.init.reset();
    if (rc != kNcclSuccess) {
      l.comm = nullptr;
      fail(l, COMMLIB_ERR_INTERNAL, std::string("ncclCommInitRank (the link with rank ") + std::to_string(l.peer) +
                                        "): " + libs_.nccl.get_error_string(rc));
      return false;
    }
    l.progress_us = now;
    *moved = true;
    return true;
  }

  void launch(Link& l, Queued& q, int64_t now) {
    DeviceGuard on(libs_.cuda, l.device);
    for (const P2PRequest* r : {&q.req, q.partner.get()}) {
      if (!r || !r->ready) continue;
      check_cuda(libs_.cuda, libs_.cuda.stream_wait_event(l.stream, static_cast<cudaEvent>(r->ready.get()), 0),
                 "cudaStreamWaitEvent (point-to-point)");
    }
    if (l.local) {
      check_cuda(libs_.cuda, libs_.cuda.memcpy_async(q.req.out, q.partner->data, q.nbytes, kCudaMemcpyDefault, l.stream),
                 "cudaMemcpyAsync (a message to this rank itself)");
    } else if (l.sends) {
      check_nccl(libs_.nccl, libs_.nccl.send(q.req.data, q.nbytes, kNcclUint8, 1, l.comm, l.stream), "ncclSend");
    } else {
      check_nccl(libs_.nccl, libs_.nccl.recv(q.req.out, q.nbytes, kNcclUint8, 0, l.comm, l.stream), "ncclRecv");
    }
    Flight f;
    f.finished = static_cast<cudaEvent>(record_event(libs_.cuda, l.device, l.stream));  // (from the pool)
    if (l.flights.empty()) l.progress_us = now;
    f.launched_us = now;
    f.req = std::move(q.req);
    f.partner = std::move(q.partner);
    l.flights.push_back(std::move(f));
  }

  // Completes every request of l with code: message (device memory it
  // allocated for them is freed after the abort), and closes l.
  void fail(Link& l, int code, const std::string& message) {
    if (l.comm) libs_.nccl.comm_abort(l.comm);
    l.comm = nullptr;
    auto release = [&](P2PRequest& r) {
      if (!r.owns_out || !r.out) return;
      if (l.stream && libs_.cuda.free_async) libs_.cuda.free_async(r.out, l.stream);
      r.handle->device_result = nullptr;  // (the caller gets the error, not the memory)
      r.out = nullptr;
    };
    for (Flight& f : l.flights) {
      destroy_event(f.finished);
      release(f.req);
      done_(f.req, code, what_of(f.req) + ": " + message);
      if (f.partner) done_(*f.partner, code, what_of(*f.partner) + ": " + message);
    }
    l.flights.clear();
    for (Queued& q : l.queued) {
      release(q.req);
      done_(q.req, code, what_of(q.req) + ": " + message);
      if (q.partner) done_(*q.partner, code, what_of(*q.partner) + ": " + message);
    }
    l.queued.clear();
    close(l, false);
  }

  // Destroys l's communicator (aborts it unless clean) and stream.
  void close(Link& l, bool clean) {
    if (l.comm) (clean ? libs_.nccl.comm_destroy : libs_.nccl.comm_abort)(l.comm);
    l.comm = nullptr;
    if (l.stream) libs_.cuda.stream_destroy(l.stream);
    l.stream = nullptr;
  }

  const GpuLibs& libs_;
  int64_t timeout_us_;
  Done done_;
  std::map<Key, std::unique_ptr<Link>> links_;
};

}  // namespace

std::unique_ptr<DeviceLinks> make_nccl_links(const GpuLibs& libs, int64_t timeout_us, DeviceLinks::Done done) {
  return std::make_unique<NcclLinks>(libs, timeout_us, std::move(done));
}

}  // namespace gpu
}  // namespace commlib
