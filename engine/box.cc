#include "engine/box.h"

#include <algorithm>

#include "util/assert.h"

namespace ckpt::engine {

bool Box::Volume(uint64_t* out) const {
  uint64_t v = 1;
  for (uint64_t s : shape) {
    if (s != 0 && v > UINT64_MAX / s) return false;
    v *= s;
  }
  *out = v;
  return true;
}

std::string Box::ToString() const {
  std::string s = "[";
  for (size_t d = 0; d < ndim(); ++d) {
    s += (d ? ", " : "") + std::to_string(offset[d]) + ":" + std::to_string(offset[d] + shape[d]);
  }
  return s + "]";
}

bool Intersect(const Box& a, const Box& b, Box* out) {
  CKPTDB_ASSERT(a.ndim() == b.ndim() && a.offset.size() == a.ndim() && b.offset.size() == b.ndim());
  out->offset.resize(a.ndim());
  out->shape.resize(a.ndim());
  for (size_t d = 0; d < a.ndim(); ++d) {
    const uint64_t lo = std::max(a.offset[d], b.offset[d]);
    const uint64_t hi = std::min(a.offset[d] + a.shape[d], b.offset[d] + b.shape[d]);
    if (hi <= lo) return false;
    out->offset[d] = lo;
    out->shape[d] = hi - lo;
  }
  return true;
}

void ForEachRun(const Box& part, const Box& from, const Box& to, uint64_t element_bytes,
                const std::function<void(uint64_t, uint64_t, uint64_t)>& run) {
  const size_t n = part.ndim();
  CKPTDB_ASSERT(from.ndim() == n && to.ndim() == n);
  for (size_t d = 0; d < n; ++d) {
    CKPTDB_ASSERT(part.offset[d] >= from.offset[d] &&
                  part.offset[d] + part.shape[d] <= from.offset[d] + from.shape[d]);
    CKPTDB_ASSERT(part.offset[d] >= to.offset[d] &&
                  part.offset[d] + part.shape[d] <= to.offset[d] + to.shape[d]);
    if (part.shape[d] == 0) return;
  }
  // Row-major strides, in elements.
  std::vector<uint64_t> from_stride(n, 1), to_stride(n, 1);
  for (size_t d = n; d-- > 1;) {
    from_stride[d - 1] = from_stride[d] * from.shape[d];
    to_stride[d - 1] = to_stride[d] * to.shape[d];
  }
  // Dimensions k.. form one run when each of k+1.. is whole in part, from and to.
  size_t k = n;
  uint64_t run_elements = 1;
  while (k > 0) {
    const size_t d = k - 1;
    run_elements *= part.shape[d];
    k = d;
    if (part.shape[d] != from.shape[d] || part.shape[d] != to.shape[d]) break;
  }
  // Odometer over dimensions 0..k-1.
  std::vector<uint64_t> index(k, 0);
  const uint64_t run_bytes = run_elements * element_bytes;
  while (true) {
    uint64_t f = 0, t = 0;
    for (size_t d = 0; d < n; ++d) {
      const uint64_t at = part.offset[d] + (d < k ? index[d] : 0);
      f += (at - from.offset[d]) * from_stride[d];
      t += (at - to.offset[d]) * to_stride[d];
    }
    run(f * element_bytes, t * element_bytes, run_bytes);
    size_t d = k;
    while (d > 0) {
      --d;
      if (++index[d] < part.shape[d]) break;
      index[d] = 0;
      if (d == 0) return;
    }
    if (k == 0) return;
  }
}

}  // namespace ckpt::engine
