#include "exec/operations.h"

#include <cstring>

#include <algorithm>

#include "base/common.h"
#include "base/half.h"
#include "base/reduce.h"
#include "base/timeline.h"
#include "collectives/allreduce_shm_fused.h"
#include "collectives/shm_collectives.h"

namespace commlib {
size_t row_bytes(const RequestDesc& d) {
  size_t n = dtype_size(d.dtype);
  for (size_t i = 1; i < d.shape.size(); ++i) n *= size_t(d.shape[i]);
  return n;
}

namespace {

// Average is a Sum followed by a 1/size postscale (Adasum stays Adasum).
void effective_op(const RequestDesc& d, int size, int* op, double* post) {
  *op = d.reduce_op == COMMLIB_AVERAGE ? COMMLIB_SUM : d.reduce_op;
  *post = d.postscale * (d.reduce_op == COMMLIB_AVERAGE ? 1.0 / size : 1.0);
}

}  // namespace

int64_t reducescatter_rows(int64_t dim0, int size, int r) {
  return dim0 / size + (r < dim0 % size ? 1 : 0);
}

int64_t reducescatter_rows(const RequestDesc& d, int size, int r) {
  if (!d.splits.empty()) return d.splits.at(size_t(r));
  return reducescatter_rows(d.shape.empty() ? 1 : d.shape[0], size, r);
}

namespace {

AlgoChoice choice_of(const OpContext& ctx) {
  return AlgoChoice{ctx.algo, ctx.shm, ctx.cross, ctx.shm_collectives};
}

bool shm_allowed(const OpContext& ctx) { return shm_allowed(choice_of(ctx)); }

// The segment has fusion regions (COMMLIB_SHM_FUSION_BYTES=0: none; the
// algorithms that stage data in them are not used).
bool shm_regions(const OpContext& ctx) { return shm_allowed(ctx) && ctx.shm->region_bytes() > 0; }

// (exec/algorithm.h decides; the whole job must be the host's shm group)
bool use_shm_collective(const OpContext& ctx, bool pays) {
  return use_shm_collective(choice_of(ctx), ctx.transport.size(), pays);
}

bool reads_directly(const OpContext& ctx) { return reads_directly(choice_of(ctx), ctx.transport.size()); }

// The same, for the algorithms that cut a region into a piece per rank
// (alltoall, reducescatter): it must hold 64 bytes (a cache line) for each.
bool use_shm_pieces(const OpContext& ctx, bool pays) {
  return use_shm_collective(ctx, pays) && ctx.shm->region_bytes() >= 64 * size_t(ctx.transport.size());
}

// Whether half types (float16, bfloat16) travel as they are: through
// commlib's own algorithms over the transport (ring, tree), which reduce them
// a block at a time in float32 (base/reduce.h), so that they move half the bytes
// of float32 between hosts (the point of fp16 compression). The shared
// segment and MPI's own collective (which cannot reduce them) take them
// widened to float32; between hosts the hierarchical algorithm rounds each
// host's sums back to the half type (allreduce_across's travel).
bool half_travels(const OpContext& ctx) {
  return !shm_allowed(ctx) && ctx.algo != AllreduceAlgo::kMpi;
}

// The bytes per element of dtype in a window (half types widened or not).
size_t window_esize(const OpContext& ctx, int dtype) {
  return is_half_dtype(dtype) && !half_travels(ctx) ? sizeof(float) : dtype_size(dtype);
}

// Reduces the tensors [first, last) of one dtype as one message: through the
// shared segment's fusion region when it fits; else half types that do not
// travel as they are are widened into the float32 fusion buffer, a single
// tensor is reduced in its output, several are packed into the fusion buffer.
void reduce_window(OpContext& ctx, const Member* first, const Member* last, int dtype, int op,
                   double pre, double post) {
  if (op == COMMLIB_ADASUM) return reduce_window_adasum(ctx, first, last, dtype, pre, post);
  size_t total = 0;
  for (const Member* m = first; m != last; ++m) total += m->count;
  const size_t work_bytes = total * window_esize(ctx, dtype);
  if (shm_regions(ctx) && (last - first > 1 || is_half_dtype(dtype)) &&
      work_bytes <= ctx.shm->region_bytes()) {
    allreduce_members_in_shm(*ctx.shm, ctx.cross, first, last, total, dtype, op, pre, post);
    return;
  }
  if (is_half_dtype(dtype) && !half_travels(ctx)) {
    float* buf = reinterpret_cast<float*>(ctx.fusion.get(total * sizeof(float)));
    size_t off = 0;
    for (const Member* m = first; m != last; ++m) {
      half_to_float(dtype, m->input, buf + off, m->count, pre);
      off += m->count;
    }
    allreduce(ctx.transport, ctx.shm, ctx.cross, buf, total, COMMLIB_FLOAT32, op, ctx.algo, 1.0,
              nullptr, dtype);
    off = 0;
    for (const Member* m = first; m != last; ++m) {
      float_to_half(dtype, buf + off, m->output, m->count, post);
      off += m->count;
    }
    return;
  }
  const size_t esize = dtype_size(dtype);
  if (last - first == 1) {  // no packing: reduce in the output buffer
    const void* in = first->input;  // (read in place where the algorithm can)
    if (pre != 1.0 && in != first->output) {
      std::memcpy(first->output, in, total * esize);
      in = first->output;
    }
    scale_buffer(dtype, first->output, total, pre);
    allreduce(ctx.transport, ctx.shm, ctx.cross, first->output, total, dtype, op, ctx.algo, post,
              in);
    return;
  }
  char* buf = ctx.fusion.get(total * esize);
  size_t off = 0;
  for (const Member* m = first; m != last; ++m) {
    std::memcpy(buf + off, m->input, m->count * esize);
    off += m->count * esize;
  }
  scale_buffer(dtype, buf, total, pre);
  allreduce(ctx.transport, ctx.shm, ctx.cross, buf, total, dtype, op, ctx.algo, post);
  off = 0;
  for (const Member* m = first; m != last; ++m) {
    std::memcpy(m->output, buf + off, m->count * esize);
    off += m->count * esize;
  }
}

}  // namespace

void run_allreduce(OpContext& ctx, const std::vector<Entry*>& entries) {
  const RequestDesc& d0 = entries[0]->desc;
  int op;
  double post;
  effective_op(d0, ctx.transport.size(), &op, &post);
  const double pre = d0.prescale;

  std::vector<Member> all;
  all.reserve(entries.size());
  for (Entry* e : entries) {
    if (e->desc.group_size >= 0) {
      all.insert(all.end(), e->members.begin(), e->members.end());
    } else {
      all.push_back({e->desc.dtype, size_t(num_elements(e->desc.shape)), e->input, e->output});
    }
  }
  // One dtype at a time (a group may mix them), in windows of at most the
  // fusion threshold; every rank cuts the same windows.
  std::vector<bool> done(all.size(), false);
  std::vector<Member> same;
  for (size_t i = 0; i < all.size(); ++i) {
    if (done[i]) continue;
    const int dtype = all[i].dtype;
    same.clear();
    for (size_t j = i; j < all.size(); ++j) {
      if (!done[j] && all[j].dtype == dtype) {
        same.push_back(all[j]);
        done[j] = true;
      }
    }
    const size_t esize = window_esize(ctx, dtype);
    const size_t limit = shm_regions(ctx) ? std::min(ctx.fusion_threshold, ctx.shm->region_bytes())
                                          : ctx.fusion_threshold;
    size_t a = 0;
    while (a < same.size()) {
      size_t b = a + 1, bytes = same[a].count * esize;
      while (b < same.size() && bytes + same[b].count * esize <= limit) {
        bytes += same[b].count * esize;
        ++b;
      }
      reduce_window(ctx, same.data() + a, same.data() + b, dtype, op, pre, post);
      a = b;
    }
  }
}

GatherRoute allgather_route(const OpContext& ctx, size_t total) {
  if (total >= direct_allgather_bytes(ctx.transport.size()) && reads_directly(ctx)) return GatherRoute::direct;
  if (use_shm_collective(ctx, true) && shm_regions(ctx)) return GatherRoute::regions;
  return GatherRoute::mpi;
}

void allgather_blocks(OpContext& ctx, const void* in, void* out, const std::vector<size_t>& bytes) {
  size_t total = 0;
  for (size_t b : bytes) total += b;
  const GatherRoute route = allgather_route(ctx, total);
  if (route == GatherRoute::direct) {
    note_algorithm("shm-direct");
    allgather_direct(*ctx.shm, in, out, bytes);
  } else if (route == GatherRoute::regions) {
    note_algorithm("shm");
    allgather_shm(*ctx.shm, in, out, bytes);
  } else {
    note_algorithm(ctx.transport.in_one_call(total) ? "mpi" : "mpi-pieces");
    ctx.transport.allgatherv(in, out, bytes);
  }
}

char* allgather_output(Entry& e, int64_t total_rows) {
  if (e.output && e.output_rows != total_rows) {
    e.error = "allgather '" + e.desc.name + "': out holds " + std::to_string(e.output_rows) +
              " rows, and the ranks' rows add up to " + std::to_string(total_rows);
  }
  if (e.output && e.error.empty()) return static_cast<char*>(e.output);
  return e.handle->alloc_result(size_t(total_rows) * row_bytes(e.desc));
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
  const size_t total = size_t(total_rows) * rb;
  char* out = allgather_output(e, total_rows);
  // An input inside the output but not at this rank's own part is read before anything is written.
  const void* in = e.input;
  std::vector<char> copy;
  const char* own = out;
  for (int r = 0; r < ctx.transport.rank(); ++r) own += bytes[r];
  const char* src = static_cast<const char*>(e.input);
  if (src != own && src < out + total && src + bytes[ctx.transport.rank()] > out) {
    copy.assign(src, src + bytes[ctx.transport.rank()]);
    in = copy.data();
  }
  allgather_blocks(ctx, in, out, bytes);
  h.rows = total_rows;
  h.splits = rows;
}

namespace {

// Root's bytes at buf into buf on every rank: through the host's shared
// memory when the whole job is on it, else MPI.
void broadcast_bytes(OpContext& ctx, void* buf, size_t bytes, int root) {
  if (ctx.transport.size() == 1 || bytes == 0) return;
  if (use_shm_collective(ctx, true) && shm_regions(ctx)) {
    const int ranks = ctx.shm->size();
    if (bytes >= direct_broadcast_bytes(ranks) && reads_directly(ctx)) {
      note_algorithm(ranks == 2 ? "shm-split" : "shm-direct");
      (ranks == 2 ? broadcast_split : broadcast_direct)(*ctx.shm, buf, bytes, root);
    } else {
      note_algorithm("shm");
      broadcast_shm(*ctx.shm, buf, bytes, root);
    }
  } else {
    note_algorithm("mpi");
    ctx.transport.broadcast(buf, bytes, root);
  }
}

}  // namespace

void run_broadcast(OpContext& ctx, Entry& e) {
  const size_t bytes = size_t(num_elements(e.desc.shape)) * dtype_size(e.desc.dtype);
  if (ctx.transport.rank() == e.desc.root && e.input != e.output) {
    std::memcpy(e.output, e.input, bytes);
  }
  broadcast_bytes(ctx, e.output, bytes, e.desc.root);
}

void run_broadcast_fused(OpContext& ctx, const std::vector<Entry*>& entries) {
  const int root = entries[0]->desc.root;
  const bool is_root = ctx.transport.rank() == root;
  size_t total = 0;
  for (const Entry* e : entries) total += size_t(entry_bytes(*e));
  char* buf = ctx.fusion.get(total);
  size_t off = 0;
  if (is_root) {
    for (const Entry* e : entries) {
      const size_t n = size_t(entry_bytes(*e));
      if (n) std::memcpy(buf + off, e->input, n);
      off += n;
    }
  }
  broadcast_bytes(ctx, buf, total, root);
  off = 0;
  for (Entry* e : entries) {
    const size_t n = size_t(entry_bytes(*e));
    if (n && !is_root) {
      std::memcpy(e->output, buf + off, n);
    } else if (n && e->input != e->output) {
      std::memcpy(e->output, e->input, n);
    }
    off += n;
  }
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
  // What every rank can tell from the matrix alone, so that all choose alike.
  size_t largest = 0;
  bool uniform = true;
  std::vector<size_t> sent(size, 0), received(size, 0);
  for (int s = 0; s < size; ++s) {
    for (int d = 0; d < size; ++d) {
      const int64_t rows = matrix[size_t(s) * size + d];
      if (s != d) largest = std::max(largest, size_t(rows) * rb);
      uniform = uniform && rows == matrix[0];
      sent[s] += size_t(rows) * rb;
      received[d] += size_t(rows) * rb;
    }
  }
  const size_t widest = std::max(*std::max_element(sent.begin(), sent.end()),
                                 *std::max_element(received.begin(), received.end()));
  char* out = h.alloc_result(size_t(total_rows) * rb);
  const size_t spread = largest * size_t(size);  // (what each rank can tell from the matrix)
  const bool can_read = reads_directly(ctx);
  if (!(can_read && spread >= direct_alltoall_bytes(size)) && use_shm_pieces(ctx, spread <= kShmAlltoallMaxBytes)) {
    note_algorithm("shm");
    alltoall_shm(*ctx.shm, e.input, send, out, recv, largest);
  } else if (can_read) {
    note_algorithm("shm-direct");
    std::vector<size_t> bytes(matrix.size());
    for (size_t i = 0; i < matrix.size(); ++i) bytes[i] = size_t(matrix[i]) * rb;
    alltoall_direct(*ctx.shm, e.input, out, bytes);
  } else {
    note_algorithm(ctx.transport.in_one_call(widest) ? "mpi" : "mpi-pieces");
    if (uniform) {
      ctx.transport.alltoall(e.input, send[0], out);
    } else {
      ctx.transport.alltoallv(e.input, send, out, recv, widest);
    }
  }
  h.rows = total_rows;
}

namespace {

void reduce_scatter(OpContext& ctx, const PieceInput& in, void* out, const std::vector<size_t>& counts,
                    int dtype, int op) {
  // (the shared-memory path needs room for one element per rank and block)
  if (use_shm_pieces(ctx, true)) {
    note_algorithm("shm");
    reducescatter_shm(*ctx.shm, in, out, counts, dtype, op);
    return;
  }
  note_algorithm(ctx.transport.in_one_call(in.elements() * in.esize()) ? "mpi" : "mpi-pieces");
  const void* src = in.contiguous();
  if (!src) {  // pieces: MPI wants one buffer
    char* buf = ctx.fusion.get(in.elements() * in.esize());
    in.copy(0, in.elements(), buf);
    src = buf;
  }
  ctx.transport.reduce_scatter(src, out, counts, dtype, op);
}

}  // namespace

void reducescatter_input(OpContext& ctx, const PieceInput& in, const std::vector<size_t>& counts,
                         const RequestDesc& d, void* out, std::vector<char>& scratch) {
  const int size = ctx.transport.size();
  const size_t mine = counts[size_t(ctx.transport.rank())];
  const size_t n = in.elements();
  const size_t esize = dtype_size(d.dtype);
  int op;
  double post;
  effective_op(d, size, &op, &post);
  if (is_half_dtype(d.dtype) || d.prescale != 1.0) {  // one contiguous copy, widened or scaled
    const void* src = in.contiguous();
    if (!src) {
      scratch.resize(n * esize);
      in.copy(0, n, scratch.data());
      src = scratch.data();
    }
    if (is_half_dtype(d.dtype)) {
      float* wide = reinterpret_cast<float*>(ctx.fusion.get(n * sizeof(float)));
      float* own = reinterpret_cast<float*>(ctx.scratch.get(mine * sizeof(float) + 1));
      half_to_float(d.dtype, src, wide, n, d.prescale);
      reduce_scatter(ctx, PieceInput(wide, n, sizeof(float)), own, counts, COMMLIB_FLOAT32, op);
      float_to_half(d.dtype, own, out, mine, post);
      return;
    }
    char* buf = ctx.fusion.get(n * esize);
    std::memcpy(buf, src, n * esize);
    scale_buffer(d.dtype, buf, n, d.prescale);
    reduce_scatter(ctx, PieceInput(buf, n, esize), out, counts, d.dtype, op);
  } else {
    reduce_scatter(ctx, in, out, counts, d.dtype, op);
  }
  scale_buffer(d.dtype, out, mine, post);
}

std::vector<size_t> reducescatter_counts(const RequestDesc& d, int size) {
  const size_t row_elems = row_bytes(d) / dtype_size(d.dtype);
  std::vector<size_t> counts(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) counts[size_t(r)] = size_t(reducescatter_rows(d, size, r)) * row_elems;
  return counts;
}

PieceInput request_input(const Entry& e) {
  const size_t esize = dtype_size(e.desc.dtype);
  if (!e.pieces.empty()) return PieceInput(e.pieces, esize);
  return PieceInput(e.input, size_t(num_elements(e.desc.shape)), esize);
}

void run_reducescatter(OpContext& ctx, Entry& e) {
  reducescatter_input(ctx, request_input(e), reducescatter_counts(e.desc, ctx.transport.size()), e.desc,
                      e.output, e.scratch);
}

}  // namespace commlib
