// Shared-memory reduce-scatter, in blocks that take one chunk of every rank's
// slice: for block k each rank copies into its region the chunks the OTHER
// ranks own (piece r of the region: rank r's chunk k, its own piece left
// unused) and posts; then every rank reduces its own chunk k at once, from
// the posted pieces and its own input, in rank order, straight into its
// output. So all ranks reduce in parallel in every block (a block over a
// contiguous window would leave all but the window's owner idle), and each
// rank copies only the (P-1)/P of its input that others reduce, as the
// shared-memory allreduce does. Each element is reduced by one rank only.
// The input is read in place from its pieces (pieces.h).
#include <algorithm>
#include <cstring>

#include "backends/shm/shm_block.h"
#include "base/common.h"
#include "base/pieces.h"
#include "base/reduce.h"
#include "collectives/shm_collectives.h"

namespace commlib {

namespace {

// acc = acc op 0, for n elements (a piece of zeros: padding).
void reduce_with_zeros(int dtype, int op, char* acc, size_t n, size_t esize) {
  if (op == COMMLIB_SUM || op == COMMLIB_AVERAGE) return;
  static const char zeros[4096] = {};
  const size_t step = sizeof(zeros) / esize;
  for (size_t i = 0; i < n; i += step) reduce_into(dtype, op, acc + i * esize, zeros, std::min(step, n - i));
}

}  // namespace

void reducescatter_shm(ShmSegment& shm, const PieceInput& in, void* out, const std::vector<size_t>& counts,
                       int dtype, int op) {
  const int P = shm.size(), me = shm.rank();
  const size_t esize = dtype_size(dtype);
  std::vector<size_t> displ(P, 0);
  size_t largest = 0;
  for (int r = 0; r < P; ++r) {
    if (r > 0) displ[r] = displ[r - 1] + counts[r - 1];
    largest = std::max(largest, counts[r]);
  }
  // Elements per chunk: P of them fit a window (kShmWindowBytes, at most the
  // region); 64-byte multiples when it allows, so pieces stay cache-line
  // aligned.
  size_t chunk = std::max<size_t>(1, std::min(shm.region_bytes(), kShmWindowBytes) / esize / size_t(P));
  const size_t align = std::max<size_t>(1, 64 / esize);
  if (chunk >= align) chunk = chunk / align * align;
  char* dst = static_cast<char*>(out);
  for (size_t a = 0; a < largest; a += chunk) {
    ShmBlock blk(shm);
    auto part = [&](int r) { return a < counts[r] ? std::min(chunk, counts[r] - a) : size_t(0); };
    auto piece = [&](char* region, int r) { return region + size_t(r) * chunk * esize; };
    for (int r = 0; r < P; ++r) {
      if (r != me) in.copy(displ[r] + a, part(r), piece(blk.mine(), r));
    }
    blk.post();
    const size_t n = part(me);
    char* o = dst + a * esize;
    for (int r = 0; r < P; ++r) {
      if (r == me) {  // this rank's own contribution, from its input
        if (r == 0) {
          in.copy(displ[me] + a, n, o);
        } else {
          in.for_each(displ[me] + a, n, [&](const void* src, size_t k, size_t at) {
            if (src) {
              reduce_into(dtype, op, o + at * esize, src, k);
            } else {
              reduce_with_zeros(dtype, op, o + at * esize, k, esize);
            }
          });
        }
        continue;
      }
      blk.wait_posted(r);
      if (n == 0) continue;
      const char* from = piece(blk.region(r), me);
      if (r == 0) {
        std::memcpy(o, from, n * esize);
      } else {
        reduce_into(dtype, op, o, from, n);
      }
    }
    blk.finish();
  }
}

}  // namespace commlib
