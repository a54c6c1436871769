// The recursive-doubling schedule (csrc/collectives/tree_schedule.h) for
// 1..7 ranks, simulated without any transport: partners are consistent, no
// rank talks to itself, and every rank ends with the same expression over
// x[0] .. x[n-1] in rank order, each input exactly once.
//
// csrc: (header-only)
#include <algorithm>
#include <string>
#include <vector>

#include "check.h"
#include "collectives/tree_schedule.h"

using commlib::TreeSchedule;

namespace {

// The leaves of an expression like "((0+1)+2)", in order.
std::vector<int> leaves(const std::string& expr) {
  std::vector<int> out;
  for (size_t i = 0; i < expr.size();) {
    if (expr[i] >= '0' && expr[i] <= '9') {
      size_t j = i;
      while (j < expr.size() && expr[j] >= '0' && expr[j] <= '9') ++j;
      out.push_back(std::stoi(expr.substr(i, j - i)));
      i = j;
    } else {
      ++i;
    }
  }
  return out;
}

std::string combine(const std::string& lower, const std::string& higher) {
  return "(" + lower + "+" + higher + ")";
}

// Runs the schedule the way allreduce_tree does, on expressions: the folding
// rank combines (dropped-out partner) + (own), partners combine (lower
// virtual rank) + (higher), and dropped-out ranks get the result copied back.
std::vector<std::string> simulate(int n) {
  const TreeSchedule s(n);
  std::vector<std::string> cur(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) cur[size_t(r)] = std::to_string(r);
  for (int r = 0; r < n; ++r)
    if (s.folds_in(r)) cur[size_t(r)] = combine(cur[size_t(s.fold_partner(r))], cur[size_t(r)]);
  for (int mask = 1; mask < s.p; mask <<= 1) {
    std::vector<std::string> next = cur;  // every pair exchanges at once
    for (int r = 0; r < n; ++r) {
      if (s.drops_out(r)) continue;
      const int q = s.peer(r, mask);
      const bool lower = s.vrank(r) < s.vrank(q);
      next[size_t(r)] = lower ? combine(cur[size_t(r)], cur[size_t(q)]) : combine(cur[size_t(q)], cur[size_t(r)]);
    }
    cur = next;
  }
  for (int r = 0; r < n; ++r)
    if (s.drops_out(r)) cur[size_t(r)] = cur[size_t(s.fold_partner(r))];
  return cur;
}

// The ranks r exchanges data with (and so hands the completion token to).
std::vector<int> partners(const TreeSchedule& s, int r) {
  if (s.drops_out(r)) return {s.fold_partner(r)};
  std::vector<int> out;
  if (s.folds_in(r)) out.push_back(s.fold_partner(r));
  for (int mask = 1; mask < s.p; mask <<= 1) out.push_back(s.peer(r, mask));
  return out;
}

}  // namespace

TEST_CASE("tree: p is the largest power of two <= n, rem the rest") {
  const int expect_p[] = {0, 1, 2, 2, 4, 4, 4, 4, 8};
  for (int n = 1; n <= 8; ++n) {
    const TreeSchedule s(n);
    CHECK_EQ(s.p, expect_p[n]);
    CHECK_EQ(s.rem, n - expect_p[n]);
    CHECK(s.rem < s.p);
  }
}

TEST_CASE("tree: fold-in pairs are consistent and never a rank with itself") {
  for (int n = 1; n <= 7; ++n) {
    const TreeSchedule s(n);
    int dropped = 0;
    for (int r = 0; r < n; ++r) {
      CHECK(!(s.drops_out(r) && s.folds_in(r)));
      if (!s.drops_out(r) && !s.folds_in(r)) continue;
      const int q = s.fold_partner(r);
      CHECK(q != r && q >= 0 && q < n);
      CHECK_EQ(s.fold_partner(q), r);
      CHECK(s.drops_out(r) ? s.folds_in(q) : s.drops_out(q));
      dropped += s.drops_out(r);
    }
    CHECK_EQ(dropped, s.rem);
  }
}

TEST_CASE("tree: virtual ranks are 0..p-1 in rank order, rank_of inverts them") {
  for (int n = 1; n <= 7; ++n) {
    const TreeSchedule s(n);
    std::vector<int> vs;
    for (int r = 0; r < n; ++r) {
      if (s.drops_out(r)) continue;
      vs.push_back(s.vrank(r));
      CHECK_EQ(s.rank_of(s.vrank(r)), r);
    }
    std::vector<int> expect(static_cast<size_t>(s.p));
    for (int v = 0; v < s.p; ++v) expect[size_t(v)] = v;
    CHECK_EQ(vs, expect);  // also: strictly increasing with the rank
  }
}

TEST_CASE("tree: each round pairs ranks symmetrically, never with themselves or a dropped rank") {
  for (int n = 1; n <= 7; ++n) {
    const TreeSchedule s(n);
    for (int mask = 1; mask < s.p; mask <<= 1) {
      for (int r = 0; r < n; ++r) {
        if (s.drops_out(r)) continue;
        const int q = s.peer(r, mask);
        CHECK(q != r && q >= 0 && q < n);
        CHECK(!s.drops_out(q));
        CHECK_EQ(s.peer(q, mask), r);
      }
    }
  }
}

TEST_CASE("tree: completion-handshake partners are mutual") {
  for (int n = 1; n <= 7; ++n) {
    const TreeSchedule s(n);
    for (int r = 0; r < n; ++r) {
      const std::vector<int> mine = partners(s, r);
      for (int q : mine) {
        const std::vector<int> back = partners(s, q);
        CHECK(q != r);
        CHECK_EQ(std::count(back.begin(), back.end(), r), std::count(mine.begin(), mine.end(), q));
      }
    }
  }
}

TEST_CASE("tree: every rank ends with the same expression over all inputs in rank order") {
  for (int n = 1; n <= 7; ++n) {
    const std::vector<std::string> result = simulate(n);
    std::vector<int> expect(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) expect[size_t(r)] = r;
    for (int r = 0; r < n; ++r) {
      CHECK_EQ(result[size_t(r)], result[0]);      // bitwise identical everywhere
      CHECK_EQ(leaves(result[size_t(r)]), expect);  // each input once, in rank order
    }
  }
  CHECK_EQ(simulate(3)[0], "((0+1)+2)");
  CHECK_EQ(simulate(4)[3], "((0+1)+(2+3))");
  CHECK_EQ(simulate(6)[5], "(((0+1)+(2+3))+(4+5))");
}

CHECK_MAIN()
