#include "backends/nccl/loader.h"

#include <dlfcn.h>

#include <memory>
#include <mutex>
#include <vector>

namespace commlib {
namespace gpu {
namespace {

std::string dl_error() {
  const char* e = dlerror();
  return e ? e : "unknown dlopen error";
}

// Looks up name in handle into *fn; false (and *missing names it) if absent.
template <typename Fn>
bool sym(void* handle, const char* name, Fn* fn, std::string* missing) {
  *fn = reinterpret_cast<Fn>(dlsym(handle, name));
  if (!*fn && missing->empty()) *missing = name;
  return *fn != nullptr;
}

std::string loaded_from(void* fn, const std::string& fallback) {
  Dl_info info{};
  if (fn && dladdr(fn, &info) && info.dli_fname) return info.dli_fname;
  return fallback;
}

bool bind_nccl(void* h, NcclLib& n, std::string* missing) {
  sym(h, "ncclGetVersion", &n.get_version, missing);
  sym(h, "ncclGetUniqueId", &n.get_unique_id, missing);
  sym(h, "ncclCommInitRank", &n.comm_init_rank, missing);
  sym(h, "ncclCommDestroy", &n.comm_destroy, missing);
  sym(h, "ncclCommAbort", &n.comm_abort, missing);
  sym(h, "ncclCommGetAsyncError", &n.comm_get_async_error, missing);
  sym(h, "ncclGetErrorString", &n.get_error_string, missing);
  sym(h, "ncclAllReduce", &n.all_reduce, missing);
  sym(h, "ncclBroadcast", &n.broadcast, missing);
  sym(h, "ncclReduce", &n.reduce, missing);
  sym(h, "ncclAllGather", &n.all_gather, missing);
  sym(h, "ncclReduceScatter", &n.reduce_scatter, missing);
  sym(h, "ncclSend", &n.send, missing);
  sym(h, "ncclRecv", &n.recv, missing);
  sym(h, "ncclGroupStart", &n.group_start, missing);
  sym(h, "ncclGroupEnd", &n.group_end, missing);
  sym(h, "ncclRedOpCreatePreMulSum", &n.red_op_create_pre_mul_sum, missing);
  sym(h, "ncclRedOpDestroy", &n.red_op_destroy, missing);
  return missing->empty();
}

// Opens path as NCCL; fills n (ok, or error) and returns whether it loaded.
bool try_nccl(const std::string& path, NcclLib& n) {
  dlerror();
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    n.error = dl_error();
    return false;
  }
  std::string missing;
  if (!bind_nccl(h, n, &missing)) {
    n.error = path + " is not a usable NCCL: it lacks " + missing;
    return false;
  }
  n.path = loaded_from(reinterpret_cast<void*>(n.get_version), path);
  if (n.get_version(&n.version) != kNcclSuccess) {
    n.error = n.path + ": ncclGetVersion failed";
    return false;
  }
  if (n.version < kMinNcclVersion) {
    n.error = n.path + " is NCCL " + nccl_version_text(n.version) + "; commlib needs NCCL >= " +
              nccl_version_text(kMinNcclVersion);
    return false;
  }
  n.ok = true;
  return true;
}

NcclLib load_nccl(const std::string& explicit_path, const std::string& wheel_path) {
  NcclLib n;
  if (!explicit_path.empty()) {
    if (!try_nccl(explicit_path, n)) n.error = "COMMLIB_NCCL_LIBRARY='" + explicit_path + "': " + n.error;
    return n;
  }
  std::vector<std::string> errors;
  for (const std::string& path : {wheel_path, std::string("libnccl.so.2")}) {
    if (path.empty()) continue;
    NcclLib attempt;
    if (try_nccl(path, attempt)) return attempt;
    errors.push_back(attempt.error);
  }
  for (size_t i = 0; i < errors.size(); ++i) n.error += (i ? "; " : "") + errors[i];
  return n;
}

bool bind_cuda(void* h, CudaRuntime& c, std::string* missing) {
  sym(h, "cudaRuntimeGetVersion", &c.runtime_get_version, missing);
  sym(h, "cudaGetDevice", &c.get_device, missing);
  sym(h, "cudaGetDeviceCount", &c.get_device_count, missing);
  sym(h, "cudaSetDevice", &c.set_device, missing);
  sym(h, "cudaGetErrorString", &c.get_error_string, missing);
  sym(h, "cudaDeviceGetStreamPriorityRange", &c.get_stream_priority_range, missing);
  sym(h, "cudaStreamCreateWithPriority", &c.stream_create_with_priority, missing);
  sym(h, "cudaStreamDestroy", &c.stream_destroy, missing);
  sym(h, "cudaEventCreateWithFlags", &c.event_create_with_flags, missing);
  sym(h, "cudaEventDestroy", &c.event_destroy, missing);
  sym(h, "cudaEventRecord", &c.event_record, missing);
  sym(h, "cudaEventQuery", &c.event_query, missing);
  sym(h, "cudaStreamWaitEvent", &c.stream_wait_event, missing);
  sym(h, "cudaMalloc", &c.malloc, missing);
  sym(h, "cudaFree", &c.free, missing);
  sym(h, "cudaMemcpyAsync", &c.memcpy_async, missing);
  sym(h, "cudaMemsetAsync", &c.memset_async, missing);
  const bool ok = missing->empty();
  c.malloc_async = reinterpret_cast<FnCudaMallocAsync>(dlsym(h, "cudaMallocAsync"));  // (optional)
  c.free_async = reinterpret_cast<FnCudaFreeAsync>(dlsym(h, "cudaFreeAsync"));
  return ok;
}

// The process's CUDA runtime (already loaded first), or why there is none.
void* open_cudart(std::string* tried) {
  static const char* kNames[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"};
  for (int flags : {RTLD_NOW | RTLD_NOLOAD, RTLD_NOW | RTLD_LOCAL}) {
    for (const char* name : kNames) {
      dlerror();
      if (void* h = dlopen(name, flags)) return h;
      if (flags & RTLD_NOLOAD) continue;
      *tried += std::string(tried->empty() ? "" : "; ") + dl_error();
    }
  }
  return nullptr;
}

CudaRuntime load_cuda() {
  CudaRuntime c;
  std::string tried;
  void* h = open_cudart(&tried);
  if (!h) {
    c.error = "no CUDA runtime loadable (" + tried + ")";
    return c;
  }
  std::string missing;
  if (!bind_cuda(h, c, &missing)) {
    c.error = "the CUDA runtime lacks " + missing;
    return c;
  }
  c.path = loaded_from(reinterpret_cast<void*>(c.runtime_get_version), "libcudart");
  c.runtime_get_version(&c.version);
  const cudaError rc = c.get_device_count(&c.devices);
  if (rc != kCudaSuccess) {
    c.error = c.path + ": cudaGetDeviceCount failed: " + c.get_error_string(rc);
  } else if (c.devices == 0) {
    c.error = c.path + ": no CUDA device visible";
  } else {
    c.ok = true;
  }
  return c;
}

std::mutex& load_mu() {
  static std::mutex mu;
  return mu;
}

std::unique_ptr<GpuLibs>& current() {
  static std::unique_ptr<GpuLibs> libs;
  return libs;
}

}  // namespace

const GpuLibs& load_gpu_libs(const std::string& explicit_path, const std::string& wheel_path) {
  std::lock_guard<std::mutex> lock(load_mu());
  std::unique_ptr<GpuLibs>& libs = current();
  if (libs && libs->nccl.ok && libs->cuda.ok) return *libs;
  auto fresh = std::make_unique<GpuLibs>();
  fresh->nccl = libs && libs->nccl.ok ? libs->nccl : load_nccl(explicit_path, wheel_path);
  fresh->cuda = load_cuda();
  // (a result still in use stays alive: readers hold references to it)
  if (libs) libs.release();
  libs = std::move(fresh);
  return *libs;
}

const GpuLibs* loaded_gpu_libs() {
  std::lock_guard<std::mutex> lock(load_mu());
  return current().get();
}

std::string nccl_version_text(int code) {
  const int major = code >= 10000 ? code / 10000 : code / 1000;
  const int rest = code >= 10000 ? code % 10000 : code % 1000;
  return std::to_string(major) + "." + std::to_string(rest / 100) + "." + std::to_string(rest % 100);
}

}  // namespace gpu
}  // namespace commlib
