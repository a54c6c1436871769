// The node pool (csrc/base/node_pool.h): erased elements' nodes are kept,
// reset, and reused by later insertions, keeping a long key's buffer; a node
// that insert() hands back (a key already there) returns to the pool; the
// containers behave as without it.
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
  NodePool<Map> pool;
  CHECK(!pool.take());  // nothing kept yet
  auto value = std::make_shared<int>(7);
  m.emplace(kLong + "a", value);
  CHECK_EQ(value.use_count(), 2L);
  int resets = 0;
  CHECK_EQ(pool.erase(m, kLong + "a", [&](Map::node_type& n) { ++resets; n.mapped().reset(); }), size_t(1));
  CHECK_EQ(resets, 1);
  CHECK(m.empty());
  CHECK_EQ(value.use_count(), 1L);  // the kept node owns nothing any more
  CHECK_EQ(pool.erase(m, std::string("absent"), [&](Map::node_type&) { ++resets; }), size_t(0));
  CHECK_EQ(resets, 1);

  Map::node_type n = pool.take();
  CHECK(static_cast<bool>(n));
  const char* buffer = n.key().data();
  const std::string next = kLong + "b";
  n.key() = next;  // (copied into the kept buffer: as the engine assigns its keys)
  CHECK(n.key().data() == buffer);
  n.mapped() = std::make_shared<int>(8);
  auto r = m.insert(std::move(n));
  CHECK(r.inserted);
  CHECK_EQ(*m.at(kLong + "b"), 8);
  CHECK(!pool.take());  // the one kept node is in use again
}

TEST_CASE("a node insert() hands back returns to the pool; iterators erase too") {
  using Set = std::unordered_set<std::string>;
  Set s{kLong};
  NodePool<Set> pool;
  pool.erase(s, s.find(kLong), [](Set::node_type&) {});
  CHECK(s.empty());
  s.insert("taken");
  Set::node_type n = pool.take();
  n.value() = "taken";
  auto r = s.insert(std::move(n));
  CHECK(!r.inserted);  // a duplicate: the node comes back in r.node
  CHECK_EQ(s.size(), size_t(1));
  pool.give_back(std::move(r.node));
  pool.give_back(Set::node_type());  // (an empty handle is ignored)
  Set::node_type again = pool.take();
  CHECK(static_cast<bool>(again));
  CHECK(!pool.take());
}

TEST_CASE("the pool keeps a bounded number of nodes") {
  using Map = std::unordered_map<int, int>;
  Map m;
  NodePool<Map> pool;
  const int n = 5000;
  for (int i = 0; i < n; ++i) m.emplace(i, i);
  for (int i = 0; i < n; ++i) pool.erase(m, i, [](Map::node_type&) {});
  CHECK(m.empty());
  int kept = 0;
  while (pool.take()) ++kept;
  CHECK_EQ(kept, 4096);
}

CHECK_MAIN()
