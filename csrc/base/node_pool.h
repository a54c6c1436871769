// Spare nodes of a node-based standard container (C++17 node handles),
// reused by later insertions.
//
// A training step inserts and erases the same keys step after step: each
// request's handle, its name in the set of names in flight, its pending
// entry, its response cache bit. Each insertion would otherwise allocate a
// node (and, for a name longer than a short string holds, the name's
// buffer) and each erasure free it again, which was almost half of the
// core's own instructions per small request. A kept node keeps its key's
// buffer (a key copied into it, not moved, reuses it); the pool's `reset`
// (given at construction) releases what its value owns, so that nothing
// outlives the erasure.
//
// Not thread-safe: used under the lock (or on the thread) that guards the
// container.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace commlib {

template <typename Container>
class NodePool {
 public:
  using Node = typename Container::node_type;
  using Iterator = typename Container::iterator;

  explicit NodePool(void (*reset)(Node&) = nullptr) : reset_(reset) {}

  // Erases the element at `it` (or with `key`: returns how many it
  // erased), keeping its node.
  void erase(Container& c, typename Container::const_iterator it) { keep(c.extract(it)); }
  template <typename Key>
  size_t erase(Container& c, const Key& key) {
    Node n = c.extract(key);
    if (!n) return 0;
    keep(std::move(n));
    return 1;
  }

  // As c.emplace(key, value) of a map (nothing inserted, and value dropped,
  // when key is there), through a kept node when there is one.
  template <typename Key, typename Value>
  std::pair<Iterator, bool> emplace(Container& c, const Key& key, Value&& value) {
    Node n = take();
    if (!n) return c.emplace(key, std::forward<Value>(value));
    n.key() = key;
    n.mapped() = std::forward<Value>(value);
    return insert_node(c, std::move(n));
  }

  // As c.insert(key) of a set, through a kept node when there is one.
  template <typename Key>
  std::pair<Iterator, bool> insert(Container& c, const Key& key) {
    Node n = take();
    if (!n) return c.insert(key);
    n.value() = key;
    return insert_node(c, std::move(n));
  }

  size_t kept() const { return spare_.size(); }

 private:
  // (a burst of requests larger than this frees the rest as before)
  static constexpr size_t kMaxSpare = 4096;

  Node take() {
    if (spare_.empty()) return Node();
    Node n = std::move(spare_.back());
    spare_.pop_back();
    return n;
  }

  std::pair<Iterator, bool> insert_node(Container& c, Node n) {
    auto r = c.insert(std::move(n));
    keep(std::move(r.node));  // (the node back when the key was there)
    return {r.position, r.inserted};
  }

  void keep(Node n) {
    if (!n || spare_.size() >= kMaxSpare) return;
    if (reset_) reset_(n);
    spare_.push_back(std::move(n));
  }

  void (*reset_)(Node&);
  std::vector<Node> spare_;
};

}  // namespace commlib
