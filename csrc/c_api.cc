// extern "C" wrappers: translate exceptions into status codes and keep the
// message of the last failure per thread.
#include "commlib/c_api.h"

#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "base/common.h"
#include "base/config.h"
#include "base/result_pool.h"
#include "base/timeline.h"
#include "runtime/engine.h"

using commlib::Engine;
using commlib::Error;
using commlib::HandleState;

namespace {

thread_local std::string g_last_error;

template <typename F>
int guarded(F f) {
  try {
    f();
    return COMMLIB_OK;
  } catch (const Error& e) {
    g_last_error = e.what();
    return e.code();
  } catch (const std::exception& e) {
    g_last_error = e.what();
    return COMMLIB_ERR_INTERNAL;
  }
}

// mpi4py hands out the raw handle value: an int for MPICH, a pointer for Open MPI.
// (A template, so that only the branch for this MPI's handle type is compiled.)
template <typename Comm>
Comm comm_from_handle(int64_t h) {
  if constexpr (std::is_pointer_v<Comm>) {
    return reinterpret_cast<Comm>(static_cast<intptr_t>(h));
  } else {
    return static_cast<Comm>(h);
  }
}

std::shared_ptr<commlib::HandleState> find_handle(int64_t handle) {
  auto h = Engine::get().handles().find(handle);
  if (!h) throw Error(COMMLIB_ERR_VALUE, "unknown or released handle " + std::to_string(handle));
  return h;
}

}  // namespace

extern "C" {

int commlib_init(int64_t comm_handle, int has_comm) {
  return guarded([&] {
    int flag = 0;
    MPI_Initialized(&flag);
    if (!flag) {
      int provided = 0;
      commlib::check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided),
                         "MPI_Init_thread");
    }
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) throw Error(COMMLIB_ERR_NOT_INIT, "MPI has already been finalized");
    int level = 0;
    MPI_Query_thread(&level);
    if (level < MPI_THREAD_SERIALIZED) {
      throw Error(COMMLIB_ERR_INTERNAL,
                  "MPI was initialized without thread support; commlib's background thread needs "
                  "MPI_THREAD_MULTIPLE (mpi4py's default)");
    }
    Engine::get().init(has_comm ? comm_from_handle<MPI_Comm>(comm_handle) : MPI_COMM_WORLD);
  });
}

int commlib_shutdown(void) {
  return guarded([] { Engine::get().shutdown(); });
}

int commlib_is_initialized(void) { return Engine::get().initialized() ? 1 : 0; }

int commlib_broken(void) { return Engine::get().unsafe_to_finalize(); }

const char* commlib_last_error(void) { return g_last_error.c_str(); }

int commlib_rank(void) { return Engine::get().topology().rank; }
int commlib_size(void) { return Engine::get().topology().size; }
int commlib_local_rank(void) { return Engine::get().topology().local_rank; }
int commlib_local_size(void) { return Engine::get().topology().local_size; }
int commlib_cross_rank(void) { return Engine::get().topology().cross_rank; }
int commlib_cross_size(void) { return Engine::get().topology().cross_size; }

int64_t commlib_submit(const commlib_request* req) {
  int64_t handle = 0;
  const int rc = guarded([&] {
    if (!req) throw Error(COMMLIB_ERR_VALUE, "commlib_submit: no request given");
    Engine& engine = Engine::get();
    const bool p2p = req->op_type == COMMLIB_OP_SEND || req->op_type == COMMLIB_OP_RECV;
    handle = p2p ? engine.enqueue_p2p(*req) : req->member_dtypes ? engine.enqueue_group(*req) : engine.enqueue(*req);
  });
  return rc == COMMLIB_OK ? handle : -int64_t(rc);
}

int64_t commlib_p2p_blocking(const commlib_request* req, double timeout_s) {
  int64_t pending = 0;
  const int rc = guarded([&] {
    if (!req) throw Error(COMMLIB_ERR_VALUE, "commlib_p2p_blocking: no request given");
    Engine& engine = Engine::get();
    const std::shared_ptr<HandleState> h = engine.queue_p2p(*req, true);
    if (!engine.wait(*h, timeout_s)) {
      pending = engine.handles().adopt(h);  // (Python synchronizes it by this id)
      return;
    }
    if (h->status != COMMLIB_OK) throw Error(h->status, h->message);
  });
  return rc != COMMLIB_OK ? -int64_t(rc) : pending;
}

