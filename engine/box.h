// Box: a rectangular region of an n-dimensional tensor, and the byte runs that copy one box's
// elements between two others' row-major layouts (ckptdb_restore_slice, docs/api.md
// "Resharding").
//
// A shard saved with a global shape and offset is the box [offset, offset + shape) of its
// global tensor, stored in row-major (C) order. A resharding restore asks for another box of the
// same tensor: what it gets from one shard is the intersection of the two, which lies in both
// layouts as runs of contiguous bytes. Runs are as long as the layouts allow: trailing
// dimensions that the intersection, the shard and the request all span whole merge into one.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ckpt::engine {

struct Box {
  std::vector<uint64_t> offset;  // ndim entries
  std::vector<uint64_t> shape;   // ndim entries

  size_t ndim() const { return shape.size(); }
  // The number of elements; false when it overflows 64 bits.
  bool Volume(uint64_t* out) const;
  std::string ToString() const;  // "[2:4, 0:8]" (Python's slice notation, end exclusive)
};

// The intersection of a and b (of equal ndim); false when it is empty. A 0-dimensional box (a
// scalar) meets another 0-dimensional box.
bool Intersect(const Box& a, const Box& b, Box* out);

// Calls run(from_byte, to_byte, bytes) for each contiguous run of `part`, which must lie inside
// both `from` and `to`, in increasing order of both offsets: from_byte is the run's offset in
// from's row-major layout, to_byte in to's, each element `element_bytes` long.
void ForEachRun(
    const Box& part, const Box& from, const Box& to, uint64_t element_bytes,
    const std::function<void(uint64_t from_byte, uint64_t to_byte, uint64_t bytes)>& run);

}  // namespace ckpt::engine
