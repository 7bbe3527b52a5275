// StripeLayout: where a coding group's bytes go (DESIGN.md section 7; ECHECK's data and parity
// chunks, ../shared/papers/echeck.txt section III-B; the rotation of RAID 5 and 6).
//
// A coding group is G = K + M ranks on G distinct nodes (its members, in position order 0..G-1).
// Each member keeps its own segment in its own memory, so that it restores from there; the code
// adds parity, held by the other members. Each member's segment image is cut into units of
// unit_bytes (the last one shorter). Stripe s is K data units of K members and the M parity
// units the code computes from them, held by the other M members:
//
//   t(s)      = (s + version) mod G          the stripe's rotation
//   data      = members t, t+1, ..., t+K-1   (mod G), data block index 0..K-1
//   parity    = members t+K, ..., t+G-1      (mod G), parity row 0..M-1
//
// so in every G consecutive stripes each member is a data member K times and holds parity M
// times: parity load is even within a version, and the version shifts which member starts.
// Member p's units fill, in order, the stripes in which p is a data member: its unit j lies in
// the (j mod K)-th such stripe of window j div K (stripes G*w .. G*w + G-1). A unit past a
// member's segment (segments are of unequal length) is zeros, logically: nothing stores or sends
// it, and a stripe's parity is as long as its longest data unit.
//
// Losing any M members loses at most M blocks of every stripe, and the K left decode it
// (redundancy/erasure_code.h). Memory: a member's parity is M/K of the group's mean segment (more
// where segments differ in length: stripes run as far as the longest member needs).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace ckpt::redundancy {

class StripeLayout {
 public:
  // 1 <= k, 1 <= m, k + m <= 32, unit_bytes > 0 (Cluster uses a multiple of 4096).
  StripeLayout(uint32_t k, uint32_t m, uint64_t unit_bytes, uint64_t version);

  uint32_t k() const { return k_; }
  uint32_t m() const { return m_; }
  uint32_t members() const { return k_ + m_; }
  uint64_t unit_bytes() const { return unit_bytes_; }
  uint64_t version() const { return version_; }

  struct Slot {
    uint64_t stripe = 0;
    uint32_t index = 0;  // data block index in the stripe, 0..K-1
  };
  // Where member `member`'s unit `unit` lies.
  Slot DataSlot(uint32_t member, uint64_t unit) const;
  // Stripe `stripe`'s data block `index`: whose, and which of its units.
  uint32_t DataMember(uint64_t stripe, uint32_t index) const;
  uint64_t DataUnit(uint64_t stripe, uint32_t index) const;
  // Stripe `stripe`'s parity row `row`: who holds it.
  uint32_t ParityMember(uint64_t stripe, uint32_t row) const;
  // The parity row `member` holds in `stripe`; nullopt where it is a data member.
  std::optional<uint32_t> ParityRow(uint64_t stripe, uint32_t member) const;

  // Units of a segment of `segment_bytes`, and the bytes of its unit `unit` (0 past its end).
  uint64_t Units(uint64_t segment_bytes) const;
  uint64_t UnitBytes(uint64_t segment_bytes, uint64_t unit) const;
  // Stripes of a version whose members' segments are member_bytes (one per member, 0 for none).
  uint64_t Stripes(std::span<const uint64_t> member_bytes) const;
  // The bytes of stripe `stripe`'s blocks: its longest data unit.
  uint64_t StripeBytes(std::span<const uint64_t> member_bytes, uint64_t stripe) const;
  // The stripes in [0, stripes) in which `member` holds parity, in order.
  std::vector<uint64_t> ParityStripes(uint32_t member, uint64_t stripes) const;

 private:
  uint32_t Rotation(uint64_t stripe) const;
  const uint32_t k_, m_;
  const uint64_t unit_bytes_, version_;
};

}  // namespace ckpt::redundancy
