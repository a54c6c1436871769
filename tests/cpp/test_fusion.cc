// Fusion planning (csrc/negotiation/fusion.h plan_fusion / fusable) and the
// fusion buffer's alignment and reuse.
//
// csrc: negotiation/fusion.cc base/fusion_buffer.cc base/common.cc
#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

#include "base/common.h"
#include "base/fusion_buffer.h"
#include "check.h"
#include "negotiation/fusion.h"
#include "requests.h"

using commlib::RequestDesc;
using commlib_test::allreduce;
using Groups = std::vector<std::vector<size_t>>;

namespace {

Groups plan(const std::vector<RequestDesc>& reqs, int64_t threshold, std::vector<bool> fusable = {}) {
  if (fusable.empty()) fusable.assign(reqs.size(), true);
  std::vector<const RequestDesc*> ptrs;
  for (const auto& r : reqs) ptrs.push_back(&r);
  return commlib::plan_fusion(ptrs, fusable, threshold);
}

RequestDesc f32(const std::string& name, int64_t elements) {
  return allreduce(name, COMMLIB_FLOAT32, {elements});
}

// A deterministic pseudo-random generator (no <random> distribution
// differences between standard libraries).
struct Lcg {
  uint64_t s;
  uint32_t next(uint32_t bound) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return uint32_t(s >> 33) % bound;
  }
};

}  // namespace

TEST_CASE("fusion: single allreduces on any device, host allgathers and reducescatters are fusable") {
  RequestDesc d = f32("a", 4);
  CHECK(commlib::fusable(d));
  d.group_size = 2;  // a grouped allreduce is already one fused unit
  CHECK(!commlib::fusable(d));
  RequestDesc g = commlib_test::request(COMMLIB_OP_ALLGATHER, "g", COMMLIB_FLOAT32, {4});
  RequestDesc rs = commlib_test::request(COMMLIB_OP_REDUCESCATTER, "rs", COMMLIB_FLOAT32, {4});
  CHECK(commlib::fusable(g));
  CHECK(commlib::fusable(rs));
  g.device_type = COMMLIB_DEVICE_CUDA;  // (the NCCL executor runs them one by one)
  rs.device_type = COMMLIB_DEVICE_CUDA;
  CHECK(!commlib::fusable(g));
  CHECK(!commlib::fusable(rs));
  RequestDesc cuda = f32("c", 4);
  cuda.device_type = COMMLIB_DEVICE_CUDA;
  CHECK(commlib::fusable(cuda));
  // host broadcasts fuse up to kHostBroadcastFusionBytes (packed and unpacked once more), CUDA ones always
  CHECK(commlib::fusable(commlib_test::request(COMMLIB_OP_BROADCAST, "b", COMMLIB_FLOAT32, {4})));
  CHECK(commlib::fusable(commlib_test::request(COMMLIB_OP_BROADCAST, "b", COMMLIB_UINT8,
                                               {commlib::kHostBroadcastFusionBytes})));
  RequestDesc big = commlib_test::request(COMMLIB_OP_BROADCAST, "b", COMMLIB_UINT8,
                                          {commlib::kHostBroadcastFusionBytes + 1});
  CHECK(!commlib::fusable(big));
  big.device_type = COMMLIB_DEVICE_CUDA;
  CHECK(commlib::fusable(big));
  CHECK(!commlib::fusable(commlib_test::request(COMMLIB_OP_ALLTOALL, "t", COMMLIB_FLOAT32, {4})));
}

