// The coordinator's validation of requests across ranks
// (csrc/negotiation/controller.h Controller::validate): which disagreements are errors,
// in which order they are reported, and the exact error text.
//
// csrc: negotiation/controller.cc negotiation/controller_failures.cc negotiation/fusion.cc base/message.cc base/common.cc
#include <string>
#include <vector>

#include "check.h"
#include "negotiation/controller.h"
#include "requests.h"

using commlib::Controller;
using commlib::RequestDesc;
using commlib_test::allreduce;
using commlib_test::request;

namespace {

// validate() over one request per rank (ranks 0..n-1 unless given).
std::string validate(const std::vector<RequestDesc>& descs, std::vector<int> ranks = {}) {
  if (ranks.empty())
    for (size_t i = 0; i < descs.size(); ++i) ranks.push_back(int(i));
  int code = -1;
  std::string err = Controller::validate(descs, ranks, &code);
  if (!err.empty() && code != COMMLIB_ERR_MISMATCH) err = "(wrong code " + std::to_string(code) + ") " + err;
  return err;
}

RequestDesc grouped(const std::string& name, std::vector<int64_t> members, int size) {
  RequestDesc d = allreduce(name, COMMLIB_FLOAT32, {});
  d.group_size = size;
  d.members = std::move(members);
  return d;
}

}  // namespace

TEST_CASE("controller: identical requests validate") {
  const RequestDesc a = allreduce("x", COMMLIB_FLOAT32, {4, 2});
  CHECK_EQ(validate({a}), "");
  CHECK_EQ(validate({a, a, a}), "");
  const RequestDesc g = grouped("g", {COMMLIB_FLOAT32, 1, 3, COMMLIB_INT32, 0}, 2);
  CHECK_EQ(validate({g, g}), "");
}

TEST_CASE("controller: mismatched operations name each rank's operation") {
  const RequestDesc a = allreduce("x", COMMLIB_FLOAT32, {4});
  const RequestDesc b = request(COMMLIB_OP_ALLGATHER, "x", COMMLIB_FLOAT32, {4});
  CHECK_EQ(validate({a, b, a}),
           "Mismatched collective operation for 'x' across ranks: ranks 0, 2: allreduce; rank 1: allgather");
}

TEST_CASE("controller: mismatched dtypes, grouped by value in order of first appearance") {
  const RequestDesc f = allreduce("w", COMMLIB_FLOAT32, {4});
  const RequestDesc d = allreduce("w", COMMLIB_FLOAT64, {4});
  CHECK_EQ(validate({d, f, d, f}),
           "Mismatched dtype for allreduce 'w' across ranks: ranks 0, 2: float64; ranks 1, 3: float32");
  // The dtype is reported before the shape.
  const RequestDesc d5 = allreduce("w", COMMLIB_FLOAT64, {5});
  CHECK_EQ(validate({f, d5}), "Mismatched dtype for allreduce 'w' across ranks: rank 0: float32; rank 1: float64");
}

TEST_CASE("controller: reduction ops and scale factors must agree for reducing collectives only") {
  const RequestDesc s = allreduce("x", COMMLIB_FLOAT32, {4});
  const RequestDesc m = allreduce("x", COMMLIB_FLOAT32, {4}, COMMLIB_MAX);
  CHECK_EQ(validate({s, m}), "Mismatched reduction op for allreduce 'x' across ranks: rank 0: Sum; rank 1: Max");
  RequestDesc pre = s, post = s;
  pre.prescale = 0.5;
  post.postscale = 0.25;
  CHECK_EQ(validate({s, pre}), "Mismatched prescale_factor for allreduce 'x' across ranks: rank 0: 1; rank 1: 0.5");
  CHECK_EQ(validate({post, s}),
           "Mismatched postscale_factor for allreduce 'x' across ranks: rank 0: 0.25; rank 1: 1");
  RequestDesc rs = s, rs_min = m;
  rs.op_type = rs_min.op_type = COMMLIB_OP_REDUCESCATTER;
  CHECK_EQ(validate({rs, rs_min}),
           "Mismatched reduction op for reducescatter 'x' across ranks: rank 0: Sum; rank 1: Max");
  // An allgather has no reduction: its reduce_op and scale factors are ignored.
  RequestDesc g1 = s, g2 = m;
  g1.op_type = g2.op_type = COMMLIB_OP_ALLGATHER;
  g2.prescale = 3;
  CHECK_EQ(validate({g1, g2}), "");
}

