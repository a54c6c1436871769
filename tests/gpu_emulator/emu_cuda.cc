// The GPU emulator's CUDA runtime (test infrastructure, never shipped): the
// entry points commlib's loader binds (csrc/backends/nccl/loader.cc), with
// "device" memory in host memory, streams and events of emu_stream.h, and
// one device per process unless COMMLIB_GPU_EMULATOR_DEVICES says more.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <vector>

#include "emu_stream.h"

namespace emu {

Stream::Stream() : worker_([this] { run(); }) {}

Stream::~Stream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

uint64_t Stream::push(std::function<void()> task) {
  uint64_t ticket;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
    ticket = ++enqueued_;
  }
  cv_.notify_all();
  return ticket;
}

uint64_t Stream::tail() {
  std::lock_guard<std::mutex> lock(mu_);
  return enqueued_;
}

bool Stream::reached(uint64_t ticket) {
  std::lock_guard<std::mutex> lock(mu_);
  return done_ >= ticket;
}

void Stream::wait(uint64_t ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_ >= ticket; });
}

void Stream::run() {
  const int64_t delay = env_us("COMMLIB_GPU_EMULATOR_DELAY_US"), tail = env_us("COMMLIB_GPU_EMULATOR_TAIL_US");
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // (stop_, and everything ran)
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    if (delay > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay));
    task();
    if (tail > 0) std::this_thread::sleep_for(std::chrono::microseconds(tail));
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++done_;
    }
    cv_.notify_all();
  }
}

int64_t env_us(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atoll(v) : 0;
}

namespace {

std::atomic<long> counts[kCountKinds];
const char* const kCountNames[kCountKinds] = {
    "comm_init", "stream_create", "event_create", "malloc", "free", "host_alloc", "sync", "copy", "nccl_call",
    "allreduce", "broadcast", "allgather", "reducescatter", "reduce", "sendrecv", "group"};

std::mutex& registry_mu() {
  static std::mutex mu;
  return mu;
}

// Every stream made (streams are never freed: a destroyed one keeps its
// thread, idle, so events and waits that still name it stay valid).
std::vector<Stream*>& streams() {
  static auto* all = new std::vector<Stream*>();
  return *all;
}

std::map<void*, size_t>& allocations() {
  static auto* all = new std::map<void*, size_t>();
  return *all;
}

int device_count() {
  const char* v = std::getenv("COMMLIB_GPU_EMULATOR_DEVICES");
  return v ? std::atoi(v) : 1;
}

thread_local int current_device = 0;

void wait_all_streams() {
  std::vector<std::pair<Stream*, uint64_t>> tails;
  {
    std::lock_guard<std::mutex> lock(registry_mu());
    for (Stream* s : streams()) tails.emplace_back(s, s->tail());
  }
  for (auto& [s, t] : tails) s->wait(t);
}

}  // namespace

void count(Count what) { counts[what].fetch_add(1, std::memory_order_relaxed); }

Stream* stream_of(void* handle) {
  if (handle) return static_cast<Stream*>(handle);
  static Stream* legacy = [] {
    auto* s = new Stream();
    std::lock_guard<std::mutex> lock(registry_mu());
    streams().push_back(s);
    return s;
  }();
  return legacy;
}

}  // namespace emu

using emu::Event;
using emu::Stream;

extern "C" {

// How many times this process did `name` (a Count's name: comm_init,
// stream_create, event_create, malloc, free, host_alloc, sync, copy,
// nccl_call, allreduce, broadcast, allgather, reducescatter, reduce,
// sendrecv, group); -1 for an unknown name. Not part of CUDA or NCCL.
long commlib_gpu_emulator_count(const char* name) {
  for (int i = 0; i < emu::kCountKinds; ++i)
    if (std::strcmp(name, emu::kCountNames[i]) == 0) return emu::counts[i].load();
  return -1;
}

int cudaRuntimeGetVersion(int* v) {
  *v = 13000;
  return 0;
}

int cudaGetDeviceCount(int* n) {
  *n = emu::device_count();
  return 0;
}

int cudaGetDevice(int* d) {
  *d = emu::current_device;
  return 0;
}

int cudaSetDevice(int d) {
  if (d < 0 || d >= emu::device_count()) return 101;  // cudaErrorInvalidDevice
  emu::current_device = d;
  return 0;
}

const char* cudaGetErrorString(int rc) {
  switch (rc) {
    case 0: return "no error";
    case 1: return "invalid argument";
    case 101: return "invalid device ordinal";
    case 600: return "device not ready";
    default: return "emulated CUDA error";
  }
}

int cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  *least = 0;
  *greatest = -5;
  return 0;
}

int cudaStreamCreateWithPriority(void** stream, unsigned, int) {
  emu::count(emu::kStreamCreate);
  auto* s = new Stream();
  {
    std::lock_guard<std::mutex> lock(emu::registry_mu());
    emu::streams().push_back(s);
  }
  *stream = s;
  return 0;
}

int cudaStreamDestroy(void* stream) {
  return stream ? 0 : 1;  // (kept: see streams())
}

