#include "exec/gpu_ops.h"

#include <cstring>
#include <string>

#include "base/common.h"
#include "base/half.h"
#include "exec/gpu_route.h"
#include "exec/operations.h"

namespace commlib {
namespace {

using gpu::check_cuda;
using gpu::check_nccl;

// Elements of one dim-0 row.
size_t row_elements(const RequestDesc& d) {
  size_t n = 1;
  for (size_t i = 1; i < d.shape.size(); ++i) n *= size_t(d.shape[i]);
  return n;
}

// An operator for NCCL: built-in, or a PreMulSum created for this call and
// destroyed once the calls using it are enqueued (NCCL allows that).
class ReduceOp {
 public:
  ReduceOp(gpu::NcclComm& c, const RequestDesc& d) : c_(c) {
    const NcclReduction r = nccl_reduction(d.reduce_op, d.prescale, d.postscale, c.size());
    op_ = r.op;
    if (!r.premul) return;
    char scalar[8] = {};  // the factor, in the data's own type
    if (d.dtype == COMMLIB_FLOAT64) {
      std::memcpy(scalar, &r.scalar, sizeof(double));
    } else if (d.dtype == COMMLIB_FLOAT32) {
      const float f = float(r.scalar);
      std::memcpy(scalar, &f, sizeof(float));
    } else {
      const float f = float(r.scalar);
      float_to_half(d.dtype, &f, scalar, 1, 1.0);
    }
    check_nccl(c.libs().nccl,
               c.libs().nccl.red_op_create_pre_mul_sum(&op_, scalar, nccl_dtype(d.dtype),
                                                       gpu::kNcclScalarHostImmediate, c.comm()),
               "ncclRedOpCreatePreMulSum");
    created_ = true;
  }
  ~ReduceOp() {
    if (created_) c_.libs().nccl.red_op_destroy(op_, c_.comm());
  }
  int op() const { return op_; }

