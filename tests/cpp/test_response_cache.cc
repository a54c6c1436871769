// The response cache (csrc/negotiation/response_cache.h): each rank's ResponseCache and
// the coordinator's CacheBits, alone and together, with the coordinator's
// bit assignments installed on several simulated ranks.
//
// csrc: negotiation/response_cache.cc base/message.cc base/common.cc
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "check.h"
#include "negotiation/response_cache.h"
#include "requests.h"

using commlib::CacheBits;
using commlib::RequestDesc;
using commlib::Response;
using commlib::ResponseCache;
using commlib_test::allreduce;
using commlib_test::request;

namespace {

Response execute(std::vector<std::string> names, int op_type = COMMLIB_OP_ALLREDUCE) {
  Response r;
  r.kind = Response::kExecute;
  r.op_type = op_type;
  r.names = std::move(names);
  return r;
}

std::vector<int64_t> assign(CacheBits& bits, Response resp) {
  bits.assign(resp);
  return resp.bits;
}

}  // namespace

TEST_CASE("response cache: install, hit, changed request, miss") {
  ResponseCache cache(4);
  const RequestDesc d = allreduce("grad", COMMLIB_FLOAT32, {8});
  int bit = -1;
  uint32_t gen = 0, evicted = 0;
  CHECK_EQ(cache.find(d, &bit, &gen), ResponseCache::kMiss);
  CHECK(!cache.install(2, "grad", d, COMMLIB_OP_ALLREDUCE, {}, &evicted));
  CHECK_EQ(cache.find(d, &bit, &gen), ResponseCache::kHit);
  CHECK_EQ(bit, 2);
  CHECK_EQ(gen, uint32_t(1));
  RequestDesc other = d;
  other.shape = {9};
  bit = -1;
  CHECK_EQ(cache.find(other, &bit, &gen), ResponseCache::kChanged);
  CHECK_EQ(bit, 2);
  CHECK_EQ(cache.find(allreduce("w", COMMLIB_FLOAT32, {8}), &bit, &gen), ResponseCache::kMiss);
}

TEST_CASE("response cache: every field of the request takes part in a hit") {
  const RequestDesc base = allreduce("t", COMMLIB_FLOAT32, {2, 3});
  const std::vector<std::function<void(RequestDesc&)>> changes = {
      [](RequestDesc& d) { d.op_type = COMMLIB_OP_ALLGATHER; },
      [](RequestDesc& d) { d.dtype = COMMLIB_FLOAT64; },
      [](RequestDesc& d) { d.reduce_op = COMMLIB_MAX; },
      [](RequestDesc& d) { d.root = 1; },
      [](RequestDesc& d) { d.prescale = 0.5; },
      [](RequestDesc& d) { d.postscale = 2.0; },
      [](RequestDesc& d) { d.shape = {3, 2}; },
      [](RequestDesc& d) { d.splits = {1, 1}; },
      [](RequestDesc& d) { d.group_size = 1; },
      [](RequestDesc& d) { d.members = {COMMLIB_FLOAT32, 1, 6}; },
  };
  for (size_t i = 0; i < changes.size(); ++i) {
    ResponseCache cache(1);
    uint32_t evicted = 0, gen = 0;
    int bit = -1;
    cache.install(0, "t", base, COMMLIB_OP_ALLREDUCE, {}, &evicted);
    RequestDesc d = base;
    changes[i](d);
    CHECK(!(d == base));
    CHECK_EQ(cache.find(d, &bit, &gen), ResponseCache::kChanged);
  }
}

TEST_CASE("response cache: names are scoped by process set") {
  ResponseCache cache(2);
  RequestDesc d = allreduce("t", COMMLIB_FLOAT32, {1});
  uint32_t evicted = 0, gen = 0;
  int bit = -1;
  cache.install(0, commlib::request_key(d), d, COMMLIB_OP_ALLREDUCE, {}, &evicted);
  RequestDesc in_set = d;
  in_set.process_set = 1;
  CHECK(commlib::request_key(in_set) != commlib::request_key(d));
  CHECK_EQ(cache.find(in_set, &bit, &gen), ResponseCache::kMiss);
  cache.install(1, commlib::request_key(in_set), in_set, COMMLIB_OP_ALLREDUCE, {}, &evicted);
  CHECK_EQ(cache.find(in_set, &bit, &gen), ResponseCache::kHit);
  CHECK_EQ(bit, 1);
  CHECK_EQ(cache.find(d, &bit, &gen), ResponseCache::kHit);
  CHECK_EQ(bit, 0);
}