int cudaEventCreateWithFlags(void** event, unsigned) {
  emu::count(emu::kEventCreate);
  *event = new Event();
  return 0;
}

int cudaEventDestroy(void* event) {
  delete static_cast<Event*>(event);
  return 0;
}

int cudaEventRecord(void* event, void* stream) {
  if (!event) return 1;
  auto* e = static_cast<Event*>(event);
  e->stream = emu::stream_of(stream);
  e->ticket = e->stream->tail();
  return 0;
}

int cudaEventQuery(void* event) {
  if (!event) return 1;
  return static_cast<Event*>(event)->complete() ? 0 : 600;
}

int cudaStreamWaitEvent(void* stream, void* event, unsigned) {
  if (!event) return 1;
  const Event at = *static_cast<Event*>(event);  // (the event may be recorded again or destroyed)
  if (!at.stream) return 0;
  emu::stream_of(stream)->push([at] { at.stream->wait(at.ticket); });
  return 0;
}

namespace emu {
namespace {

int allocate(void** ptr, size_t bytes) {
  const size_t rounded = (bytes + 255) / 256 * 256;
  *ptr = std::aligned_alloc(256, rounded ? rounded : 256);
  if (!*ptr) return 2;  // cudaErrorMemoryAllocation
  std::memset(*ptr, 0xA5, rounded);  // (garbage, as fresh device memory is)
  std::lock_guard<std::mutex> lock(emu::registry_mu());
  allocations()[*ptr] = rounded;
  return 0;
}

}  // namespace
}  // namespace emu

int cudaMalloc(void** ptr, size_t bytes) {
  emu::count(emu::kMalloc);
  return emu::allocate(ptr, bytes);
}

int cudaFree(void* ptr) {
  if (!ptr) return 0;
  emu::count(emu::kFree);
  emu::wait_all_streams();  // (cudaFree synchronizes the device)
  size_t bytes = 0;
  {
    std::lock_guard<std::mutex> lock(emu::registry_mu());
    auto it = emu::allocations().find(ptr);
    if (it == emu::allocations().end()) return 1;
    bytes = it->second;
    emu::allocations().erase(it);
  }
  std::memset(ptr, 0xDD, bytes);
  std::free(ptr);
  return 0;
}

// The blocking waits (not used by commlib's core: tests wait for a stream
// with cudaStreamSynchronize), counted as host round trips.
int cudaStreamSynchronize(void* stream) {
  emu::count(emu::kSync);
  Stream* s = emu::stream_of(stream);
  s->wait(s->tail());
  return 0;
}

int cudaEventSynchronize(void* event) {
  if (!event) return 1;
  emu::count(emu::kSync);
  const Event at = *static_cast<Event*>(event);
  if (at.stream) at.stream->wait(at.ticket);
  return 0;
}

int cudaDeviceSynchronize() {
  emu::count(emu::kSync);
  emu::wait_all_streams();
  return 0;
}

int cudaMemcpy(void* dst, const void* src, size_t bytes, int) {
  emu::count(emu::kSync);
  emu::wait_all_streams();  // (a copy on the legacy stream waits for the device)
  std::memcpy(dst, src, bytes);
  return 0;
}

// Pinned host memory is ordinary host memory here.
int cudaHostAlloc(void** ptr, size_t bytes, unsigned) {
  emu::count(emu::kHostAlloc);
  *ptr = std::malloc(bytes ? bytes : 1);
  return *ptr ? 0 : 2;
}

int cudaMallocHost(void** ptr, size_t bytes) { return cudaHostAlloc(ptr, bytes, 0); }

int cudaFreeHost(void* ptr) {
  std::free(ptr);
  return 0;
}

int cudaMemcpyAsync(void* dst, const void* src, size_t bytes, int, void* stream) {
  emu::count(emu::kCopy);
  emu::stream_of(stream)->push([=] { std::memcpy(dst, src, bytes); });
  return 0;
}

// Stream-ordered allocation: the memory is there at once (usable by the
// stream's later work), and freed when the stream reaches the free.
int cudaMallocAsync(void** ptr, size_t bytes, void*) { return cudaMalloc(ptr, bytes); }

int cudaFreeAsync(void* ptr, void* stream) {
  if (!ptr) return 0;
  emu::count(emu::kFree);
  size_t bytes = 0;
  {
    std::lock_guard<std::mutex> lock(emu::registry_mu());
    auto it = emu::allocations().find(ptr);
    if (it == emu::allocations().end()) return 1;
    bytes = it->second;
  }
  emu::stream_of(stream)->push([ptr, bytes] {
    {
      std::lock_guard<std::mutex> lock(emu::registry_mu());
      emu::allocations().erase(ptr);
    }
    std::memset(ptr, 0xDD, bytes);  // (a read after the free sees garbage)
    std::free(ptr);
  });
  return 0;
}

int cudaMemsetAsync(void* dst, int value, size_t bytes, void* stream) {
  emu::stream_of(stream)->push([=] { std::memset(dst, value, bytes); });
  return 0;
}

}  // extern "C"
