#include "exec/gpu_route.h"

#include "backends/nccl/gpu_api.h"
#include "base/common.h"

namespace commlib {
namespace {

[[noreturn]] void refuse(int code, const commlib_request& q, const std::string& why) {
  throw Error(code, std::string(op_type_name(q.op_type)) + " '" + (q.name ? q.name : "") +
                        "' on CUDA device " + std::to_string(q.device_id) + ": " + why);
}

bool scaled(const commlib_request& q) { return q.prescale != 1.0 || q.postscale != 1.0; }

void check_reduction(const commlib_request& q) {
  if (q.reduce_op == COMMLIB_ADASUM) {
    refuse(COMMLIB_ERR_VALUE, q, "NCCL does not run Adasum; stage the tensors through host memory "
                                 "(commlib.torch does so) or use COMMLIB_GPU_BACKEND=host");
  }
  if (nccl_dtype(q.dtype) < 0) {
    refuse(COMMLIB_ERR_TYPE, q, std::string("NCCL cannot reduce ") + dtype_name(q.dtype) +
                                    "; use COMMLIB_GPU_BACKEND=host for it");
  }
  const bool sum_like = q.reduce_op == COMMLIB_SUM || q.reduce_op == COMMLIB_AVERAGE;
  if (scaled(q) && !sum_like) {
    refuse(COMMLIB_ERR_VALUE, q, std::string("prescale/postscale with op ") + reduce_op_name(q.reduce_op) +
                                     " is not run by NCCL (only with Sum and Average); scale the tensor "
                                     "before or after, or use COMMLIB_GPU_BACKEND=host");
  }
  if ((scaled(q) || q.reduce_op == COMMLIB_AVERAGE) && !is_float_dtype(q.dtype)) {
    refuse(COMMLIB_ERR_TYPE, q, std::string("Average and scale factors need a floating-point dtype on "
                                            "the NCCL path, got ") + dtype_name(q.dtype));
  }
}

}  // namespace

GpuBackend parse_gpu_backend(const std::string& name) {
  if (name == "auto") return GpuBackend::kAuto;
  if (name == "nccl") return GpuBackend::kNccl;
  if (name == "host") return GpuBackend::kHost;
  throw Error(COMMLIB_ERR_VALUE, "COMMLIB_GPU_BACKEND='" + name + "': expected auto, nccl or host");
}

int nccl_dtype(int dtype) {
  switch (dtype) {
    case COMMLIB_UINT8: return gpu::kNcclUint8;
    case COMMLIB_INT8: return gpu::kNcclInt8;
    case COMMLIB_INT32: return gpu::kNcclInt32;
    case COMMLIB_UINT32: return gpu::kNcclUint32;
    case COMMLIB_INT64: return gpu::kNcclInt64;
    case COMMLIB_UINT64: return gpu::kNcclUint64;
    case COMMLIB_FLOAT16: return gpu::kNcclFloat16;
    case COMMLIB_BFLOAT16: return gpu::kNcclBfloat16;
    case COMMLIB_FLOAT32: return gpu::kNcclFloat32;
    case COMMLIB_FLOAT64: return gpu::kNcclFloat64;
    default: return -1;
  }
}

NcclReduction nccl_reduction(int op, double prescale, double postscale, int size) {
  NcclReduction r;
  const double scale = prescale * postscale;
  switch (op) {
    case COMMLIB_SUM:
      r.op = gpu::kNcclSum;
      break;
    case COMMLIB_AVERAGE:
      r.op = gpu::kNcclAvg;
      break;
    case COMMLIB_MIN: r.op = gpu::kNcclMin; return r;
    case COMMLIB_MAX: r.op = gpu::kNcclMax; return r;
    case COMMLIB_PRODUCT: r.op = gpu::kNcclProd; return r;
    default: throw Error(COMMLIB_ERR_TYPE, "unknown reduction op " + std::to_string(op));
  }
  if (scale != 1.0) {
    r.premul = true;
    r.scalar = op == COMMLIB_AVERAGE ? scale / double(size) : scale;
  }
  return r;
}

void check_device_route(const commlib_request& q, GpuBackend backend, const gpu::GpuLibs* libs) {
  if (q.device_type == COMMLIB_DEVICE_CPU) return;
  if (q.device_type != COMMLIB_DEVICE_CUDA)
    throw Error(COMMLIB_ERR_VALUE, "unknown device type " + std::to_string(q.device_type));
  if (backend == GpuBackend::kHost) {
    refuse(COMMLIB_ERR_VALUE, q, "COMMLIB_GPU_BACKEND=host: the core takes host buffers only (the "
                                 "frontend stages CUDA tensors through host memory)");
  }
  if (!libs || !libs->nccl.ok) {
    refuse(COMMLIB_ERR_VALUE, q, "CUDA buffers need NCCL, which is not usable: " +
                                     (libs ? libs->nccl.error : std::string("not loaded")));
  }
  if (!libs->cuda.ok) refuse(COMMLIB_ERR_VALUE, q, "the CUDA runtime is not usable: " + libs->cuda.error);
  if (q.device_id < 0 || q.device_id >= libs->cuda.devices) {
    refuse(COMMLIB_ERR_VALUE, q, "no such device (" + std::to_string(libs->cuda.devices) + " visible)");
  }
  switch (q.op_type) {
    case COMMLIB_OP_ALLREDUCE:
    case COMMLIB_OP_REDUCESCATTER:
      check_reduction(q);
      break;
    case COMMLIB_OP_ALLGATHER:
    case COMMLIB_OP_ALLTOALL:
      if (!q.output) refuse(COMMLIB_ERR_VALUE, q, "the caller allocates the output on the device (output is NULL)");
      break;
    case COMMLIB_OP_BROADCAST:
      break;
    default:
      refuse(COMMLIB_ERR_VALUE, q, "this operation takes no device buffers");
  }
}

}  // namespace commlib
