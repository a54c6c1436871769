// Executing one negotiated response on this rank: packing tensors into the
// fusion buffer, applying scale factors, widening half types to float32, and
// calling the collective algorithm over the transport.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backends/transport.h"
#include "base/entry.h"
#include "base/fusion_buffer.h"
#include "base/message.h"
#include "exec/algorithm.h"

namespace commlib {

struct OpContext {
  Transport& transport;
  FusionBuffer& fusion;
  FusionBuffer& scratch;  // second buffer (reducescatter of half types)
  AllreduceAlgo algo;
  size_t fusion_threshold;  // bytes per fused reduction
  ShmSegment* shm;        // this host's ranks; null if alone or hosts differ in size
  Transport* cross;       // same local rank across hosts; null on one host
  int shm_collectives;    // kShmAuto / kShmAlways / kShmNever (COMMLIB_SHM_COLLECTIVES)
};

// Rows of dim 0 that reducescatter leaves on rank r (first ranks get extras).
int64_t reducescatter_rows(int64_t dim0, int size, int r);
// The same for a request: its explicit splits (rows per rank) when it has them.
int64_t reducescatter_rows(const RequestDesc& d, int size, int r);

// Bytes of one dim-0 row (product of the other dimensions times dtype size).
size_t row_bytes(const RequestDesc& d);

// How an allgather of total bytes (every rank's blocks) moves: each rank
// reading the others' buffers (direct), through the shared segment's regions,
// or MPI.
enum class GatherRoute { direct, regions, mpi };
GatherRoute allgather_route(const OpContext& ctx, size_t total);

// Every rank's block (bytes[r] from rank r) into out, rank after rank; in
// holds this rank's block (it may be its place in out).
void allgather_blocks(OpContext& ctx, const void* in, void* out, const std::vector<size_t>& bytes);

// Where an allgather's result of total_rows rows goes: the caller's out when
// it holds exactly that many, else a buffer the core allocates (a wrong out
// then fails this request alone, after it took part: Entry::error).
char* allgather_output(Entry& e, int64_t total_rows);

// A reducescatter's elements for each rank of a set of size.
std::vector<size_t> reducescatter_counts(const RequestDesc& d, int size);
// A request's input as a reduce-scatter reads it: its pieces, or its one buffer.
PieceInput request_input(const Entry& e);

// The reduce-scatter of `in` (counts[r] elements for rank r, rank after
// rank) into out (this rank's counts), with d's op, dtype and scale factors;
// half types are reduced in float32. scratch: room for a packed copy.
void reducescatter_input(OpContext& ctx, const PieceInput& in, const std::vector<size_t>& counts,
                         const RequestDesc& d, void* out, std::vector<char>& scratch);

void run_allreduce(OpContext& ctx, const std::vector<Entry*>& entries);

// The Adasum allreduce of the tensors [first, last), all of dtype, as one
// fused window in which each tensor keeps its own coefficients; prescale
// before, postscale after (exec/adasum_window.cc).
void reduce_window_adasum(OpContext& ctx, const Member* first, const Member* last, int dtype,
                          double pre, double post);
void run_allgather(OpContext& ctx, Entry& e, const std::vector<int64_t>& rows);
void run_broadcast(OpContext& ctx, Entry& e);
// Broadcasts of one root fused (negotiation/fusion.h: small ones on the host):
// the root packs its inputs into the fusion buffer, one broadcast moves it,
// every rank unpacks its outputs.
void run_broadcast_fused(OpContext& ctx, const std::vector<Entry*>& entries);
void run_alltoall(OpContext& ctx, Entry& e, const std::vector<int64_t>& matrix);
void run_reducescatter(OpContext& ctx, Entry& e);

// Several allgathers (or reducescatters) of one fused response as one
// collective: every rank's block holds its part of each member in turn
// (fused_gathers.cc). rows: every member's rows (negotiation/fusion.h).
void run_allgather_fused(OpContext& ctx, const std::vector<Entry*>& entries, const std::vector<int64_t>& rows);
void run_reducescatter_fused(OpContext& ctx, const std::vector<Entry*>& entries);

}  // namespace commlib