TEST_CASE("fusion: collectives never mix; an allgather counts its gathered bytes") {
  RequestDesc a = f32("a", 10), c = f32("c", 10);
  RequestDesc g = commlib_test::request(COMMLIB_OP_ALLGATHER, "g", COMMLIB_FLOAT32, {2, 5});
  RequestDesc g2 = commlib_test::request(COMMLIB_OP_ALLGATHER, "g2", COMMLIB_FLOAT32, {1, 5});
  RequestDesc rs = commlib_test::request(COMMLIB_OP_REDUCESCATTER, "rs", COMMLIB_FLOAT32, {10});
  CHECK_EQ(plan({a, g, rs, c, g2}, 1 << 20), (Groups{{0, 3}, {1, 4}, {2}}));
  // Allgathers of any dtype fuse (bytes are gathered); reducescatters only of one.
  RequestDesc g64 = commlib_test::request(COMMLIB_OP_ALLGATHER, "g64", COMMLIB_FLOAT64, {1});
  RequestDesc rs64 = commlib_test::request(COMMLIB_OP_REDUCESCATTER, "rs64", COMMLIB_FLOAT64, {10});
  CHECK_EQ(plan({g, rs, g64, rs64}, 1 << 20), (Groups{{0, 2}, {1}, {3}}));
  // 2 + 3 + 1 rows of 5 float32: 120 bytes gathered; this rank's own 2 rows: 40.
  CHECK_EQ(commlib::fusion_bytes(g, {2, 3, 1}), 120);
  CHECK_EQ(commlib::fusion_bytes(g, {}), 40);
  // Half types: reduced in float32 on the host, gathered as they are.
  RequestDesc h = commlib_test::request(COMMLIB_OP_ALLGATHER, "h", COMMLIB_FLOAT16, {4});
  CHECK_EQ(commlib::fusion_bytes(h, {4, 4}), 16);
  CHECK_EQ(commlib::fusion_bytes(commlib_test::request(COMMLIB_OP_REDUCESCATTER, "r", COMMLIB_FLOAT16, {4}), {}), 16);
  // Planned by the gathered bytes: 120 + 120 > 200, so two groups.
  const std::vector<int64_t> bytes{120, 120};
  std::vector<const RequestDesc*> ptrs{&g, &g2};
  CHECK_EQ(commlib::plan_fusion(ptrs, {true, true}, 200, &bytes), (Groups{{0}, {1}}));
  CHECK_EQ(commlib::plan_fusion(ptrs, {true, true}, 240, &bytes), (Groups{{0, 1}}));
  // Above kGatherFusionBytes they run alone, whatever the threshold; allreduces do not stop there.
  const int64_t big = commlib::kGatherFusionBytes / 2 + 1;
  const std::vector<int64_t> large{big, big};
  CHECK_EQ(commlib::plan_fusion(ptrs, {true, true}, int64_t(1) << 30, &large), (Groups{{0}, {1}}));
  const std::vector<int64_t> fits{big - 2, big - 2};
  CHECK_EQ(commlib::plan_fusion(ptrs, {true, true}, int64_t(1) << 30, &fits), (Groups{{0, 1}}));
  RequestDesc a1 = f32("a1", big / 4), a2 = f32("a2", big / 4);
  CHECK_EQ(plan({a1, a2}, int64_t(1) << 30), (Groups{{0, 1}}));
}

TEST_CASE("fusion: a fused allgather's rows, member by member") {
  const std::vector<int64_t> rows{1, 2, 3, 4, 5, 6};  // 2 members of 3 ranks
  CHECK_EQ(commlib::member_rows(rows, 2, 0), (std::vector<int64_t>{1, 2, 3}));
  CHECK_EQ(commlib::member_rows(rows, 2, 1), (std::vector<int64_t>{4, 5, 6}));
  CHECK_EQ(commlib::member_rows(rows, 1, 0), rows);
}

TEST_CASE("fusion: a group fills up to the threshold inclusive, then a new one starts") {
  // 100 float32 = 400 bytes each.
  CHECK_EQ(plan({f32("a", 100), f32("b", 100), f32("c", 100)}, 800), (Groups{{0, 1}, {2}}));
  CHECK_EQ(plan({f32("a", 100), f32("b", 100), f32("c", 100)}, 1200), (Groups{{0, 1, 2}}));
  CHECK_EQ(plan({f32("a", 100), f32("b", 100), f32("c", 100)}, 799), (Groups{{0}, {1}, {2}}));
  // A tensor over the threshold runs alone; nothing joins it.
  CHECK_EQ(plan({f32("big", 1000), f32("s", 1)}, 800), (Groups{{0}, {1}}));
}

TEST_CASE("fusion: once a group is full, later requests join the newest group only") {
  // 600 + 600 > 1000: b opens a new group; c (100) would fit into a's
  // group but a's group is closed, so c joins b's.
  CHECK_EQ(plan({f32("a", 150), f32("b", 150), f32("c", 25)}, 1000), (Groups{{0}, {1, 2}}));
}

TEST_CASE("fusion: dtypes, ops, scale factors and process sets never mix") {
  RequestDesc a = f32("a", 1), c = f32("c", 1);
  RequestDesc b = allreduce("b", COMMLIB_FLOAT64, {1}), d = allreduce("d", COMMLIB_FLOAT64, {1});
  // Groups come in the order of their first member.
  CHECK_EQ(plan({a, b, c, d}, 1 << 20), (Groups{{0, 2}, {1, 3}}));
  RequestDesc mx = allreduce("mx", COMMLIB_FLOAT32, {1}, COMMLIB_MAX);
  CHECK_EQ(plan({a, mx, c}, 1 << 20), (Groups{{0, 2}, {1}}));
  RequestDesc pre = f32("pre", 1), post = f32("post", 1), ps = f32("ps", 1);
  pre.prescale = 0.5;
  post.postscale = 2.0;
  ps.process_set = 1;
  CHECK_EQ(plan({a, pre, post, ps, c}, 1 << 20), (Groups{{0, 4}, {1}, {2}, {3}}));
}

