#include "negotiation/response_cache.h"

#include "negotiation/order_log.h"

namespace commlib {

bool operator==(const RequestDesc& a, const RequestDesc& b) {
  return a.name == b.name && a.op_type == b.op_type && a.dtype == b.dtype && a.reduce_op == b.reduce_op &&
         a.root == b.root && a.prescale == b.prescale && a.postscale == b.postscale && a.shape == b.shape &&
         a.splits == b.splits && a.group_size == b.group_size && a.members == b.members &&
         a.process_set == b.process_set && a.device_type == b.device_type;
}

ResponseCache::Lookup ResponseCache::find(const RequestDesc& d, int* bit, uint32_t* gen) const {
  std::string buf;
  auto it = by_key_.find(key_of(d, buf));
  if (it == by_key_.end()) return kMiss;
  const CachedResponse& c = slots_[size_t(it->second)];
  *bit = it->second;
  *gen = c.gen;
  return c.desc == d ? kHit : kChanged;
}

bool ResponseCache::install(int bit, const std::string& key, const RequestDesc& d, int op_type,
                            const std::vector<int64_t>& rows, uint32_t* evicted_gen) {
  CachedResponse& c = slots_.at(size_t(bit));
  const bool evicted = c.valid;
  if (evicted) {
    *evicted_gen = c.gen;
    by_key_.erase(c.key);
  }
  auto old = by_key_.find(key);  // (cannot happen: a cached key negotiates only after its bit ended)
  if (old != by_key_.end()) slots_[size_t(old->second)].valid = false;
  c.valid = true;
  ++c.gen;
  c.key = key;
  c.desc = d;
  c.op_type = op_type;
  c.rows = rows;
  by_key_[key] = bit;
  return evicted;
}

bool ResponseCache::remove(int bit, uint32_t gen) {
  CachedResponse& c = slots_.at(size_t(bit));
  if (!c.valid || c.gen != gen) return false;
  c.valid = false;
  by_key_.erase(c.key);
  return true;
}

const CachedResponse* ResponseCache::get(int bit, uint32_t gen) const {
  if (bit < 0 || size_t(bit) >= slots_.size()) return nullptr;
  const CachedResponse& c = slots_[size_t(bit)];
  return c.valid && c.gen == gen ? &c : nullptr;
}

CacheBits::CacheBits(int capacity, int units)
    : bits_(size_t(capacity)), max_seen_(size_t(capacity) * 8 + 1024), units_(units) {
  for (int b = 0; b < capacity; ++b) free_.insert(b);
}

void CacheBits::assign(Response& resp) {
  resp.bits.assign(resp.names.size(), -1);
  if (resp.kind != Response::kExecute || resp.process_set != 0 ||
      resp.op_type == COMMLIB_OP_ADD_PROCESS_SET || resp.op_type == COMMLIB_OP_REMOVE_PROCESS_SET ||
      resp.op_type == COMMLIB_OP_JOIN) {
    return;
  }
  for (size_t i = 0; i < resp.names.size() && !free_.empty(); ++i) {
    if (seen_.insert(resp.names[i]).second) {  // first sighting
      if (seen_.size() > max_seen_) seen_.clear();  // unique names must not grow it forever
      continue;
    }
    if (by_key_.count(resp.names[i])) continue;  // (its old bit has yet to be released)
    const int bit = *free_.begin();
    free_.erase(free_.begin());
    Assigned& a = bits_[size_t(bit)];
    a.key = resp.names[i];
    ++a.gen;  // as every rank's install will
    a.arrivals = 0;
    by_key_[a.key] = bit;
    resp.bits[i] = bit;
  }
}

void CacheBits::release(int bit) {
  Assigned& a = bits_.at(size_t(bit));
  if (a.key.empty()) return;
  by_key_.erase(a.key);
  a.key.clear();
  free_.insert(bit);
}

int CacheBits::bit_of(const std::string& key, uint32_t* gen) const {
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return -1;
  *gen = bits_[size_t(it->second)].gen;
  return it->second;
}

bool CacheBits::current(int bit, uint32_t gen) const {
  return bit >= 0 && size_t(bit) < bits_.size() && !bits_[size_t(bit)].key.empty() && bits_[size_t(bit)].gen == gen;
}

std::vector<uint64_t> CacheBits::assigned() const {
  std::vector<uint64_t> out;
  for (size_t b = 0; b < bits_.size(); ++b)
    if (!bits_[b].key.empty()) out.push_back(LogEntry::word(int(b), bits_[b].gen));
  return out;
}

bool CacheBits::end(int bit, uint32_t gen) {
  if (!current(bit, gen)) return false;
  release(bit);
  return true;
}

bool CacheBits::arrive(int bit, uint32_t gen) {
  if (!current(bit, gen)) return false;
  Assigned& a = bits_[size_t(bit)];
  if (++a.arrivals < units_) return false;
  a.arrivals = 0;
  return true;
}

}  // namespace commlib
