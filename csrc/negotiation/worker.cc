#include "negotiation/worker.h"

namespace commlib {

void Worker::report(const std::vector<Entry*>& entries) {
  Writer w;
  w.put<int32_t>(kMsgRequests);
  w.put<uint32_t>(uint32_t(entries.size()));
  for (Entry* e : entries) encode(w, e->desc);
  control_.send(0, w.take());
}

bool Worker::on_message(int kind, Reader& r, std::deque<Response>& ready, bool by_log, bool stopping) {
  if (kind == kMsgResponses) {
    const uint32_t n = r.get<uint32_t>();
    for (uint32_t i = 0; i < n; ++i) ready.push_back(decode_response(r));
  } else if (kind == kMsgShutdown) {
    if (by_log) {
      // The order log carries departures, in their place in the order (on_left).
    } else {
      // Responses that came before it (perhaps in this very poll) run
      // first: the coordinator ran them, so every rank must (Engine::cycle).
      closing_ = stopping ? "commlib was shut down before this collective completed"
                          : kCoordinatorLeft;
    }
  } else if (kind == kMsgLeaving) {
    leaving_ = true;
  } else {
    return false;
  }
  return true;
}

void Worker::send_leaving() {
  Writer w;
  w.put<int32_t>(kMsgShutdown);
  control_.send(0, w.take());
}

bool Worker::take_leaving() {
  const bool out = leaving_;
  leaving_ = false;
  return out;
}

std::string Worker::take_closing() {
  std::string out;
  out.swap(closing_);
  return out;
}

}  // namespace commlib
