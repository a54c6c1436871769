// The coordinator's negotiation (csrc/negotiation/controller.h): requests become
// responses once every member of their process set has sent them, fused
// allreduces, errors for mismatches, departed ranks and non-members, process
// set registration and stall warnings.
//
// csrc: negotiation/controller.cc negotiation/controller_failures.cc negotiation/fusion.cc base/message.cc base/common.cc
#include <string>
#include <vector>

#include "check.h"
#include "negotiation/controller.h"
#include "requests.h"

using commlib::Controller;
using commlib::RequestDesc;
using commlib::Response;
using commlib_test::allreduce;
using commlib_test::request;

namespace {

void add_all(Controller& c, const RequestDesc& d, std::vector<int> ranks, int64_t now = 0) {
  for (int r : ranks) c.add(r, d, now);
}

RequestDesc in_set(RequestDesc d, int set) {
  d.process_set = set;
  return d;
}

}  // namespace

TEST_CASE("controller flow: a request is ready once every rank sent it") {
  Controller c(3, 1 << 20);
  const RequestDesc a = allreduce("a", COMMLIB_FLOAT32, {4});
  c.add(0, a, 0);
  c.add(2, a, 0);
  CHECK(c.take_ready().empty());
  c.add(1, a, 0);
  const std::vector<Response> out = c.take_ready();
  CHECK_EQ(out.size(), size_t(1));
  if (out.size() == 1) {
    CHECK_EQ(out[0].kind, int(Response::kExecute));
    CHECK_EQ(out[0].names, std::vector<std::string>{"a"});
    CHECK_EQ(out[0].to, (std::vector<int>{0, 1, 2}));
  }
  CHECK(c.take_ready().empty());  // answered once
}

TEST_CASE("controller flow: small allreduces fuse in completion order, up to the threshold") {
  Controller c(2, 64);
  // 8 float32 = 32 bytes each: two per fused response.
  for (const char* n : {"c", "a", "b"}) add_all(c, allreduce(n, COMMLIB_FLOAT32, {8}), {0, 1});
  add_all(c, request(COMMLIB_OP_BROADCAST, "z", COMMLIB_FLOAT32, {8}), {0, 1});
  const std::vector<Response> out = c.take_ready();
  CHECK_EQ(out.size(), size_t(3));
  if (out.size() == 3) {
    CHECK_EQ(out[0].names, (std::vector<std::string>{"c", "a"}));
    CHECK_EQ(out[1].names, std::vector<std::string>{"b"});
    CHECK_EQ(out[2].names, std::vector<std::string>{"z"});
  }
  c.set_fusion_threshold(0);
  add_all(c, allreduce("p", COMMLIB_FLOAT32, {1}), {0, 1});
  add_all(c, allreduce("q", COMMLIB_FLOAT32, {1}), {0, 1});
  CHECK_EQ(c.take_ready().size(), size_t(2));
}

TEST_CASE("controller flow: a mismatch is an error response for the request's members") {
  Controller c(2, 1 << 20);
  c.add(0, allreduce("x", COMMLIB_FLOAT32, {2}), 0);
  c.add(1, allreduce("x", COMMLIB_FLOAT32, {3}), 0);
  add_all(c, allreduce("y", COMMLIB_FLOAT32, {2}), {0, 1});
  const std::vector<Response> out = c.take_ready();
  CHECK_EQ(out.size(), size_t(2));  // the error does not fuse with y
  if (out.size() == 2) {
    CHECK_EQ(out[0].kind, int(Response::kError));
    CHECK_EQ(out[0].error_code, int(COMMLIB_ERR_MISMATCH));
    CHECK_EQ(out[0].error, "Mismatched shape for allreduce 'x' across ranks: rank 0: [2]; rank 1: [3]");
    CHECK_EQ(out[1].names, std::vector<std::string>{"y"});
  }
}

