// The engine's side of CUDA requests: checking and preparing them at enqueue
// (caller threads), launching negotiated ones on the NCCL executor and
// finishing them when their completion event is reached (the engine's
// thread). See exec/gpu_route.h and exec/gpu_executor.h.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "base/common.h"
#include "base/progress.h"
#include "base/timeline.h"
#include "runtime/engine.h"
#include "runtime/trace_events.h"

namespace commlib {

// The loaded CUDA runtime and NCCL; with load, loaded first when they are not
// usable yet (null: none loaded and not asked to load).
const gpu::GpuLibs* Engine::gpu_libs(bool load) {
  const gpu::GpuLibs* libs = gpu::loaded_gpu_libs();
  if (load && (!libs || !libs->nccl.ok || !libs->cuda.ok)) libs = &gpu::load_gpu_libs(config_.nccl_library, "");
  return libs;
}

void Engine::prepare_gpu_entry(const commlib_request& q, Entry& e) {
  const gpu::GpuLibs* libs = gpu_libs(gpu_backend_ != GpuBackend::kHost);
  check_device_route(q, gpu_backend_, libs);
  int expected = -1;
  if (!gpu_device_.compare_exchange_strong(expected, q.device_id) && expected != q.device_id) {
    throw Error(COMMLIB_ERR_VALUE, std::string(op_type_name(q.op_type)) + " '" + q.name + "': this process's "
                                       "CUDA collectives run on device " + std::to_string(expected) +
                                       ", not " + std::to_string(q.device_id) + " (one device per process)");
  }
  e.desc.device_type = q.device_type;
  e.device_id = q.device_id;
  e.output_rows = q.output_rows;
  e.ready_event = gpu::record_event(libs->cuda, q.device_id, q.stream);
}

// A launch can block this thread inside NCCL until every member has
// launched it too (from NCCL 2.22 a communicator connects its members at its
// first collective of each kind): rank 0's responses still being sent go out
// first, since one above MPI's eager size moves only while its sender calls
// into MPI and the others need it to launch. (Only rank 0's: the others'
// requests are not needed for a launch, and rank 0 may be blocked in one.)
void Engine::flush_control_sends() {
  if (!coordinator_) return;
  poll_until([this] {  // (returns at once, before any clock read, when nothing is in flight)
    control_->progress();
    return !control_->sending();
  });
}

void Engine::launch_gpu(const Response& resp, const std::vector<Entry*>& entries) {
  flush_control_sends();
  std::vector<int> members;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (resp.process_set != 0) {
      members = sets_.at(resp.process_set);
    } else {
      for (int r = 0; r < topo_.size; ++r) members.push_back(r);
    }
  }
  std::vector<Entry> taken;
  for (Entry* p : entries) {
    if (p->stand_in) {  // this rank has joined (take_entries)
      taken.push_back(std::move(*p));
      continue;
    }
    auto it = pending_.find(request_key(p->desc));
    if (it == pending_.end() || &it->second != p) {
      throw Error(COMMLIB_ERR_INTERNAL, "CUDA request '" + p->desc.name + "' launched but not pending");
    }
    taken.push_back(std::move(it->second));
    pending_.erase(it);
  }
  std::vector<std::shared_ptr<HandleState>> launched;
  std::vector<RequestDesc> ran;  // (for the response cache: launch() takes the entries)
  std::vector<std::string> own_keys;
  for (const Entry& e : taken) {
    ran.push_back(e.desc);
    if (e.stand_in) continue;
    launched.push_back(e.handle);
    own_keys.push_back(request_key(e.desc));
  }
  std::string message;
  int code = COMMLIB_ERR_INTERNAL;
  try {
    prepare_stand_ins(taken);
    if (!gpu_) gpu_ = std::make_unique<GpuExecutor>(*gpu::loaded_gpu_libs(), timeout_us_, fusion_threshold_,
                                                      stall_warning_us_);
    std::shared_ptr<void> done = gpu_->launch(resp, taken, executor_.transport_for(resp.process_set), members,
                                              now_us());
    // Launched: the names are free for the next requests of those names (the
    // device runs them after these), since synchronize returns at the launch
    // and training loops reuse names; finish() leaves in_flight_ alone then.
    // Freed before the handles say "launched": a waiter woken by that submits
    // the next one at once (under load it found the name still in flight).
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      for (const std::string& key : own_keys) in_flight_.erase(key);
    }
    gpu_launches_.store(int64_t(gpu_->in_flight()), std::memory_order_relaxed);
    for (auto& h : launched) handles_.mark_launched(*h, done);
  } catch (const Error& e) {
    // (the other ranks' launches, if any, end by the timeout or NCCL's own error)
    message = std::string(op_type_name(resp.op_type)) + " '" + resp.names.at(0) + "'" +
              (resp.process_set ? " on process set " + std::to_string(resp.process_set) : std::string()) + ": " +
              e.what();
    if (e.code() == COMMLIB_ERR_TIMED_OUT) code = e.code();
  }
  cache_.after_run(resp, message.empty(), &ran);
  if (message.empty()) return;  // (launch took the entries)
  if (launched.empty()) {  // (only stand-ins: nobody here waits to hear of it)
    std::fprintf(stderr, "commlib (rank %d): ERROR: %s\n", topo_.rank, message.c_str());
  }
  for (Entry& e : taken) finish(e, code, message);
}

