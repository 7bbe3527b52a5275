#include "engine/staging_ring.h"

#include <algorithm>

#include "util/assert.h"

namespace ckpt {

StagingRing::StagingRing(uint64_t capacity, uint64_t alignment)
    : capacity_(capacity), alignment_(alignment) {
  CKPTDB_ASSERT(capacity > 0 && alignment > 0);
  CKPTDB_ASSERT((alignment & (alignment - 1)) == 0);
  CKPTDB_ASSERT(capacity % alignment == 0);
}

bool StagingRing::IsFree(uint64_t offset, uint64_t bytes) const {
  if (offset > capacity_ || bytes > capacity_ - offset) return false;
  // The first live region starting at or after offset must start at or after the end...
  auto next = live_.lower_bound(offset);
  if (next != live_.end() && next->first < offset + bytes) return false;
  // ...and the last one starting before offset must end at or before offset.
  if (next != live_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second > offset) return false;
  }
  return true;
}

bool StagingRing::Allocate(uint64_t bytes, Region* out) {
  CKPTDB_ASSERT(bytes > 0 && out != nullptr);
  if (bytes > capacity_) return false;
  bytes = (bytes + alignment_ - 1) & ~(alignment_ - 1);
  // Candidate starts: the cursor, then the end of every live region after it, then 0 and the end
  // of every live region before the cursor. A free run of `bytes` anywhere starts either at 0 or
  // right after a live region, so this finds one whenever one exists. Bounded: each live region
  // is visited at most twice.
  uint64_t found = UINT64_MAX;
  auto try_at = [&](uint64_t start) {
    if (found == UINT64_MAX && IsFree(start, bytes)) found = start;
  };
  try_at(cursor_);
  for (auto it = live_.lower_bound(cursor_); it != live_.end() && found == UINT64_MAX; ++it) {
    try_at(it->first + it->second);
  }
  try_at(0);
  for (auto it = live_.begin(); it != live_.end() && it->first < cursor_ && found == UINT64_MAX;
       ++it) {
    try_at(it->first + it->second);
  }
  if (found == UINT64_MAX) return false;
  live_.emplace(found, bytes);
  live_bytes_ += bytes;
  high_water_bytes_ = std::max(high_water_bytes_, live_bytes_);
  cursor_ = found + bytes == capacity_ ? 0 : found + bytes;
  out->offset = found;
  out->bytes = bytes;
  CheckInvariants();
  return true;
}

void StagingRing::Free(const Region& region) {
  auto it = live_.find(region.offset);
  CKPTDB_ASSERT(it != live_.end());           // freeing a region that is not live
  CKPTDB_ASSERT(it->second == region.bytes);  // ... or not the one handed out
  live_bytes_ -= it->second;
  live_.erase(it);
  CheckInvariants();
}

bool StagingRing::Claim(const Region& region) {
  if (region.bytes == 0 || region.offset % alignment_ != 0 || region.bytes % alignment_ != 0 ||
      !IsFree(region.offset, region.bytes)) {
    return false;
  }
  live_.emplace(region.offset, region.bytes);
  live_bytes_ += region.bytes;
  high_water_bytes_ = std::max(high_water_bytes_, live_bytes_);
  CheckInvariants();
  return true;
}

bool StagingRing::Resize(uint64_t capacity) {
  CKPTDB_ASSERT(capacity > 0 && capacity % alignment_ == 0);
  if (!live_.empty()) {
    auto last = std::prev(live_.end());
    if (last->first + last->second > capacity) return false;
  }
  capacity_ = capacity;
  if (cursor_ >= capacity_) cursor_ = 0;
  CheckInvariants();
  return true;
}

uint64_t StagingRing::LargestFreeRun() const {
  uint64_t largest = 0;
  uint64_t end = 0;  // end of the previous live region
  for (const auto& [offset, bytes] : live_) {
    largest = std::max(largest, offset - end);
    end = offset + bytes;
  }
  return std::max(largest, capacity_ - end);
}

void StagingRing::CheckInvariants() const {
  CKPTDB_ASSERT(cursor_ < capacity_);
  CKPTDB_ASSERT(live_bytes_ <= capacity_);
  // The full walk is linear in the live regions: kept on while they are few (a ring of 4 MiB
  // chunks holds tens); beyond that, disjointness holds by construction (IsFree before insert).
  if (live_.size() > kFullCheckRegions) return;
  // Disjoint, in bounds, aligned, and summing to live_bytes_.
  uint64_t end = 0;
  uint64_t sum = 0;
  for (const auto& [offset, bytes] : live_) {
    CKPTDB_ASSERT(offset >= end);
    CKPTDB_ASSERT(bytes > 0 && bytes <= capacity_ - offset);
    CKPTDB_ASSERT(offset % alignment_ == 0 && bytes % alignment_ == 0);
    end = offset + bytes;
    sum += bytes;
  }
  CKPTDB_ASSERT(sum == live_bytes_);
}

}  // namespace ckpt