TEST_CASE("controller flow: allgather and alltoall responses carry every rank's rows") {
  Controller c(3, 1 << 20);
  for (int r = 0; r < 3; ++r) c.add(r, request(COMMLIB_OP_ALLGATHER, "g", COMMLIB_INT32, {r + 1, 2}), 0);
  for (int r = 0; r < 3; ++r) {
    RequestDesc d = request(COMMLIB_OP_ALLTOALL, "t", COMMLIB_INT32, {3});
    d.splits = {r, 1, 2 - r};
    c.add(r, d, 0);
  }
  const std::vector<Response> out = c.take_ready();
  CHECK_EQ(out.size(), size_t(2));
  if (out.size() == 2) {
    CHECK_EQ(out[0].rows, (std::vector<int64_t>{1, 2, 3}));
    CHECK_EQ(out[1].rows, (std::vector<int64_t>{0, 1, 2, 1, 1, 1, 2, 1, 0}));
  }
}

TEST_CASE("controller flow: after a rank left, open and later requests fail") {
  Controller c(3, 1 << 20);
  c.add(0, allreduce("open", COMMLIB_FLOAT32, {1}), 0);
  c.rank_left(2);
  c.add(1, allreduce("later", COMMLIB_FLOAT32, {1}), 0);
  const std::vector<Response> out = c.take_ready();
  CHECK_EQ(out.size(), size_t(2));
  if (out.size() == 2) {
    CHECK_EQ(out[0].kind, int(Response::kError));
    CHECK_EQ(out[0].error_code, int(COMMLIB_ERR_NOT_INIT));
    CHECK_EQ(out[0].error, "rank 2 called shutdown() before 'open' could complete");
    CHECK_EQ(out[1].error, "rank 2 called shutdown() before 'later' could complete");
  }
}

TEST_CASE("controller flow: after a rank left, process sets without it go on") {
  Controller c(4, 1 << 20);
  RequestDesc add = request(COMMLIB_OP_ADD_PROCESS_SET, "add", 0, {});
  add.splits = {1, 2};
  add_all(c, add, {0, 1, 2, 3});
  add.name = "add2";
  add.splits = {0, 3};
  add_all(c, add, {0, 1, 2, 3});
  CHECK_EQ(c.take_ready().size(), size_t(2));
  const RequestDesc open = in_set(allreduce("open", COMMLIB_FLOAT32, {1}), 2);
  c.add(3, open, 0);
  c.add(1, in_set(allreduce("pair", COMMLIB_FLOAT32, {1}), 1), 0);
  c.rank_left(0);
  c.add(2, in_set(allreduce("pair", COMMLIB_FLOAT32, {1}), 1), 0);  // set {1, 2}: completes
  add_all(c, allreduce("whole", COMMLIB_FLOAT32, {1}), {1, 2, 3});
  c.add(3, in_set(allreduce("later", COMMLIB_FLOAT32, {1}), 2), 0);
  const std::vector<Response> out = c.take_ready();
  CHECK_EQ(out.size(), size_t(6));  // (each rank's 'whole' fails on its own)
  std::vector<std::string> errors;
  int executed = 0;
  for (const Response& r : out) {
    if (r.kind == Response::kError) {
      CHECK_EQ(r.error_code, int(COMMLIB_ERR_NOT_INIT));
      errors.push_back(r.error);
    } else {
      ++executed;
      CHECK_EQ(r.process_set, 1);
      CHECK_EQ(r.to, (std::vector<int>{1, 2}));
    }
  }
  CHECK_EQ(executed, 1);
  auto left = [](const char* name) { return "rank 0 called shutdown() before '" + std::string(name) + "' could complete"; };
  CHECK_EQ(errors, (std::vector<std::string>{left("open"), left("whole"), left("whole"), left("whole"), left("later")}));
}

