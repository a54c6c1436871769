// Spare nodes of a node-based standard container (C++17 node handles),
// reused by later insertions.
//
// A training step inserts and erases the same keys step after step: each
// request's handle, its name in the set of names in flight, its pending
// entry, its response cache bit. Each insertion would otherwise allocate a
// node (and, for a name longer than a short string holds, the name's
// buffer) and each erasure free it again, which was almost half of the
// core's own instructions per small request. A kept node keeps its key's
// buffer (a key copied into it, not moved, reuses it); its mapped value is
// reset (``reset``) so that nothing it owned outlives the erasure.
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

  // Erases the element at `it` (or with `key`: returns how many it
  // erased), keeping its node; `reset` is called on the node first (to
  // release what its value owns).
  template <typename Reset>
  void erase(Container& c, typename Container::const_iterator it, Reset reset) {
    keep(c.extract(it), reset);
  }
  template <typename Key, typename Reset>
  size_t erase(Container& c, const Key& key, Reset reset) {
    Node n = c.extract(key);
    if (!n) return 0;
    keep(std::move(n), reset);
    return 1;
  }

  // A kept node (empty when none is kept).
  Node take() {
    if (spare_.empty()) return Node();
    Node n = std::move(spare_.back());
    spare_.pop_back();
    return n;
  }

  // Gives back a node that insert() returned (its key was there already).
  void give_back(Node n) {
    if (n && spare_.size() < kMaxSpare) spare_.push_back(std::move(n));
  }

 private:
  // (a burst of requests larger than this frees the rest as before)
  static constexpr size_t kMaxSpare = 4096;

  template <typename Reset>
  void keep(Node n, Reset reset) {
    if (!n || spare_.size() >= kMaxSpare) return;
    reset(n);
    spare_.push_back(std::move(n));
  }

  std::vector<Node> spare_;
};

}  // namespace commlib
