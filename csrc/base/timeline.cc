#include "base/timeline.h"

#include <cerrno>
#include <chrono>
#include <cstring>

#include <algorithm>

#include "base/common.h"

namespace commlib {
namespace {

// How often the writer thread appends the buffered events to the file.
constexpr auto kWriteEvery = std::chrono::milliseconds(20);

std::string metadata(const char* what, int pid, int tid, const std::string& name) {
  return "{\"name\": \"" + std::string(what) + "\", \"ph\": \"M\", \"pid\": " + std::to_string(pid) +
         ", \"tid\": " + std::to_string(tid) + ", \"args\": {\"name\": " + json_string(name) + "}}";
}

}  // namespace

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof(esc), "\\u%04x", c);
      out += esc;
    } else {
      out += char(c);
    }
  }
  return out + "\"";
}

Timeline& timeline() {
  static Timeline* t = new Timeline();  // never destroyed: outlives atexit order issues
  return *t;
}

std::string Timeline::path_for(const std::string& path, int rank) {
  if (rank == 0) return path;
  const std::string suffix = ".rank" + std::to_string(rank);
  const size_t slash = path.rfind('/');
  const size_t dot = path.rfind('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash) || dot == slash + 1) {
    return path + suffix;
  }
  return path.substr(0, dot) + suffix + path.substr(dot);
}

void Timeline::start(const std::string& path, int rank, bool mark_cycles) {
  std::lock_guard<std::mutex> lock(mu_);
  if (file_) throw Error(COMMLIB_ERR_VALUE, "a timeline is already being written; stop_timeline() first");
  const std::string mine = path_for(path, rank);
  FILE* f = std::fopen(mine.c_str(), "w");
  if (!f) throw Error(COMMLIB_ERR_VALUE, "cannot write the timeline '" + mine + "': " + std::strerror(errno));
  file_ = f;
  rank_ = rank;
  closing_ = false;
  rows_.clear();
  buffer_ = "[\n" + metadata("process_name", rank, 0, "rank " + std::to_string(rank)) + ",\n" +
            metadata("thread_name", rank, 0, "cycles") + ",\n";
  mark_cycles_.store(mark_cycles);
  thread_ = std::thread([this] { writer(); });
  on_.store(true);
}

void Timeline::stop() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!file_) return;
  on_.store(false);
  closing_ = true;
  cv_.notify_all();
  lock.unlock();
  thread_.join();
  lock.lock();
  // The last event carries no comma: the file is a complete JSON array.
  buffer_ += metadata("process_sort_index", rank_, 0, std::to_string(rank_)) + "\n]\n";
  std::fwrite(buffer_.data(), 1, buffer_.size(), file_);
  std::fclose(file_);
  file_ = nullptr;
  buffer_.clear();
}

void Timeline::writer() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!closing_) {
    cv_.wait_for(lock, kWriteEvery);
    if (buffer_.empty()) continue;
    std::string out;
    out.swap(buffer_);
    FILE* f = file_;
    lock.unlock();
    std::fwrite(out.data(), 1, out.size(), f);
    std::fflush(f);
    lock.lock();
  }
}

int Timeline::row_of(const std::string& name) {
  if (name.empty()) return 0;
  auto it = rows_.find(name);
  if (it != rows_.end()) return it->second;
  const int row = int(rows_.size()) + 1;
  rows_.emplace(name, row);
  append(metadata("thread_name", rank_, row, name));
  return row;
}

void Timeline::append(const std::string& event) {
  buffer_ += event;
  buffer_ += ",\n";
}

void Timeline::span(const std::string& name, const char* phase, int64_t start_us, int64_t end_us,
                    const std::string& args_json) {
  char head[192];
  std::lock_guard<std::mutex> lock(mu_);
  if (!file_ || closing_) return;
  const int row = row_of(name);
  const int n = std::snprintf(head, sizeof(head),
                              "{\"name\": \"%s\", \"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %lld, "
                              "\"dur\": %lld, \"args\": {",
                              phase, rank_, row, static_cast<long long>(start_us),
                              static_cast<long long>(end_us > start_us ? end_us - start_us : 0));
  buffer_.append(head, size_t(std::min<int>(n, int(sizeof(head)) - 1)));
  buffer_ += args_json;
  buffer_ += "}},\n";
}

void Timeline::mark(const std::string& name, const char* what, int64_t ts_us, const std::string& args_json) {
  char head[160];
  std::lock_guard<std::mutex> lock(mu_);
  if (!file_ || closing_) return;
  const int row = row_of(name);
  const int n = std::snprintf(head, sizeof(head),
                              "{\"name\": \"%s\", \"ph\": \"i\", \"s\": \"t\", \"pid\": %d, \"tid\": %d, "
                              "\"ts\": %lld, \"args\": {",
                              what, rank_, row, static_cast<long long>(ts_us));
  buffer_.append(head, size_t(std::min<int>(n, int(sizeof(head)) - 1)));
  buffer_ += args_json;
  buffer_ += "}},\n";
}

namespace {
thread_local std::string t_algorithms;
}  // namespace

void note_algorithm(const char* name) {
  if (!timeline().on()) return;
  const std::string n(name);
  size_t at = 0;
  while ((at = t_algorithms.find(n, at)) != std::string::npos) {
    const size_t end = at + n.size();
    if ((at == 0 || t_algorithms[at - 1] == '+') && (end == t_algorithms.size() || t_algorithms[end] == '+')) return;
    at = end;
  }
  if (!t_algorithms.empty()) t_algorithms += '+';
  t_algorithms += n;
}

std::string take_algorithms() {
  std::string out;
  out.swap(t_algorithms);
  return out;
}

}  // namespace commlib
