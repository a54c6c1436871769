#include "base/liveness.h"

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <thread>

#include "base/common.h"

namespace commlib {
namespace {

std::atomic<int> g_lost_rank{-1};
std::mutex g_mu;
std::string g_lost_message;
std::thread g_thread;
std::condition_variable g_cv;
bool g_stop = false;

// A process is alive when /proc/<pid>/stat exists and its state is not
// zombie ('Z') or dead ('X').
bool process_alive(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  if (!f) return false;
  std::string line;
  std::getline(f, line);
  const size_t paren = line.rfind(')');
  if (paren == std::string::npos || paren + 2 >= line.size()) return true;
  const char state = line[paren + 2];
  return state != 'Z' && state != 'X';
}

void monitor_loop(std::vector<PeerInfo> peers, std::atomic<int32_t>* first_lost) {
  std::unique_lock<std::mutex> lock(g_mu);
  while (!g_stop) {
    g_cv.wait_for(lock, std::chrono::milliseconds(100));
    if (g_stop) break;
    const PeerInfo* lost = nullptr;
    for (const PeerInfo& p : peers) {
      if (!process_alive(p.pid)) {
        lost = &p;
        break;
      }
    }
    if (!lost) continue;
    if (first_lost) {  // agree with the host's other ranks on who died first
      int32_t none = 0;
      if (!first_lost->compare_exchange_strong(none, lost->rank + 1)) {
        for (const PeerInfo& p : peers)
          if (p.rank + 1 == none) lost = &p;
      }
    }
    g_lost_message = "rank " + std::to_string(lost->rank) + " (pid " + std::to_string(lost->pid) +
                     " on host " + lost->host + ") exited or was killed; the job cannot continue";
    g_lost_rank.store(lost->rank);
    return;
  }
}

}  // namespace

void start_peer_monitor(const std::vector<PeerInfo>& local_peers,
                        std::atomic<int32_t>* first_lost) {
  stop_peer_monitor();
  std::lock_guard<std::mutex> lock(g_mu);
  g_stop = false;
  g_lost_rank.store(-1);
  g_lost_message.clear();
  if (local_peers.empty()) return;
  g_thread = std::thread(monitor_loop, local_peers, first_lost);
}

void stop_peer_monitor() {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_stop = true;
  }
  g_cv.notify_all();
  if (g_thread.joinable()) g_thread.join();
}

int lost_rank() { return g_lost_rank.load(std::memory_order_relaxed); }

std::string lost_peer_message() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_lost_message;
}

void throw_if_peer_lost() {
  if (lost_rank() >= 0) throw Error(COMMLIB_ERR_PEER_LOST, lost_peer_message());
}

}  // namespace commlib