int commlib_abort(const commlib_request* req, const char* why) {
  return guarded([&] {
    if (!req) throw Error(COMMLIB_ERR_VALUE, "commlib_abort: no request given");
    Engine& engine = Engine::get();
    if (engine.initialized()) engine.abort_others(*req, why ? why : "");
  });
}

int commlib_handle_recv_info(int64_t handle, int* dtype, int* ndim, int64_t* shape, int max_ndim) {
  return guarded([&] {
    auto h = find_handle(handle);
    if (!h->done.load()) throw Error(COMMLIB_ERR_VALUE, "handle has not completed");
    if (int(h->shape.size()) > max_ndim) throw Error(COMMLIB_ERR_VALUE, "the message has more dimensions than the caller's buffer");
    *dtype = h->dtype;
    *ndim = int(h->shape.size());
    std::copy(h->shape.begin(), h->shape.end(), shape);
  });
}

int commlib_handle_p2p_result(int64_t handle, void** device_ptr) {
  int where = 0;
  const int rc = guarded([&] {
    auto h = find_handle(handle);
    if (!h->done.load()) throw Error(COMMLIB_ERR_VALUE, "handle has not completed");
    *device_ptr = h->device_result;
    where = h->device_result ? 2 : h->result ? 1 : 0;
  });
  return rc ? -rc : where;
}

int commlib_device_release(void* src, void* dst, int64_t bytes, int device, void* stream) {
  return guarded([&] { Engine::get().release_device_result(src, dst, size_t(bytes < 0 ? 0 : bytes), device, stream); });
}

int commlib_add_process_set(const int32_t* ranks, int n, int64_t* handle) {
  return guarded([&] { *handle = Engine::get().add_process_set(ranks, n); });
}

int commlib_remove_process_set(int id, int64_t* handle) {
  return guarded([&] { *handle = Engine::get().remove_process_set(id); });
}

int commlib_handle_value(int64_t handle, int64_t* value) {
  return guarded([&] {
    auto h = find_handle(handle);
    if (!h->done.load()) throw Error(COMMLIB_ERR_VALUE, "handle has not completed");
    *value = h->rows;
  });
}

int commlib_poll(int64_t handle) {
  auto h = Engine::get().handles().find(handle);
  return (!h || h->done.load()) ? 1 : 0;
}

namespace {

// A completed handle's status, or the failure of an earlier detached CUDA
// collective (reported once) when it succeeded.
int outcome(Engine& engine, const HandleState& h) {
  int status = h.status;
  if (status != COMMLIB_OK) {
    g_last_error = h.message;
  } else if (const int deferred = engine.take_deferred_error(&g_last_error)) {
    status = deferred;
  }
  return status;
}

// Waits up to timeout_s for the handle (COMMLIB_ERR_TIMEOUT while pending);
// once complete, runs ok(state) if it succeeded, releases it when asked and
// returns its status.
extern "C++" template <class Ok>
int wait_then(int64_t handle, double timeout_s, int release, Ok&& ok) {
  int status = COMMLIB_OK;
  const int rc = guarded([&] {
    Engine& engine = Engine::get();
    auto h = find_handle(handle);
    if (!engine.wait(*h, timeout_s)) throw Error(COMMLIB_ERR_TIMEOUT, "timed out");
    status = outcome(engine, *h);
    if (status == COMMLIB_OK) ok(*h);
    if (release) engine.handles().release(handle);
  });
  return rc != COMMLIB_OK ? rc : status;
}

// An allgather/alltoall/recv result passed to the caller: pointer, bytes, rows.
void take_result(HandleState& h, void** data, int64_t* nbytes, int64_t* rows) {
  *data = h.result;
  *nbytes = int64_t(h.result_bytes);
  *rows = h.rows;
  h.result = nullptr;
  h.result_bytes = 0;
}

}  // namespace

int commlib_wait_status(int64_t handle, double timeout_s, int release) {
  return wait_then(handle, timeout_s, release, [](HandleState&) {});
}

int commlib_wait_on_stream(int64_t handle, void* stream, double timeout_s, int* on_stream) {
  int status = COMMLIB_OK;
  const int rc = guarded([&] {
    Engine& engine = Engine::get();
    auto h = find_handle(handle);
    bool waits = false;
    if (!engine.wait_on_stream(*h, stream, timeout_s, &waits)) throw Error(COMMLIB_ERR_TIMEOUT, "timed out");
    *on_stream = waits ? 1 : 0;
    if (waits) {  // (the engine releases it)
      if (const int deferred = engine.take_deferred_error(&g_last_error)) status = deferred;
      return;
    }
    status = outcome(engine, *h);
    engine.handles().release(handle);
  });
  return rc != COMMLIB_OK ? rc : status;
}

