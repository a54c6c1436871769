// Our own minimal declarations of the NCCL and CUDA runtime entry points the
// core calls, written from their public API documentation (no NCCL or CUDA
// header is needed at build time). Both libraries are dlopen'ed at run time
// (loader.h); these are the types of the function pointers looked up there.
// Enum values are those documented for NCCL >= 2.10 and the CUDA runtime.
#pragma once

#include <cstddef>
#include <cstdint>

namespace commlib {
namespace gpu {

// ---- NCCL ----
using ncclResult = int;  // ncclResult_t
enum : int {
  kNcclSuccess = 0,
  kNcclUnhandledCudaError = 1,
  kNcclSystemError = 2,
  kNcclInternalError = 3,
  kNcclInvalidArgument = 4,
  kNcclInvalidUsage = 5,
  kNcclRemoteError = 6,
  kNcclInProgress = 7,
};

// ncclDataType_t
enum : int {
  kNcclInt8 = 0, kNcclUint8 = 1, kNcclInt32 = 2, kNcclUint32 = 3, kNcclInt64 = 4,
  kNcclUint64 = 5, kNcclFloat16 = 6, kNcclFloat32 = 7, kNcclFloat64 = 8, kNcclBfloat16 = 9,
};

// ncclRedOp_t (built-in operators; PreMulSum operators are created at run time)
enum : int { kNcclSum = 0, kNcclProd = 1, kNcclMax = 2, kNcclMin = 3, kNcclAvg = 4 };
// ncclScalarResidence_t
enum : int { kNcclScalarDevice = 0, kNcclScalarHostImmediate = 1 };

struct NcclUniqueId {
  char internal[128];  // NCCL_UNIQUE_ID_BYTES
};
using ncclComm = struct NcclCommOpaque*;
using cudaStream = struct CudaStreamOpaque*;
using cudaEvent = struct CudaEventOpaque*;

using FnNcclGetVersion = ncclResult (*)(int*);
using FnNcclGetUniqueId = ncclResult (*)(NcclUniqueId*);
using FnNcclCommInitRank = ncclResult (*)(ncclComm*, int, NcclUniqueId, int);
using FnNcclComm = ncclResult (*)(ncclComm);  // destroy, abort
using FnNcclCommGetAsyncError = ncclResult (*)(ncclComm, ncclResult*);
using FnNcclGetErrorString = const char* (*)(ncclResult);
using FnNcclAllReduce = ncclResult (*)(const void*, void*, size_t, int, int, ncclComm, cudaStream);
using FnNcclBroadcast = ncclResult (*)(const void*, void*, size_t, int, int, ncclComm, cudaStream);
using FnNcclReduce = ncclResult (*)(const void*, void*, size_t, int, int, int, ncclComm, cudaStream);
using FnNcclAllGather = ncclResult (*)(const void*, void*, size_t, int, ncclComm, cudaStream);
using FnNcclReduceScatter = ncclResult (*)(const void*, void*, size_t, int, int, ncclComm, cudaStream);
using FnNcclSendRecv = ncclResult (*)(const void*, size_t, int, int, ncclComm, cudaStream);  // send
using FnNcclRecv = ncclResult (*)(void*, size_t, int, int, ncclComm, cudaStream);
using FnNcclGroup = ncclResult (*)();  // ncclGroupStart / ncclGroupEnd
using FnNcclRedOpCreatePreMulSum = ncclResult (*)(int*, void*, int, int, ncclComm);
using FnNcclRedOpDestroy = ncclResult (*)(int, ncclComm);

// ---- CUDA runtime ----
using cudaError = int;  // cudaError_t
enum : int { kCudaSuccess = 0, kCudaErrorNotReady = 600 };
enum : int { kCudaMemcpyDeviceToDevice = 3, kCudaMemcpyDefault = 4 };
enum : unsigned { kCudaStreamNonBlocking = 1, kCudaEventDisableTiming = 2 };

using FnCudaInt = cudaError (*)(int*);  // cudaRuntimeGetVersion, cudaGetDevice, cudaGetDeviceCount
using FnCudaSetDevice = cudaError (*)(int);
using FnCudaGetErrorString = const char* (*)(cudaError);
using FnCudaGetPriorityRange = cudaError (*)(int*, int*);
using FnCudaStreamCreate = cudaError (*)(cudaStream*, unsigned, int);  // ...WithPriority
using FnCudaStreamDestroy = cudaError (*)(cudaStream);
using FnCudaEventCreate = cudaError (*)(cudaEvent*, unsigned);  // ...WithFlags
using FnCudaEventDestroy = cudaError (*)(cudaEvent);
using FnCudaEventRecord = cudaError (*)(cudaEvent, cudaStream);
using FnCudaEventQuery = cudaError (*)(cudaEvent);
using FnCudaStreamWaitEvent = cudaError (*)(cudaStream, cudaEvent, unsigned);
using FnCudaMalloc = cudaError (*)(void**, size_t);
using FnCudaFree = cudaError (*)(void*);
using FnCudaMemcpyAsync = cudaError (*)(void*, const void*, size_t, int, cudaStream);
using FnCudaMemsetAsync = cudaError (*)(void*, int, size_t, cudaStream);
using FnCudaMallocAsync = cudaError (*)(void**, size_t, cudaStream);  // CUDA >= 11.2
using FnCudaFreeAsync = cudaError (*)(void*, cudaStream);

}  // namespace gpu
}  // namespace commlib
