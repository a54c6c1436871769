// Waiting without holding the core and without a slow scheduler wake-up.
//
// On this class of VM a futex/condvar wake costs 30-70 us while a spin loop
// that calls sched_yield hands off in a few microseconds; pure spinning starves
// the other threads of a 2-core machine. So every wait in the core spins with
// sched_yield for a bounded time, then naps with growing sleeps (up to
// kMaxNapUs) so that an idle job does not burn CPU.
#pragma once

#include <sched.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

#include "base/liveness.h"

namespace commlib {

// Microseconds spent spinning before napping (COMMLIB_SPIN_US, set at init;
// the table's default before); on the engine's background thread
// COMMLIB_BG_SPIN_US instead: it shares the cores with the training threads,
// and a collective it progresses asynchronously is not waited for yet.
int64_t spin_budget_us();
void set_spin_budget_us(int64_t us);
void set_bg_spin_budget_us(int64_t us);
// Marks the calling thread as the engine's background thread.
void mark_background_thread();

// Microseconds a wait looks at its condition before it starts to yield: a
// peer's answer on one host often comes that soon, and each yield is a
// system call (about 1 us here, 0.8 us of an 8-byte allreduce's 2.8 at 2
// ranks). Only where every rank of the host can have a core of its own (set
// at init, Engine::init): where ranks share cores, the peer waited for may
// need this very core, and a spin that keeps it delays the peer (3 ranks on
// 2 cores: 4 KiB allreduces 19-20 -> 25-29 us). 0 until then, and always on
// the background thread: it runs collectives nobody waits for yet, beside
// the training's threads, which need the core more than it needs the
// microsecond.
constexpr int64_t kNoYieldUs = 5;
int64_t no_yield_us();
void set_no_yield_us(int64_t us);

// COMMLIB_TIMEOUT in microseconds (0: none; set at init). Every rank of a
// negotiated collective takes part in it at once, so a wait that lasts longer
// means a peer froze, died on another host or was cut off in the middle of
// it: the wait throws Error(COMMLIB_ERR_TIMED_OUT) naming what it waited for
// (the engine cannot go on: the collective is half done).
int64_t stuck_timeout_us();
void set_stuck_timeout_us(int64_t us);
[[noreturn]] void throw_stuck(int64_t waited_us, const std::string& waited_for);

// What a wait waits for, in its timeout message (poll_until's `describe`).
struct OtherRanks {
  std::string operator()() const { return "the other ranks of this host"; }
};
constexpr int64_t kMaxNapUs = 1000;
// The longest nap of an idle background thread while CUDA collectives are in
// flight: it alone sees their completion events reached (the waiters sleep),
// and a 1 ms nap made a 4-rank allreduce on one GPU 0.91-0.98x torch's NCCL.
constexpr int64_t kGpuPollNapUs = 20;
// The longest nap between MPI progress calls of a long transfer (see
// poll_until): 0.2 ms is 25 KB at 1 Gbit/s, 250 KB at 10 Gbit/s, well within
// what the kernel's socket buffers hold meanwhile.
constexpr int64_t kMaxTransferNapUs = 200;

// The engine's count of threads spinning in a wait for a handle (driving
// the engine; a waiter that sleeps after its spin budget does not count). Set
// for the engine's lifetime.
inline const std::atomic<int>* g_drivers = nullptr;
// Whether an MPI wait that outlasted its spin budget may nap: on the
// engine's background thread, while no thread spins waiting for a handle
// (nobody waits for the collective, or its waiter already sleeps and pays a
// condvar wake-up anyway); on any other thread (one that runs the collective
// it waits for itself), always.
bool transfer_may_nap();

inline int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Called while a shared-memory wait spins or naps (set by the engine for its
// lifetime): it moves the engine's own pending control sends along. A
// control message above MPI's eager size completes only while its sender
// calls into MPI, and the ranks this wait waits for may be waiting for that
// very message (rank 0's responses) before they can take part.
inline void (*g_wait_hook)(void*) = nullptr;
inline void* g_wait_hook_arg = nullptr;

inline void nap_us(int64_t us) {
  timespec ts{static_cast<time_t>(us / 1000000), static_cast<long>((us % 1000000) * 1000)};
  nanosleep(&ts, nullptr);
}

// Calls done() until it returns true. Throws Error(COMMLIB_ERR_PEER_LOST) if a
// peer of the job is found dead meanwhile (see liveness.h), and
// Error(COMMLIB_ERR_TIMED_OUT) after stuck_timeout_us(). may_sleep=false is
// for MPI requests, whose progress happens only inside MPI_Test (a large
// message is many steps; a nap between steps would cost up to 1 ms each,
// which is how a 16 MiB alltoall once took 0.8 s): after its spin budget it
// naps at most kMaxTransferNapUs, and only where transfer_may_nap(), else it
// yields. A transfer across hosts runs beside the training's computation
// (delayed averaging, a gradient allreduce during backward) or beside the
// kernel's TCP work, and a thread yielding through the whole transfer takes
// half of a core from them.
template <typename Done, typename Describe = OtherRanks>
void poll_until(Done done, bool may_sleep = true, Describe describe = Describe()) {
  if (done()) return;
  const int64_t start = now_us();
  const int64_t budget = spin_budget_us();
  const int64_t limit = stuck_timeout_us();
  const int64_t first = no_yield_us();
  int64_t nap = 20;
  for (;;) {
    if (done()) return;
    throw_if_peer_lost();
    const int64_t waited = now_us() - start;
    if (limit > 0 && waited > limit) throw_stuck(waited, describe());
    if (may_sleep && g_wait_hook) g_wait_hook(g_wait_hook_arg);
    if (waited < first) continue;
    if (waited < budget || (!may_sleep && !transfer_may_nap())) {
      sched_yield();
    } else {
      nap_us(nap);
      const int64_t most = may_sleep ? kMaxNapUs : kMaxTransferNapUs;
      nap = nap * 2 < most ? nap * 2 : most;
    }
  }
}

}  // namespace commlib