TEST_CASE("response cache: reinstalling a bit evicts its request and bumps the generation") {
  ResponseCache cache(2);
  const RequestDesc a = allreduce("a", COMMLIB_FLOAT32, {1});
  const RequestDesc b = request(COMMLIB_OP_ALLGATHER, "b", COMMLIB_INT32, {3});
  uint32_t evicted = 0, gen = 0;
  int bit = -1;
  cache.install(1, "a", a, COMMLIB_OP_ALLREDUCE, {}, &evicted);
  CHECK(cache.install(1, "b", b, COMMLIB_OP_ALLGATHER, {3, 4}, &evicted));
  CHECK_EQ(evicted, uint32_t(1));
  CHECK_EQ(cache.find(a, &bit, &gen), ResponseCache::kMiss);
  CHECK_EQ(cache.find(b, &bit, &gen), ResponseCache::kHit);
  CHECK_EQ(gen, uint32_t(2));
  CHECK(cache.get(1, 1) == nullptr);  // the evicted assignment is gone
  const commlib::CachedResponse* c = cache.get(1, 2);
  CHECK(c != nullptr);
  if (c) {
    CHECK_EQ(c->key, std::string("b"));
    CHECK_EQ(c->op_type, int(COMMLIB_OP_ALLGATHER));
    CHECK_EQ(c->rows, (std::vector<int64_t>{3, 4}));
  }
}

TEST_CASE("response cache: remove ends exactly one assignment; get checks bounds") {
  ResponseCache cache(3);
  const RequestDesc a = allreduce("a", COMMLIB_FLOAT32, {1});
  uint32_t evicted = 0, gen = 0;
  int bit = -1;
  cache.install(0, "a", a, COMMLIB_OP_ALLREDUCE, {}, &evicted);
  CHECK(!cache.remove(0, 2));  // not the current generation
  CHECK(cache.get(0, 1) != nullptr);
  CHECK(cache.remove(0, 1));
  CHECK(!cache.remove(0, 1));  // already gone
  CHECK(cache.get(0, 1) == nullptr);
  CHECK_EQ(cache.find(a, &bit, &gen), ResponseCache::kMiss);
  // A removed bit installs without evicting, with the next generation.
  CHECK(!cache.install(0, "a", a, COMMLIB_OP_ALLREDUCE, {}, &evicted));
  CHECK(cache.get(0, 2) != nullptr);
  CHECK(cache.get(-1, 1) == nullptr);
  CHECK(cache.get(3, 1) == nullptr);
  CHECK_EQ(cache.capacity(), 3);
}

TEST_CASE("cache bits: a name gets a bit at its second sighting, the lowest free one") {
  CacheBits bits(4, 2);
  uint32_t gen = 0;
  CHECK_EQ(assign(bits, execute({"a", "b"})), (std::vector<int64_t>{-1, -1}));
  CHECK_EQ(bits.bit_of("a", &gen), -1);
  CHECK_EQ(assign(bits, execute({"b", "c", "a"})), (std::vector<int64_t>{0, -1, 1}));
  CHECK_EQ(bits.bit_of("a", &gen), 1);
  CHECK_EQ(gen, uint32_t(1));
  // A name holding a bit keeps it.
  CHECK_EQ(assign(bits, execute({"a", "c"})), (std::vector<int64_t>{-1, 2}));
  CHECK_EQ(bits.bit_of("a", &gen), 1);
}

TEST_CASE("cache bits: errors, process sets and process-set changes get no bits") {
  CacheBits bits(4, 1);
  assign(bits, execute({"a"}));
  Response err = execute({"a"});
  err.kind = Response::kError;
  CHECK_EQ(assign(bits, err), (std::vector<int64_t>{-1}));
  Response in_set = execute({"a"});
  in_set.process_set = 1;
  CHECK_EQ(assign(bits, in_set), (std::vector<int64_t>{-1}));
  assign(bits, execute({"ps"}, COMMLIB_OP_ADD_PROCESS_SET));
  CHECK_EQ(assign(bits, execute({"ps"}, COMMLIB_OP_ADD_PROCESS_SET)), (std::vector<int64_t>{-1}));
  CHECK_EQ(assign(bits, execute({"a"})), (std::vector<int64_t>{0}));
}

