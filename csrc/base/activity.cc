#include "base/activity.h"

#include <cstdio>
#include <mutex>
#include <vector>

#include "base/progress.h"

namespace commlib {
namespace {

struct Running {
  int64_t id;
  const char* what;
  const std::string* detail;
  int64_t since_us;
};

struct Board {
  std::mutex mu;
  std::vector<Running> running;
  int64_t next_id = 1;
  Board() { running.reserve(16); }
};

Board& board() {
  static auto* b = new Board();  // (never destroyed: a scope may end during exit)
  return *b;
}

}  // namespace

Activity::Activity(const char* what, const std::string* detail) {
  const int64_t now = now_us();
  Board& b = board();
  std::lock_guard<std::mutex> lock(b.mu);
  id_ = b.next_id++;
  b.running.push_back(Running{id_, what, detail, now});
}

Activity::~Activity() {
  Board& b = board();
  std::lock_guard<std::mutex> lock(b.mu);
  for (size_t i = b.running.size(); i-- > 0;) {
    if (b.running[i].id == id_) {
      b.running.erase(b.running.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
  }
}

std::string running_activities(int64_t now_us) {
  Board& b = board();
  std::lock_guard<std::mutex> lock(b.mu);
  std::string out;
  for (const Running& r : b.running) {
    char took[32];
    std::snprintf(took, sizeof(took), " for %.1f s", double(now_us - r.since_us) / 1e6);
    if (!out.empty()) out += "; within it, ";
    out += r.what;
    if (r.detail) out += " '" + *r.detail + "'";
    out += took;
  }
  return out;
}

}  // namespace commlib