TEST_CASE("controller: shapes must match, except the first dimension of allgather and alltoall") {
  const RequestDesc a = allreduce("x", COMMLIB_FLOAT32, {4, 2});
  const RequestDesc b = allreduce("x", COMMLIB_FLOAT32, {4, 3});
  CHECK_EQ(validate({a, b}), "Mismatched shape for allreduce 'x' across ranks: rank 0: [4, 2]; rank 1: [4, 3]");
  const RequestDesc scalar = allreduce("x", COMMLIB_FLOAT32, {});
  CHECK_EQ(validate({scalar, a}), "Mismatched shape for allreduce 'x' across ranks: rank 0: []; rank 1: [4, 2]");
  for (int op : {COMMLIB_OP_ALLGATHER, COMMLIB_OP_ALLTOALL}) {
    const std::string kind = op == COMMLIB_OP_ALLGATHER ? "allgather" : "alltoall";
    const RequestDesc g2 = request(op, "y", COMMLIB_INT32, {2, 3});
    const RequestDesc g5 = request(op, "y", COMMLIB_INT32, {5, 3});
    const RequestDesc g24 = request(op, "y", COMMLIB_INT32, {2, 4});
    const RequestDesc g1d = request(op, "y", COMMLIB_INT32, {2});
    CHECK_EQ(validate({g2, g5}), "");
    CHECK_EQ(validate({g2, g24}), "Mismatched shape (dimensions after the first) for " + kind +
                                      " 'y' across ranks: rank 0: [2, 3]; rank 1: [2, 4]");
    CHECK_EQ(validate({g2, g1d}), "Mismatched shape (dimensions after the first) for " + kind +
                                      " 'y' across ranks: rank 0: [2, 3]; rank 1: [2]");
  }
}

TEST_CASE("controller: broadcast roots must agree; other collectives ignore the root") {
  RequestDesc b0 = request(COMMLIB_OP_BROADCAST, "p", COMMLIB_FLOAT32, {3});
  RequestDesc b1 = b0;
  b1.root = 1;
  CHECK_EQ(validate({b0, b1, b1}), "Mismatched root rank for broadcast 'p' across ranks: rank 0: 0; ranks 1, 2: 1");
  RequestDesc a0 = allreduce("p", COMMLIB_FLOAT32, {3}), a1 = a0;
  a1.root = 2;
  CHECK_EQ(validate({a0, a1}), "");
}

TEST_CASE("controller: grouped requests report the count, then the first differing member") {
  const RequestDesc g2 = grouped("g", {COMMLIB_FLOAT32, 1, 3, COMMLIB_INT32, 0}, 2);
  const RequestDesc g1 = grouped("g", {COMMLIB_FLOAT32, 1, 3}, 1);
  CHECK_EQ(validate({g2, g1}), "Mismatched number of grouped tensors for allreduce 'g' across ranks: rank 0: 2; rank 1: 1");
  const RequestDesc other = grouped("g", {COMMLIB_FLOAT32, 1, 3, COMMLIB_INT32, 1, 7}, 2);
  CHECK_EQ(validate({g2, other}),
           "Mismatched dtype/shape of grouped tensor 1 ('g.1') for allreduce 'g' across ranks: "
           "rank 0: int32 []; rank 1: int32 [7]");
  const RequestDesc first = grouped("g", {COMMLIB_FLOAT64, 1, 3, COMMLIB_INT32, 0}, 2);
  CHECK_EQ(validate({g2, g2, first}),
           "Mismatched dtype/shape of grouped tensor 0 ('g.0') for allreduce 'g' across ranks: "
           "ranks 0, 1: float32 [3]; rank 2: float64 [3]");
}

TEST_CASE("controller: barriers and process-set changes check only what they use") {
  RequestDesc b0 = request(COMMLIB_OP_BARRIER, "b", COMMLIB_FLOAT32, {1});
  RequestDesc b1 = request(COMMLIB_OP_BARRIER, "b", COMMLIB_INT8, {9});
  CHECK_EQ(validate({b0, b1}), "");
  RequestDesc add0 = request(COMMLIB_OP_ADD_PROCESS_SET, "s", 0, {}), add1 = add0;
  add0.splits = {0, 1};
  add1.splits = {0, 2};
  CHECK_EQ(validate({add0, add1}),
           "Mismatched process set ranks for add_process_set 's' across ranks: rank 0: [0, 1]; rank 1: [0, 2]");
  RequestDesc rm0 = request(COMMLIB_OP_REMOVE_PROCESS_SET, "r", 0, {}), rm1 = rm0;
  rm0.root = 1;
  rm1.root = 2;
  CHECK_EQ(validate({rm0, rm1}),
           "Mismatched process set id for remove_process_set 'r' across ranks: rank 0: 1; rank 1: 2");
}

TEST_CASE("controller: errors name the job ranks of a process set's members") {
  const RequestDesc a = allreduce("x", COMMLIB_FLOAT32, {1});
  const RequestDesc b = allreduce("x", COMMLIB_FLOAT32, {2});
  CHECK_EQ(validate({a, b, b}, {1, 3, 6}),
           "Mismatched shape for allreduce 'x' across ranks: rank 1: [1]; ranks 3, 6: [2]");
}

CHECK_MAIN()
