#include "collectives/allreduce_shm_fused.h"

#include <algorithm>
#include <cstring>

#include <vector>

#include "base/common.h"
#include "base/half.h"
#include "base/reduce.h"
#include "base/timeline.h"
#include "collectives/allreduce_across.h"

namespace commlib {

void ShmFusedAllreduce::cut(size_t count, size_t esize, size_t* lo, size_t* hi) {
  const int P = block_.size(), me = block_.rank();
  const size_t align = std::max<size_t>(1, 64 / esize);
  const size_t piece = ((count + P - 1) / P + align - 1) / align * align;
  piece_bytes_ = piece * esize;
  *lo = std::min(count, me * piece);
  *hi = std::min(count, (me + 1) * piece);
}

void ShmFusedAllreduce::reduce(size_t count, int dtype, int op, double postscale,
                               Transport* cross, int travel) {
  const int P = block_.size(), me = block_.rank();
  const size_t esize = dtype_size(dtype);
  size_t first, last;
  cut(count, esize, &first, &last);
  block_.post();
  block_.wait_all_posted();
  char* mine = block_.mine() + first * esize;
  for (int r = 0; r < P; ++r) {
    if (r != me) reduce_into(dtype, op, mine, block_.region(r) + first * esize, last - first);
  }
  if (cross) {
    allreduce_across(*cross, mine, last - first, dtype, op, postscale, travel);
  } else {
    scale_buffer(dtype, mine, last - first, postscale);
  }
  block_.mark_reduced();
  block_.wait_all_reduced();
}

void ShmFusedAllreduce::copy_out(size_t byte_offset, void* dst, size_t bytes) {
  char* out = static_cast<char*>(dst);
  while (bytes > 0) {
    const int owner = int(byte_offset / piece_bytes_);
    const size_t in_piece = std::min(bytes, (owner + 1) * piece_bytes_ - byte_offset);
    std::memcpy(out, block_.region(owner) + byte_offset, in_piece);
    out += in_piece;
    byte_offset += in_piece;
    bytes -= in_piece;
  }
}

void ShmFusedAllreduce::reduce_members(const Member* first, const Member* last, size_t count, int dtype,
                                       int op, double postscale) {
  const int P = block_.size(), me = block_.rank();
  const size_t esize = dtype_size(dtype);
  size_t lo, hi;
  cut(count, esize, &lo, &hi);
  char* mine = block_.mine();
  // Each member's elements are [a, b) of the whole; the part in [lo, hi)
  // is this rank's own piece.
  size_t a = 0;
  for (const Member* m = first; m != last; a += m->count, ++m) {
    const size_t b = a + m->count;
    const char* in = static_cast<const char*>(m->input);
    const size_t own_lo = std::clamp(lo, a, b), own_hi = std::clamp(hi, a, b);
    if (own_lo > a) std::memcpy(mine + a * esize, in, (own_lo - a) * esize);
    if (b > own_hi) std::memcpy(mine + own_hi * esize, in + (own_hi - a) * esize, (b - own_hi) * esize);
    if (own_hi > own_lo && m->output != m->input) {
      std::memcpy(static_cast<char*>(m->output) + (own_lo - a) * esize, in + (own_lo - a) * esize,
                  (own_hi - own_lo) * esize);
    }
  }
  block_.post();
  block_.wait_all_posted();
  // The own piece: each output accumulates the other ranks' values in rank
  // order (as reduce() accumulates them into the region), the last pass
  // scaling, and the result is copied into the region for the others. (A
  // copy, not the reduction's second store: when the ranks' cores share no
  // cache, lines another core has read cost less to overwrite through
  // memcpy: the other way, 128 x 4 KiB at 2 ranks took longer than packing all.)
  const int last_peer = me == P - 1 ? P - 2 : P - 1;
  a = 0;
  for (const Member* m = first; m != last; a += m->count, ++m) {
    const size_t b = a + m->count;
    const size_t own_lo = std::clamp(lo, a, b), own_hi = std::clamp(hi, a, b);
    if (own_hi == own_lo) continue;
    char* acc = static_cast<char*>(m->output) + (own_lo - a) * esize;
    for (int r = 0; r < P; ++r) {
      if (r == me) continue;
      const char* theirs = block_.region(r) + own_lo * esize;
      if (r == last_peer) {
        reduce_into_and_copy_scaled(dtype, op, acc, theirs, nullptr, own_hi - own_lo, postscale);
      } else {
        reduce_into(dtype, op, acc, theirs, own_hi - own_lo);
      }
    }
    std::memcpy(mine + own_lo * esize, acc, (own_hi - own_lo) * esize);
  }
  block_.mark_reduced();
  block_.wait_all_reduced();
  a = 0;
  for (const Member* m = first; m != last; a += m->count, ++m) {
    const size_t b = a + m->count;
    char* out = static_cast<char*>(m->output);
    const size_t own_lo = std::clamp(lo, a, b), own_hi = std::clamp(hi, a, b);
    if (own_lo > a) copy_out(a * esize, out, (own_lo - a) * esize);
    if (b > own_hi) copy_out(own_hi * esize, out + (own_hi - a) * esize, (b - own_hi) * esize);
  }
  block_.finish();
}

void allreduce_members_in_shm(ShmSegment& shm, Transport* cross, const Member* first, const Member* last,
                              size_t total, int dtype, int op, double pre, double post) {
  note_algorithm(cross ? "shm-fused-hierarchical" : "shm-fused");
  ShmFusedAllreduce f(shm);
  const bool half = is_half_dtype(dtype);
  if (!half && pre == 1.0 && !cross && shm.size() > 1) {
    f.reduce_members(first, last, total, dtype, op, post);
    return;
  }
  // Packs the window straight into this rank's region and reads the results
  // from their owners' regions.
  const int work = half ? COMMLIB_FLOAT32 : dtype;
  const size_t esize = dtype_size(work);
  char* buf = f.buffer();
  size_t off = 0;
  for (const Member* m = first; m != last; ++m) {
    if (half) {
      half_to_float(dtype, m->input, reinterpret_cast<float*>(buf + off), m->count, pre);
    } else {
      std::memcpy(buf + off, m->input, m->count * esize);
    }
    off += m->count * esize;
  }
  if (!half) scale_buffer(dtype, buf, total, pre);
  f.reduce(total, work, op, half ? 1.0 : post, cross, half ? dtype : -1);
  off = 0;
  std::vector<float> tmp;
  for (const Member* m = first; m != last; ++m) {
    if (half) {
      tmp.resize(m->count);
      f.copy_out(off, tmp.data(), m->count * esize);
      float_to_half(dtype, tmp.data(), m->output, m->count, post);
    } else {
      f.copy_out(off, m->output, m->count * esize);
    }
    off += m->count * esize;
  }
  f.finish();
}

}  // namespace commlib