TEST_CASE("controller flow: process sets are registered, used, and removed") {
  Controller c(4, 1 << 20);
  RequestDesc add = request(COMMLIB_OP_ADD_PROCESS_SET, "add", 0, {});
  add.splits = {1, 3};
  add_all(c, add, {0, 1, 2, 3});
  std::vector<Response> out = c.take_ready();
  CHECK_EQ(out.size(), size_t(1));
  if (out.size() == 1) CHECK_EQ(out[0].rows, std::vector<int64_t>{1});
  // A collective of set 1: its members only; its key is scoped by the set.
  const RequestDesc x = in_set(allreduce("x", COMMLIB_FLOAT32, {1}), 1);
  c.add(0, x, 0);  // not a member
  add_all(c, x, {1, 3});
  out = c.take_ready();
  CHECK_EQ(out.size(), size_t(2));
  if (out.size() == 2) {
    CHECK_EQ(out[0].error, "rank 0 is not a member of process set 1 [1, 3]");
    CHECK_EQ(out[0].error_code, int(COMMLIB_ERR_VALUE));
    CHECK_EQ(out[1].to, (std::vector<int>{1, 3}));
    CHECK_EQ(out[1].names, std::vector<std::string>{commlib::request_key("x", 1)});
  }
  // The same ranks again: refused.
  RequestDesc again = add;
  again.name = "again";
  add_all(c, again, {0, 1, 2, 3});
  out = c.take_ready();
  CHECK(out.size() == 1 && out[0].error == "a process set with ranks [1, 3] already exists (id 1)");
  // Removal waits for no collective: it fails while one is pending.
  c.add(1, in_set(allreduce("y", COMMLIB_FLOAT32, {1}), 1), 0);
  RequestDesc rm = request(COMMLIB_OP_REMOVE_PROCESS_SET, "rm", 0, {});
  rm.root = 1;
  add_all(c, rm, {0, 1, 2, 3});
  out = c.take_ready();
  CHECK(out.size() == 1 && out[0].error ==
                               "cannot remove process set 1 while 'y' is pending on it (submitted by ranks [1]); "
                               "synchronize it first");
  // Completed in the same batch, ahead of the removal: y runs first, then the
  // removal succeeds (y is no longer pending).
  c.add(3, in_set(allreduce("y", COMMLIB_FLOAT32, {1}), 1), 0);
  rm.name = "rm2";
  add_all(c, rm, {0, 1, 2, 3});
  out = c.take_ready();
  CHECK_EQ(out.size(), size_t(2));
  if (out.size() == 2) {
    CHECK_EQ(out[0].names, std::vector<std::string>{commlib::request_key("y", 1)});
    CHECK_EQ(out[1].error, "");
    CHECK_EQ(out[1].kind, int(Response::kExecute));
  }
  c.add(1, x, 0);
  out = c.take_ready();
  CHECK(out.size() == 1 && out[0].error == "process set 1 does not exist (removed?)");
}

TEST_CASE("controller flow: a removal completed ahead of a collective of the set fails") {
  Controller c(3, 1 << 20);
  RequestDesc add = request(COMMLIB_OP_ADD_PROCESS_SET, "add", 0, {});
  add.splits = {0, 1};
  add_all(c, add, {0, 1, 2});
  CHECK_EQ(c.take_ready().at(0).error, "");
  const RequestDesc y = in_set(allreduce("y", COMMLIB_FLOAT32, {1}), 1);
  RequestDesc rm = request(COMMLIB_OP_REMOVE_PROCESS_SET, "rm", 0, {});
  rm.root = 1;
  c.add(0, y, 0);
  add_all(c, rm, {0, 1, 2});
  c.add(1, y, 0);  // completes after the removal, in the same batch
  const std::vector<Response> out = c.take_ready();
  CHECK_EQ(out.size(), size_t(2));
  if (out.size() == 2) {
    CHECK_EQ(out[0].error,
             "cannot remove process set 1 while 'y' is pending on it (submitted by ranks [0, 1]); "
             "synchronize it first");
    CHECK_EQ(out[1].kind, int(Response::kExecute));  // y still runs: its set is kept
  }
}

