// The timeline: a Chrome-trace JSON file per rank (opens in Perfetto and
// chrome://tracing) of what happened to each tensor on this rank: queued
// (held for batching), negotiated (with a cache hit or not; on rank 0 also
// when each rank's request arrived), executed (operation, algorithm, bytes,
// what it was fused with) and completed or failed, plus optional markers for
// the background loop's busy cycles.
//
// Events are formatted by the thread that records them into a small
// in-memory buffer; a writer thread of its own appends them to the file
// every few milliseconds, so no communication path waits on the disk. When
// the timeline is off, each recording site costs one relaxed atomic load.
//
// Layout of the trace: pid = the job rank ("rank R"), one tid (row) per
// tensor name, tid 0 for the loop's cycle markers; timestamps in
// microseconds of the steady clock (comparable between the ranks of one
// host). Rank 0 writes the path it was given; rank r > 0 writes
// "<stem>.rank<r><ext>" beside it (commlib.timeline merges them).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

namespace commlib {

class Timeline {
 public:
  // Opens the file (rank's path, see above) and starts the writer; throws
  // Error(COMMLIB_ERR_VALUE) if it cannot be created or one is running.
  void start(const std::string& path, int rank, bool mark_cycles);
  // Writes what is buffered, closes the JSON array and the file. No-op when off.
  void stop();

  bool on() const { return on_.load(std::memory_order_relaxed); }
  bool marks_cycles() const { return mark_cycles_.load(std::memory_order_relaxed); }

  // A phase of tensor `name` from start_us to end_us; args_json is the inside
  // of a JSON object ("" or "\"k\": v, ...").
  void span(const std::string& name, const char* phase, int64_t start_us, int64_t end_us,
            const std::string& args_json = "");
  // A point in time on tensor `name`'s row (empty name: the cycle row).
  void mark(const std::string& name, const char* what, int64_t ts_us, const std::string& args_json = "");

  // The file rank `rank` writes for `path`.
  static std::string path_for(const std::string& path, int rank);

 private:
  int row_of(const std::string& name);  // caller holds mu_; names new rows
  void append(const std::string& event);  // caller holds mu_
  void writer();

  std::atomic<bool> on_{false};
  std::atomic<bool> mark_cycles_{false};
  std::mutex mu_;  // everything below
  std::condition_variable cv_;
  bool closing_ = false;
  int rank_ = 0;
  FILE* file_ = nullptr;
  std::string buffer_;  // formatted events not yet written
  std::unordered_map<std::string, int> rows_;
  std::thread thread_;
};

// The process's timeline (one engine per process).
Timeline& timeline();

// `text` as a JSON string literal (with quotes).
std::string json_string(const std::string& text);

// What ran, for the timeline: the code that picks an algorithm notes its
// name ("ring", "shm", "hierarchical", "mpi", ...) while the timeline is on;
// the executor takes the names noted during a response (joined by '+', each
// once).
void note_algorithm(const char* name);
std::string take_algorithms();

}  // namespace commlib