TEST_CASE("fusion: requests that may not fuse run alone and leave open groups open") {
  CHECK_EQ(plan({f32("a", 1), f32("x", 1), f32("c", 1)}, 1 << 20, {true, false, true}),
           (Groups{{0, 2}, {1}}));
}

TEST_CASE("fusion: half types count as float32, the type they are reduced in") {
  const auto h = [](const std::string& n) { return allreduce(n, COMMLIB_FLOAT16, {100}); };
  const auto bf = [](const std::string& n) { return allreduce(n, COMMLIB_BFLOAT16, {100}); };
  // 400 counted bytes each (200 real): two fit in 800, three do not.
  CHECK_EQ(plan({h("a"), h("b"), h("c")}, 800), (Groups{{0, 1}, {2}}));
  CHECK_EQ(plan({bf("a"), bf("b"), bf("c")}, 800), (Groups{{0, 1}, {2}}));
  // int8 counts its own size.
  const auto i8 = [](const std::string& n) { return allreduce(n, COMMLIB_INT8, {100}); };
  CHECK_EQ(plan({i8("a"), i8("b"), i8("c")}, 300), (Groups{{0, 1, 2}}));
}

TEST_CASE("fusion: random plans partition the requests into homogeneous groups under the threshold") {
  Lcg rng{12345};
  const int dtypes[] = {COMMLIB_FLOAT32, COMMLIB_FLOAT64, COMMLIB_FLOAT16, COMMLIB_INT32};
  for (int round = 0; round < 50; ++round) {
    std::vector<RequestDesc> reqs;
    std::vector<bool> fusable;
    const size_t n = 1 + rng.next(60);
    for (size_t i = 0; i < n; ++i) {
      RequestDesc d = allreduce("t" + std::to_string(i), dtypes[rng.next(4)], {int64_t(rng.next(300))},
                                rng.next(4) == 0 ? COMMLIB_MAX : COMMLIB_SUM);
      d.process_set = int(rng.next(2));
      reqs.push_back(d);
      fusable.push_back(rng.next(8) != 0);
    }
    const int64_t threshold = 256 + rng.next(4096);
    const Groups groups = plan(reqs, threshold, fusable);
    std::vector<int> seen(n, 0);
    size_t last_first = 0;
    bool ok = true;
    for (size_t g = 0; g < groups.size(); ++g) {
      const auto& grp = groups[g];
      ok &= !grp.empty() && (g == 0 || grp[0] > last_first);
      last_first = grp.empty() ? last_first : grp[0];
      int64_t bytes = 0;
      for (size_t k = 0; k < grp.size(); ++k) {
        const RequestDesc& d = reqs[grp[k]];
        ++seen[grp[k]];
        ok &= k == 0 || grp[k] > grp[k - 1];
        ok &= grp.size() == 1 || fusable[grp[k]];
        ok &= std::make_tuple(d.dtype, d.reduce_op, d.process_set) ==
              std::make_tuple(reqs[grp[0]].dtype, reqs[grp[0]].reduce_op, reqs[grp[0]].process_set);
        bytes += commlib::num_elements(d.shape) * (commlib::is_half_dtype(d.dtype) ? 4 : int64_t(commlib::dtype_size(d.dtype)));
      }
      ok &= grp.size() == 1 || bytes <= threshold;
    }
    for (size_t i = 0; i < n; ++i) ok &= seen[i] == 1;
    CHECK(ok);
  }
}

TEST_CASE("fusion buffer: 64-byte aligned, reused when big enough, grown otherwise") {
  commlib::FusionBuffer buf;
  char* a = buf.get(100);
  CHECK_EQ(reinterpret_cast<uintptr_t>(a) % 64, uintptr_t(0));
  a[99] = 1;
  CHECK(buf.get(50) == a);  // no reallocation for a smaller request
  char* b = buf.get(size_t(3) << 20);
  CHECK_EQ(reinterpret_cast<uintptr_t>(b) % 64, uintptr_t(0));
  b[(size_t(3) << 20) - 1] = 1;  // the whole request is usable
  CHECK(buf.get(size_t(1) << 20) == b);
}

CHECK_MAIN()
