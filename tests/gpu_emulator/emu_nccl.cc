// The GPU emulator's NCCL (test infrastructure, never shipped): the entry
// points commlib's loader binds, for ranks that are processes of one host.
//
// A communicator is a shared-memory segment named by its unique id. Every
// NCCL call (or every call of an ncclGroupStart/End group) is one "round",
// a task on the caller's stream (emu_stream.h), so it runs after the call
// returned and in stream order, as on a GPU. A round: each rank publishes
// where its inputs are (address and bytes); a barrier; each rank reads what
// it needs straight from the others' memory (process_vm_readv) and computes
// its results in rank order, so every rank gets bitwise the same; a second
// barrier (no input is overwritten before everyone has read it); each rank
// writes its outputs.
//
// Failures behave as NCCL's do: an operation that cannot finish (a peer
// exited or aborted, the ranks called different collectives, a read failed)
// sets the communicator's asynchronous error and keeps its stream blocked
// until ncclCommAbort; a rank that stops taking part blocks the others until
// they abort. Nothing is freed: communicators and streams live until exit.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "emu_reduce.h"
#include "emu_stream.h"

namespace emu {
namespace {

enum : int { kOk = 0, kSystemError = 2, kInternalError = 3, kInvalidArgument = 4, kInvalidUsage = 5, kRemoteError = 6 };
constexpr int kMaxRanks = 32, kMaxOps = 64, kMaxSends = 4;

struct Desc {
  uint64_t addr, bytes;
};

// One rank's part of the segment.
struct Slot {
  std::atomic<int32_t> pid;
  std::atomic<int32_t> aborted;
  std::atomic<uint64_t> epoch;  // barriers passed
  std::atomic<uint32_t> connected;  // collective kinds issued (connect_first), a bit each
  uint64_t signature;           // of the round's collectives
  Desc coll[kMaxOps];           // each collective's input
  int32_t nsend[kMaxRanks];     // sends to each peer this round
  Desc send[kMaxRanks][kMaxSends];
};
struct Segment {
  Slot slot[kMaxRanks];
};

enum Kind : int { kAllReduce, kBroadcast, kReduce, kAllGather, kReduceScatter, kSend, kRecv };

struct Op {
  Kind kind;
  const void* in;
  void* out;
  size_t count;  // elements: of the input (allgather: per rank), of the output (reducescatter)
  int dtype, redop, peer;  // peer: root, or the other side of a send/recv
  std::vector<char> scalar;  // PreMulSum's factor, in dtype
};

struct Comm {
  int rank = 0, size = 0;
  Segment* seg = nullptr;
  std::atomic<bool> aborted{false};
  std::atomic<int> async_error{kOk};
  std::mutex mu;
  std::map<int, std::vector<char>> premul;  // operator id -> scalar
  int next_op = 5;
  uint64_t epoch = 0;  // (stream tasks only: one round at a time)
  uint32_t connected = 0;  // this rank's kinds issued (connect_first; the issuing thread's)
};

thread_local int group_depth = 0;
thread_local std::vector<std::pair<Comm*, std::pair<Stream*, Op>>> grouped;

void report(Comm* c, int code, const std::string& what) {
  int expected = kOk;
  if (c->async_error.compare_exchange_strong(expected, code))
    std::fprintf(stderr, "[gpu emulator] rank %d: %s\n", c->rank, what.c_str());
}

// Blocks a stream that cannot go on until the communicator is aborted.
void fail(Comm* c, int code, const std::string& what) {
  report(c, code, what);
  while (!c->aborted.load()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
}

// Every rank's epoch reaches c->epoch + 1; false (after fail) if that cannot happen.
bool barrier(Comm* c) {
  const uint64_t target = ++c->epoch;
  c->seg->slot[c->rank].epoch.store(target, std::memory_order_release);
  auto next_check = std::chrono::steady_clock::now();
  for (int spins = 0;; ++spins) {
    bool all = true;
    for (int r = 0; r < c->size && all; ++r) all = c->seg->slot[r].epoch.load(std::memory_order_acquire) >= target;
    // (aborted looked at after the others' epochs: a peer stopped inside this
    // round may be resumed once this rank aborted, and reach the barrier
    // while this thread had not yet seen the abort; an aborted
    // communicator, as NCCL's, goes no further)
    if (c->aborted.load()) return false;
    if (all) return true;
    if (spins < 200) {
      sched_yield();
      continue;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    if (std::chrono::steady_clock::now() < next_check) continue;
    next_check = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
    for (int r = 0; r < c->size; ++r) {
      const Slot& s = c->seg->slot[r];
      const int pid = s.pid.load();
      if (s.aborted.load()) {
        fail(c, kRemoteError, "rank " + std::to_string(r) + " aborted the communicator");
        return false;
      }
      if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) {
        fail(c, kRemoteError, "rank " + std::to_string(r) + " (pid " + std::to_string(pid) + ") exited");
        return false;
      }
    }
  }
}

// Copies bytes at addr of rank r's process into dst.
bool read_rank(Comm* c, int r, uint64_t addr, void* dst, size_t bytes) {
  if (bytes == 0) return true;
  if (r == c->rank) {
    std::memcpy(dst, reinterpret_cast<const void*>(addr), bytes);
    return true;
  }
  size_t done = 0;
  while (done < bytes) {
    iovec local{static_cast<char*>(dst) + done, bytes - done};
    iovec remote{reinterpret_cast<void*>(addr + done), bytes - done};
    const ssize_t n = process_vm_readv(c->seg->slot[r].pid.load(), &local, 1, &remote, 1, 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      fail(c, kSystemError, "reading rank " + std::to_string(r) + "'s buffer: " + std::strerror(n < 0 ? errno : EFAULT));
      return false;
    }
    done += size_t(n);
  }
  return true;
}

uint64_t signature(const std::vector<Op>& ops) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  for (const Op& op : ops) {
    if (op.kind == kSend || op.kind == kRecv) continue;
    for (uint64_t v : {uint64_t(op.kind), uint64_t(op.count), uint64_t(op.dtype), uint64_t(op.redop),
                       uint64_t(op.peer)})
      mix(v);
  }
  return h;
}

struct Write {
  void* dst;
  std::vector<char> data;
};

// Reads every rank's `bytes` at offset `skip` of its collective `i`'s input.
bool gather_inputs(Comm* c, int i, size_t skip, size_t bytes, std::vector<std::vector<char>>& parts) {
  parts.assign(size_t(c->size), std::vector<char>(bytes));
  for (int r = 0; r < c->size; ++r) {
    const Desc& d = c->seg->slot[r].coll[i];
    if (skip + bytes > d.bytes) {
      fail(c, kInvalidUsage, "rank " + std::to_string(r) + "'s input is smaller than this rank expects");
      return false;
    }
    if (!read_rank(c, r, d.addr + skip, parts[size_t(r)].data(), bytes)) return false;
  }
  return true;
}

Write reduced(const Op& op, const std::vector<std::vector<char>>& parts, size_t n) {
  std::vector<const void*> in;
  for (const auto& p : parts) in.push_back(p.data());
  Write w{op.out, std::vector<char>(n * dtype_bytes(op.dtype))};
  reduce(op.dtype, op.redop, w.data.data(), in.data(), int(in.size()), n, op.scalar.data());
  return w;
}

// This rank's results of collective i (op), to be written after the second barrier.
bool compute(Comm* c, int i, const Op& op, std::vector<Write>& out) {
  const size_t esz = dtype_bytes(op.dtype), bytes = op.count * esz;
  std::vector<std::vector<char>> parts;
  switch (op.kind) {
    case kAllReduce:
      if (!gather_inputs(c, i, 0, bytes, parts)) return false;
      out.push_back(reduced(op, parts, op.count));
      return true;
    case kReduce:
      if (c->rank != op.peer) return true;
      if (!gather_inputs(c, i, 0, bytes, parts)) return false;
      out.push_back(reduced(op, parts, op.count));
      return true;
    case kReduceScatter:
      if (!gather_inputs(c, i, size_t(c->rank) * bytes, bytes, parts)) return false;
      out.push_back(reduced(op, parts, op.count));
      return true;
    case kBroadcast: {
      Write w{op.out, std::vector<char>(bytes)};
      const Desc& d = c->seg->slot[op.peer].coll[i];
      if (d.bytes < bytes) {
        fail(c, kInvalidUsage, "the root's broadcast input is smaller than this rank expects");
        return false;
      }
      if (!read_rank(c, op.peer, d.addr, w.data.data(), bytes)) return false;
      out.push_back(std::move(w));
      return true;
    }
    case kAllGather: {
      if (!gather_inputs(c, i, 0, bytes, parts)) return false;
      Write w{op.out, {}};
      for (const auto& p : parts) w.data.insert(w.data.end(), p.begin(), p.end());
      out.push_back(std::move(w));
      return true;
    }
    default:
      return true;
  }
}

// The receives of a round: the k-th receive from p reads p's k-th send to this rank.
bool receive(Comm* c, const std::vector<Op>& ops, std::vector<Write>& out) {
  int taken[kMaxRanks] = {};
  for (const Op& op : ops) {
    if (op.kind != kRecv) continue;
    const Slot& peer = c->seg->slot[op.peer];
    const int k = taken[op.peer]++;
    const size_t bytes = op.count * dtype_bytes(op.dtype);
    if (k >= peer.nsend[c->rank] || peer.send[c->rank][k].bytes != bytes) {
      fail(c, kInvalidUsage, "a receive of " + std::to_string(bytes) + " bytes from rank " + std::to_string(op.peer) +
                                 " has no matching send");
      return false;
    }
    Write w{op.out, std::vector<char>(bytes)};
    if (!read_rank(c, op.peer, peer.send[c->rank][k].addr, w.data.data(), bytes)) return false;
    out.push_back(std::move(w));
  }
  return true;
}

// False (after fail) for more sends to one peer than a round holds.
bool publish(Comm* c, const std::vector<Op>& ops) {
  Slot& me = c->seg->slot[c->rank];
  std::memset(me.nsend, 0, sizeof(me.nsend));
  int i = 0;
  for (const Op& op : ops) {
    const size_t esz = dtype_bytes(op.dtype);
    if (op.kind == kSend) {
      if (me.nsend[op.peer] == kMaxSends) {
        fail(c, kInvalidUsage, "more than " + std::to_string(kMaxSends) + " sends to one peer in a group");
        return false;
      }
      me.send[op.peer][me.nsend[op.peer]++] = Desc{uint64_t(op.in), op.count * esz};
    } else if (op.kind != kRecv) {
      const size_t in = op.kind == kReduceScatter ? op.count * esz * size_t(c->size) : op.count * esz;
      me.coll[i++] = Desc{uint64_t(op.in), in};
    }
  }
  me.signature = signature(ops);
  return true;
}

void run_round(Comm* c, const std::vector<Op>& ops) {
  if (c->aborted.load() || c->async_error.load() != kOk) return;  // (an aborted communicator does nothing)
  if (!publish(c, ops) || !barrier(c)) return;
  const uint64_t mine = c->seg->slot[c->rank].signature;
  for (int r = 0; r < c->size; ++r) {
    if (c->seg->slot[r].signature != mine) {
      return fail(c, kInvalidUsage, "rank " + std::to_string(r) + " called different collectives in this round");
    }
  }
  std::vector<Write> writes;
  int i = 0;
  for (const Op& op : ops) {
    if (op.kind == kSend || op.kind == kRecv) continue;
    if (!compute(c, i++, op, writes)) return;
  }
  if (!receive(c, ops, writes)) return;
  if (!barrier(c)) return;
  for (const Write& w : writes) std::memcpy(w.dst, w.data.data(), w.data.size());
}

// COMMLIB_GPU_EMULATOR_CONNECT=1: as NCCL (2.22 on) connects the members
// lazily, the first collective of each kind on a communicator blocks the
// thread that issues it until every member has issued its own (sends and
// receives excepted); a member that exited or aborted meanwhile fails it.
int connect_first(Comm* c, Kind kind) {
  static const bool on = [] {
    const char* v = std::getenv("COMMLIB_GPU_EMULATOR_CONNECT");
    return v && std::atoi(v) != 0;
  }();
  const uint32_t bit = 1u << kind;
  if (!on || kind == kSend || kind == kRecv || (c->connected & bit)) return kOk;
  c->connected |= bit;
  c->seg->slot[c->rank].connected.fetch_or(bit);
  for (;;) {
    bool all = true;
    for (int r = 0; r < c->size && all; ++r) all = (c->seg->slot[r].connected.load() & bit) != 0;
    if (all) return kOk;
    if (c->aborted.load()) return kRemoteError;
    for (int r = 0; r < c->size; ++r) {
      const Slot& slot = c->seg->slot[r];
      const int pid = slot.pid.load();
      if (slot.aborted.load() || (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH)) return kRemoteError;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

int enqueue(Comm* c, Stream* s, Op op) {
  if (!c) return kInvalidArgument;
  count(kNcclCall);
  static const Count kinds[] = {kCallAllReduce, kCallBroadcast, kCallReduce, kCallAllGather, kCallReduceScatter,
                               kCallSendRecv, kCallSendRecv};  // (by Kind)
  count(kinds[op.kind]);
  if (dtype_bytes(op.dtype) == 0) return kInvalidArgument;
  if ((op.kind == kSend || op.kind == kRecv || op.kind == kBroadcast || op.kind == kReduce) &&
      (op.peer < 0 || op.peer >= c->size))
    return kInvalidArgument;
  if (op.redop >= 5) {
    std::lock_guard<std::mutex> lock(c->mu);
    auto it = c->premul.find(op.redop);
    if (it == c->premul.end()) return kInvalidArgument;
    op.scalar = it->second;
    op.redop = kPreMulSum;
  } else if (op.redop < 0) {
    return kInvalidArgument;
  }
  if (const int rc = connect_first(c, op.kind); rc != kOk) return rc;
  if (group_depth > 0) {
    grouped.push_back({c, {s, std::move(op)}});
    return kOk;
  }
  s->push([c, ops = std::vector<Op>{std::move(op)}] { run_round(c, ops); });
  return kOk;
}

void* attach(const std::string& name, int rank) {
  const int fd = shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
  if (fd < 0) return nullptr;
  void* p = nullptr;
  if (ftruncate(fd, sizeof(Segment)) == 0) p = mmap(nullptr, sizeof(Segment), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return nullptr;
  static_cast<Segment*>(p)->slot[rank].pid.store(getpid());
  return p;
}

}  // namespace
}  // namespace emu

using emu::Comm;
using emu::Op;

extern "C" {

int ncclGetVersion(int* v) {
  *v = 22303;  // (claims 2.23.3: what commlib's executor needs)
  return 0;
}

int ncclGetUniqueId(void* id) {
  static std::atomic<int> counter{0};
  std::memset(id, 0, 128);
  std::snprintf(static_cast<char*>(id), 128, "/commlib-gpu-emulator-%d-%d-%lld", int(getpid()), counter++,
                static_cast<long long>(std::chrono::steady_clock::now().time_since_epoch().count()));
  return 0;
}

struct UniqueId {
  char internal[128];
};

int ncclCommInitRank(Comm** out, int nranks, UniqueId id, int rank) {
  if (nranks < 1 || nranks > emu::kMaxRanks || rank < 0 || rank >= nranks || id.internal[0] != '/')
    return emu::kInvalidArgument;
  emu::count(emu::kCommInit);
  prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);  // (the others read this process's buffers)
  // COMMLIB_GPU_EMULATOR_INIT_HANG_RANK=r: rank r of every communicator never
  // joins it (a member frozen after the unique id went out, or a bootstrap
  // that cannot reach the others): the others wait in their barrier.
  if (const char* hang = std::getenv("COMMLIB_GPU_EMULATOR_INIT_HANG_RANK"); hang && std::atoi(hang) == rank) {
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  const std::string name(id.internal, strnlen(id.internal, 127));
  auto* c = new Comm();
  c->rank = rank;
  c->size = nranks;
  c->seg = static_cast<emu::Segment*>(emu::attach(name, rank));
  if (!c->seg) return emu::kSystemError;
  if (!emu::barrier(c)) return emu::kRemoteError;  // (every rank attached: the name can go)
  if (rank == 0) shm_unlink(name.c_str());
  *out = c;
  return 0;
}

int ncclCommDestroy(Comm* c) { return c ? 0 : emu::kInvalidArgument; }

int ncclCommAbort(Comm* c) {
  if (!c) return emu::kInvalidArgument;
  c->aborted.store(true);
  c->seg->slot[c->rank].aborted.store(1);
  return 0;
}

int ncclCommGetAsyncError(Comm* c, int* err) {
  if (!c) return emu::kInvalidArgument;
  *err = c->async_error.load();
  return 0;
}

const char* ncclGetErrorString(int rc) {
  switch (rc) {
    case 0: return "no error";
    case 2: return "unhandled system error (emulated)";
    case 4: return "invalid argument (emulated)";
    case 5: return "invalid usage (emulated)";
    case 6: return "remote process exited or there was a network error (emulated)";
    default: return "emulated NCCL error";
  }
}

int ncclAllReduce(const void* in, void* out, size_t count, int dt, int op, Comm* c, void* stream) {
  return emu::enqueue(c, emu::stream_of(stream), Op{emu::kAllReduce, in, out, count, dt, op, 0, {}});
}

int ncclBroadcast(const void* in, void* out, size_t count, int dt, int root, Comm* c, void* stream) {
  return emu::enqueue(c, emu::stream_of(stream), Op{emu::kBroadcast, in, out, count, dt, 0, root, {}});
}

int ncclReduce(const void* in, void* out, size_t count, int dt, int op, int root, Comm* c, void* stream) {
  return emu::enqueue(c, emu::stream_of(stream), Op{emu::kReduce, in, out, count, dt, op, root, {}});
}

int ncclAllGather(const void* in, void* out, size_t count, int dt, Comm* c, void* stream) {
  return emu::enqueue(c, emu::stream_of(stream), Op{emu::kAllGather, in, out, count, dt, 0, 0, {}});
}

int ncclReduceScatter(const void* in, void* out, size_t count, int dt, int op, Comm* c, void* stream) {
  return emu::enqueue(c, emu::stream_of(stream), Op{emu::kReduceScatter, in, out, count, dt, op, 0, {}});
}

int ncclSend(const void* in, size_t count, int dt, int peer, Comm* c, void* stream) {
  return emu::enqueue(c, emu::stream_of(stream), Op{emu::kSend, in, nullptr, count, dt, 0, peer, {}});
}

int ncclRecv(void* out, size_t count, int dt, int peer, Comm* c, void* stream) {
  return emu::enqueue(c, emu::stream_of(stream), Op{emu::kRecv, nullptr, out, count, dt, 0, peer, {}});
}

int ncclGroupStart() {
  ++emu::group_depth;
  return 0;
}

int ncclGroupEnd() {
  if (emu::group_depth == 0) return emu::kInvalidUsage;
  if (--emu::group_depth > 0) return 0;
  emu::count(emu::kGroup);
  // One round per (communicator, stream), in the order of their first call.
  std::vector<std::pair<std::pair<Comm*, emu::Stream*>, std::vector<Op>>> rounds;
  for (auto& [c, so] : emu::grouped) {
    auto key = std::make_pair(c, so.first);
    auto it = rounds.begin();
    while (it != rounds.end() && it->first != key) ++it;
    if (it == rounds.end()) it = rounds.insert(rounds.end(), {key, {}});
    it->second.push_back(std::move(so.second));
  }
  emu::grouped.clear();
  for (auto& [key, ops] : rounds) {
    if (ops.size() > size_t(emu::kMaxOps)) return emu::kInvalidUsage;
    key.second->push([c = key.first, ops = std::move(ops)] { emu::run_round(c, ops); });
  }
  return 0;
}

int ncclRedOpCreatePreMulSum(int* op, void* scalar, int dt, int residence, Comm* c) {
  if (!c || emu::dtype_bytes(dt) == 0 || residence != 1) return emu::kInvalidArgument;  // (host scalars only)
  std::lock_guard<std::mutex> lock(c->mu);
  const char* s = static_cast<const char*>(scalar);
  *op = c->next_op++;
  c->premul[*op] = std::vector<char>(s, s + emu::dtype_bytes(dt));
  return 0;
}

int ncclRedOpDestroy(int op, Comm* c) {
  if (!c) return emu::kInvalidArgument;
  std::lock_guard<std::mutex> lock(c->mu);
  return c->premul.erase(op) ? 0 : emu::kInvalidArgument;
}

}  // extern "C"
