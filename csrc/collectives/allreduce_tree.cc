// Recursive-doubling all-reduce: latency-optimal for small messages
// (log2 p exchange rounds for the largest power of two p <= n, plus a fold-in
// and a fold-out step when n is not a power of two), at the price of sending
// the whole buffer in every round. The schedule, the exchanges and the
// completion handshake are pairwise_tree's (pairwise_tree.h).
//
// Bitwise identical results. Floating-point reduction is not associative,
// and min/max are not even commutative bit for bit (signed zeros, NaN
// payloads). pairwise_tree combines as (lower block) (op) (higher block)
// on both partners: reduce_into computes acc = acc (op) in, so the lower
// value is the accumulator and the result stays in its buffer (for the
// higher partner that is the received one: the two buffers swap roles
// instead of paying for a copy each round).
#include "base/common.h"
#include "base/reduce.h"
#include "collectives/allreduce.h"
#include "collectives/pairwise_tree.h"

namespace commlib {

void allreduce_tree(Transport& t, void* buf, size_t count, int dtype, int op) {
  if (count == 0) return;
  pairwise_tree(t, buf, count * dtype_size(dtype), [&](char* lower, char* higher) {
    reduce_into(dtype, op, lower, higher, count);  // lower (op) higher
    return lower;
  });
}

}  // namespace commlib
