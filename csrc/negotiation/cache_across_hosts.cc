// The response-cache protocol across hosts (see cache_protocol.h): rank 0
// completes cached requests and orders them.
#include "negotiation/cache_protocol.h"

#include <utility>

#include "negotiation/fusion.h"

namespace commlib {

// This rank was the last of its host (or counts alone) at these bits.
void CacheProtocol::send_arrivals(const std::vector<Entry*>& entries) {
  std::vector<uint64_t> words;
  for (const Entry* e : entries) words.push_back(LogEntry::word(e->cache_bit, e->cache_gen));
  if (setup_.rank == 0) {
    on_arrived(words);
    return;
  }
  Writer w;
  w.put<int32_t>(kMsgArrived);
  w.put_vec(std::vector<int64_t>(words.begin(), words.end()));
  host_.send_to_coordinator(w.take());
}

// A full request reaches rank 0. If its key holds a bit, the request changed
// on its rank (or its bit ended there): every rank must stop waiting at it.
void CacheProtocol::on_full_request(const RequestDesc& desc) {
  if (hier_ && cache_bits_ && desc.process_set == 0) {
    uint32_t gen = 0;
    const int bit = cache_bits_->bit_of(request_key(desc), &gen);
    if (bit >= 0) on_expire({LogEntry::word(bit, gen)});
  }
}

void CacheProtocol::on_expire(const std::vector<uint64_t>& words) {
  if (!cache_bits_) return;
  Response notice;
  notice.kind = Response::kInvalidate;
  for (uint64_t w : words)
    if (cache_bits_->end(LogEntry::bit_of(w), LogEntry::gen_of(w))) notice.rows.push_back(int64_t(w));
  if (!notice.rows.empty()) cache_notices_.push_back(std::move(notice));
}

void CacheProtocol::on_arrived(const std::vector<uint64_t>& words) {
  if (!cache_bits_) return;
  for (uint64_t w : words)
    if (cache_bits_->arrive(LogEntry::bit_of(w), LogEntry::gen_of(w))) completed_words_.push_back(w);
}

// No cached request completes once a rank has left; the ranks still
// waiting at a bit fail (execute_notice).
void CacheProtocol::on_rank_left(int rank) {
  if (!hier_ || !cache_bits_) return;
  cache_bits_.reset();
  completed_words_.clear();
  Response off;
  off.kind = Response::kCacheOff;
  off.rows = {rank};
  cache_notices_.push_back(std::move(off));
}

void CacheProtocol::prepare_responses(std::vector<Response>& resps, int64_t fusion_threshold) {
  if (hier_) add_cached_responses(resps, fusion_threshold);
  if (!resps.empty() && cache_bits_ && !cache_off_ && !paused_)
    for (Response& r : resps) cache_bits_->assign(r);
}

// Rank 0's responses of this cycle get the cache's: its notices first, then
// the cached requests now complete everywhere, fused as the coordinator fuses.
void CacheProtocol::add_cached_responses(std::vector<Response>& resps, int64_t fusion_threshold) {
  std::vector<Response> out = std::move(cache_notices_);
  cache_notices_.clear();
  std::vector<const CachedResponse*> done;
  for (uint64_t w : completed_words_) {
    const int bit = LogEntry::bit_of(w);
    const uint32_t gen = LogEntry::gen_of(w);
    if (!cache_bits_ || !cache_bits_->current(bit, gen)) continue;  // invalidated meanwhile
    // Rank 0 arrived too, so its own cache holds the assignment.
    const CachedResponse* c = cache_->get(bit, gen);
    if (!c) throw Error(COMMLIB_ERR_INTERNAL, "cache bit " + std::to_string(bit) + " complete but not cached on rank 0");
    done.push_back(c);
  }
  completed_words_.clear();
  std::vector<const RequestDesc*> descs;
  std::vector<bool> may_fuse;
  std::vector<int64_t> bytes;
  for (const CachedResponse* c : done) {
    descs.push_back(&c->desc);
    may_fuse.push_back(fusable(c->desc));
    bytes.push_back(fusion_bytes(c->desc, c->rows));
  }
  for (const auto& group : plan_fusion(descs, may_fuse, fusion_threshold, &bytes)) {
    Response resp;
    resp.op_type = done[group[0]]->op_type;
    resp.rows = done[group[0]]->rows;
    for (size_t k = 1; k < group.size() && resp.op_type == COMMLIB_OP_ALLGATHER; ++k)
      resp.rows.insert(resp.rows.end(), done[group[k]]->rows.begin(), done[group[k]]->rows.end());
    for (size_t i : group) resp.names.push_back(done[i]->key);
    out.push_back(std::move(resp));
  }
  if (out.empty()) return;
  for (Response& r : resps) out.push_back(std::move(r));
  resps = std::move(out);
}

void CacheProtocol::execute_notice(const Response& resp) {
  if (resp.kind == Response::kCacheOff) {
    stop_cache(int(resp.rows.at(0)));
    return;
  }
  for (int64_t w : resp.rows) {
    const int bit = LogEntry::bit_of(uint64_t(w));
    const uint32_t gen = LogEntry::gen_of(uint64_t(w));
    if (cache_->remove(bit, gen)) retire_live(bit, gen);
  }
}

}  // namespace commlib