TEST_CASE("cache bits: capacity bounds the bits; a released bit is given again, a newer generation") {
  CacheBits bits(2, 1);
  assign(bits, execute({"a", "b", "c"}));
  CHECK_EQ(assign(bits, execute({"a", "b", "c"})), (std::vector<int64_t>{0, 1, -1}));
  uint32_t gen = 0;
  CHECK_EQ(bits.bit_of("a", &gen), 0);
  CHECK(!bits.end(0, gen + 1));  // not the current generation
  CHECK(bits.end(0, gen));
  CHECK(!bits.end(0, gen));  // already ended
  CHECK_EQ(bits.bit_of("a", &gen), -1);
  CHECK_EQ(assign(bits, execute({"c"})), (std::vector<int64_t>{0}));
  CHECK_EQ(bits.bit_of("c", &gen), 0);
  CHECK_EQ(gen, uint32_t(2));
  bits.release(1);
  CHECK_EQ(bits.bit_of("b", &gen), -1);
  CHECK_EQ(assign(bits, execute({"a"})), (std::vector<int64_t>{1}));
}

TEST_CASE("cache bits: arrivals complete a bit after `units` arrivals; stale ones are ignored") {
  CacheBits bits(2, 3);
  assign(bits, execute({"a"}));
  assign(bits, execute({"a"}));
  uint32_t gen = 0;
  const int bit = bits.bit_of("a", &gen);
  CHECK(bits.current(bit, gen));
  CHECK(!bits.current(bit, gen + 1));
  CHECK(!bits.current(-1, gen));
  CHECK(!bits.current(2, gen));
  for (int round = 0; round < 2; ++round) {
    CHECK(!bits.arrive(bit, gen));
    CHECK(!bits.arrive(bit, gen + 1));  // another generation: ignored
    CHECK(!bits.arrive(bit, gen));
    CHECK(bits.arrive(bit, gen));
  }
  CHECK(!bits.arrive(bit, gen));
  CHECK(bits.end(bit, gen));
  CHECK(!bits.arrive(bit, gen));
  CHECK(!bits.arrive(bit, gen));  // ended: never completes
}

TEST_CASE("cache bits: the set of names seen is bounded") {
  CacheBits bits(1, 1);
  assign(bits, execute({"x"}));
  for (int i = 0; i < 3000; ++i) assign(bits, execute({"unique." + std::to_string(i)}));
  // "x" was forgotten when the set was cleared: this is a first sighting again.
  CHECK_EQ(assign(bits, execute({"x"})), (std::vector<int64_t>{-1}));
  CHECK_EQ(assign(bits, execute({"x"})), (std::vector<int64_t>{0}));
}

TEST_CASE("cache bits and the ranks' caches agree on every bit and generation") {
  constexpr int kRanks = 3, kCapacity = 4;
  CacheBits coord(kCapacity, kRanks);
  std::vector<ResponseCache> ranks(kRanks, ResponseCache(kCapacity));
  std::vector<RequestDesc> pool;
  for (int i = 0; i < 8; ++i) pool.push_back(allreduce("t" + std::to_string(i), COMMLIB_FLOAT32, {i + 1}));
  uint64_t s = 7;
  const auto rnd = [&s](uint32_t bound) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return uint32_t(s >> 33) % bound;
  };
  bool agree = true, no_eviction = true, removed = true;
  for (int step = 0; step < 400; ++step) {
    if (rnd(4) == 0) {  // invalidate a request: the coordinator ends its bit, every rank removes it
      uint32_t gen = 0;
      const int bit = coord.bit_of(pool[rnd(8)].name, &gen);
      if (bit >= 0 && coord.end(bit, gen))
        for (auto& cache : ranks) removed &= cache.remove(bit, gen);
      continue;
    }
    Response resp = execute({});
    for (uint32_t k = 1 + rnd(3); k > 0; --k) resp.names.push_back(pool[rnd(8)].name);
    coord.assign(resp);
    for (auto& cache : ranks) {  // every rank installs the bits at the same point
      for (size_t i = 0; i < resp.names.size(); ++i) {
        if (resp.bits[i] < 0) continue;
        uint32_t evicted = 0;
        const RequestDesc& d = pool[size_t(std::stoi(resp.names[i].substr(1)))];
        no_eviction &= !cache.install(int(resp.bits[i]), resp.names[i], d, resp.op_type, {}, &evicted);
      }
    }
    for (const RequestDesc& d : pool) {
      uint32_t cgen = 0;
      const int cbit = coord.bit_of(d.name, &cgen);
      for (const auto& cache : ranks) {
        int bit = -1;
        uint32_t gen = 0;
        const auto found = cache.find(d, &bit, &gen);
        agree &= cbit < 0 ? found == ResponseCache::kMiss
                          : found == ResponseCache::kHit && bit == cbit && gen == cgen;
      }
    }
  }
  CHECK(agree);
  CHECK(no_eviction);
  CHECK(removed);
}

CHECK_MAIN()
