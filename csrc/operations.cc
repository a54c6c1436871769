#include "operations.h"

#include <cstring>

#include "common.h"
#include "half.h"
#include "reduce.h"

namespace commlib {
namespace {

// Bytes of one dim-0 row (product of the other dimensions times dtype size).
size_t row_bytes(const RequestDesc& d) {
  size_t n = dtype_size(d.dtype);
  for (size_t i = 1; i < d.shape.size(); ++i) n *= size_t(d.shape[i]);
  return n;
}

// Average is a Sum followed by a 1/size postscale.
void effective_op(const RequestDesc& d, int size, int* op, double* post) {
  *op = d.reduce_op == COMMLIB_AVERAGE ? COMMLIB_SUM : d.reduce_op;
  *post = d.postscale * (d.reduce_op == COMMLIB_AVERAGE ? 1.0 / size : 1.0);
}

}  // namespace

int64_t reducescatter_rows(int64_t dim0, int size, int r) {
  return dim0 / size + (r < dim0 % size ? 1 : 0);
}

void run_allreduce(OpContext& ctx, const std::vector<Entry*>& entries) {
  const RequestDesc& d0 = entries[0]->desc;
  const int dtype = d0.dtype;
  int op;
  double post;
  effective_op(d0, ctx.transport.size(), &op, &post);
  const double pre = d0.prescale;

  if (is_half_dtype(dtype)) {  // widen into the float32 fusion buffer
    size_t total = 0;
    for (Entry* e : entries) total += size_t(num_elements(e->desc.shape));
    float* buf = reinterpret_cast<float*>(ctx.fusion.get(total * sizeof(float)));
    size_t off = 0;
    for (Entry* e : entries) {
      const size_t n = size_t(num_elements(e->desc.shape));
      half_to_float(dtype, e->input, buf + off, n, pre);
      off += n;
    }
    allreduce(ctx.transport, ctx.shm, buf, total, COMMLIB_FLOAT32, op, ctx.algo);
    off = 0;
    for (Entry* e : entries) {
      const size_t n = size_t(num_elements(e->desc.shape));
      float_to_half(dtype, buf + off, e->output, n, post);
      off += n;
    }
    return;
  }

  const size_t esize = dtype_size(dtype);
  if (entries.size() == 1) {  // no packing: reduce in the output buffer
    Entry* e = entries[0];
    const size_t n = size_t(num_elements(e->desc.shape));
    if (e->input != e->output) std::memcpy(e->output, e->input, n * esize);
    scale_buffer(dtype, e->output, n, pre);
    allreduce(ctx.transport, ctx.shm, e->output, n, dtype, op, ctx.algo);
    scale_buffer(dtype, e->output, n, post);
    return;
  }

  size_t total = 0;
  for (Entry* e : entries) total += size_t(num_elements(e->desc.shape));
  char* buf = ctx.fusion.get(total * esize);
  size_t off = 0;
  for (Entry* e : entries) {
    const size_t bytes = size_t(num_elements(e->desc.shape)) * esize;
    std::memcpy(buf + off, e->input, bytes);
    off += bytes;
  }
  scale_buffer(dtype, buf, total, pre);
  allreduce(ctx.transport, ctx.shm, buf, total, dtype, op, ctx.algo);
  scale_buffer(dtype, buf, total, post);
  off = 0;
  for (Entry* e : entries) {
    const size_t bytes = size_t(num_elements(e->desc.shape)) * esize;
    std::memcpy(e->output, buf + off, bytes);
    off += bytes;
  }
}

void run_allgather(OpContext& ctx, Entry& e, const std::vector<int64_t>& rows) {
  const size_t rb = row_bytes(e.desc);
  const int size = ctx.transport.size();
  std::vector<size_t> bytes(size);
  int64_t total_rows = 0;
  for (int r = 0; r < size; ++r) {
    bytes[r] = size_t(rows[r]) * rb;
    total_rows += rows[r];
  }
  HandleState& h = *e.handle;
  h.result.resize(size_t(total_rows) * rb);
  ctx.transport.allgatherv(e.input, h.result.data(), bytes);
  h.rows = total_rows;
  h.splits = rows;
}

void run_broadcast(OpContext& ctx, Entry& e) {
  const size_t bytes = size_t(num_elements(e.desc.shape)) * dtype_size(e.desc.dtype);
  if (ctx.transport.rank() == e.desc.root && e.input != e.output) {
    std::memcpy(e.output, e.input, bytes);
  }
  if (ctx.transport.size() > 1 && bytes > 0) ctx.transport.broadcast(e.output, bytes, e.desc.root);
}

void run_alltoall(OpContext& ctx, Entry& e, const std::vector<int64_t>& matrix) {
  const size_t rb = row_bytes(e.desc);
  const int size = ctx.transport.size();
  const int me = ctx.transport.rank();
  std::vector<size_t> send(size), recv(size);
  HandleState& h = *e.handle;
  h.splits.assign(size, 0);
  int64_t total_rows = 0;
  for (int r = 0; r < size; ++r) {
    send[r] = size_t(matrix[size_t(me) * size + r]) * rb;
    h.splits[r] = matrix[size_t(r) * size + me];
    recv[r] = size_t(h.splits[r]) * rb;
    total_rows += h.splits[r];
  }
  h.result.resize(size_t(total_rows) * rb);
  ctx.transport.alltoallv(e.input, send, h.result.data(), recv);
  h.rows = total_rows;
}

void run_reducescatter(OpContext& ctx, Entry& e) {
  const RequestDesc& d = e.desc;
  const int size = ctx.transport.size();
  const int me = ctx.transport.rank();
  const int64_t dim0 = d.shape.empty() ? 1 : d.shape[0];
  const size_t row_elems = row_bytes(d) / dtype_size(d.dtype);
  const size_t n = size_t(num_elements(d.shape));
  std::vector<size_t> counts(size);
  for (int r = 0; r < size; ++r) counts[r] = size_t(reducescatter_rows(dim0, size, r)) * row_elems;
  const size_t mine = counts[me];
  int op;
  double post;
  effective_op(d, size, &op, &post);

  if (is_half_dtype(d.dtype)) {
    float* in = reinterpret_cast<float*>(ctx.fusion.get(n * sizeof(float)));
    float* out = reinterpret_cast<float*>(ctx.scratch.get(mine * sizeof(float) + 1));
    half_to_float(d.dtype, e.input, in, n, d.prescale);
    ctx.transport.reduce_scatter(in, out, counts, COMMLIB_FLOAT32, op);
    float_to_half(d.dtype, out, e.output, mine, post);
    return;
  }
  const void* src = e.input;
  if (d.prescale != 1.0) {
    char* buf = ctx.fusion.get(n * dtype_size(d.dtype));
    std::memcpy(buf, e.input, n * dtype_size(d.dtype));
    scale_buffer(d.dtype, buf, n, d.prescale);
    src = buf;
  }
  ctx.transport.reduce_scatter(src, e.output, counts, d.dtype, op);
  scale_buffer(d.dtype, e.output, mine, post);
}

}  // namespace commlib