// A joined rank stands in for CUDA collectives on its CUDA device: the one
// of its own CUDA requests, else the one join() named.
void Engine::prepare_stand_ins(std::vector<Entry>& taken) {
  if (std::none_of(taken.begin(), taken.end(), [](const Entry& e) { return e.stand_in; })) return;
  int device = gpu_device_.load();
  if (device < 0) device = join_device_.load();
  const std::string who = "rank " + std::to_string(topo_.rank) + " has joined and stands in for the CUDA " +
                          op_type_name(taken[0].desc.op_type) + " '" + taken[0].desc.name + "'";
  if (device < 0) {
    throw Error(COMMLIB_ERR_INTERNAL, who + ", but it knows no CUDA device: it ran no CUDA collective and join() "
                                            "named none (commlib.torch.join() passes the current one)");
  }
  const std::string why = gpu::unusable_reason(*gpu_libs(true));
  if (!why.empty()) throw Error(COMMLIB_ERR_INTERNAL, who + ", but NCCL is not usable here: " + why);
  for (Entry& e : taken)
    if (e.stand_in) e.device_id = device;
}

// Negotiation (submission to launch) and execution (launch to the
// completion event seen here) of a CUDA collective that ran.
void Engine::trace_gpu_execution(GpuExecutor::Done& d) {
  Response resp;
  resp.op_type = d.op_type;
  resp.process_set = d.process_set;
  std::vector<Entry*> entries;
  for (Entry& e : d.entries) entries.push_back(&e);
  trace_execution(resp, entries, d.launched_us, now_us(), "nccl");
}

bool Engine::poll_gpu() {
  if (!gpu_ || !gpu_->busy()) return false;
  std::vector<GpuExecutor::Done> done = gpu_->poll(now_us(), timeout_us_);
  gpu_launches_.store(int64_t(gpu_->in_flight()), std::memory_order_relaxed);
  for (GpuExecutor::Done& d : done) {
    if (d.status == COMMLIB_OK && timeline().on()) trace_gpu_execution(d);
    for (Entry& e : d.entries) finish(e, d.status, d.message);
  }
  return !done.empty();
}

