// Run-time loading of NCCL and the CUDA runtime (dlopen; nothing of either is
// needed at build time).
//
// NCCL comes from, in order: an explicit path (COMMLIB_NCCL_LIBRARY; when it
// is set nothing else is tried), the nvidia-nccl-cu* wheel's
// nvidia/nccl/lib/libnccl.so.2 (the Python side finds it and passes it in),
// the system's libnccl.so.2. The CUDA runtime is preferably the one already
// in the process (the framework's; RTLD_NOLOAD), else the first of
// libcudart.so.13, .12, .11.0, libcudart.so that loads. Each library is
// either usable (path, version, function pointers) or carries the reason it
// is not, in words.
#pragma once

#include <string>

#include "backends/nccl/gpu_api.h"

namespace commlib {
namespace gpu {

struct NcclLib {
  bool ok = false;
  std::string path;   // where it was loaded from
  std::string error;  // why it is unusable (ok == false)
  int version = 0;    // ncclGetVersion's code
  FnNcclGetVersion get_version = nullptr;
  FnNcclGetUniqueId get_unique_id = nullptr;
  FnNcclCommInitRank comm_init_rank = nullptr;
  FnNcclComm comm_destroy = nullptr, comm_abort = nullptr;
  FnNcclCommGetAsyncError comm_get_async_error = nullptr;
  FnNcclGetErrorString get_error_string = nullptr;
  FnNcclAllReduce all_reduce = nullptr;
  FnNcclBroadcast broadcast = nullptr;
  FnNcclReduce reduce = nullptr;
  FnNcclAllGather all_gather = nullptr;
  FnNcclReduceScatter reduce_scatter = nullptr;
  FnNcclSendRecv send = nullptr;
  FnNcclRecv recv = nullptr;
  FnNcclGroup group_start = nullptr, group_end = nullptr;
  FnNcclRedOpCreatePreMulSum red_op_create_pre_mul_sum = nullptr;
  FnNcclRedOpDestroy red_op_destroy = nullptr;
};

struct CudaRuntime {
  bool ok = false;  // loaded, and at least one device visible
  std::string path, error;
  int version = 0;  // cudaRuntimeGetVersion: 1000 * major + 10 * minor
  int devices = 0;
  FnCudaInt runtime_get_version = nullptr, get_device = nullptr, get_device_count = nullptr;
  FnCudaSetDevice set_device = nullptr;
  FnCudaGetErrorString get_error_string = nullptr;
  FnCudaGetPriorityRange get_stream_priority_range = nullptr;
  FnCudaStreamCreate stream_create_with_priority = nullptr;
  FnCudaStreamDestroy stream_destroy = nullptr;
  FnCudaEventCreate event_create_with_flags = nullptr;
  FnCudaEventDestroy event_destroy = nullptr;
  FnCudaEventRecord event_record = nullptr;
  FnCudaEventQuery event_query = nullptr;
  FnCudaStreamWaitEvent stream_wait_event = nullptr;
  FnCudaMalloc malloc = nullptr;
  FnCudaFree free = nullptr;
  FnCudaMemcpyAsync memcpy_async = nullptr;
  FnCudaMemsetAsync memset_async = nullptr;
  // Stream-ordered allocation (optional: null before CUDA 11.2, when
  // point-to-point falls back to cudaMalloc/cudaFree).
  FnCudaMallocAsync malloc_async = nullptr;
  FnCudaFreeAsync free_async = nullptr;
};

struct GpuLibs {
  NcclLib nccl;
  CudaRuntime cuda;
};

// The oldest NCCL the executor uses (ncclAvg, PreMulSum, ncclCommGetAsyncError).
constexpr int kMinNcclVersion = 21200;

// Loads both libraries (thread-safe). Once NCCL loaded successfully the
// result is kept for the process and later calls return it whatever their
// arguments (its function pointers stay in use); an unusable result is
// retried on the next call. explicit_path / wheel_path: "" for none.
const GpuLibs& load_gpu_libs(const std::string& explicit_path, const std::string& wheel_path);
// The last result of load_gpu_libs, or null before the first call.
const GpuLibs* loaded_gpu_libs();

// "2.32.3" for ncclGetVersion's code (major*10000 + minor*100 + patch from
// 2.9 on, major*1000 + minor*100 + patch before).
std::string nccl_version_text(int code);

}  // namespace gpu
}  // namespace commlib
