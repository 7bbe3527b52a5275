// A vector's memory kept for the next user of the same size. A vector of megabytes is mapped
// afresh by malloc each time and faulted in a page at a time; on a paravirtualized guest those
// faults cost a third of a batched put of 5,000 small shards (docs/performance.md, "Many small
// tensors"). Where every version builds vectors of about the same size, the one given back is
// handed to the next Take, cleared but with its capacity, its pages still mapped.
#pragma once

#include <cstddef>
#include <mutex>
#include <utility>
#include <vector>

namespace ckpt {

template <class T>
class SpareVector {
 public:
  // Keeps at most one vector, of at most max_bytes of capacity.
  explicit SpareVector(size_t max_bytes) : max_bytes_(max_bytes) {}
  SpareVector(const SpareVector&) = delete;
  SpareVector& operator=(const SpareVector&) = delete;

  // The kept vector (empty, with its capacity), or a new one.
  std::vector<T> Take() {
    std::lock_guard<std::mutex> guard(mu_);
    std::vector<T> taken = std::move(spare_);
    spare_ = std::vector<T>();
    return taken;
  }

  // Keeps `v`'s memory for the next Take if it is larger than what is kept and within the limit;
  // its elements are destroyed either way.
  void Give(std::vector<T>&& v) {
    v.clear();
    if (v.capacity() * sizeof(T) > max_bytes_) return;
    std::lock_guard<std::mutex> guard(mu_);
    if (v.capacity() > spare_.capacity()) spare_ = std::move(v);
  }

 private:
  const size_t max_bytes_;
  std::mutex mu_;
  std::vector<T> spare_;  // empty; only its capacity counts
};

}  // namespace ckpt
