// The parity a coding group's members hold for each other (engine/parity_store.h), built the way
// Cluster builds it: every member announces its segment's length, then sends each of its units
// to the holders of its stripe's parity, in any order and in pieces, then says it is done. The
// parity segments that result are read back as segments (every block's xxh3 checked) and, for
// every set of up to M lost members, the lost members' bytes are decoded from what the others
// hold and compared with the originals.
#include "engine/parity_store.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <random>

#include "ckptdb/ckptdb.h"
#include "format/segment_reader.h"
#include "tests/test_util.h"

namespace ckpt::engine {
namespace {

namespace fs = std::filesystem;
using redundancy::CodeScheme;
using redundancy::CodeSpec;
using redundancy::ErasureCode;
using redundancy::ParseCodeSpec;
using redundancy::StripeLayout;

struct Group {
  CodingGroup shape;
  uint64_t version = 0;
  std::vector<std::string> images;  // each member's segment (any bytes: the store never parses)
  std::vector<std::unique_ptr<ParityStore>> stores;
};

// A group of the code `spec`, members ranks 10, 11, ..., images of the given lengths.
Group MakeGroup(const test::TempDir& dir, CodeSpec spec, uint64_t unit, uint64_t version,
                const std::vector<uint64_t>& lengths, uint64_t budget = 0) {
  Group g;
  g.shape.code = spec;
  g.shape.group = 7;
  g.shape.unit_bytes = unit;
  g.version = version;
  const uint32_t n = spec.k + spec.m;
  for (uint32_t p = 0; p < n; ++p) g.shape.members.push_back(10 + p);
  std::mt19937_64 rng(version * 31 + n);
  for (uint32_t p = 0; p < n; ++p) {
    std::string image(lengths[p], '\0');
    for (char& c : image) c = static_cast<char>(rng());
    g.images.push_back(std::move(image));
    ParityStore::Writer w{0x5EED, 10 + p, 64, "node" + std::to_string(p)};
    std::unique_ptr<ParityStore> store;
    EXPECT_TRUE(
        ParityStore::Open(nullptr, dir.Sub("m" + std::to_string(p)), w, 2, budget, &store).ok());
    g.stores.push_back(std::move(store));
  }
  return g;
}

// Every member announces and sends all of its units, each in two pieces, in a shuffled order.
Status Build(Group& g, uint64_t seed, bool replace_sealed = false) {
  const uint32_t n = g.shape.code.k + g.shape.code.m;
  StripeLayout layout(g.shape.code.k, g.shape.code.m, g.shape.unit_bytes, g.version);
  for (uint32_t p = 0; p < n; ++p) {
    for (uint32_t q = 0; q < n; ++q) {
      CKPTDB_RETURN_IF_ERROR(g.stores[q]->Announce(g.shape, g.version, p, g.images[p].size(),
                                                   "announce", replace_sealed));
    }
  }
  for (uint32_t q = 0; q < n; ++q) {
    CKPTDB_RETURN_IF_ERROR(g.stores[q]->Layout(g.shape.group, g.version, "layout"));
  }
  struct Piece {
    uint32_t member, holder;
    uint64_t unit, offset, bytes;
  };
  std::vector<Piece> pieces;
  for (uint32_t p = 0; p < n; ++p) {
    const uint64_t units = layout.Units(g.images[p].size());
    for (uint64_t j = 0; j < units; ++j) {
      const uint64_t stripe = layout.DataSlot(p, j).stripe;
      const uint64_t bytes = layout.UnitBytes(g.images[p].size(), j);
      const uint64_t half = bytes / 2;
      for (uint32_t r = 0; r < g.shape.code.m; ++r) {
        const uint32_t holder = layout.ParityMember(stripe, r);
        if (half > 0) pieces.push_back({p, holder, j, 0, half});
        pieces.push_back({p, holder, j, half, bytes - half});
      }
    }
  }
  std::shuffle(pieces.begin(), pieces.end(), std::mt19937_64(seed));
  // Encoded at the senders, each piece goes as the sender's partial for the holder's row.
  std::unique_ptr<ErasureCode> code;
  CKPTDB_RETURN_IF_ERROR(ErasureCode::Make(g.shape.code, &code));
  const bool at_sender = g.shape.code.encoding == redundancy::Encoding::kSender;
  std::vector<uint8_t> partial;
  for (const Piece& pc : pieces) {
    const uint8_t* data = reinterpret_cast<const uint8_t*>(g.images[pc.member].data()) +
                          pc.unit * g.shape.unit_bytes + pc.offset;
    if (at_sender) {
      const StripeLayout::Slot slot = layout.DataSlot(pc.member, pc.unit);
      const uint32_t row = *layout.ParityRow(slot.stripe, pc.holder);
      partial.resize(pc.bytes);
      uint8_t* out = partial.data();
      code->Partial(pc.bytes, slot.index, data, {&row, 1}, &out);
      data = partial.data();
    }
    CKPTDB_RETURN_IF_ERROR(g.stores[pc.holder]->Accumulate(
        g.shape.group, g.version, pc.member, pc.unit, pc.offset, {data, pc.bytes}, "piece"));
  }
  for (uint32_t p = 0; p < n; ++p) {
    for (uint32_t q = 0; q < n; ++q) {
      CKPTDB_RETURN_IF_ERROR(g.stores[q]->Done(g.shape.group, g.version, p, "done"));
    }
  }
  for (uint32_t q = 0; q < n; ++q) {
    CKPTDB_RETURN_IF_ERROR(g.stores[q]->Sealed(g.shape.group, g.version, "sealed"));
  }
  return Status::Ok();
}

// Opens member q's sealed parity segment as a segment (framing, manifest, every block's xxh3).
Status OpenParity(Group& g, uint32_t q, std::shared_ptr<MappedFile>* map,
                  std::unique_ptr<format::SegmentReader>* reader) {
  *map = g.stores[q]->Find(g.shape.group, g.version);
  if (*map == nullptr) return Status::NotFound("no parity on member " + std::to_string(q));
  const uint8_t* base = (*map)->data();
  const uint64_t size = (*map)->bytes();
  CKPTDB_RETURN_IF_ERROR(format::SegmentReader::Open(
      "parity of member " + std::to_string(q), size,
      [base, size](uint64_t off, void* buf, size_t len) {
        if (off > size || len > size - off) return Status::Corrupt("past the end");
        std::memcpy(buf, base + off, len);
        return Status::Ok();
      },
      reader));
  for (uint32_t i = 0; i < (*reader)->manifest().chunk_count(); ++i) {
    format::ChunkProblem problem;
    const auto& c = (*reader)->manifest().chunk(i);
    CKPTDB_RETURN_IF_ERROR((*reader)->CheckRecord(i, base + c.record_offset(), &problem));
  }
  return Status::Ok();
}

// Decodes member `lost`'s whole image from the members not in `lost_mask`.
std::string Reconstruct(Group& g, uint32_t lost, uint32_t lost_mask) {
  const CodeSpec& spec = g.shape.code;
  const uint32_t n = spec.k + spec.m;
  StripeLayout layout(spec.k, spec.m, g.shape.unit_bytes, g.version);
  std::vector<uint64_t> bytes;
  for (const auto& image : g.images) bytes.push_back(image.size());
  std::unique_ptr<ErasureCode> code;
  EXPECT_TRUE(ErasureCode::Make(spec, &code).ok());
  std::vector<std::shared_ptr<MappedFile>> maps(n);
  std::vector<std::unique_ptr<format::SegmentReader>> readers(n);
  for (uint32_t q = 0; q < n; ++q) {
    if (!(lost_mask & (1u << q))) EXPECT_TRUE(OpenParity(g, q, &maps[q], &readers[q]).ok());
  }
  std::string out(g.images[lost].size(), '\0');
  for (uint64_t j = 0; j < layout.Units(bytes[lost]); ++j) {
    const auto slot = layout.DataSlot(lost, j);
    const uint64_t stripe_bytes = layout.StripeBytes(bytes, slot.stripe);
    std::vector<std::string> blocks;
    std::vector<uint32_t> index;
    for (uint32_t i = 0; i < spec.k && index.size() < spec.k; ++i) {
      const uint32_t p = layout.DataMember(slot.stripe, i);
      if (lost_mask & (1u << p)) continue;
      std::string block(stripe_bytes, '\0');
      const uint64_t unit = layout.DataUnit(slot.stripe, i);
      std::memcpy(block.data(), g.images[p].data() + unit * g.shape.unit_bytes,
                  layout.UnitBytes(bytes[p], unit));
      blocks.push_back(std::move(block));
      index.push_back(i);
    }
    for (uint32_t r = 0; r < spec.m && index.size() < spec.k; ++r) {
      const uint32_t q = layout.ParityMember(slot.stripe, r);
      if (lost_mask & (1u << q)) continue;
      char name[64];
      std::snprintf(name, sizeof name, "parity/s%020llur%02u",
                    static_cast<unsigned long long>(slot.stripe), r);
      const fb::Tensor* t = readers[q]->manifest().Find(name);
      EXPECT_NE(t, nullptr) << name;
      if (t == nullptr) return "";
      EXPECT_EQ(t->bytes(), stripe_bytes);
      const auto& c = readers[q]->manifest().chunk(t->first_chunk());
      blocks.emplace_back(
          reinterpret_cast<const char*>(maps[q]->data()) + c.record_offset() + format::kBlockBytes,
          stripe_bytes);
      index.push_back(spec.k + r);
    }
    EXPECT_EQ(index.size(), spec.k);
    std::vector<const uint8_t*> present;
    for (const auto& b : blocks) present.push_back(reinterpret_cast<const uint8_t*>(b.data()));
    std::string unit(stripe_bytes, '\0');
    uint8_t* dst = reinterpret_cast<uint8_t*>(unit.data());
    const uint32_t wanted = slot.index;
    EXPECT_TRUE(code->Decode(stripe_bytes, index, present.data(), {&wanted, 1}, &dst).ok());
    std::memcpy(out.data() + j * g.shape.unit_bytes, unit.data(), layout.UnitBytes(bytes[lost], j));
  }
  return out;
}

TEST(ParityStoreTest, EveryLossOfUpToMMembersDecodesFromTheParityTheOthersHold) {
  size_t decoded = 0;
  for (const char* name : {"ec:2+2", "ec:4+2", "ec:3+3", "xor:3", "ec:2+1", "ec:2+2,encode=sender",
                           "ec:4+2,encode=sender", "ec:3+3,encode=sender"}) {
    CodeSpec spec;
    ASSERT_TRUE(ParseCodeSpec(name, &spec).ok()) << name;
    test::TempDir dir("/dev/shm");
    const uint32_t n = spec.k + spec.m;
    const uint64_t unit = 8192;
    // Unequal segments: one long, one empty, the rest in between, none a multiple of the unit.
    std::vector<uint64_t> lengths;
    for (uint32_t p = 0; p < n; ++p) lengths.push_back(p == 1 ? 0 : 5 * unit + 123 + p * 4099);
    Group g = MakeGroup(dir, spec, unit, 42, lengths);
    Status st = Build(g, n);
    ASSERT_TRUE(st.ok()) << name << ": " << st.message();
    for (uint32_t mask = 0; mask < (1u << n); ++mask) {
      if (static_cast<uint32_t>(__builtin_popcount(mask)) > spec.m) continue;
      for (uint32_t lost = 0; lost < n; ++lost) {
        if (!(mask & (1u << lost))) continue;
        ASSERT_EQ(Reconstruct(g, lost, mask), g.images[lost])
            << name << " lost mask " << mask << " member " << lost;
        ++decoded;
      }
    }
  }
  std::printf("lost members decoded: %zu\n", decoded);
}

// ECHECK's encoding at the senders builds the same parity as the holders' multiply-add: every
// parity block of every holder is the same bytes (and xxh3) either way, pieces in any order.
TEST(ParityStoreTest, ParityEncodedAtTheSendersIsTheSameBytesAsAtTheHolders) {
  for (const char* name : {"ec:2+2", "ec:4+2", "ec:3+1", "ec:1+3"}) {
    CodeSpec holder_spec, sender_spec;
    ASSERT_TRUE(ParseCodeSpec(name, &holder_spec).ok());
    ASSERT_TRUE(ParseCodeSpec(std::string(name) + ",encode=sender", &sender_spec).ok());
    const uint32_t n = holder_spec.k + holder_spec.m;
    const uint64_t unit = 8192;
    std::vector<uint64_t> lengths;
    for (uint32_t p = 0; p < n; ++p) lengths.push_back(3 * unit + 777 * p);
    test::TempDir dir_h("/dev/shm"), dir_s("/dev/shm");
    Group h = MakeGroup(dir_h, holder_spec, unit, 9, lengths);
    Group s = MakeGroup(dir_s, sender_spec, unit, 9, lengths);
    ASSERT_EQ(h.images, s.images);
    ASSERT_TRUE(Build(h, 1).ok()) << name;
    ASSERT_TRUE(Build(s, 2).ok()) << name;
    size_t blocks = 0;
    for (uint32_t q = 0; q < n; ++q) {
      std::shared_ptr<MappedFile> hm, sm;
      std::unique_ptr<format::SegmentReader> hr, sr;
      ASSERT_TRUE(OpenParity(h, q, &hm, &hr).ok());
      ASSERT_TRUE(OpenParity(s, q, &sm, &sr).ok());
      ASSERT_EQ(hr->manifest().chunk_count(), sr->manifest().chunk_count());
      for (uint32_t i = 0; i < hr->manifest().chunk_count(); ++i) {
        const auto& hc = hr->manifest().chunk(i);
        const auto& sc = sr->manifest().chunk(i);
        ASSERT_EQ(hc.payload_bytes(), sc.payload_bytes());
        EXPECT_EQ(hc.xxh3(), sc.xxh3()) << name << " member " << q << " block " << i;
        EXPECT_EQ(0, std::memcmp(hm->data() + hc.record_offset() + format::kBlockBytes,
                                 sm->data() + sc.record_offset() + format::kBlockBytes,
                                 hc.payload_bytes()))
            << name << " member " << q << " block " << i;
        ++blocks;
      }
    }
    EXPECT_GT(blocks, 0u);
  }
}

// Members that disagree on where the coefficients multiply never build parity together: the
// second layout announced is refused, so no holder XORs raw units or multiplies partials.
TEST(ParityStoreTest, AMemberAnnouncingTheOtherEncodingIsRefused) {
  test::TempDir dir("/dev/shm");
  CodeSpec spec;
  ASSERT_TRUE(ParseCodeSpec("ec:2+1,encode=sender", &spec).ok());
  Group g = MakeGroup(dir, spec, 4096, 5, {4096, 4096, 4096});
  CodingGroup other = g.shape;
  other.code.encoding = redundancy::Encoding::kHolder;
  ASSERT_TRUE(g.stores[0]->Announce(g.shape, 5, 0, 4096, "announce").ok());
  Status st = g.stores[0]->Announce(other, 5, 1, 4096, "announce");
  EXPECT_EQ(st.code(), CKPTDB_EINVAL) << st.message();
  EXPECT_NE(st.message().find("ec:2+1,encode=sender"), std::string::npos) << st.message();
}

// A killed job leaves parity sealed for a version it never committed; the restarted job puts
// that version number again with other bytes. Without replace_sealed (it committed) the holder
// refuses; with replace_sealed the stale parity is dropped and the new bytes' parity built, and
// decodes.
TEST(ParityStoreTest, SealedParityOfAVersionNeverCommittedIsBuiltAgainOnlyWhenAllowed) {
  test::TempDir dir("/dev/shm");
  CodeSpec spec;
  ASSERT_TRUE(ParseCodeSpec("ec:2+2,encode=sender", &spec).ok());
  const uint64_t unit = 4096;
  Group g = MakeGroup(dir, spec, unit, 12, {3 * unit + 5, 2 * unit, unit + 1, 4 * unit});
  ASSERT_TRUE(Build(g, 3).ok());
  g.version = 13;  // the killed job got as far as sealing v13's parity too (pipelined commits)
  ASSERT_TRUE(Build(g, 5).ok());
  g.version = 12;
  Status st = g.stores[2]->Announce(g.shape, 12, 0, g.images[0].size(), "again");
  EXPECT_EQ(st.code(), CKPTDB_ESTATE) << st.message();
  EXPECT_NE(st.message().find("sealed already, and v12 may have committed"), std::string::npos)
      << st.message();
  // The new run's bytes, of other lengths.
  for (uint32_t p = 0; p < 4; ++p) {
    g.images[p].assign(p == 3 ? unit : 2 * unit + 7 * p, static_cast<char>('a' + p));
    g.images[p][p] = 'x';
  }
  st = Build(g, 4, /*replace_sealed=*/true);
  ASSERT_TRUE(st.ok()) << st.message();
  for (uint32_t q = 0; q < 4; ++q) {
    EXPECT_EQ(g.stores[q]->Find(7, 13), nullptr) << "v13's parity is above v12, never committed";
    EXPECT_NE(g.stores[q]->Find(7, 12), nullptr);
  }
  for (uint32_t lost = 0; lost < 4; ++lost) {
    for (uint32_t other = 0; other < 4; ++other) {
      const uint32_t mask = (1u << lost) | (1u << other);
      EXPECT_EQ(Reconstruct(g, lost, mask), g.images[lost]) << lost << " with " << other;
    }
  }
}

TEST(ParityStoreTest, ParityMemoryIsMOverKOfTheDataForEqualSegments) {
  test::TempDir dir("/dev/shm");
  const CodeSpec spec{CodeScheme::kReedSolomon, 4, 2};
  const uint64_t unit = 4096;
  Group g = MakeGroup(dir, spec, unit, 3, std::vector<uint64_t>(6, 24 * unit));
  ASSERT_TRUE(Build(g, 1).ok());
  uint64_t parity_payload = 0;
  for (uint32_t q = 0; q < 6; ++q) {
    std::shared_ptr<MappedFile> map;
    std::unique_ptr<format::SegmentReader> reader;
    ASSERT_TRUE(OpenParity(g, q, &map, &reader).ok());
    uint64_t mine = 0;
    for (uint32_t i = 0; i < reader->manifest().chunk_count(); ++i) {
      mine += reader->manifest().chunk(i).payload_bytes();
    }
    EXPECT_EQ(mine, 24 * unit * 2 / 4) << "member " << q << ": M/K of its own data";
    parity_payload += mine;
  }
  EXPECT_EQ(parity_payload, 6 * 24 * unit * 2 / 4);
}

// The memory one version of a coding group costs, for each scheme docs/performance.md lists
// ("Memory per scheme"): members with segments of 16 units, the parity summed as the sealed
// files' sizes (headers, record headers and manifests included). (K + M) / K, plus what the
// framing adds and what partly empty last stripes cost; printed, for the table.
TEST(ParityStoreTest, EverySchemesParityMemoryIsAboutKPlusMOverK) {
  const uint64_t unit = 256 << 10;
  const uint64_t segment = 16 * unit;
  for (const char* name : {"ec:2+2", "xor:3", "ec:4+2", "ec:8+2", "ec:6+3"}) {
    test::TempDir dir("/dev/shm");
    CodeSpec spec;
    ASSERT_TRUE(ParseCodeSpec(name, &spec).ok()) << name;
    const uint32_t n = spec.k + spec.m;
    Group g = MakeGroup(dir, spec, unit, 1, std::vector<uint64_t>(n, segment));
    ASSERT_TRUE(Build(g, 5).ok()) << name;
    uint64_t parity = 0;
    for (uint32_t q = 0; q < n; ++q) {
      parity += fs::file_size(g.stores[q]->SealedPath(g.shape.group, g.version));
    }
    const double measured = static_cast<double>(n * segment + parity) / (n * segment);
    const double ideal = static_cast<double>(n) / spec.k;
    std::printf("  %-7s (data + parity) / data = %.4f, (K+M)/K = %.4f\n", name, measured, ideal);
    EXPECT_GE(measured, ideal) << name;
    // Above (K+M)/K: each parity record's 4 KiB header (1.6% of the parity at 256 KiB units),
    // the segment's header and manifest, and for xor:3 and ec:6+3 the last stripes, partly
    // empty (a member's 16 units do not fill whole windows of K + M stripes) while their
    // parity is whole: 2.2% in all for ec:6+3.
    EXPECT_LE(measured, ideal * 1.03) << name;
  }
}

TEST(ParityStoreTest, WrongPiecesAreRefusedAndTheRefusalReachesEveryMember) {
  test::TempDir dir("/dev/shm");
  const CodeSpec spec{CodeScheme::kReedSolomon, 2, 1};
  const uint64_t unit = 4096;
  Group g = MakeGroup(dir, spec, unit, 5, {3 * unit, 3 * unit, 3 * unit});
  StripeLayout layout(2, 1, unit, 5);
  ParityStore& holder = *g.stores[layout.ParityMember(0, 0)];
  // A piece before the layout is answered.
  for (uint32_t p = 0; p < 3; ++p) {
    ASSERT_TRUE(holder.Announce(g.shape, 5, p, 3 * unit, "announce").ok());
  }
  const uint8_t* data = reinterpret_cast<const uint8_t*>(g.images[0].data());
  const uint32_t p0 = layout.DataMember(0, 0);
  const uint64_t u0 = layout.DataUnit(0, 0);
  EXPECT_EQ(holder.Accumulate(7, 5, p0, u0, 0, {data, 100}, "early").code(), CKPTDB_ESTATE);
  // Another layout announced by a member.
  CodingGroup other = g.shape;
  other.unit_bytes = 2 * unit;
  EXPECT_EQ(holder.Announce(other, 5, 0, 3 * unit, "announce").code(), CKPTDB_EINVAL);
  ASSERT_TRUE(holder.Layout(7, 5, "layout").ok());
  // A range twice: refused, and from then on every member hears the refusal.
  ASSERT_TRUE(holder.Accumulate(7, 5, p0, u0, 0, {data, 100}, "piece").ok());
  Status st = holder.Accumulate(7, 5, p0, u0, 50, {data, 100}, "piece");
  EXPECT_EQ(st.code(), CKPTDB_EINVAL) << st.message();
  EXPECT_NE(st.message().find("arrive a second time"), std::string::npos) << st.message();
  EXPECT_EQ(holder.Sealed(7, 5, "sealed").code(), CKPTDB_EINVAL);
  EXPECT_EQ(holder.Done(7, 5, (p0 + 1) % 3, "done").code(), CKPTDB_EINVAL);
  // A newer version drops the refused build.
  ASSERT_TRUE(holder.Announce(g.shape, 6, 0, 3 * unit, "announce").ok());
  EXPECT_EQ(holder.Sealed(7, 5, "sealed").code(), CKPTDB_ENOTFOUND);
}

TEST(ParityStoreTest, AMemberThatOwesBytesCannotBeDone) {
  test::TempDir dir("/dev/shm");
  const CodeSpec spec{CodeScheme::kXor, 2, 1};
  const uint64_t unit = 4096;
  Group g = MakeGroup(dir, spec, unit, 1, {2 * unit, 2 * unit, 2 * unit});
  StripeLayout layout(2, 1, unit, 1);
  for (uint32_t q = 0; q < 3; ++q) {
    for (uint32_t p = 0; p < 3; ++p)
      ASSERT_TRUE(g.stores[q]->Announce(g.shape, 1, p, 2 * unit, "a").ok());
    ASSERT_TRUE(g.stores[q]->Layout(7, 1, "layout").ok());
  }
  // Member 0 says it is done without sending: every holder of its stripes' parity refuses.
  size_t refused = 0;
  for (uint32_t q = 1; q < 3; ++q) {
    Status st = g.stores[q]->Done(7, 1, 0, "done");
    if (!st.ok()) {
      EXPECT_EQ(st.code(), CKPTDB_ECORRUPT);
      EXPECT_NE(st.message().find("sent 0 of the"), std::string::npos) << st.message();
      ++refused;
    }
  }
  EXPECT_GT(refused, 0u);
}

TEST(ParityStoreTest, RetentionKeepsTheNewestAndReusesTheDroppedParitysPagesFromZero) {
  test::TempDir dir("/dev/shm");
  const CodeSpec spec{CodeScheme::kReedSolomon, 2, 1};
  const uint64_t unit = 4096;
  const std::vector<uint64_t> lengths = {5 * unit + 7, 4 * unit, 3 * unit + 99};
  Group g = MakeGroup(dir, spec, unit, 1, lengths);
  for (uint64_t v = 1; v <= 4; ++v) {
    // The same stores, the next version: new bytes (the spare's old parity must not leak in).
    Group next = MakeGroup(dir, spec, unit, v, lengths);
    next.stores.clear();
    g.images = std::move(next.images);
    g.version = v;
    ASSERT_TRUE(Build(g, v).ok()) << "v" << v;
    for (uint32_t lost = 0; lost < 3; ++lost) {
      ASSERT_EQ(Reconstruct(g, lost, 1u << lost), g.images[lost]) << "v" << v;
    }
  }
  EXPECT_EQ(g.stores[0]->Held(), (std::vector<std::pair<uint32_t, uint64_t>>{{7, 3}, {7, 4}}));
  EXPECT_TRUE(fs::exists(dir.Sub("m0") + "/g00007.spare"));
}

// A budget of exactly what a version's parity takes holds it (the parity being laid out is
// counted once).
TEST(ParityStoreTest, ABudgetOfExactlyTheParitysSizeHoldsIt) {
  const CodeSpec spec{CodeScheme::kReedSolomon, 2, 1};
  const uint64_t unit = 4096;
  const std::vector<uint64_t> lengths = {12 * unit, 12 * unit, 12 * unit};
  uint64_t most = 0;
  {
    test::TempDir dir("/dev/shm");
    Group g = MakeGroup(dir, spec, unit, 1, lengths);
    ASSERT_TRUE(Build(g, 1).ok());
    for (const auto& store : g.stores) most = std::max(most, store->held_bytes());
  }
  test::TempDir dir("/dev/shm");
  Group g = MakeGroup(dir, spec, unit, 1, lengths, /*budget=*/most);
  Status st = Build(g, 1);
  EXPECT_TRUE(st.ok()) << st.message();
}

// A member late for a version its group has moved past is refused at once, not left waiting for
// members that will never announce it.
TEST(ParityStoreTest, AnAnnouncementOfAVersionTheGroupMovedPastIsRefused) {
  test::TempDir dir("/dev/shm");
  const CodeSpec spec{CodeScheme::kReedSolomon, 2, 1};
  Group g = MakeGroup(dir, spec, 4096, 5, {8192, 8192, 8192});
  ASSERT_TRUE(Build(g, 5).ok());
  Status st = g.stores[0]->Announce(g.shape, 4, 1, 8192, "late");
  EXPECT_EQ(st.code(), CKPTDB_ESTATE) << st.message();
  EXPECT_NE(st.message().find("moved on"), std::string::npos) << st.message();
  ASSERT_TRUE(g.stores[0]->Announce(g.shape, 7, 1, 8192, "next").ok());
  EXPECT_EQ(g.stores[0]->Announce(g.shape, 6, 1, 8192, "late").code(), CKPTDB_ESTATE);
}

TEST(ParityStoreTest, TheBudgetRefusesParityThatDoesNotFit) {
  test::TempDir dir("/dev/shm");
  const CodeSpec spec{CodeScheme::kReedSolomon, 2, 1};
  const uint64_t unit = 4096;
  Group g = MakeGroup(dir, spec, unit, 1, {64 * unit, 64 * unit, 64 * unit}, /*budget=*/8 * unit);
  Status st = Build(g, 1);
  EXPECT_EQ(st.code(), CKPTDB_ENOSPC) << st.message();
  EXPECT_NE(st.message().find("over their budget"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace ckpt::engine
