// Routing of device buffers (exec/gpu_route.h): which requests the NCCL
// executor takes, the reasons it refuses the others, and the translation of
// dtypes and reductions to NCCL's; the device type in negotiation (encoded,
// compared across ranks, never fused with the other kind).
//
// csrc: exec/gpu_route.cc base/common.cc base/message.cc negotiation/controller.cc negotiation/controller_failures.cc negotiation/fusion.cc
#include <string>

#include "base/common.h"
#include "check.h"
#include "exec/gpu_route.h"
#include "negotiation/controller.h"
#include "negotiation/fusion.h"
#include "requests.h"

using commlib::Error;
using commlib::GpuBackend;
using commlib::gpu::GpuLibs;

namespace {

GpuLibs usable_libs() {
  GpuLibs libs;
  libs.nccl.ok = true;
  libs.cuda.ok = true;
  libs.cuda.devices = 2;
  return libs;
}

commlib_request cuda_request(int op_type, int dtype, int reduce_op = COMMLIB_SUM) {
  commlib_request q{};
  q.op_type = op_type;
  q.name = "t";
  q.dtype = dtype;
  q.reduce_op = reduce_op;
  q.prescale = 1.0;
  q.postscale = 1.0;
  q.device_type = COMMLIB_DEVICE_CUDA;
  q.device_id = 1;
  static char out[8];
  q.output = out;
  return q;
}

// The message of the Error the route check throws ("" when it passes), and its code.
std::string refusal(const commlib_request& q, GpuBackend b, const GpuLibs* libs, int* code = nullptr) {
  try {
    commlib::check_device_route(q, b, libs);
  } catch (const Error& e) {
    if (code) *code = e.code();
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("host_requests_always_pass") {
  commlib_request q = cuda_request(COMMLIB_OP_ALLREDUCE, COMMLIB_INT16);
  q.device_type = COMMLIB_DEVICE_CPU;
  CHECK_EQ(refusal(q, GpuBackend::kHost, nullptr), "");
  CHECK_EQ(refusal(q, GpuBackend::kNccl, nullptr), "");
}

TEST_CASE("cuda_requests_need_nccl_and_cuda") {
  const commlib_request q = cuda_request(COMMLIB_OP_ALLREDUCE, COMMLIB_FLOAT32);
  const GpuLibs ok = usable_libs();
  CHECK_EQ(refusal(q, GpuBackend::kAuto, &ok), "");
  CHECK_EQ(refusal(q, GpuBackend::kNccl, &ok), "");
  int code = 0;
  CHECK_CONTAINS(refusal(q, GpuBackend::kHost, &ok, &code), "COMMLIB_GPU_BACKEND=host");
  CHECK_EQ(code, COMMLIB_ERR_VALUE);
  CHECK_CONTAINS(refusal(q, GpuBackend::kAuto, nullptr), "NCCL, which is not usable: not loaded");
  GpuLibs no_nccl = ok;
  no_nccl.nccl.ok = false;
  no_nccl.nccl.error = "libnccl.so.2: cannot open";
  CHECK_EQ(refusal(q, GpuBackend::kAuto, &no_nccl),
           "allreduce 't' on CUDA device 1: CUDA buffers need NCCL, which is not usable: libnccl.so.2: cannot open");
  GpuLibs no_cuda = ok;
  no_cuda.cuda.ok = false;
  no_cuda.cuda.error = "no CUDA device visible";
  CHECK_CONTAINS(refusal(q, GpuBackend::kNccl, &no_cuda), "the CUDA runtime is not usable: no CUDA device visible");
  commlib_request far = q;
  far.device_id = 2;
  CHECK_CONTAINS(refusal(far, GpuBackend::kAuto, &ok), "no such device (2 visible)");
  commlib_request unknown = q;
  unknown.device_type = 7;
  CHECK_CONTAINS(refusal(unknown, GpuBackend::kAuto, &ok), "unknown device type 7");
}

TEST_CASE("reductions_nccl_cannot_run_are_refused") {
  const GpuLibs ok = usable_libs();
  int code = 0;
  CHECK_CONTAINS(refusal(cuda_request(COMMLIB_OP_ALLREDUCE, COMMLIB_INT16), GpuBackend::kAuto, &ok, &code),
                 "NCCL cannot reduce int16");
  CHECK_EQ(code, COMMLIB_ERR_TYPE);
  CHECK_CONTAINS(refusal(cuda_request(COMMLIB_OP_REDUCESCATTER, COMMLIB_BOOL, COMMLIB_MAX), GpuBackend::kAuto, &ok),
                 "NCCL cannot reduce bool");
  CHECK_EQ(refusal(cuda_request(COMMLIB_OP_BROADCAST, COMMLIB_INT16), GpuBackend::kAuto, &ok), "");  // bytes
  commlib_request scaled_max = cuda_request(COMMLIB_OP_ALLREDUCE, COMMLIB_FLOAT32, COMMLIB_MAX);
  scaled_max.prescale = 2.0;
  CHECK_CONTAINS(refusal(scaled_max, GpuBackend::kAuto, &ok), "prescale/postscale with op Max");
  CHECK_CONTAINS(refusal(cuda_request(COMMLIB_OP_ALLREDUCE, COMMLIB_INT32, COMMLIB_AVERAGE), GpuBackend::kAuto, &ok),
                 "need a floating-point dtype");
  CHECK_EQ(refusal(cuda_request(COMMLIB_OP_ALLREDUCE, COMMLIB_BFLOAT16, COMMLIB_AVERAGE), GpuBackend::kAuto, &ok), "");
  CHECK_EQ(refusal(cuda_request(COMMLIB_OP_ALLREDUCE, COMMLIB_INT64, COMMLIB_PRODUCT), GpuBackend::kAuto, &ok), "");
  CHECK_CONTAINS(refusal(cuda_request(COMMLIB_OP_ALLREDUCE, COMMLIB_FLOAT32, COMMLIB_ADASUM), GpuBackend::kAuto,
                         &ok, &code),
                 "NCCL does not run Adasum");
  CHECK_EQ(code, COMMLIB_ERR_VALUE);
}

TEST_CASE("gather_ops_need_a_caller_allocated_output") {
  const GpuLibs ok = usable_libs();
  commlib_request q = cuda_request(COMMLIB_OP_ALLGATHER, COMMLIB_FLOAT32);
  CHECK_EQ(refusal(q, GpuBackend::kAuto, &ok), "");
  q.output = nullptr;
  CHECK_CONTAINS(refusal(q, GpuBackend::kAuto, &ok), "the caller allocates the output");
  CHECK_CONTAINS(refusal(cuda_request(COMMLIB_OP_BARRIER, COMMLIB_UINT8), GpuBackend::kAuto, &ok),
                 "takes no device buffers");
}

TEST_CASE("nccl_dtypes_and_reductions") {
  using namespace commlib::gpu;
  CHECK_EQ(commlib::nccl_dtype(COMMLIB_FLOAT16), int(kNcclFloat16));
  CHECK_EQ(commlib::nccl_dtype(COMMLIB_BFLOAT16), int(kNcclBfloat16));
  CHECK_EQ(commlib::nccl_dtype(COMMLIB_UINT64), int(kNcclUint64));
  CHECK_EQ(commlib::nccl_dtype(COMMLIB_UINT16), -1);
  auto r = commlib::nccl_reduction(COMMLIB_AVERAGE, 1.0, 1.0, 4);
  CHECK(!r.premul);
  CHECK_EQ(r.op, int(kNcclAvg));
  r = commlib::nccl_reduction(COMMLIB_AVERAGE, 2.0, 3.0, 4);
  CHECK(r.premul);
  CHECK_EQ(r.scalar, 1.5);
  r = commlib::nccl_reduction(COMMLIB_SUM, 0.5, 1.0, 4);
  CHECK(r.premul);
  CHECK_EQ(r.scalar, 0.5);
  CHECK_EQ(commlib::nccl_reduction(COMMLIB_MIN, 1.0, 1.0, 4).op, int(kNcclMin));
  CHECK_EQ(commlib::nccl_reduction(COMMLIB_PRODUCT, 1.0, 1.0, 4).op, int(kNcclProd));
  CHECK(commlib::parse_gpu_backend("host") == GpuBackend::kHost);
  CHECK_THROWS(Error, commlib::parse_gpu_backend("cuda"));
}

TEST_CASE("device type: encoded, compared across ranks, kept apart by fusion") {
  commlib::RequestDesc cpu = commlib_test::allreduce("g", COMMLIB_FLOAT16, {8});
  commlib::RequestDesc cuda = cpu;
  cuda.device_type = COMMLIB_DEVICE_CUDA;
  commlib::Writer w;
  commlib::encode(w, cuda);
  const std::string bytes = w.take();
  commlib::Reader rd(bytes);
  CHECK_EQ(commlib::decode_request(rd).device_type, int(COMMLIB_DEVICE_CUDA));
  int code = 0;
  CHECK_EQ(commlib::Controller::validate({cuda, cuda}, {0, 1}, &code), "");
  CHECK_EQ(commlib::Controller::validate({cpu, cuda, cuda}, {0, 1, 2}, &code),
           "Mismatched device for allreduce 'g' across ranks: rank 0: cpu; ranks 1, 2: cuda");
  CHECK_EQ(code, COMMLIB_ERR_MISMATCH);
  commlib::RequestDesc cpu2 = cpu, cuda2 = cuda;
  cpu2.name = "h";
  cuda2.name = "i";
  // (float16: 4 bytes an element on the host, where it is widened; 2 on the device)
  const auto groups = commlib::plan_fusion({&cpu, &cuda, &cpu2, &cuda2}, {true, true, true, true}, 64);
  CHECK_EQ(groups.size(), size_t(2));
  CHECK(groups[0] == std::vector<size_t>({0, 2}));
  CHECK(groups[1] == std::vector<size_t>({1, 3}));
  const auto tight = commlib::plan_fusion({&cuda, &cuda2}, {true, true}, 32);  // 16 + 16 device bytes
  CHECK_EQ(tight.size(), size_t(1));
  const auto host_tight = commlib::plan_fusion({&cpu, &cpu2}, {true, true}, 32);  // 32 + 32 host bytes
  CHECK_EQ(host_tight.size(), size_t(2));
}

CHECK_MAIN()
