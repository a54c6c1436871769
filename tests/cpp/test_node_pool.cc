// The node pool (csrc/base/node_pool.h): erased elements' nodes are kept,
// reset, and reused by later insertions, keeping a long key's buffer; a
// duplicate key's node comes back to the pool with its value dropped, as
// emplace() drops it; the containers behave as without it.
//
// csrc:
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "base/node_pool.h"
#include "check.h"

using commlib::NodePool;

namespace {
const std::string kLong(64, 'x');
}

TEST_CASE("an erased node is reset, kept and reused with its key's buffer") {
  using Map = std::unordered_map<std::string, std::shared_ptr<int>>;
  Map m;
  NodePool<Map> pool([](Map::node_type& n) { n.mapped().reset(); });
  auto value = std::make_shared<int>(7);
  CHECK(pool.emplace(m, kLong + "a", value).second);  // (nothing kept yet: a plain emplace)
  CHECK_EQ(value.use_count(), 2L);
  const char* buffer = m.begin()->first.data();
  CHECK_EQ(pool.erase(m, kLong + "a"), size_t(1));
  CHECK(m.empty());
  CHECK_EQ(value.use_count(), 1L);  // the kept node owns nothing any more
  CHECK_EQ(pool.kept(), size_t(1));
  CHECK_EQ(pool.erase(m, std::string("absent")), size_t(0));

  const std::string next = kLong + "b";  // (copied into the kept buffer, as the engine's keys are)
  auto r = pool.emplace(m, next, std::make_shared<int>(8));
  CHECK(r.second);
  CHECK(r.first->first.data() == buffer);
  CHECK_EQ(*m.at(next), 8);
  CHECK_EQ(pool.kept(), size_t(0));
}

TEST_CASE("a duplicate key inserts nothing, drops the value and keeps the node") {
  using Map = std::unordered_map<int, std::shared_ptr<int>>;
  Map m;
  NodePool<Map> pool([](Map::node_type& n) { n.mapped().reset(); });
  pool.emplace(m, 1, std::make_shared<int>(1));
  pool.emplace(m, 2, std::make_shared<int>(2));
  pool.erase(m, m.find(2));
  CHECK_EQ(pool.kept(), size_t(1));
  auto dropped = std::make_shared<int>(3);
  auto r = pool.emplace(m, 1, dropped);
  CHECK(!r.second);
  CHECK_EQ(*r.first->second, 1);  // the element there stays
  CHECK_EQ(dropped.use_count(), 1L);  // the node that came back was reset
  CHECK_EQ(pool.kept(), size_t(1));

  using Set = std::unordered_set<std::string>;
  Set s;
  NodePool<Set> names;
  CHECK(names.insert(s, kLong).second);
  CHECK(!names.insert(s, kLong).second);
  names.erase(s, kLong);
  CHECK(s.empty());
  CHECK(names.insert(s, kLong + "c").second);  // (through the kept node)
  CHECK_EQ(s.count(kLong + "c"), size_t(1));
  CHECK(!names.insert(s, kLong + "c").second);  // (a plain insert, nothing kept)
  CHECK_EQ(names.kept(), size_t(0));
}

TEST_CASE("the pool keeps a bounded number of nodes") {
  using Map = std::unordered_map<int, int>;
  Map m;
  NodePool<Map> pool;
  const int n = 5000;
  for (int i = 0; i < n; ++i) m.emplace(i, i);
  for (int i = 0; i < n; ++i) pool.erase(m, i);
  CHECK(m.empty());
  CHECK_EQ(pool.kept(), size_t(4096));
}

CHECK_MAIN()
