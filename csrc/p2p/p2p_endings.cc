// How point-to-point requests end other than by a transfer (see
// point_to_point.h): a peer's shutdown, stall warnings and receive timeouts,
// failing everything, and this rank's own goodbye.
#include <sched.h>

#include <cstdio>
#include <iterator>

#include "base/common.h"
#include "base/progress.h"
#include "p2p/point_to_point.h"
#include "p2p/wire.h"

namespace commlib {

void PointToPoint::on_bye(int source) {
  departed_[size_t(source)] = true;
  const std::string who = "rank " + std::to_string(source) + " called shutdown() before ";
  for (auto it = posted_.begin(); it != posted_.end();) {
    if (std::get<0>(it->first) != source) {
      ++it;
      continue;
    }
    for (P2PRequest& r : it->second)
      complete(r, COMMLIB_ERR_NOT_INIT, who + "sending a message this recv (" + tag_str(r.tag, r.process_set) +
                                            ") could match");
    it = posted_.erase(it);
  }
  for (auto it = splits_.begin(); it != splits_.end();) {
    if (it->source != source) {
      ++it;
      continue;
    }
    complete(it->req, COMMLIB_ERR_NOT_INIT, who + "writing its half of this recv (" +
                                                tag_str(it->req.tag, it->req.process_set) + ")");
    it = splits_.erase(it);
  }
  for (auto it = outgoing_.begin(); it != outgoing_.end();) {
    if (it->first.first != source || !it->second.data.empty()) {
      ++it;
      continue;
    }
    P2PRequest& r = it->second.req;
    complete(r, COMMLIB_ERR_NOT_INIT, who + "receiving this send (" + tag_str(r.tag, r.process_set) + ")");
    it = outgoing_.erase(it);
  }
}

void PointToPoint::check_stalls(int64_t now, int64_t limit_us, int64_t timeout_us) {
  if (now - last_stall_check_us_ < 1000000) return;
  last_stall_check_us_ = now;
  auto warn = [&](P2PRequest& r) {
    if (r.warned || now - r.posted_us < limit_us) return;
    r.warned = true;
    std::fprintf(stderr, "commlib (rank %d): WARNING: %s rank %d (%s) has waited %.0f s for a matching %s\n",
                 rank_, r.is_send ? "send to" : "recv from", r.peer, tag_str(r.tag, r.process_set).c_str(),
                 double(now - r.posted_us) / 1e6, r.is_send ? "recv" : "send");
  };
  for (auto& [key, q] : posted_)
    for (P2PRequest& r : q) warn(r);
  if (timeout_us > 0) {
    time_out_receives(now, timeout_us);
    withdraw_sends(now, timeout_us);
  }
  for (auto& [key, o] : outgoing_)
    if (o.data.empty()) warn(o.req);
}

void PointToPoint::time_out_receives(int64_t now, int64_t timeout_us) {
  for (auto it = posted_.begin(); it != posted_.end();) {
    auto& q = it->second;
    for (auto r = q.begin(); r != q.end();) {
      if (now - r->posted_us < timeout_us) {
        ++r;
        continue;
      }
      complete(*r, COMMLIB_ERR_TIMED_OUT,
               "recv from rank " + std::to_string(r->peer) + " (" + tag_str(r->tag, r->process_set) +
                   ") timed out after " + std::to_string(timeout_us / 1000000) +
                   " s (COMMLIB_TIMEOUT): no matching send arrived");
      r = q.erase(r);
    }
    it = q.empty() ? posted_.erase(it) : std::next(it);
  }
}

void PointToPoint::withdraw_sends(int64_t now, int64_t timeout_us) {
  for (auto& [key, o] : outgoing_) {
    if (o.withdrawn || !o.data.empty() || now - o.req.posted_us < timeout_us) continue;
    o.withdrawn = true;
    Writer w;
    w.put<int32_t>(kWithdraw);
    w.put<int32_t>(o.req.process_set);
    w.put<int64_t>(o.req.tag);
    w.put<uint64_t>(key.second);
    w.put<int64_t>(timeout_us);
    send_ctl(key.first, w.take());
  }
}

void PointToPoint::on_withdraw(int source, std::string_view msg) {
  Reader rd(msg);
  rd.get<int32_t>();
  const int set = rd.get<int32_t>();
  const int64_t tag = rd.get<int64_t>();
  const uint64_t seq = rd.get<uint64_t>();
  const int64_t timeout_us = rd.get<int64_t>();
  auto a = arrived_.find(Key{source, set, tag});
  if (a == arrived_.end()) return;  // (taken by a receive meanwhile: its reply completes the send)
  auto& q = a->second;
  for (auto in = q.begin(); in != q.end(); ++in) {
    if (in->seq != seq) continue;
    q.erase(in);
    if (q.empty()) arrived_.erase(a);
    send_ack(source, seq, COMMLIB_ERR_TIMED_OUT,
             "send to rank " + std::to_string(rank_) + " (" + tag_str(tag, set) + ") timed out after " +
                 std::to_string(timeout_us / 1000000) + " s (COMMLIB_TIMEOUT): no matching recv was posted");
    return;
  }
}

void PointToPoint::fail_all(int code, const std::string& message) {
  for (auto& [key, q] : posted_)
    for (P2PRequest& r : q) complete(r, code, message);
  posted_.clear();
  for (auto& [key, o] : outgoing_) complete(o.req, code, message);
  outgoing_.clear();
  for (Transfer& t : transfers_) complete(t.req, code, message);
  transfers_.clear();
  for (Split& t : splits_) complete(t.req, code, message);
  splits_.clear();
  arrived_.clear();
  to_self_.clear();
  if (links_) links_->fail_all(code, message);
}

void PointToPoint::say_goodbye() {
  // Data already cleared to send is sent first: its receiver waits for it.
  const int64_t deadline = now_us() + 2000000;
  auto sending = [&] {
    for (auto& [key, o] : outgoing_)
      if (!o.data.empty()) return true;
    return false;
  };
  while (sending() && now_us() < deadline) {
    progress();
    throw_if_peer_lost();
    sched_yield();
  }
  Writer w;
  w.put<int32_t>(kBye);
  const std::string bye = w.take();
  for (int r = 0; r < size_; ++r)
    if (r != rank_ && !departed_[size_t(r)]) send_ctl(r, bye);
}

}  // namespace commlib