TEST_CASE("controller flow: the global set cannot be removed, bad set ranks are refused") {
  Controller c(2, 1 << 20);
  RequestDesc rm = request(COMMLIB_OP_REMOVE_PROCESS_SET, "rm", 0, {});
  add_all(c, rm, {0, 1});
  RequestDesc add = request(COMMLIB_OP_ADD_PROCESS_SET, "add", 0, {});
  add.splits = {1, 0};
  add_all(c, add, {0, 1});
  const std::vector<Response> out = c.take_ready();
  CHECK_EQ(out.size(), size_t(2));
  if (out.size() == 2) {
    CHECK_EQ(out[0].error, "the global process set (id 0) cannot be removed");
    CHECK_EQ(out[1].error,
             "process set ranks [1, 0] must be distinct ranks of the job (0..1), in ascending order");
  }
}

TEST_CASE("controller flow: a stalled request is reported once, naming who is missing") {
  Controller c(3, 1 << 20);
  c.add(0, allreduce("slow", COMMLIB_FLOAT32, {1}), 1000000);
  c.add(2, allreduce("slow", COMMLIB_FLOAT32, {1}), 2000000);
  CHECK(c.stall_warnings(5000000, 10000000).empty());  // not yet
  const std::vector<std::string> w = c.stall_warnings(62000000, 60000000);
  CHECK_EQ(w, std::vector<std::string>{
                  "'slow' has waited 61 s: submitted by ranks [0, 2], still missing on ranks [1]. Check that "
                  "every rank calls the same collectives with the same names."});
  CHECK(c.stall_warnings(99000000, 60000000).empty());  // once
}

CHECK_MAIN()

TEST_CASE("controller flow: a joined rank completes the others' requests; the join comes last") {
  Controller c(3, 1 << 20);
  const RequestDesc join = request(COMMLIB_OP_JOIN, "join", COMMLIB_UINT8, {});
  const RequestDesc a = allreduce("a", COMMLIB_FLOAT32, {4});
  RequestDesc g = request(COMMLIB_OP_ALLGATHER, "g", COMMLIB_INT32, {3, 2});
  add_all(c, a, {0, 1});  // open before rank 2 joins
  CHECK(c.take_ready().empty());
  c.add(2, join, 0);
  CHECK(c.joining());
  add_all(c, g, {0, 1});
  std::vector<Response> out = c.take_ready();
  CHECK_EQ(out.size(), size_t(2));
  if (out.size() == 2) {
    CHECK_EQ(out[0].names, std::vector<std::string>{"a"});
    CHECK_EQ(out[0].descs.size(), size_t(1));  // what rank 2 runs without having submitted it
    CHECK_EQ(out[0].to, (std::vector<int>{0, 1, 2}));
    CHECK_EQ(out[1].names, std::vector<std::string>{"g"});
    CHECK_EQ(out[1].rows, (std::vector<int64_t>{3, 3, 0}));  // the joined rank sends no rows
  }
  RequestDesc b = request(COMMLIB_OP_BROADCAST, "b", COMMLIB_FLOAT32, {2});
  b.root = 2;
  add_all(c, b, {0, 1});
  out = c.take_ready();
  CHECK_EQ(out.size(), size_t(1));
  if (out.size() == 1) {
    CHECK_EQ(out[0].kind, int(Response::kError));
    CHECK(out[0].error.find("rank 2 has called join()") != std::string::npos);
  }
  c.add(0, join, 0);
  c.add(1, join, 0);
  out = c.take_ready();
  CHECK_EQ(out.size(), size_t(1));
  if (out.size() == 1) {
    CHECK_EQ(out[0].op_type, int(COMMLIB_OP_JOIN));
    CHECK_EQ(out[0].rows, std::vector<int64_t>{1});  // the last to join
  }
  CHECK(!c.joining());
  add_all(c, a, {0, 1});  // the join is over: rank 2 counts again
  CHECK(c.take_ready().empty());
}
