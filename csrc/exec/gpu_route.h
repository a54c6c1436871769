// Which executor takes a request's buffers, decided before anything is
// queued: host buffers go to the CPU executor; CUDA buffers to the NCCL
// executor (exec/gpu_executor.h) when COMMLIB_GPU_BACKEND is auto or nccl and
// NCCL and the CUDA runtime are usable. With COMMLIB_GPU_BACKEND=host the
// frontend stages CUDA tensors through host memory and the core only ever
// sees host buffers. Also the translation of commlib's dtypes and reductions
// to NCCL's. Pure functions: no CUDA or NCCL call here.
#pragma once

#include <string>

#include "backends/nccl/loader.h"
#include "commlib/c_api.h"

namespace commlib {

enum class GpuBackend { kAuto, kNccl, kHost };

// COMMLIB_GPU_BACKEND: auto|nccl|host; Error(COMMLIB_ERR_VALUE) otherwise.
GpuBackend parse_gpu_backend(const std::string& name);

// NCCL's ncclDataType_t for dtype, or -1 when NCCL has none (bool, int16,
// uint16: moved as bytes, never reduced).
int nccl_dtype(int dtype);

// The NCCL reduction of an allreduce/reducescatter: a built-in operator, or
// a PreMulSum by scalar (Sum/Average with scale factors; Average with scale
// factors folds 1/size into the scalar).
struct NcclReduction {
  int op = 0;         // ncclRedOp_t when !premul
  bool premul = false;
  double scalar = 1;  // premul: the factor every input is multiplied by
};
NcclReduction nccl_reduction(int op, double prescale, double postscale, int size);

// Throws Error(COMMLIB_ERR_VALUE / COMMLIB_ERR_TYPE), naming the reason,
// when the core cannot run q on q.device_type: an unknown device; a CUDA
// request under COMMLIB_GPU_BACKEND=host; NCCL or the CUDA runtime not usable
// (libs null: not loaded); an operation, dtype or reduction the NCCL
// executor does not run. Every rank decides alike (same request, same
// libraries), so the others fail at once instead of waiting.
void check_device_route(const commlib_request& q, GpuBackend backend, const gpu::GpuLibs* libs);

}  // namespace commlib
