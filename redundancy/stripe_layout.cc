#include "redundancy/stripe_layout.h"

#include <algorithm>

#include "util/assert.h"

namespace ckpt::redundancy {

StripeLayout::StripeLayout(uint32_t k, uint32_t m, uint64_t unit_bytes, uint64_t version)
    : k_(k), m_(m), unit_bytes_(unit_bytes), version_(version) {
  CKPTDB_ASSERT(k >= 1 && m >= 1 && k + m <= 32 && unit_bytes > 0);
}

uint32_t StripeLayout::Rotation(uint64_t stripe) const {
  const uint32_t g = members();
  return static_cast<uint32_t>((stripe % g + version_ % g) % g);
}

StripeLayout::Slot StripeLayout::DataSlot(uint32_t member, uint64_t unit) const {
  const uint32_t g = members();
  CKPTDB_ASSERT(member < g);
  const uint64_t window = unit / k_;
  const uint64_t nth = unit % k_;
  uint64_t seen = 0;
  // Bounded: G offsets, of which exactly K make `member` a data member.
  for (uint32_t offset = 0; offset < g; ++offset) {
    const uint64_t stripe = window * g + offset;
    const uint32_t index = (member + g - Rotation(stripe)) % g;
    if (index >= k_) continue;
    if (seen++ == nth) return {stripe, index};
  }
  CKPTDB_ASSERT(false);
  return {};
}

uint32_t StripeLayout::DataMember(uint64_t stripe, uint32_t index) const {
  CKPTDB_ASSERT(index < k_);
  return (Rotation(stripe) + index) % members();
}

uint64_t StripeLayout::DataUnit(uint64_t stripe, uint32_t index) const {
  const uint32_t g = members();
  const uint32_t member = DataMember(stripe, index);
  const uint64_t window = stripe / g;
  uint64_t before = 0;  // stripes earlier in the window in which `member` is a data member
  for (uint64_t s = window * g; s < stripe; ++s) {
    if ((member + g - Rotation(s)) % g < k_) ++before;
  }
  return window * k_ + before;
}

uint32_t StripeLayout::ParityMember(uint64_t stripe, uint32_t row) const {
  CKPTDB_ASSERT(row < m_);
  return (Rotation(stripe) + k_ + row) % members();
}

std::optional<uint32_t> StripeLayout::ParityRow(uint64_t stripe, uint32_t member) const {
  const uint32_t g = members();
  CKPTDB_ASSERT(member < g);
  const uint32_t index = (member + g - Rotation(stripe)) % g;
  if (index < k_) return std::nullopt;
  return index - k_;
}

uint64_t StripeLayout::Units(uint64_t segment_bytes) const {
  return (segment_bytes + unit_bytes_ - 1) / unit_bytes_;
}

uint64_t StripeLayout::UnitBytes(uint64_t segment_bytes, uint64_t unit) const {
  if (unit >= Units(segment_bytes)) return 0;
  return std::min(unit_bytes_, segment_bytes - unit * unit_bytes_);
}

uint64_t StripeLayout::Stripes(std::span<const uint64_t> member_bytes) const {
  CKPTDB_ASSERT(member_bytes.size() == members());
  uint64_t stripes = 0;
  for (uint32_t p = 0; p < members(); ++p) {
    const uint64_t units = Units(member_bytes[p]);
    if (units > 0) stripes = std::max(stripes, DataSlot(p, units - 1).stripe + 1);
  }
  return stripes;
}

uint64_t StripeLayout::StripeBytes(std::span<const uint64_t> member_bytes, uint64_t stripe) const {
  CKPTDB_ASSERT(member_bytes.size() == members());
  uint64_t bytes = 0;
  for (uint32_t i = 0; i < k_; ++i) {
    bytes = std::max(bytes, UnitBytes(member_bytes[DataMember(stripe, i)], DataUnit(stripe, i)));
  }
  return bytes;
}

std::vector<uint64_t> StripeLayout::ParityStripes(uint32_t member, uint64_t stripes) const {
  std::vector<uint64_t> out;
  for (uint64_t s = 0; s < stripes; ++s) {
    if (ParityRow(s, member)) out.push_back(s);
  }
  return out;
}

}  // namespace ckpt::redundancy