bool Engine::wait_on_stream(HandleState& h, void* stream, double timeout_s, bool* on_stream) {
  *on_stream = false;
  if (!wait(h, timeout_s, /*until_launched=*/true)) return false;
  if (h.done.load()) return true;
  const gpu::GpuLibs* libs = gpu::loaded_gpu_libs();
  gpu::check_cuda(libs->cuda,
                  libs->cuda.stream_wait_event(static_cast<gpu::cudaStream>(stream),
                                               static_cast<gpu::cudaEvent>(h.done_event.get()), 0),
                  "cudaStreamWaitEvent on the caller's stream");
  h.detached.store(true);
  // (completed meanwhile and not settled by the engine: the caller takes the outcome)
  *on_stream = !(h.done.load() && !h.claimed.exchange(true));
  return true;
}

void Engine::settle_detached(HandleState& h) {
  if (h.status != COMMLIB_OK) {
    std::fprintf(stderr, "commlib (rank %d): ERROR: a CUDA collective failed after synchronize() had returned "
                 "(the caller's stream waited for it on the device): %s\n", topo_.rank, h.message.c_str());
    std::lock_guard<std::mutex> lock(deferred_mu_);
    if (deferred_code_ == 0) {
      deferred_code_ = h.status;
      deferred_message_ = "a CUDA collective failed after synchronize() had returned (its results are not "
                          "valid): " + h.message;
      has_deferred_.store(true);
    }
  }
  handles_.release(h.id);
}

int Engine::take_deferred_error(std::string* message) {
  if (!has_deferred_.load()) return 0;
  std::lock_guard<std::mutex> lock(deferred_mu_);
  const int code = deferred_code_;
  message->swap(deferred_message_);
  deferred_message_.clear();
  deferred_code_ = 0;
  has_deferred_.store(false);
  return code;
}

void Engine::drain_gpu() {
  if (!gpu_) return;
  const int64_t deadline = now_us() + (timeout_us_ > 0 ? timeout_us_ : 10000000);
  while (gpu_->busy() && now_us() < deadline) {
    if (!poll_gpu()) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void Engine::abandon_gpu(int code, const std::string& message) {
  if (!gpu_) return;
  for (GpuExecutor::Done& d : gpu_->abandon(code, message)) {
    for (Entry& e : d.entries) finish(e, code, message);
  }
}

void Engine::release_device_result(void* src, void* dst, size_t bytes, int device, void* stream) {
  const gpu::GpuLibs* libs = gpu::loaded_gpu_libs();
  if (!libs || !libs->cuda.ok) throw Error(COMMLIB_ERR_VALUE, "no CUDA runtime is loaded");
  gpu::DeviceGuard on(libs->cuda, device);
  auto s = static_cast<gpu::cudaStream>(stream);
  if (dst && bytes) {
    gpu::check_cuda(libs->cuda, libs->cuda.memcpy_async(dst, src, bytes, gpu::kCudaMemcpyDeviceToDevice, s),
                    "cudaMemcpyAsync (a received message)");
  }
  if (libs->cuda.free_async) {
    gpu::check_cuda(libs->cuda, libs->cuda.free_async(src, s), "cudaFreeAsync (a received message)");
  } else {
    gpu::check_cuda(libs->cuda, libs->cuda.free(src), "cudaFree (a received message)");
  }
}

void Engine::nccl_unique_id(int process_set, uint8_t out[128]) {
  if (!running_.load()) throw Error(COMMLIB_ERR_NOT_INIT, "commlib is not initialized: call commlib.init() first");
  const gpu::GpuLibs* libs = gpu::loaded_gpu_libs();
  if (!libs || !libs->nccl.ok) {
    throw Error(COMMLIB_ERR_VALUE, "NCCL is not usable: " + (libs ? libs->nccl.error : std::string("not loaded")));
  }
  std::lock_guard<std::mutex> lock(cycle_mu_);
  const gpu::NcclUniqueId id = gpu::shared_unique_id(libs->nccl, executor_.transport_for(process_set));
  std::memcpy(out, id.internal, sizeof(id.internal));
}

}  // namespace commlib