int commlib_handle_take_result(int64_t handle, void** data, int64_t* nbytes, int64_t* rows) {
  return guarded([&] { take_result(*find_handle(handle), data, nbytes, rows); });
}

void commlib_free_result(void* data) { commlib::result_free(data); }

int commlib_wait_result(int64_t handle, double timeout_s, int release, int64_t* info) {
  return wait_then(handle, timeout_s, release, [&](HandleState& h) {
    void* data = nullptr;
    take_result(h, &data, &info[1], &info[2]);
    info[0] = int64_t(reinterpret_cast<intptr_t>(data));
  });
}

int commlib_handle_splits(int64_t handle, int64_t* out) {
  return guarded([&] {
    auto h = find_handle(handle);
    std::memcpy(out, h->splits.data(), h->splits.size() * sizeof(int64_t));
  });
}

int commlib_release(int64_t handle) {
  return guarded([&] { Engine::get().handles().release(handle); });
}

int commlib_set_fusion_threshold(int64_t bytes) {
  return guarded([&] { Engine::get().set_fusion_threshold(bytes); });
}

int64_t commlib_fusion_threshold(void) { return Engine::get().fusion_threshold(); }

int64_t commlib_tune_history(int64_t* out, int64_t max_rows) { return Engine::get().tune_history(out, max_rows); }

void commlib_cache_stats(int64_t* out) { Engine::get().cache_stats(out); }

const char* commlib_engine_state(void) {
  static thread_local std::string state;
  state = Engine::get().describe_state();
  return state.c_str();
}

int commlib_start_timeline(const char* path, int mark_cycles) {
  return guarded([&] {
    Engine& engine = Engine::get();
    if (!engine.initialized()) throw Error(COMMLIB_ERR_NOT_INIT, "commlib is not initialized: call commlib.init() first");
    if (!path || !*path) throw Error(COMMLIB_ERR_VALUE, "start_timeline needs a file path");
    commlib::timeline().start(path, engine.topology().rank, mark_cycles != 0);
  });
}

int commlib_stop_timeline(void) {
  return guarded([] { commlib::timeline().stop(); });
}

const char* commlib_mpi_library_version(void) {
  static char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(version, &len);
  return version;
}

int commlib_gpu_load(const char* nccl_library, const char* wheel_library) {
  return guarded([&] { commlib::gpu::load_gpu_libs(nccl_library ? nccl_library : "", wheel_library ? wheel_library : ""); });
}

int commlib_gpu_library(int which, int* version, const char** path, const char** error) {
  const commlib::gpu::GpuLibs* libs = commlib::gpu::loaded_gpu_libs();
  if (!libs) return -1;
  const bool nccl = which == 0;
  *version = nccl ? libs->nccl.version : libs->cuda.version;
  *path = nccl ? libs->nccl.path.c_str() : libs->cuda.path.c_str();
  *error = nccl ? libs->nccl.error.c_str() : libs->cuda.error.c_str();
  return (nccl ? libs->nccl.ok : libs->cuda.ok) ? 1 : 0;
}

int commlib_nccl_unique_id(int process_set, uint8_t* out) {
  return guarded([&] { Engine::get().nccl_unique_id(process_set, out); });
}

int commlib_config_count(void) { return int(commlib::config_table().size()); }

int commlib_config_entry(int i, const char** name, const char** default_value, const char** accepted,
                         const char** meaning) {
  return guarded([&] {
    const auto& table = commlib::config_table();
    if (i < 0 || size_t(i) >= table.size()) {
      throw Error(COMMLIB_ERR_VALUE, "no configuration entry " + std::to_string(i));
    }
    const commlib::ConfigEntry& e = table[size_t(i)];
    *name = e.name;
    *default_value = e.default_text;
    *accepted = e.accepted.c_str();
    *meaning = e.meaning;
  });
}

int commlib_config_check(const char* name, const char* value) {
  return guarded([&] {
    const commlib::ConfigEntry* e = commlib::find_config_entry(name ? name : "");
    if (!e) throw Error(COMMLIB_ERR_VALUE, std::string(name ? name : "") + ": not a commlib configuration variable");
    commlib::Config cfg = commlib::Config::defaults();
    if (value && *value) commlib::set_config_value(*e, value, cfg);
  });
}

}  // extern "C"
