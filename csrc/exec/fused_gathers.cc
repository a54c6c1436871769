// Allgathers and reducescatters fused into one collective each (a fused
// response, negotiation/fusion.h). Rank r's block is its part of every
// member in the members' order, so one allgatherv (or reduce-scatter) moves
// them all; each member's result is then cut out of the blocks.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "base/common.h"
#include "base/pieces.h"
#include "base/timeline.h"
#include "collectives/shm_collectives.h"
#include "exec/operations.h"
#include "negotiation/fusion.h"

namespace commlib {
namespace {

// Whether no member's input overlaps any member's output but at its own
// rank's place there (allgather(out[lo:hi], out=out)), and no two outputs
// overlap: then each input can be read while outputs are written
// (allgather_shm_members). The outputs sorted once, each input looks up the
// one output it could meet (k log k for k members, not k squared).
bool inputs_apart(const std::vector<GatherMember>& members, size_t me) {
  struct Range {
    uintptr_t lo, hi, own;  // the output, and this rank's place in it
    size_t member;
  };
  std::vector<Range> outs;
  outs.reserve(members.size());
  for (size_t m = 0; m < members.size(); ++m) {
    size_t total = 0, own = 0;
    for (size_t r = 0; r < members[m].bytes.size(); ++r) {
      if (r == me) own = total;
      total += members[m].bytes[r];
    }
    const uintptr_t lo = reinterpret_cast<uintptr_t>(members[m].out);
    if (total) outs.push_back({lo, lo + total, lo + own, m});
  }
  std::sort(outs.begin(), outs.end(), [](const Range& x, const Range& y) { return x.lo < y.lo; });
  for (size_t i = 1; i < outs.size(); ++i) {
    if (outs[i].lo < outs[i - 1].hi) return false;
  }
  for (size_t m = 0; m < members.size(); ++m) {
    const size_t n = members[m].bytes[me];
    if (!n) continue;
    const uintptr_t in = reinterpret_cast<uintptr_t>(members[m].in);
    // (the first output ending after the input starts: outputs are disjoint, so
    // an input at its own place lies inside that one and meets no other)
    auto it = std::upper_bound(outs.begin(), outs.end(), in, [](uintptr_t v, const Range& x) { return v < x.hi; });
    if (it == outs.end() || it->lo >= in + n) continue;
    if (it->member != m || in != it->own) return false;
  }
  return true;
}

}  // namespace

void run_allgather_fused(OpContext& ctx, const std::vector<Entry*>& entries, const std::vector<int64_t>& rows) {
  const size_t size = size_t(ctx.transport.size()), me = size_t(ctx.transport.rank());
  const size_t k = entries.size();
  if (rows.size() != k * size) {
    throw Error(COMMLIB_ERR_INTERNAL, "fused allgather: " + std::to_string(rows.size()) + " rows for " +
                                          std::to_string(k) + " members of " + std::to_string(size) + " ranks");
  }
  auto part = [&](size_t m, size_t r) { return size_t(rows[m * size + r]) * row_bytes(entries[m]->desc); };
  std::vector<size_t> block(size, 0);
  for (size_t r = 0; r < size; ++r)
    for (size_t m = 0; m < k; ++m) block[r] += part(m, r);
  size_t total = 0, own = 0;
  for (size_t r = 0; r < size; ++r) {
    if (r == me) own = total;
    total += block[r];
  }
  std::vector<GatherMember> members(k);
  for (size_t m = 0; m < k; ++m) {
    Entry& e = *entries[m];
    int64_t member_total = 0;
    members[m].bytes.resize(size);
    for (size_t r = 0; r < size; ++r) {
      member_total += rows[m * size + r];
      members[m].bytes[r] = part(m, r);
    }
    members[m].in = e.input;
    members[m].out = allgather_output(e, member_total);
    e.handle->rows = member_total;
    e.handle->splits = member_rows(rows, k, m);
  }
  if (allgather_route(ctx, total) == GatherRoute::regions && inputs_apart(members, me)) {
    note_algorithm("shm");
    allgather_shm_members(*ctx.shm, members);
    return;
  }
  char* buf = ctx.fusion.get(total + 1);
  for (size_t m = 0, at = own; m < k; at += part(m, me), ++m) {
    if (part(m, me)) std::memcpy(buf + at, entries[m]->input, part(m, me));
  }
  allgather_blocks(ctx, buf + own, buf, block);
  // Each member's result: its part of every rank's block, rank after rank.
  std::vector<size_t> at(size);
  for (size_t r = 0, off = 0; r < size; off += block[r], ++r) at[r] = off;
  for (size_t m = 0; m < k; ++m) {
    char* out = static_cast<char*>(members[m].out);
    for (size_t r = 0; r < size; ++r) {
      if (part(m, r)) std::memcpy(out, buf + at[r], part(m, r));
      out += part(m, r);
      at[r] += part(m, r);
    }
  }
}

void run_reducescatter_fused(OpContext& ctx, const std::vector<Entry*>& entries) {
  const int size = ctx.transport.size(), me = ctx.transport.rank();
  const RequestDesc& d0 = entries[0]->desc;
  const size_t esize = dtype_size(d0.dtype);
  // counts[m][r]: member m's elements for rank r; the fused input is, rank
  // after rank, each member's part for that rank, read in place.
  std::vector<std::vector<size_t>> counts;
  std::vector<PieceInput> inputs;
  for (const Entry* e : entries) {
    counts.push_back(reducescatter_counts(e->desc, size));
    inputs.push_back(request_input(*e));
  }
  std::vector<size_t> fused(size_t(size), 0);
  std::vector<Piece> pieces;
  for (int r = 0; r < size; ++r) {
    for (size_t m = 0; m < entries.size(); ++m) {
      size_t first = 0;
      for (int q = 0; q < r; ++q) first += counts[m][size_t(q)];
      inputs[m].for_each(first, counts[m][size_t(r)], [&](const void* src, size_t count, size_t) {
        pieces.push_back({src, count});
      });
      fused[size_t(r)] += counts[m][size_t(r)];
    }
  }
  static thread_local std::vector<char> own, scratch;  // (kept: no page faults per call)
  if (own.size() < fused[size_t(me)] * esize + 1) own.resize(fused[size_t(me)] * esize + 1);
  reducescatter_input(ctx, PieceInput(pieces, esize), fused, d0, own.data(), scratch);
  size_t at = 0;
  for (size_t m = 0; m < entries.size(); ++m) {
    const size_t bytes = counts[m][size_t(me)] * esize;
    if (bytes) std::memcpy(entries[m]->output, own.data() + at, bytes);
    at += bytes;
  }
}

}  // namespace commlib