 private:
  gpu::NcclComm& c_;
  int op_ = 0;
  bool created_ = false;
};

void copy_async(gpu::NcclComm& c, void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  check_cuda(c.libs().cuda, c.libs().cuda.memcpy_async(dst, src, bytes, gpu::kCudaMemcpyDeviceToDevice, c.stream()),
             "cudaMemcpyAsync");
}

// Runs NCCL calls between ncclGroupStart and ncclGroupEnd.
template <typename Body>
void grouped(gpu::NcclComm& c, Body body) {
  const gpu::NcclLib& n = c.libs().nccl;
  check_nccl(n, n.group_start(), "ncclGroupStart");
  try {
    body();
  } catch (...) {
    n.group_end();
    throw;
  }
  check_nccl(n, n.group_end(), "ncclGroupEnd");
}

void check_output_rows(const Entry& e, int64_t rows) {
  if (e.output_rows != rows) {
    throw Error(COMMLIB_ERR_VALUE, std::string(op_type_name(e.desc.op_type)) + " '" + e.desc.name +
                                       "': the output holds " + std::to_string(e.output_rows) +
                                       " rows, the negotiated result " + std::to_string(rows));
  }
}

}  // namespace

void nccl_allreduce(gpu::NcclComm& c, const std::vector<Entry*>& entries) {
  const RequestDesc& d = entries[0]->desc;
  const size_t esize = dtype_size(d.dtype);
  ReduceOp op(c, d);
  const gpu::NcclLib& n = c.libs().nccl;
  if (entries.size() == 1) {
    const Entry& e = *entries[0];
    check_nccl(n, n.all_reduce(e.input, e.output, size_t(num_elements(d.shape)), nccl_dtype(d.dtype), op.op(),
                               c.comm(), c.stream()),
               "ncclAllReduce '" + d.name + "'");
    return;
  }
  size_t total = 0;
  for (const Entry* e : entries) total += size_t(num_elements(e->desc.shape));
  char* buf = static_cast<char*>(c.fusion_buffer(total * esize));
  size_t off = 0;
  for (const Entry* e : entries) {
    const size_t bytes = size_t(num_elements(e->desc.shape)) * esize;
    copy_async(c, buf + off, e->input, bytes);
    off += bytes;
  }
  check_nccl(n, n.all_reduce(buf, buf, total, nccl_dtype(d.dtype), op.op(), c.comm(), c.stream()),
             "ncclAllReduce (" + std::to_string(entries.size()) + " fused tensors, first '" + d.name + "')");
  off = 0;
  for (const Entry* e : entries) {
    const size_t bytes = size_t(num_elements(e->desc.shape)) * esize;
    copy_async(c, e->output, buf + off, bytes);
    off += bytes;
  }
}

void nccl_broadcast(gpu::NcclComm& c, const std::vector<Entry*>& entries) {
  const RequestDesc& d = entries[0]->desc;
  const gpu::NcclLib& n = c.libs().nccl;
  auto bytes_of = [](const Entry* e) { return size_t(entry_bytes(*e)); };  // (a broadcast is never grouped)
  if (entries.size() == 1) {
    const Entry& e = *entries[0];
    check_nccl(n, n.broadcast(e.input, e.output, bytes_of(&e), gpu::kNcclUint8, d.root, c.comm(), c.stream()),
               "ncclBroadcast '" + d.name + "'");
    return;
  }
  size_t total = 0;
  for (const Entry* e : entries) total += bytes_of(e);
  char* buf = static_cast<char*>(c.fusion_buffer(total));
  const bool root = c.rank() == d.root;
  size_t off = 0;
  for (const Entry* e : entries) {  // the root packs its inputs; every rank unpacks the result
    if (root) copy_async(c, buf + off, e->input, bytes_of(e));
    off += bytes_of(e);
  }
  check_nccl(n, n.broadcast(buf, buf, total, gpu::kNcclUint8, d.root, c.comm(), c.stream()),
             "ncclBroadcast (" + std::to_string(entries.size()) + " fused tensors, first '" + d.name + "')");
  off = 0;
  for (const Entry* e : entries) {
    copy_async(c, e->output, root ? e->input : buf + off, bytes_of(e));
    off += bytes_of(e);
  }
}

void nccl_allgather(gpu::NcclComm& c, Entry& e, const std::vector<int64_t>& rows) {
  const size_t row_bytes = row_elements(e.desc) * dtype_size(e.desc.dtype);
  int64_t total = 0;
  bool equal = true;
  for (int64_t r : rows) {
    total += r;
    equal = equal && r == rows[0];
  }
  check_output_rows(e, total);
  const gpu::NcclLib& n = c.libs().nccl;
  char* out = static_cast<char*>(e.output);
  if (equal) {
    check_nccl(n, n.all_gather(e.input, out, size_t(rows[0]) * row_bytes, gpu::kNcclUint8, c.comm(), c.stream()),
               "ncclAllGather '" + e.desc.name + "'");
    return;
  }
  grouped(c, [&] {  // uneven rows: one broadcast per rank into its place
    size_t off = 0;
    for (int r = 0; r < c.size(); ++r) {
      const size_t bytes = size_t(rows[r]) * row_bytes;
      check_nccl(n, n.broadcast(e.input, out + off, bytes, gpu::kNcclUint8, r, c.comm(), c.stream()),
                 "ncclBroadcast (allgather '" + e.desc.name + "')");
      off += bytes;
    }
  });
}

void nccl_alltoall(gpu::NcclComm& c, Entry& e, const std::vector<int64_t>& matrix) {
  const size_t row_bytes = row_elements(e.desc) * dtype_size(e.desc.dtype);
  const int size = c.size(), me = c.rank();
  int64_t incoming = 0;
  for (int src = 0; src < size; ++src) incoming += matrix[size_t(src) * size + me];
  check_output_rows(e, incoming);
  const gpu::NcclLib& n = c.libs().nccl;
  const char* in = static_cast<const char*>(e.input);
  char* out = static_cast<char*>(e.output);
  grouped(c, [&] {
    size_t send_off = 0, recv_off = 0;
    for (int p = 0; p < size; ++p) {
      const size_t send = size_t(matrix[size_t(me) * size + p]) * row_bytes;
      const size_t recv = size_t(matrix[size_t(p) * size + me]) * row_bytes;
      if (send) check_nccl(n, n.send(in + send_off, send, gpu::kNcclUint8, p, c.comm(), c.stream()), "ncclSend");
      if (recv) check_nccl(n, n.recv(out + recv_off, recv, gpu::kNcclUint8, p, c.comm(), c.stream()), "ncclRecv");
      send_off += send;
      recv_off += recv;
    }
  });
}

void nccl_reducescatter(gpu::NcclComm& c, Entry& e) {
  const RequestDesc& d = e.desc;
  const size_t row = row_elements(d), esize = dtype_size(d.dtype);
  const int size = c.size();
  ReduceOp op(c, d);
  const gpu::NcclLib& n = c.libs().nccl;
  const int64_t dim0 = d.shape[0];
  if (d.splits.empty() && dim0 % size == 0) {
    check_nccl(n, n.reduce_scatter(e.input, e.output, size_t(dim0 / size) * row, nccl_dtype(d.dtype), op.op(),
                                   c.comm(), c.stream()),
               "ncclReduceScatter '" + d.name + "'");
    return;
  }
  grouped(c, [&] {  // uneven rows: one reduce per rank to its slice
    size_t off = 0;
    for (int r = 0; r < size; ++r) {
      const size_t count = size_t(reducescatter_rows(d, size, r)) * row;
      const char* src = static_cast<const char*>(e.input) + off * esize;
      // (only the root's receive buffer is written; the others pass their input)
      void* dst = r == c.rank() ? e.output : const_cast<char*>(src);
      if (count) check_nccl(n, n.reduce(src, dst, count, nccl_dtype(d.dtype), op.op(), r, c.comm(), c.stream()),
                 "ncclReduce (reducescatter '" + d.name + "')");
      off += count;
    }
  });
}

}  // namespace commlib
