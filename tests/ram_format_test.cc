// The ram tier's on-memory format (format/ram_format.h, docs/format.md section 15): a header
// copy (fixed header and root path extension) and a copy's index round-trip, and every flipped
// bit, short region, oversized path or entry count is refused with a clear Corrupt (or
// NotSupported for another format version) instead of being believed.
#include "format/ram_format.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <vector>

#include "format/checksum.h"
#include "format/little_endian.h"
#include "format/segment_format.h"
#include "tests/test_util.h"

namespace ckpt::format {
namespace {

ArenaHeader SampleHeader() {
  ArenaHeader h;
  h.rank = 3;
  h.job_id = 0x0123456789abcdefull;
  h.capacity_bytes = 64ull << 20;
  h.generation = 0xfeedfacecafebeefull;
  h.created_unix_ns = 1700000000000000000ull;
  h.sequence = 7;
  h.root_path = "/var/tmp/job7/ckpt";
  return h;
}

RamIndex SampleIndex(uint32_t records) {
  RamIndex index;
  index.version = 42;
  index.rank = 3;
  index.generation = 0xfeedfacecafebeefull;
  index.job_id = 0x0123456789abcdefull;
  uint64_t logical = 0;
  for (uint32_t i = 0; i < records; ++i) {
    uint64_t bytes = 4096 * (1 + i % 5);
    index.entries.push_back({logical, 4096 + 8192 * uint64_t{i}, bytes});
    logical += bytes;
  }
  index.file_bytes = logical;
  return index;
}

TEST(RamFormat, ArenaHeaderRoundTripsAndEveryFlippedBitIsCaught) {
  uint8_t block[kArenaHeaderBytes];
  EncodeArenaHeader(SampleHeader(), std::span<uint8_t, kArenaHeaderBytes>(block));
  ArenaHeader got;
  ASSERT_TRUE(
      DecodeArenaHeader(std::span<const uint8_t, kArenaHeaderBytes>(block), "a", &got).ok());
  EXPECT_EQ(got.format_version, 2u);
  EXPECT_EQ(got.rank, 3u);
  EXPECT_EQ(got.job_id, 0x0123456789abcdefull);
  EXPECT_EQ(got.capacity_bytes, 64ull << 20);
  EXPECT_EQ(got.generation, 0xfeedfacecafebeefull);
  EXPECT_EQ(got.created_unix_ns, 1700000000000000000ull);
  EXPECT_EQ(got.sequence, 7u);
  for (size_t bit = 0; bit < kArenaHeaderBytes * 8; ++bit) {
    uint8_t bad[kArenaHeaderBytes];
    std::copy(block, block + kArenaHeaderBytes, bad);
    bad[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    Status st =
        DecodeArenaHeader(std::span<const uint8_t, kArenaHeaderBytes>(bad), "arena x", &got);
    EXPECT_EQ(st.code(), CKPTDB_ECORRUPT) << "bit " << bit;
    EXPECT_NE(st.message().find("arena x"), std::string::npos) << st.message();
  }
}

TEST(RamFormat, AnotherArenaFormatVersionIsNotSupported) {
  for (uint32_t version : {1u, 3u}) {
    ArenaHeader h = SampleHeader();
    h.format_version = version;
    uint8_t block[kArenaHeaderBytes];
    EncodeArenaHeader(h, std::span<uint8_t, kArenaHeaderBytes>(block));
    ArenaHeader got;
    Status st = DecodeArenaHeader(std::span<const uint8_t, kArenaHeaderBytes>(block), "a", &got);
    EXPECT_EQ(st.code(), CKPTDB_ENOTSUP);
    EXPECT_EQ(got.format_version, version) << "the caller learns which version it found";
    EXPECT_NE(st.message().find("format version " + std::to_string(version)), std::string::npos)
        << st.message();
  }
}

TEST(RamFormat, ArenaExtensionRoundTripsAndEveryFlippedBitIsCaught) {
  const std::string path = "/dev/shm/a store/with spaces";
  std::vector<uint8_t> ext(ArenaExtensionBytes(path.size()));
  EncodeArenaExtension(path, ext);
  std::string got;
  ASSERT_TRUE(DecodeArenaExtension(ext, "e", &got).ok());
  EXPECT_EQ(got, path);
  for (size_t bit = 0; bit < ext.size() * 8; ++bit) {
    std::vector<uint8_t> bad = ext;
    bad[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    Status st = DecodeArenaExtension(bad, "ext y", &got);
    EXPECT_EQ(st.code(), CKPTDB_ECORRUPT) << "bit " << bit;
    EXPECT_NE(st.message().find("ext y"), std::string::npos) << st.message();
  }
}

TEST(RamFormat, ArenaExtensionBoundsAreChecked) {
  std::string got;
  // The longest path a copy's slot takes (PATH_MAX less its NUL), and an empty one.
  for (size_t n : {size_t{0}, kArenaMaxRootPathBytes}) {
    const std::string path(n, 'p');
    std::vector<uint8_t> ext(ArenaExtensionBytes(n));
    EncodeArenaExtension(path, ext);
    ASSERT_TRUE(DecodeArenaExtension(ext, "e", &got).ok()) << n;
    EXPECT_EQ(got, path);
    EXPECT_LE(kArenaExtensionOffset + ext.size(), kArenaHeaderCopyBytes);
  }
  // A length past the bound, or past the bytes given, is refused before anything is hashed.
  std::vector<uint8_t> ext(ArenaExtensionBytes(kArenaMaxRootPathBytes + 1), 0);
  le::Put<uint32_t>(ext.data(), 0, static_cast<uint32_t>(kArenaMaxRootPathBytes + 1));
  Status st = DecodeArenaExtension(ext, "e", &got);
  EXPECT_EQ(st.code(), CKPTDB_ECORRUPT);
  EXPECT_NE(st.message().find("4096 bytes of path"), std::string::npos) << st.message();
  le::Put<uint32_t>(ext.data(), 0, 0xffffffffu);
  EXPECT_EQ(DecodeArenaExtension(ext, "e", &got).code(), CKPTDB_ECORRUPT);
  std::vector<uint8_t> fits(ArenaExtensionBytes(10));
  EncodeArenaExtension(std::string(10, 'q'), fits);
  EXPECT_EQ(DecodeArenaExtension(std::span<const uint8_t>(fits.data(), fits.size() - 1), "e", &got)
                .code(),
            CKPTDB_ECORRUPT);
  EXPECT_EQ(DecodeArenaExtension(std::span<const uint8_t>(fits.data(), 3), "e", &got).code(),
            CKPTDB_ECORRUPT);
  // Zeroed memory is an empty path whose checksum does not hold.
  std::vector<uint8_t> zeros(64, 0);
  EXPECT_EQ(DecodeArenaExtension(zeros, "e", &got).code(), CKPTDB_ECORRUPT);
}

TEST(RamFormat, ArenaHeaderCopyRoundTrips) {
  std::vector<uint8_t> slot(kArenaHeaderCopyBytes, 0xee);  // the encoder zeroes the rest
  const ArenaHeader h = SampleHeader();
  EncodeArenaHeaderCopy(h, std::span<uint8_t, kArenaHeaderCopyBytes>(slot.data(), slot.size()));
  ArenaHeader got;
  ASSERT_TRUE(
      DecodeArenaHeaderCopy(
          std::span<const uint8_t, kArenaHeaderCopyBytes>(slot.data(), slot.size()), "c", &got)
          .ok());
  EXPECT_EQ(got.sequence, h.sequence);
  EXPECT_EQ(got.root_path, h.root_path);
  EXPECT_EQ(got.generation, h.generation);
  const size_t used = kArenaExtensionOffset + ArenaExtensionBytes(h.root_path.size());
  for (size_t i = used; i < slot.size(); ++i) ASSERT_EQ(slot[i], 0) << "byte " << i;
  // Damage in either half fails the copy, named as the caller named it.
  for (size_t at : {size_t{20}, size_t{74}, used - 1}) {
    std::vector<uint8_t> bad = slot;
    bad[at] ^= 0x10;
    Status st = DecodeArenaHeaderCopy(
        std::span<const uint8_t, kArenaHeaderCopyBytes>(bad.data(), bad.size()),
        "header copy B at offset 8192", &got);
    EXPECT_EQ(st.code(), CKPTDB_ECORRUPT) << at;
    EXPECT_EQ(st.message().rfind("header copy B at offset 8192", 0), 0u) << st.message();
    EXPECT_NE(st.message().find("fails xxh3"), std::string::npos) << st.message();
  }
  // Bytes past the extension are not part of the copy.
  slot[used + 5] = 0x55;
  EXPECT_TRUE(
      DecodeArenaHeaderCopy(
          std::span<const uint8_t, kArenaHeaderCopyBytes>(slot.data(), slot.size()), "c", &got)
          .ok());
}

// Every byte of one copy where docs/format.md section 15 puts it.
TEST(RamFormat, ArenaHeaderCopyGoldenLayout) {
  std::vector<uint8_t> slot(kArenaHeaderCopyBytes);
  const ArenaHeader h = SampleHeader();
  EncodeArenaHeaderCopy(h, std::span<uint8_t, kArenaHeaderCopyBytes>(slot.data(), slot.size()));
  const uint8_t* p = slot.data();
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(p), 8), "CKPTRAM1");
  EXPECT_EQ(le::Get<uint32_t>(p, 8), 2u);
  EXPECT_EQ(le::Get<uint32_t>(p, 12), 3u);
  EXPECT_EQ(le::Get<uint64_t>(p, 16), 0x0123456789abcdefull);
  EXPECT_EQ(le::Get<uint64_t>(p, 24), 64ull << 20);
  EXPECT_EQ(le::Get<uint64_t>(p, 32), 0xfeedfacecafebeefull);
  EXPECT_EQ(le::Get<uint64_t>(p, 40), 1700000000000000000ull);
  EXPECT_EQ(le::Get<uint64_t>(p, 48), 7u);
  EXPECT_EQ(le::Get<uint64_t>(p, 56), Xxh3(p, 56));
  const uint32_t n = static_cast<uint32_t>(h.root_path.size());
  EXPECT_EQ(le::Get<uint32_t>(p, 64), n);
  EXPECT_EQ(le::Get<uint32_t>(p, 68), 0u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(p + 72), n), h.root_path);
  EXPECT_EQ(le::Get<uint64_t>(p, 72 + n), Xxh3(p + 64, 8 + n));
  EXPECT_EQ(kArenaHeaderCopyOffsets[0], 0u);
  EXPECT_EQ(kArenaHeaderCopyOffsets[1], 8192u);
  EXPECT_EQ(kArenaHeaderAreaBytes, 16384u);
}

TEST(RamFormat, IndexRoundTripsAndEveryFlippedBitIsCaught) {
  const RamIndex index = SampleIndex(7);
  std::vector<uint8_t> region(AlignUp(RamIndexBytes(index.entries.size())), 0);
  EncodeRamIndex(index, region);
  RamIndex got;
  ASSERT_TRUE(DecodeRamIndex(region, 100, "i", &got).ok());
  EXPECT_EQ(got.version, 42u);
  EXPECT_EQ(got.rank, 3u);
  EXPECT_EQ(got.file_bytes, index.file_bytes);
  EXPECT_EQ(got.generation, index.generation);
  EXPECT_EQ(got.job_id, index.job_id);
  ASSERT_EQ(got.entries.size(), 7u);
  for (size_t i = 0; i < 7; ++i) {
    EXPECT_EQ(got.entries[i].logical_offset, index.entries[i].logical_offset);
    EXPECT_EQ(got.entries[i].arena_offset, index.entries[i].arena_offset);
    EXPECT_EQ(got.entries[i].bytes, index.entries[i].bytes);
  }
  const size_t used = RamIndexBytes(index.entries.size());
  for (size_t bit = 0; bit < used * 8; ++bit) {
    std::vector<uint8_t> bad = region;
    bad[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    Status st = DecodeRamIndex(bad, 100, "index y", &got);
    EXPECT_EQ(st.code(), CKPTDB_ECORRUPT) << "bit " << bit;
    EXPECT_NE(st.message().find("index y"), std::string::npos) << st.message();
  }
}

TEST(RamFormat, IndexBoundsAreChecked) {
  const RamIndex index = SampleIndex(7);
  std::vector<uint8_t> region(AlignUp(RamIndexBytes(index.entries.size())), 0);
  EncodeRamIndex(index, region);
  RamIndex got;
  // More entries than the caller allows, or than the region holds.
  Status st = DecodeRamIndex(region, 6, "i", &got);
  EXPECT_EQ(st.code(), CKPTDB_ECORRUPT);
  EXPECT_NE(st.message().find("lists 7 records"), std::string::npos) << st.message();
  st = DecodeRamIndex(std::span<const uint8_t>(region.data(), RamIndexBytes(6)), 100, "i", &got);
  EXPECT_EQ(st.code(), CKPTDB_ECORRUPT);
  st = DecodeRamIndex(std::span<const uint8_t>(region.data(), 10), 100, "i", &got);
  EXPECT_EQ(st.code(), CKPTDB_ECORRUPT);
  EXPECT_NE(st.message().find("shorter than its 64-byte header"), std::string::npos);
  // Zeroed memory (a region never written) is no index.
  std::vector<uint8_t> zeros(4096, 0);
  EXPECT_EQ(DecodeRamIndex(zeros, 100, "i", &got).code(), CKPTDB_ECORRUPT);
}

std::string CorpusDir() {
  return std::string(CKPTDB_TEST_DATA_DIR) + "/../../fuzz/corpus/ram_index";
}

// Seeds for fuzz/fuzz_ram_index.cc: a header copy (a whole slot, and cut after its extension), an
// index, and an index of no records.
TEST(RamFuzzSeeds, DISABLED_Regenerate) {
  std::filesystem::create_directories(CorpusDir());
  // One header copy, cut after its extension (the rest of the slot is zeros).
  const ArenaHeader h = SampleHeader();
  std::vector<uint8_t> header(kArenaHeaderCopyBytes);
  EncodeArenaHeaderCopy(h, std::span<uint8_t, kArenaHeaderCopyBytes>(header.data(), header.size()));
  test::WriteWholeFile(CorpusDir() + "/header-slot.bin", std::string(header.begin(), header.end()));
  header.resize(kArenaExtensionOffset + ArenaExtensionBytes(h.root_path.size()));
  const RamIndex index = SampleIndex(5);
  std::vector<uint8_t> region(RamIndexBytes(index.entries.size()));
  EncodeRamIndex(index, region);
  test::WriteWholeFile(CorpusDir() + "/header.bin", std::string(header.begin(), header.end()));
  test::WriteWholeFile(CorpusDir() + "/index-5.bin", std::string(region.begin(), region.end()));
  const RamIndex empty = SampleIndex(0);
  std::vector<uint8_t> none(RamIndexBytes(0));
  EncodeRamIndex(empty, none);
  test::WriteWholeFile(CorpusDir() + "/index-0.bin", std::string(none.begin(), none.end()));
}

// Every seed and regression input of fuzz_ram_index, in the ordinary build.
TEST(RamFormat, FuzzCorpusDecodesCleanly) {
  size_t seen = 0, decoded = 0;
  for (const auto& e : std::filesystem::directory_iterator(CorpusDir())) {
    std::string raw = test::ReadWholeFile(e.path().string());
    std::vector<uint8_t> bytes(raw.begin(), raw.end());
    RamIndex index;
    Status st = DecodeRamIndex(bytes, 1u << 16, "seed", &index);
    EXPECT_TRUE(st.ok() || st.code() == CKPTDB_ECORRUPT) << e.path() << ": " << st.ToString();
    if (bytes.size() >= kArenaHeaderBytes) {
      ArenaHeader h;
      Status hs = DecodeArenaHeader(
          std::span<const uint8_t, kArenaHeaderBytes>(bytes.data(), kArenaHeaderBytes), "seed", &h);
      EXPECT_TRUE(hs.ok() || hs.code() == CKPTDB_ECORRUPT || hs.code() == CKPTDB_ENOTSUP)
          << e.path() << ": " << hs.ToString();
      Status xs = DecodeArenaExtension(
          std::span<const uint8_t>(bytes).subspan(kArenaExtensionOffset), "seed", &h.root_path);
      EXPECT_TRUE(xs.ok() || xs.code() == CKPTDB_ECORRUPT) << e.path() << ": " << xs.ToString();
      decoded += hs.ok() && xs.ok();
    }
    if (bytes.size() >= kArenaHeaderCopyBytes) {
      ArenaHeader h;
      Status cs = DecodeArenaHeaderCopy(
          std::span<const uint8_t, kArenaHeaderCopyBytes>(bytes.data(), kArenaHeaderCopyBytes),
          "seed", &h);
      EXPECT_TRUE(cs.ok() || cs.code() == CKPTDB_ECORRUPT || cs.code() == CKPTDB_ENOTSUP)
          << e.path() << ": " << cs.ToString();
    }
    decoded += st.ok();
    ++seen;
  }
  EXPECT_GE(seen, 3u);
  EXPECT_GE(decoded, 3u) << "the seeds must include valid inputs";
}

}  // namespace
}  // namespace ckpt::format
