#include "base/result_pool.h"

#include <malloc.h>

#include <cstdlib>
#include <mutex>
#include <new>
#include <vector>

#include "base/config.h"

namespace commlib {
namespace {

// Smaller buffers are recycled well enough by malloc itself.
constexpr size_t kMinCached = size_t(8) << 20;

struct Pool {
  std::mutex mu;
  std::vector<std::pair<void*, size_t>> free;  // buffer, usable bytes
  size_t cached = 0;
  size_t limit = size_t(Config::defaults().result_cache_bytes);  // set at init
};

Pool& pool() {
  static Pool* p = new Pool();  // never destroyed: results may be freed at exit
  return *p;
}

}  // namespace

void result_pool_set_limit(size_t bytes) {
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mu);
  p.limit = bytes;
}

char* result_alloc(size_t bytes) {
  if (bytes >= kMinCached) {
    Pool& p = pool();
    std::lock_guard<std::mutex> lock(p.mu);
    // The smallest cached buffer that fits without wasting more than half.
    size_t best = p.free.size();
    for (size_t i = 0; i < p.free.size(); ++i) {
      const size_t cap = p.free[i].second;
      if (cap >= bytes && cap / 2 <= bytes && (best == p.free.size() || cap < p.free[best].second)) best = i;
    }
    if (best != p.free.size()) {
      void* buf = p.free[best].first;
      p.cached -= p.free[best].second;
      p.free.erase(p.free.begin() + long(best));
      return static_cast<char*>(buf);
    }
  }
  void* buf = std::malloc(bytes ? bytes : 1);
  if (!buf) throw std::bad_alloc();
  return static_cast<char*>(buf);
}

void result_free(void* buf) {
  if (!buf) return;
  const size_t cap = malloc_usable_size(buf);
  if (cap >= kMinCached) {
    Pool& p = pool();
    std::lock_guard<std::mutex> lock(p.mu);
    // Room for it: drop the oldest cached buffers first.
    while (!p.free.empty() && p.cached + cap > p.limit) {
      p.cached -= p.free.front().second;
      std::free(p.free.front().first);
      p.free.erase(p.free.begin());
    }
    if (p.cached + cap <= p.limit) {
      p.free.emplace_back(buf, cap);
      p.cached += cap;
      return;
    }
  }
  std::free(buf);
}

}  // namespace commlib
